package backend

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/muxfs/muxfs/internal/sftp"
)

// stripeSource serves a file "big" of size random bytes over a test pool, with links
// counted as slow from minRTT on, and measures the link once (a round trip).
func stripeSource(t *testing.T, minRTT time.Duration, size int, seed int64) (*SFTP, *Pool, []byte) {
	t.Helper()
	old := stripeMinRTT
	stripeMinRTT = minRTT
	t.Cleanup(func() { stripeMinRTT = old })
	dir := t.TempDir()
	want := randomBytes(size, seed)
	os.WriteFile(filepath.Join(dir, "big"), want, 0o644) //nolint:errcheck
	pool := newTestPool(t, "")
	s := newTestSource(t, 10*time.Second, dir, pool)
	if _, err := s.Lstat(context.Background(), "big"); err != nil {
		t.Fatal(err)
	}
	return s, pool, want
}

// readSequentially opens "big" and reads it whole in 1 MiB pieces, calling before (if
// set) ahead of each read; it checks the data read and returns the file, open until
// the test ends.
func readSequentially(t *testing.T, s *SFTP, want []byte, before func(off int)) File {
	t.Helper()
	ctx := context.Background()
	f, err := s.Open(ctx, "big", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close(ctx) }) //nolint:errcheck
	got := make([]byte, len(want))
	for off := 0; off < len(want); off += 1 << 20 {
		if before != nil {
			before(off)
		}
		if n, err := f.ReadAt(ctx, got[off:off+1<<20], int64(off)); err != nil || n != 1<<20 {
			t.Fatalf("read at %d: %d, %v", off, n, err)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatal("data read differs from the file")
	}
	return f
}

// waitStriped gives the read-ahead time to open an extra handle once the stream is at
// full window (past 16 MiB).
func waitStriped(s *SFTP, off int) {
	for deadline := time.Now().Add(2 * time.Second); off > 16<<20 && s.striped.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStripedRead: over a slow link, a big sequential read goes through a second
// session too, and the data is the file's.
func TestStripedRead(t *testing.T) {
	s, pool, want := stripeSource(t, time.Nanosecond, 64<<20, 3) // every link is slow
	in := map[*sftp.Client]int64{}
	readSequentially(t, s, want, func(off int) { waitStriped(s, off) })
	if s.striped.Load() == 0 {
		t.Fatal("no extra handle was opened")
	}
	pool.mu.Lock()
	busy := 0
	for _, ss := range pool.sessions {
		in[ss.client] = ss.client.Stats().BytesIn
		if in[ss.client] > 8<<20 {
			busy++
		}
	}
	pool.mu.Unlock()
	if busy < 2 {
		t.Errorf("the read did not go through two sessions: bytes in per session %v", in)
	}
}

// TestStripedReadSurvivesLostSessions: every session killed halfway through a striped
// read; the read goes on, correct, on new ones.
func TestStripedReadSurvivesLostSessions(t *testing.T) {
	s, pool, want := stripeSource(t, time.Nanosecond, 64<<20, 4)
	readSequentially(t, s, want, func(off int) {
		waitStriped(s, off)
		if off == len(want)/2 {
			if s.striped.Load() == 0 {
				t.Error("not striped when the sessions were killed")
			}
			signalSessions(t, pool, syscall.SIGKILL)
		}
	})
}

// TestSlowLinkOnlyStripes: on a link faster than stripeMinRTT, nothing is striped.
func TestSlowLinkOnlyStripes(t *testing.T) {
	s, _, want := stripeSource(t, time.Hour, 40<<20, 5)
	readSequentially(t, s, want, nil)
	if n := s.striped.Load(); n != 0 {
		t.Errorf("%d extra handles opened on a fast link", n)
	}
}

// TestReadAheadGrowsWithLargeReads: reads larger than the read-ahead window (the disk
// cache's whole-file fetch reads 1 MiB at a time) grow it to its maximum; the window
// used to start over each time such a read overtook it, and stayed at 512 KiB.
func TestReadAheadGrowsWithLargeReads(t *testing.T) {
	s, _, want := stripeSource(t, time.Hour, 24<<20, 6)
	f := readSequentially(t, s, want, nil)
	sf := f.(*sftpFile)
	sf.ra.mu.Lock()
	defer sf.ra.mu.Unlock()
	if sf.ra.window != readAheadMax {
		t.Errorf("read-ahead window %d after 24 reads of 1 MiB, want %d", sf.ra.window, readAheadMax)
	}
}

// TestSpareOpensFewAtOnce: a pool filled up for a striped read starts at most
// maxOpening handshakes at once (sshd refuses connections beyond MaxStartups), and
// more once those are done.
func TestSpareOpensFewAtOnce(t *testing.T) {
	pool := newTestPool(t, "")
	pool.ep.MaxConns = 8
	none := func(*sftp.Client) bool { return true } // every session is in use
	if c := pool.spare(none); c != nil {
		t.Fatal("spare returned a session that was to be excluded")
	}
	pool.mu.Lock()
	started := len(pool.sessions) + pool.opening - 1 // one session came with Dial
	pool.mu.Unlock()
	if started != maxOpening {
		t.Errorf("%d sessions started at once for 7 missing, want %d", started, maxOpening)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		pool.spare(none)
		pool.mu.Lock()
		n := len(pool.sessions)
		pool.mu.Unlock()
		if n == pool.ep.MaxConns {
			return
		}
	}
	t.Error("the pool was not filled up")
}

// TestReadAheadSharedByConcurrentReaders: read-ahead chunks keep their bytes in the
// packets that carried them, recycled once the last reader is done with them. Readers
// of one handle at different places (the kernel's concurrent reads, two programs
// reading one file) drop and refill the read-ahead under each other while a second
// file's reads reuse the recycled packets: every byte read must be the file's.
func TestReadAheadSharedByConcurrentReaders(t *testing.T) {
	s, _, want := stripeSource(t, time.Hour, 24<<20, 7)
	other := randomBytes(8<<20, 8)
	os.WriteFile(s.members[0].abs("other"), other, 0o644) //nolint:errcheck
	ctx := context.Background()
	open := func(name string) File {
		f, err := s.Open(ctx, name, os.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close(ctx) }) //nolint:errcheck
		return f
	}
	f, g := open("big"), open("other")
	errs := make(chan error, 4)
	read := func(f File, data []byte, start, step int) {
		buf := make([]byte, step)
		for i := range len(data) / step {
			off := (start + i*step) % len(data)
			n, err := f.ReadAt(ctx, buf, int64(off))
			end := min(off+step, len(data))
			if err == nil && (n != end-off || !bytes.Equal(buf[:n], data[off:end])) {
				err = fmt.Errorf("read of %d bytes at %d: got %d bytes, not the file's", step, off, n)
			}
			if err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}
	go read(f, want, 0, 128<<10)
	go read(f, want, 64<<10, 128<<10)
	go read(f, want, 12<<20, 96<<10)
	go read(g, other, 0, 1<<20)
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
