package backend

import (
	"bytes"
	"context"
	"math/rand"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestLargeWritesAnsweredBeforeSent: a large write is answered once its data is
// copied, while the file's sender puts it on the connection. With the server stopped
// (its input pipe full), writes inside the write-behind window still return at once;
// once it goes on, everything arrives in order.
func TestLargeWritesAnsweredBeforeSent(t *testing.T) {
	dir := t.TempDir()
	pool := newTestPool(t, "")
	s := newTestSource(t, 10*time.Second, dir, pool)
	ctx := context.Background()
	f, err := s.Open(ctx, "big", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	want := randomBytes(4<<20, 7)
	signalSessions(t, pool, syscall.SIGSTOP)
	resumed := make(chan struct{})
	go func() {
		// Well inside the pool's 2 s watchdog, well beyond what copying 4 MiB takes.
		time.Sleep(time.Second)
		signalSessions(t, pool, syscall.SIGCONT)
		close(resumed)
	}()
	start := time.Now()
	for off := 0; off < len(want); off += 256 << 10 {
		if _, err := f.WriteAt(ctx, want[off:off+256<<10], int64(off)); err != nil {
			t.Fatalf("write at %d: %v", off, err)
		}
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("4 MiB of writes to a stopped server took %v: the writer waited for the connection", took)
	}
	<-resumed
	closeAndCompare(t, f, filepath.Join(dir, "big"), want)
}

// TestRequestsFollowSentWrites: whatever is asked of a file after a large write —
// a read, a stat, a change of size, a small write — reaches the server after it, so
// it sees the write, though the write may still be with the file's sender.
func TestRequestsFollowSentWrites(t *testing.T) {
	_, dir, f := newCreated(t, "f", os.O_RDWR, 0o644)
	ctx := context.Background()
	rnd := rand.New(rand.NewSource(3))
	var want []byte
	for i := range 200 {
		n := sendAsyncMin + rnd.Intn(300<<10)
		off := rnd.Intn(len(want) + 1)
		p := randomBytes(n, int64(i))
		if _, err := f.WriteAt(ctx, p, int64(off)); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		if end := off + n; end > len(want) {
			want = append(want, make([]byte, end-len(want))...)
		}
		copy(want[off:], p)
		switch i % 4 {
		case 0:
			got := make([]byte, n)
			if m, err := f.ReadAt(ctx, got, int64(off)); err != nil || m != n || !bytes.Equal(got, p) {
				t.Fatalf("read %d after its write: %d bytes, %v, equal %v", i, m, err, bytes.Equal(got[:m], p[:m]))
			}
		case 1:
			if a, err := f.Stat(ctx); err != nil || a.Size != int64(len(want)) {
				t.Fatalf("stat %d after a write: size %d (%v), want %d", i, a.Size, err, len(want))
			}
		case 2:
			size := len(want) - rnd.Intn(len(want)/4+1)
			if err := f.SetAttr(ctx, SetAttr{Valid: SetSize, Size: int64(size)}); err != nil {
				t.Fatalf("truncate %d: %v", i, err)
			}
			want = want[:size]
		case 3:
			at := rnd.Intn(len(want))
			if _, err := f.WriteAt(ctx, []byte{'x'}, int64(at)); err != nil {
				t.Fatalf("small write %d: %v", i, err)
			}
			want[at] = 'x'
		}
	}
	closeAndCompare(t, f, filepath.Join(dir, "f"), want)
}

// TestReplayCopiesSized: a write sent and kept until acknowledged is kept in a copy of
// about its size. Each took 256 KiB, so a random writer's 1,024 requests in flight
// (the window bounds their bytes, 4 MiB of 4 KiB writes) held 256 MiB.
func TestReplayCopiesSized(t *testing.T) {
	_, dir, f := newCreated(t, "f", os.O_RDWR, 0o644)
	ctx := context.Background()
	sf := f.(*sftpFile)
	want, size := make([]byte, 8<<20), 0
	rnd := rand.New(rand.NewSource(5))
	for i := range 1000 {
		n := 1 + rnd.Intn(8<<10)
		if i%3 == 0 { // some continue the write before: held, then merged into it
			n = 4 << 10
		}
		off := rnd.Intn(len(want) - n - 4<<10)
		p := randomBytes(n, int64(i))
		if _, err := f.WriteAt(ctx, p, int64(off)); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		copy(want[off:], p)
		size = max(size, off+n)
		if i%3 == 0 {
			next := p[:2<<10]
			size = max(size, off+n+len(next))
			if _, err := f.WriteAt(ctx, next, int64(off+n)); err != nil {
				t.Fatalf("write %d: %v", i, err)
			}
			copy(want[off+n:], next)
		}
		sf.wb.mu.Lock()
		sent := sf.wb.pending
		if sf.wb.held.Load() { // the held write keeps room for the writes that may continue it
			sent = sent[:len(sent)-1]
		}
		for _, pw := range sent {
			if c := cap(pw.data); c > 4<<10 && c >= 2*len(pw.data) {
				sf.wb.mu.Unlock()
				t.Fatalf("a write of %d bytes kept in a copy of %d", len(pw.data), c)
			}
		}
		sf.wb.mu.Unlock()
	}
	closeAndCompare(t, f, filepath.Join(dir, "f"), want[:size])
}
