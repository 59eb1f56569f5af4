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

// signalSessions sends sig to every session's server process of the pool: SIGKILL is
// a lost connection, SIGSTOP a server (or link) that stops answering.
func signalSessions(t *testing.T, p *Pool, sig syscall.Signal) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.sessions {
		if err := s.cmd.Process.Signal(sig); err != nil {
			t.Logf("signal %v: %v", sig, err)
		}
	}
}

// closeAndCompare closes f, which must succeed, and checks that the file at path
// holds exactly want.
func closeAndCompare(t *testing.T, f File, path string, want []byte) {
	t.Helper()
	if err := f.Close(context.Background()); err != nil {
		t.Fatalf("close: %v", err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("file differs from what was written (%d vs %d bytes)", len(got), len(want))
	}
}

func randomBytes(n int, seed int64) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

// TestWritesReplayedAfterLostConnection: writes the caller was told succeeded, but the
// server had not yet acknowledged when the connection died, are sent again on a new
// session; the file ends up exactly as written.
func TestWritesReplayedAfterLostConnection(t *testing.T) {
	dir := t.TempDir()
	pool := newTestPool(t, "")
	s := newTestSource(t, 10*time.Second, dir, pool)
	ctx := context.Background()
	want := randomBytes(12<<20, 1)
	f, err := s.Open(ctx, "big", os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(want); off += 1 << 20 {
		if _, err := f.WriteAt(ctx, want[off:off+1<<20], int64(off)); err != nil {
			t.Fatalf("write at %d: %v", off, err)
		}
		if off == 4<<20 || off == 9<<20 {
			signalSessions(t, pool, syscall.SIGKILL)
		}
	}
	closeAndCompare(t, f, filepath.Join(dir, "big"), want)
	if s.reopened.Load() == 0 {
		t.Error("the file was never reopened: the kill did not hit the test")
	}
	if st := pool.Stats(); st.Reconnects == 0 {
		t.Errorf("no reconnect counted: %+v", st)
	}
}

// TestReadsAndLookupsSurviveLostConnection: an open file and metadata requests go on
// after every session of the pool is killed.
func TestReadsAndLookupsSurviveLostConnection(t *testing.T) {
	dir := t.TempDir()
	want := randomBytes(5<<20, 2)
	os.WriteFile(filepath.Join(dir, "data"), want, 0o644) //nolint:errcheck
	pool := newTestPool(t, "")
	s := newTestSource(t, 10*time.Second, dir, pool)
	ctx := context.Background()
	f, err := s.Open(ctx, "data", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close(ctx) //nolint:errcheck
	got := make([]byte, len(want))
	for off := 0; off < len(want); off += 1 << 20 {
		if off == 2<<20 {
			signalSessions(t, pool, syscall.SIGKILL)
		}
		n, err := f.ReadAt(ctx, got[off:off+1<<20], int64(off))
		if err != nil || n != 1<<20 {
			t.Fatalf("read at %d: %d, %v", off, n, err)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatal("read data differs")
	}
	signalSessions(t, pool, syscall.SIGKILL)
	if a, err := s.Lstat(ctx, "data"); err != nil || a.Size != int64(len(want)) {
		t.Fatalf("lstat after kill: %+v, %v", a, err)
	}
	if _, err := s.Mkdir(ctx, "d", 0o755); err != nil {
		t.Fatalf("mkdir after kill: %v", err)
	}
}

// TestReopenSeesReplacedFile: a reader whose connection is lost after the file was
// replaced on the server (a new file renamed over it) gets ESTALE from the reopened
// path, never the other file's bytes; a file that only grew (a log being followed)
// reads on, old bytes and new.
func TestReopenSeesReplacedFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "data")
	old := randomBytes(3<<20, 3)
	pool := newTestPool(t, "")
	s := newTestSource(t, 10*time.Second, dir, pool)
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		change  func() []byte // the file's content after the change, made on the server
		replace bool
	}{
		{"replaced", func() []byte {
			b := randomBytes(len(old), 4)
			os.WriteFile(path+".new", b, 0o644) //nolint:errcheck
			if err := os.Rename(path+".new", path); err != nil {
				t.Fatal(err)
			}
			return b
		}, true},
		{"grown", func() []byte {
			more := randomBytes(1<<20, 5)
			f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.Write(more) //nolint:errcheck
			f.Close()
			return append(append([]byte(nil), old...), more...)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(path, old, 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := s.Open(ctx, "data", os.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close(ctx) //nolint:errcheck
			buf := make([]byte, 64<<10)
			if _, err := f.ReadAt(ctx, buf, 0); err != nil {
				t.Fatal(err)
			}
			now := tc.change()
			signalSessions(t, pool, syscall.SIGKILL)
			// Past the read-ahead's first chunks, so the read goes to the server.
			off := int64(2 << 20)
			n, err := f.ReadAt(ctx, buf, off)
			switch {
			case tc.replace && ToErrno(err) != syscall.ESTALE:
				t.Errorf("read of a replaced file after a reconnect: %d bytes, %v; want ESTALE", n, err)
			case !tc.replace && (err != nil || !bytes.Equal(buf[:n], now[off:off+int64(n)])):
				t.Errorf("read of a grown file after a reconnect: %d bytes, %v", n, err)
			case !tc.replace:
				n, err := f.ReadAt(ctx, buf, int64(len(old)))
				if err != nil || !bytes.Equal(buf[:n], now[len(old):len(old)+n]) {
					t.Errorf("the grown part after a reconnect: %d bytes, %v", n, err)
				}
			}
		})
	}
}

// TestStalledServerTimesOut: a server that stops answering costs a caller at most
// the timeout, and the next request runs on a fresh session.
func TestStalledServerTimesOut(t *testing.T) {
	dir := t.TempDir()
	pool := newTestPool(t, "") // the watchdog ends a session silent for 2 s
	s := newTestSource(t, time.Second, dir, pool)
	ctx := context.Background()
	if _, err := s.Lstat(ctx, ""); err != nil {
		t.Fatal(err)
	}
	signalSessions(t, pool, syscall.SIGSTOP)
	start := time.Now()
	_, err := s.Lstat(ctx, "")
	took := time.Since(start)
	if err == nil {
		t.Fatal("lstat on a stopped server succeeded")
	}
	if got := ToErrno(err); got != syscall.ETIMEDOUT || !IsUnavailable(err) {
		t.Errorf("got %v (%v), want ETIMEDOUT", got, err)
	}
	if took > 2*time.Second {
		t.Errorf("the caller waited %v, more than the 1 s timeout allows", took)
	}
	// The watchdog kills the silent session; SIGCONT lets the killed processes go.
	time.Sleep(2500 * time.Millisecond)
	signalSessions(t, pool, syscall.SIGCONT)
	if _, err := s.Lstat(ctx, ""); err != nil {
		t.Fatalf("lstat after the stall: %v", err)
	}
}

// TestUnreachableServerFailsFast: with the server down, requests fail within the
// timeout with an error that says the source is unavailable, and succeed again once
// it is back.
func TestUnreachableServerFailsFast(t *testing.T) {
	dir := t.TempDir()
	flag := filepath.Join(t.TempDir(), "down")
	pool := newTestPool(t, flag)
	s := newTestSource(t, time.Second, dir, pool)
	ctx := context.Background()
	os.WriteFile(flag, nil, 0o644) //nolint:errcheck
	signalSessions(t, pool, syscall.SIGKILL)
	start := time.Now()
	_, err := s.Lstat(ctx, "")
	if err == nil || !IsUnavailable(err) {
		t.Fatalf("lstat with the server down: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("took %v", took)
	}
	if st := pool.State(); st != StateDown {
		t.Errorf("state %v, want down", st)
	}
	os.Remove(flag)
	deadline := time.Now().Add(10 * time.Second)
	for pool.State() != StateUp && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := s.Lstat(ctx, ""); err != nil {
		t.Fatalf("lstat once the server is back: %v", err)
	}
}

// TestReplicaFailover: a replica set spreads reads over its members, and an open file
// being written moves to the other member when its own fails, losing nothing.
func TestReplicaFailover(t *testing.T) {
	dir := t.TempDir()
	flagA := filepath.Join(t.TempDir(), "a-down")
	a, b := newTestPool(t, flagA), newTestPool(t, "")
	s := newTestSource(t, 5*time.Second, dir, a, b)
	ctx := context.Background()

	data := randomBytes(1<<20, 3)
	os.WriteFile(filepath.Join(dir, "r"), data, 0o644) //nolint:errcheck
	done := make(chan error, 8)
	for i := 0; i < 8; i++ {
		go func() {
			f, err := s.Open(ctx, "r", os.O_RDONLY, 0)
			if err == nil {
				buf := make([]byte, len(data))
				_, err = f.ReadAt(ctx, buf, 0)
				f.Close(ctx) //nolint:errcheck
			}
			done <- err
		}()
	}
	for i := 0; i < 8; i++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if a.Stats().BytesIn == 0 || b.Stats().BytesIn == 0 {
		t.Errorf("reads were not spread: member A read %d bytes, B %d", a.Stats().BytesIn, b.Stats().BytesIn)
	}

	want := randomBytes(6<<20, 4)
	f, err := s.Open(ctx, "w", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(want); off += 1 << 20 {
		if off == 3<<20 {
			os.WriteFile(flagA, nil, 0o644) //nolint:errcheck
			signalSessions(t, a, syscall.SIGKILL)
		}
		if _, err := f.WriteAt(ctx, want[off:off+1<<20], int64(off)); err != nil {
			t.Fatalf("write at %d: %v", off, err)
		}
	}
	if err := f.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "w"))
	if !bytes.Equal(got, want) {
		t.Fatal("file written through the failover differs")
	}
	if _, err := s.Lstat(ctx, "w"); err != nil {
		t.Fatalf("lstat with member A down: %v", err)
	}
	if st := a.State(); st == StateUp {
		t.Error("member A is up although its server is down")
	}
	os.Remove(flagA)
	deadline := time.Now().Add(10 * time.Second)
	for a.State() != StateUp && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if a.State() != StateUp {
		t.Error("member A was not probed back in")
	}
}

// TestRandomOpsWithKills compares a file written through random pwrite, truncate,
// read and fsync with an in-memory model while connections are killed at random.
func TestRandomOpsWithKills(t *testing.T) {
	dir := t.TempDir()
	pool := newTestPool(t, "")
	s := newTestSource(t, 10*time.Second, dir, pool)
	ctx := context.Background()
	rng := rand.New(rand.NewSource(5))
	f, err := s.Open(ctx, "model", os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var model []byte
	const maxSize = 3 << 20
	for i := 0; i < 400; i++ {
		if rng.Intn(40) == 0 {
			signalSessions(t, pool, syscall.SIGKILL)
		}
		switch op := rng.Intn(10); {
		case op < 5:
			off := rng.Intn(maxSize)
			buf := randomBytes(1+rng.Intn(300<<10), rng.Int63())
			if _, err := f.WriteAt(ctx, buf, int64(off)); err != nil {
				t.Fatalf("op %d: write: %v", i, err)
			}
			if end := off + len(buf); end > len(model) {
				model = append(model, make([]byte, end-len(model))...)
			}
			copy(model[off:], buf)
		case op < 6:
			size := rng.Intn(maxSize)
			if err := f.SetAttr(ctx, SetAttr{Valid: SetSize, Size: int64(size)}); err != nil {
				t.Fatalf("op %d: truncate: %v", i, err)
			}
			if size < len(model) {
				model = model[:size]
			} else {
				model = append(model, make([]byte, size-len(model))...)
			}
		case op < 9:
			if err := f.Flush(ctx); err != nil {
				t.Fatalf("op %d: flush: %v", i, err)
			}
			off := rng.Intn(maxSize)
			buf := make([]byte, 1+rng.Intn(600<<10))
			n, err := f.ReadAt(ctx, buf, int64(off))
			if err != nil {
				t.Fatalf("op %d: read: %v", i, err)
			}
			var want []byte
			if off < len(model) {
				want = model[off:min(len(model), off+len(buf))]
			}
			if !bytes.Equal(buf[:n], want) {
				t.Fatalf("op %d: read %d bytes at %d differ from the model (%d expected)", i, n, off, len(want))
			}
		default:
			if err := f.Sync(ctx); err != nil {
				t.Fatalf("op %d: fsync: %v", i, err)
			}
		}
	}
	if err := f.Close(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "model"))
	if !bytes.Equal(got, model) {
		t.Fatalf("final file (%d bytes) differs from the model (%d bytes)", len(got), len(model))
	}
	t.Logf("reopens: %d, retries: %d", s.reopened.Load(), s.retries.Load())
}
