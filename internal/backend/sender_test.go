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
	s, dir := newTestSFTP(t)
	ctx := context.Background()
	f, err := s.Open(ctx, "f", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
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
