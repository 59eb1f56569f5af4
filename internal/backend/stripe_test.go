package backend

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/muxfs/muxfs/internal/sftp"
)

// readStriped reads the test file sequentially in 1 MiB pieces, giving the read-ahead
// time to open its extra handle once the stream is at full window; kill, if set, is
// called halfway.
func readStriped(t *testing.T, s *SFTP, want []byte, kill func()) []byte {
	t.Helper()
	ctx := context.Background()
	f, err := s.Open(ctx, "big", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close(ctx) //nolint:errcheck
	got := make([]byte, len(want))
	for off := 0; off < len(want); off += 1 << 20 {
		if off == len(want)/2 && kill != nil {
			kill()
		}
		n, err := f.ReadAt(ctx, got[off:off+1<<20], int64(off))
		if err != nil || n != 1<<20 {
			t.Fatalf("read at %d: %d, %v", off, n, err)
		}
		for deadline := time.Now().Add(2 * time.Second); off >= 16<<20 && s.striped.Load() == 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
	}
	return got
}

// TestStripedRead: over a slow link, a big sequential read goes through a second
// session too, and the data is the file's.
func TestStripedRead(t *testing.T) {
	defer func(d time.Duration) { stripeMinRTT = d }(stripeMinRTT)
	stripeMinRTT = time.Nanosecond // every link counts as slow
	dir := t.TempDir()
	want := randomBytes(64<<20, 3)
	os.WriteFile(filepath.Join(dir, "big"), want, 0o644) //nolint:errcheck
	pool := newTestPool(t, "")
	s := newTestSource(t, 10*time.Second, dir, pool)
	if _, err := s.Lstat(context.Background(), "big"); err != nil { // a round trip to measure
		t.Fatal(err)
	}
	in := map[*sftp.Client]int64{}
	got := readStriped(t, s, want, nil)
	if !bytes.Equal(got, want) {
		t.Fatal("striped read differs from the file")
	}
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
	defer func(d time.Duration) { stripeMinRTT = d }(stripeMinRTT)
	stripeMinRTT = time.Nanosecond
	dir := t.TempDir()
	want := randomBytes(64<<20, 4)
	os.WriteFile(filepath.Join(dir, "big"), want, 0o644) //nolint:errcheck
	pool := newTestPool(t, "")
	s := newTestSource(t, 10*time.Second, dir, pool)
	if _, err := s.Lstat(context.Background(), "big"); err != nil {
		t.Fatal(err)
	}
	got := readStriped(t, s, want, func() {
		if s.striped.Load() == 0 {
			t.Error("not striped when the sessions were killed")
		}
		signalSessions(t, pool, syscall.SIGKILL)
	})
	if !bytes.Equal(got, want) {
		t.Fatal("read differs from the file after the sessions were lost")
	}
}

// TestSlowLinkOnlyStripes: on a link faster than stripeMinRTT, nothing is striped.
func TestSlowLinkOnlyStripes(t *testing.T) {
	defer func(d time.Duration) { stripeMinRTT = d }(stripeMinRTT)
	stripeMinRTT = time.Hour
	dir := t.TempDir()
	want := randomBytes(40<<20, 5)
	os.WriteFile(filepath.Join(dir, "big"), want, 0o644) //nolint:errcheck
	pool := newTestPool(t, "")
	s := newTestSource(t, 10*time.Second, dir, pool)
	if _, err := s.Lstat(context.Background(), "big"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	f, err := s.Open(ctx, "big", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close(ctx) //nolint:errcheck
	buf := make([]byte, 1<<20)
	for off := int64(0); off < int64(len(want)); off += 1 << 20 {
		if _, err := f.ReadAt(ctx, buf, off); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.striped.Load(); n != 0 {
		t.Errorf("%d extra handles opened on a fast link", n)
	}
}

// TestReadAheadGrowsWithLargeReads: reads larger than the read-ahead window (the disk
// cache's whole-file fetch reads 1 MiB at a time) grow it to its maximum; the window
// used to start over each time such a read overtook it, and stayed at 512 KiB.
func TestReadAheadGrowsWithLargeReads(t *testing.T) {
	dir := t.TempDir()
	want := randomBytes(24<<20, 6)
	os.WriteFile(filepath.Join(dir, "big"), want, 0o644) //nolint:errcheck
	s := newTestSource(t, 10*time.Second, dir, newTestPool(t, ""))
	ctx := context.Background()
	f, err := s.Open(ctx, "big", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close(ctx) //nolint:errcheck
	got := make([]byte, len(want))
	for off := 0; off < len(want); off += 1 << 20 {
		if _, err := f.ReadAt(ctx, got[off:off+1<<20], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatal("read differs from the file")
	}
	sf := f.(*sftpFile)
	sf.ra.mu.Lock()
	defer sf.ra.mu.Unlock()
	if sf.ra.window != readAheadMax {
		t.Errorf("read-ahead window %d after 24 reads of 1 MiB, want %d", sf.ra.window, readAheadMax)
	}
}
