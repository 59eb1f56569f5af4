package backend

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// paceAt feeds p readings every step, of rate bytes per second, for d, from t0; it
// returns the time after the last.
func paceAt(p *pace, t0 time.Time, total *int64, rate float64, step, d time.Duration) time.Time {
	t := t0
	for ; t.Sub(t0) < d; t = t.Add(step) {
		*total += int64(rate * step.Seconds())
		p.limit(t, *total)
	}
	return t
}

// TestPaceLimit: on a narrow link the limit is paceGain times the bandwidth-delay product; a fast
// link, however long, and a link not yet measured have none; a pause of the reader
// keeps the limit; the sessions' total falling (a handle dropped) measures nothing.
func TestPaceLimit(t *testing.T) {
	t0 := time.Unix(1000, 0)
	near := func(what string, got, want int) {
		t.Helper()
		if got < want*9/10 || got > want*11/10 {
			t.Errorf("%s: limit %d, want about %d", what, got, want)
		}
	}

	var narrow pace
	var total int64 = 5 << 30 // the sessions' history counts for nothing
	if l := narrow.limit(t0, total); l != 0 {
		t.Errorf("limit %d before anything was measured", l)
	}
	narrow.chunk(t0, t0.Add(20*time.Millisecond))
	narrow.chunk(t0, t0.Add(35*time.Millisecond)) // queued behind the first
	end := paceAt(&narrow, t0, &total, 12.5e6, 5*time.Millisecond, time.Second)
	near("100 Mbit/s, 20 ms", narrow.limit(end, total), paceGain*12.5e6*0.020)

	// The reader pauses for 2 s, then reads on: the link is no slower.
	end = end.Add(2 * time.Second)
	near("after a pause", narrow.limit(end, total+1<<20), paceGain*12.5e6*0.020)
	near("a handle dropped", narrow.limit(end.Add(20*time.Millisecond), total-5<<20), paceGain*12.5e6*0.020)

	var far pace // 20 ms, 120 MB/s: a window per round trip, in bursts
	far.chunk(t0, t0.Add(22*time.Millisecond))
	total = 0
	tt := t0
	for i := 0; i < 50; i++ {
		tt = paceAt(&far, tt, &total, 600e6, time.Millisecond, 4*time.Millisecond)
		tt = paceAt(&far, tt, &total, 0, time.Millisecond, 16*time.Millisecond)
	}
	if l := far.limit(tt, total); l != 0 {
		t.Errorf("limit %d on a fast long link", l)
	}

	var unmeasured pace // rates known, no chunk latency yet
	total = 0
	end = paceAt(&unmeasured, t0, &total, 12.5e6, 5*time.Millisecond, time.Second)
	if l := unmeasured.limit(end, total); l != 0 {
		t.Errorf("limit %d without a chunk's latency", l)
	}
}

// narrowLinkEnv: the test binary, started with it set to a rate in bytes per second, is
// an SFTP session whose answers come through a link of that rate: OpenSSH's
// sftp-server behind a pipe that passes its output no faster.
const narrowLinkEnv = "MUXFS_TEST_NARROW_LINK"

func narrowLink(rate string) {
	bps, err := strconv.ParseFloat(rate, 64)
	if err != nil || bps <= 0 {
		os.Exit(2)
	}
	srv := exec.Command(sftpServer)
	srv.Stdin = os.Stdin
	out, _ := srv.StdoutPipe()
	if err := srv.Start(); err != nil {
		os.Exit(1)
	}
	var free time.Time // when the link has passed what it was given
	buf := make([]byte, 16<<10)
	for {
		n, err := out.Read(buf)
		if n > 0 {
			free = later(free, time.Now()).Add(time.Duration(float64(n) / bps * float64(time.Second)))
			time.Sleep(time.Until(free))
			if _, err := os.Stdout.Write(buf[:n]); err != nil {
				os.Exit(0)
			}
		}
		if err != nil {
			os.Exit(0)
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// TestReadAheadPacedOnNarrowLink: over a 16 MB/s link, a sequential read keeps what the
// link needs in flight, not the 8 MiB a fast link gets, and reads the file right.
func TestReadAheadPacedOnNarrowLink(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	want := randomBytes(8<<20, 31)
	os.WriteFile(filepath.Join(dir, "big"), want, 0o644) //nolint:errcheck
	pool := newTestPoolScript(t, narrowLinkEnv+"=16000000 exec "+exe)
	s := newTestSource(t, 10*time.Second, dir, pool)
	ctx := context.Background()
	f, err := s.Open(ctx, "big", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close(ctx) //nolint:errcheck
	got := make([]byte, len(want))
	widest := 0
	const piece = 128 << 10 // the kernel's reads
	for off := 0; off < len(want); off += piece {
		if n, err := f.ReadAt(ctx, got[off:off+piece], int64(off)); err != nil || n != piece {
			t.Fatalf("read at %d: %d, %v", off, n, err)
		}
		if off >= len(want)/2 {
			sf := f.(*sftpFile)
			sf.ra.mu.Lock()
			widest = max(widest, sf.ra.window)
			sf.ra.mu.Unlock()
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatal("data read differs from the file")
	}
	if widest > 2<<20 {
		t.Errorf("read-ahead window up to %d bytes on a 16 MB/s link in the file's second half, want at most 2 MiB", widest)
	}
}
