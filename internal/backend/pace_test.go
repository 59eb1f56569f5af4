package backend

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/muxfs/muxfs/internal/linksim"
)

// paceAt feeds p readings every step, of rate bytes per second, for d, from t0; it
// returns the time after the last.
func paceAt(p *pace, t0 time.Time, total *int64, rate float64, step, d time.Duration) time.Time {
	t := t0
	for ; t.Sub(t0) < d; t = t.Add(step) {
		*total += int64(rate * step.Seconds())
		p.reading(t, *total)
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
	narrow.reading(t0, total)
	if l := narrow.limit(); l != 0 {
		t.Errorf("limit %d before anything was measured", l)
	}
	narrow.chunk(t0, t0.Add(20*time.Millisecond))
	narrow.chunk(t0, t0.Add(35*time.Millisecond)) // queued behind the first
	end := paceAt(&narrow, t0, &total, 12.5e6, 5*time.Millisecond, time.Second)
	near("100 Mbit/s, 20 ms", narrow.limit(), paceGain*12.5e6*0.020)

	// The reader pauses for 2 s, then reads on: the link is no slower.
	end = end.Add(2 * time.Second)
	narrow.reading(end, total+1<<20)
	near("after a pause", narrow.limit(), paceGain*12.5e6*0.020)
	narrow.reading(end.Add(20*time.Millisecond), total-5<<20)
	near("a handle dropped", narrow.limit(), paceGain*12.5e6*0.020)

	var far pace // 20 ms, 120 MB/s: a window per round trip, in bursts
	far.chunk(t0, t0.Add(22*time.Millisecond))
	total = 0
	tt := t0
	for i := 0; i < 50; i++ {
		tt = paceAt(&far, tt, &total, 600e6, time.Millisecond, 4*time.Millisecond)
		tt = paceAt(&far, tt, &total, 0, time.Millisecond, 16*time.Millisecond)
	}
	if l := far.limit(); l != 0 {
		t.Errorf("limit %d on a fast long link", l)
	}

	var unmeasured pace // rates known, no chunk latency yet
	total = 0
	paceAt(&unmeasured, t0, &total, 12.5e6, 5*time.Millisecond, time.Second)
	if l := unmeasured.limit(); l != 0 {
		t.Errorf("limit %d without a chunk's latency", l)
	}
}

// TestPaceWindowBound: a long link that carries one SSH window per round trip is told
// from a narrow one by its rate times its latency, though both deliver under
// paceMaxRate; a link not yet measured is neither.
func TestPaceWindowBound(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var long pace // 200 ms: a 2 MiB window per round trip, arriving over 100 ms
	long.chunk(t0, t0.Add(203*time.Millisecond))
	var total int64
	tt := t0
	for i := 0; i < 10; i++ {
		tt = paceAt(&long, tt, &total, 20e6, time.Millisecond, 100*time.Millisecond)
		tt = paceAt(&long, tt, &total, 0, time.Millisecond, 100*time.Millisecond)
	}
	if l := long.limit(); l == 0 {
		t.Errorf("no limit on a long link delivering %.1f MB/s: it would stripe anyway", float64(total)/tt.Sub(t0).Seconds()/1e6)
	}
	if !long.windowBound() {
		t.Error("a link carrying one window per 200 ms is not found window-bound")
	}

	var narrow pace // 100 Mbit/s, 20 ms: a 255 KiB chunk's latency is 41 ms
	narrow.chunk(t0, t0.Add(41*time.Millisecond))
	total = 0
	paceAt(&narrow, t0, &total, 12.5e6, 5*time.Millisecond, time.Second)
	if narrow.windowBound() {
		t.Error("a 100 Mbit/s link at 20 ms found window-bound")
	}

	var unmeasured pace
	unmeasured.chunk(t0, t0.Add(200*time.Millisecond))
	if unmeasured.windowBound() {
		t.Error("a link with no rate yet found window-bound")
	}
}

// narrowLinkEnv: the test binary, started with it set to a rate in bytes per second
// and optionally ",DELAY" (a duration), is an SFTP session over a link of that rate and
// that delay each way: OpenSSH's sftp-server behind pipes that pass its input and its
// output no faster and no sooner.
const narrowLinkEnv = "MUXFS_TEST_NARROW_LINK"

func narrowLink(spec string) {
	rate, delayText, _ := strings.Cut(spec, ",")
	bps, err := strconv.ParseFloat(rate, 64)
	if err != nil || bps <= 0 {
		os.Exit(2)
	}
	var delay time.Duration
	if delayText != "" {
		if delay, err = time.ParseDuration(delayText); err != nil {
			os.Exit(2)
		}
	}
	srv := exec.Command(sftpServer)
	in, _ := srv.StdinPipe()
	out, _ := srv.StdoutPipe()
	if err := srv.Start(); err != nil {
		os.Exit(1)
	}
	go func() {
		linksim.Copy(in, os.Stdin, bps, delay)
		in.Close()
	}()
	linksim.Copy(os.Stdout, out, bps, delay)
	os.Exit(0)
}

// narrowSource is a source over sessions through a 16 MB/s link each, serving a
// temporary directory. Its round trips count as a slow link's, so that a file would
// be striped but for the narrowness.
func narrowSource(t *testing.T) (*SFTP, string) { return linkSource(t, "16000000") }

// linkSource is a source over sessions through links given as narrowLinkEnv's value,
// whose round trips count as a slow link's.
func linkSource(t *testing.T, link string) (*SFTP, string) {
	t.Helper()
	old := stripeMinRTT
	stripeMinRTT = time.Nanosecond
	t.Cleanup(func() { stripeMinRTT = old })
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pool := newTestPoolScript(t, narrowLinkEnv+"="+link+" exec "+exe)
	return newTestSource(t, 10*time.Second, dir, pool), dir
}

// TestReadAheadPacedOnNarrowLink: over a 16 MB/s link, a sequential read keeps what the
// link needs in flight, not the 8 MiB a fast link gets, and reads the file right.
func TestReadAheadPacedOnNarrowLink(t *testing.T) {
	s, dir := narrowSource(t)
	want := randomBytes(40<<20, 31)                      // big enough to be striped (stripeMinSize)
	os.WriteFile(filepath.Join(dir, "big"), want, 0o644) //nolint:errcheck
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
	if n := s.striped.Load(); n != 0 {
		t.Errorf("%d extra handles opened on a narrow link", n)
	}
	if widest > 2<<20 {
		t.Errorf("read-ahead window up to %d bytes on a 16 MB/s link in the file's second half, want at most 2 MiB", widest)
	}
}

// TestWriteBehindPacedOnNarrowLink: over a 16 MB/s link, a sequential write keeps what
// the link needs in flight, not the 8 MiB a fast link gets, and the file arrives
// whole. The first 8 MiB are queued before any acknowledgement can measure the link.
func TestWriteBehindPacedOnNarrowLink(t *testing.T) {
	s, dir := narrowSource(t)
	ctx := context.Background()
	f, err := s.Open(ctx, "out", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	want := randomBytes(16<<20, 32)
	most := 0
	const piece = 128 << 10
	for off := 0; off < len(want); off += piece {
		if n, err := f.WriteAt(ctx, want[off:off+piece], int64(off)); err != nil || n != piece {
			t.Fatalf("write at %d: %d, %v", off, n, err)
		}
		if off >= len(want)*5/8 {
			sf := f.(*sftpFile)
			sf.wb.mu.Lock()
			most = max(most, sf.wb.bytes)
			sf.wb.mu.Unlock()
		}
	}
	if err := f.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "out")); !bytes.Equal(got, want) {
		t.Fatal("the server's file differs from what was written")
	}
	if n := s.striped.Load(); n != 0 {
		t.Errorf("%d extra handles opened on a narrow link", n)
	}
	if most > 2<<20 {
		t.Errorf("up to %d bytes of writes in flight on a 16 MB/s link after its first 10 MiB, want at most 2 MiB", most)
	}
}

// TestWriteStripedOnLongLink: over links of 16 MB/s and 100 ms each way, narrower than
// paceMaxRate but long enough that their bandwidth-delay product exceeds a window, a
// sequential write is striped over the pool's sessions, paced still (a window under
// the unpaced writeWindow per handle), and the file arrives whole. (Each session has a
// link of its own here, so striping gains, as over a long fast link.)
func TestWriteStripedOnLongLink(t *testing.T) {
	s, dir := linkSource(t, "16000000,100ms")
	ctx := context.Background()
	f, err := s.Open(ctx, "out", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	want := randomBytes(40<<20, 33)
	const piece = 128 << 10
	paced := false
	for off := 0; off < len(want); off += piece {
		if n, err := f.WriteAt(ctx, want[off:off+piece], int64(off)); err != nil || n != piece {
			t.Fatalf("write at %d: %d, %v", off, n, err)
		}
		sf := f.(*sftpFile)
		if n := sf.handles(); n > 1 {
			sf.wb.mu.Lock()
			paced = paced || sf.writeWindowLocked() < n*writeWindow
			sf.wb.mu.Unlock()
		}
	}
	if err := f.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "out")); !bytes.Equal(got, want) {
		t.Fatal("the server's file differs from what was written")
	}
	if n := s.striped.Load(); n == 0 {
		t.Fatal("no extra handle opened on a long link")
	}
	if !paced {
		t.Error("the striped write was never paced on links under paceMaxRate")
	}
}
