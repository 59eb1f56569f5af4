package diskcache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/muxfs/muxfs/internal/backend"
	"github.com/muxfs/muxfs/internal/bufpool"
)

// holdWriter holds the cache's writer back until the returned func is called (at
// the latest when the test ends).
func holdWriter(t *testing.T, c *Cache) (release func()) {
	gate := make(chan struct{})
	c.writeFault = func() error { <-gate; return nil }
	release = sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release)
	return release
}

// writeBig writes p to path through s, in 64 KiB writes (past what is held in
// memory: the data goes to the data file, through the writer), and returns the open
// file.
func writeBig(t *testing.T, s *Source, path string, p []byte) backend.File {
	t.Helper()
	ctx := context.Background()
	f, err := s.Open(ctx, path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(p); off += 64 << 10 {
		if _, err := f.WriteAt(ctx, p[off:min(off+64<<10, len(p))], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// notYet fails the test if done is closed within a short while: something that must
// wait for the held writer did not.
func notYet(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
		t.Fatalf("%s did not wait for the writes queued before it", what)
	case <-time.After(100 * time.Millisecond):
	}
}

// A write returns before its data is in the data file; a read of it, the commit of
// its record and a later mount all see the data.
func TestQueuedWritesAreReadBack(t *testing.T) {
	dir := t.TempDir()
	c, s, cb, remote := setup(t, dir, Options{})
	ctx := context.Background()
	release := holdWriter(t, c)
	want := data(1<<20, 11)
	f := writeBig(t, s, "w", want) // returns: the writes are queued, not made

	got := make([]byte, 200<<10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.ReadAt(ctx, got, 300<<10) //nolint:errcheck // checked below
	}()
	notYet(t, done, "a read of written data")
	release()
	<-done
	if !bytes.Equal(got, want[300<<10:500<<10]) {
		t.Fatal("the read of written data differs")
	}
	if cb.read.Load() != 0 {
		t.Errorf("the writer's read fetched %d bytes from the server", cb.read.Load())
	}
	f.Stat(ctx)            //nolint:errcheck // as close(2) does
	f.Close(ctx)           //nolint:errcheck
	time.Sleep(racyWindow) // a record is committed once its mtime is not racy
	c.Close()
	remountAndRead(t, dir, remote, "w", want)
}

// A truncate and the commit wait for the writes queued before them: the data file
// holds what the spans name when its record is committed.
func TestTruncateAndCommitWaitForQueuedWrites(t *testing.T) {
	c, s, _, remote := setup(t, t.TempDir(), Options{})
	t.Cleanup(c.Close) // after holdWriter's release
	ctx := context.Background()
	release := holdWriter(t, c)
	want := data(1<<20, 12)
	f := writeBig(t, s, "w", want)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.SetAttr(ctx, backend.SetAttr{Valid: backend.SetSize, Size: 600 << 10}) //nolint:errcheck
	}()
	notYet(t, done, "a truncate")
	release()
	<-done
	want = want[:600<<10]
	f.Stat(ctx)  //nolint:errcheck
	f.Close(ctx) //nolint:errcheck
	if got, _ := os.ReadFile(filepath.Join(remote, "w")); !bytes.Equal(got, want) {
		t.Fatal("the server's copy differs")
	}

	// Queued again behind a held writer: the commit waits too.
	release = holdWriter(t, c)
	g := writeBig(t, s, "w", want)
	os.Chtimes(filepath.Join(remote, "w"), time.Now(), time.Unix(1e9, 0)) //nolint:errcheck // not racy
	g.Stat(ctx)                                                           //nolint:errcheck
	g.Close(ctx)                                                          //nolint:errcheck
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		s.st.flush()
	}()
	notYet(t, flushed, "a commit")
	release()
	<-flushed
	if got, _ := os.ReadFile(s.st.dataPath("w")); !bytes.Equal(got, want) {
		t.Fatal("the data file committed differs from the file written")
	}
}

// A queued write that fails (a full disk) drops what the cache holds of the file: it
// is read from the server, never as the zeros the data file has in its place.
func TestFailedQueuedWriteDropsTheData(t *testing.T) {
	c, s, cb, remote := setup(t, t.TempDir(), Options{})
	t.Cleanup(c.Close) // after holdWriter's release
	ctx := context.Background()
	c.writeFault = func() error { return syscall.ENOSPC }
	want := data(1<<20, 13)
	f := writeBig(t, s, "w", want)
	got := make([]byte, 100<<10)
	if n, err := f.ReadAt(ctx, got, 500<<10); n != len(got) || err != nil || !bytes.Equal(got, want[500<<10:600<<10]) {
		t.Fatalf("read back after a failed cache write: %d bytes, %v", n, err)
	}
	if cb.read.Load() == 0 {
		t.Error("the read was served from a cache whose write failed")
	}
	f.Stat(ctx)  //nolint:errcheck
	f.Close(ctx) //nolint:errcheck
	if got := readAll(t, s, "w"); !bytes.Equal(got, want) {
		t.Fatal("the file read after a failed cache write differs")
	}
	if got, _ := os.ReadFile(filepath.Join(remote, "w")); !bytes.Equal(got, want) {
		t.Fatal("the server's copy differs")
	}
}

// Once the kernel reads the data file itself (passthrough), a write through another
// open is in it when the write returns.
func TestWritesUnderPassthroughAreImmediate(t *testing.T) {
	c, s, _, remote := setup(t, t.TempDir(), Options{})
	t.Cleanup(c.Close) // after holdWriter's release
	ctx := context.Background()
	fd := openPassthrough(t, s, remote, "f", data(1<<20, 14))
	c.writeFault = func() error { return errors.New("a write to a passthrough file was queued") }
	w, err := s.Open(ctx, "f", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx) //nolint:errcheck
	patch := data(64<<10, 15)
	if _, err := w.WriteAt(ctx, patch, 128<<10); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(patch))
	if n, _ := syscall.Pread(fd, got, 128<<10); n != len(got) || !bytes.Equal(got, patch) {
		t.Error("the passthrough file does not hold the write when it returns")
	}
}

// openPassthrough puts b at name on the server, reads it whole through s (so the
// cache holds it) and opens it read-only for passthrough, as the kernel would (the
// open is closed at the test's end): it returns the data file's descriptor.
func openPassthrough(t *testing.T, s *Source, remote, name string, b []byte) int {
	t.Helper()
	ctx := context.Background()
	putRemote(t, remote, name, b)
	readAll(t, s, name)
	r, err := s.Open(ctx, name, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(ctx) }) //nolint:errcheck
	fd, ok := r.(interface{ PassthroughFd() (int, bool) }).PassthroughFd()
	if !ok {
		t.Fatal("a fully cached file is not offered for passthrough")
	}
	return fd
}

// A write under passthrough that fails to reach the data file (a full disk) drops
// the cached data: the bytes it would have replaced are never served as the file
// the close recorded.
func TestFailedWriteUnderPassthroughDropsTheData(t *testing.T) {
	c, s, _, remote := setup(t, t.TempDir(), Options{})
	t.Cleanup(c.Close)
	ctx := context.Background()
	want := data(1<<20, 24)
	openPassthrough(t, s, remote, "f", append([]byte(nil), want...))
	c.writeNowFault = func() error { return syscall.ENOSPC }
	w, err := s.Open(ctx, "f", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	patch := data(64<<10, 25)
	if _, err := w.WriteAt(ctx, patch, 128<<10); err != nil {
		t.Fatal(err)
	}
	copy(want[128<<10:], patch)
	w.Stat(ctx)  //nolint:errcheck
	w.Close(ctx) //nolint:errcheck
	c.writeNowFault = nil
	if got := readAll(t, s, "f"); !bytes.Equal(got, want) {
		t.Fatal("the file read after a failed write under passthrough differs")
	}
}

// Aligned writes go in with direct I/O and leave no pages in the page cache;
// unaligned ones, buffered, mix with them in any order; everything reads back, from
// the writer's open, the data file and a later open.
func TestDirectAndBufferedWritesMix(t *testing.T) {
	c, s, cb, remote := setup(t, t.TempDir(), Options{})
	t.Cleanup(c.Close)
	ctx := context.Background()
	want := data(2<<20, 16)
	f := writeBig(t, s, "w", want)
	for _, w := range []struct{ off, n int }{
		{100, 3000},       // unaligned, inside direct writes' pages
		{64 << 10, 4096},  // aligned, over the page cache pages of nothing
		{5000, 70 << 10},  // unaligned, across aligned writes
		{8192, 64 << 10},  // aligned, over the unaligned one's pages
		{2<<20 - 10, 500}, // past the end: the file grows
	} {
		p := data(w.n, int64(w.off))
		if _, err := f.WriteAt(ctx, p, int64(w.off)); err != nil {
			t.Fatal(err)
		}
		if end := w.off + w.n; end > len(want) {
			want = append(want, make([]byte, end-len(want))...)
		}
		copy(want[w.off:], p)
	}
	got := make([]byte, len(want))
	if n, err := f.ReadAt(ctx, got, 0); n != len(want) || (err != nil && n < len(want)) || !bytes.Equal(got, want) {
		t.Fatalf("read back of mixed writes: %d bytes, %v", n, err)
	}
	if cb.read.Load() != 0 {
		t.Errorf("the writer's read fetched %d bytes from the server", cb.read.Load())
	}
	f.Stat(ctx)  //nolint:errcheck
	f.Close(ctx) //nolint:errcheck
	if got, _ := os.ReadFile(filepath.Join(remote, "w")); !bytes.Equal(got, want) {
		t.Fatal("the server's copy differs")
	}
	if got := readAll(t, s, "w"); !bytes.Equal(got, want) {
		t.Fatal("a later open reads other data")
	}
}

// A sequential write's data is gathered into writes of 1 MiB, and goes to the data
// file with direct I/O: it is not left in the page cache.
func TestSequentialWritesGatheredAndDirect(t *testing.T) {
	c, s, _, _ := setup(t, t.TempDir(), Options{})
	t.Cleanup(c.Close)
	ctx := context.Background()
	var writes atomic.Int64
	c.writeFault = func() error { writes.Add(1); return nil }
	f := writeBig(t, s, "w", data(4<<20, 17))
	defer f.Close(ctx) //nolint:errcheck
	s.st.mu.Lock()
	e := s.st.entries["w"]
	s.st.mu.Unlock()
	e.mu.Lock()
	e.drainLocked()
	e.mu.Unlock()
	// 64 KiB writes: the first 256 KiB held in memory (memToFileLocked writes
	// them), the other 3.75 MiB in three writes of 1 MiB and one of 768 KiB.
	queuedDirect(t, c, s, "w", writes.Load(), 4)
}

// Small writes at random go to the data file through the page cache, not with
// direct I/O: the writer makes its writes one at a time, and a direct 4 KiB write
// waits for the disk, so a random writer's FUSE WRITEs waited for the disk too.
func TestSmallWritesBuffered(t *testing.T) {
	c, s, _, _ := setup(t, t.TempDir(), Options{})
	t.Cleanup(c.Close)
	ctx := context.Background()
	want := data(4<<20, 19)
	f := writeBig(t, s, "w", want)
	defer f.Close(ctx) //nolint:errcheck
	s.st.mu.Lock()
	e := s.st.entries["w"]
	s.st.mu.Unlock()
	drain := func() {
		e.mu.Lock()
		e.drainLocked()
		e.mu.Unlock()
	}
	drain()
	if c.noDirect.Load() {
		t.Skip("the cache's file system refuses direct I/O")
	}
	before := residentPages(t, s.st.dataPath("w"))
	const small = 4 << 10
	page := make([]byte, small)
	for i := range 32 {
		off := (4<<20 - small) - i*3*small // backwards, apart: nothing is gathered
		for j := range page {
			page[j] = byte(i)
		}
		if _, err := f.WriteAt(ctx, page, int64(off)); err != nil {
			t.Fatal(err)
		}
		copy(want[off:], page)
	}
	drain()
	if n := residentPages(t, s.st.dataPath("w")) - before; n < 32 {
		t.Errorf("32 small writes left %d pages in the page cache: they went in with direct I/O", n)
	}
	if got := readAll(t, s, "w"); !bytes.Equal(got, want) {
		t.Fatal("the file read after the small writes differs")
	}
}

// queuedDirect checks that the data of p, 4 MiB, reached its data file in want queued
// writes, with direct I/O: of its pages only the first 256 KiB, held in memory and then
// written buffered (memToFileLocked), may be in the page cache.
func queuedDirect(t *testing.T, c *Cache, s *Source, p string, writes, want int64) {
	t.Helper()
	if writes != want {
		t.Errorf("4 MiB reached the data file in %d queued writes, want %d", writes, want)
	}
	if c.noDirect.Load() {
		t.Skip("the cache's file system refuses direct I/O")
	}
	if n := residentPages(t, s.st.dataPath(p)); n > memFileMax/os.Getpagesize() {
		t.Errorf("%d pages of the data file are in the page cache", n)
	}
}

// Several files written at once, backwards (no write continues the one before it, so
// none are gathered: each is one queued write, and the queue is full most of the
// time), each read back while it is written: every read sees what was written, and
// nothing deadlocks (a goroutine holding an entry's lock may wait for room in the
// queue; the writer must never wait for an entry's lock).
func TestConcurrentWritersShareTheQueue(t *testing.T) {
	c, s, _, remote := setup(t, t.TempDir(), Options{})
	t.Cleanup(c.Close)
	ctx := context.Background()
	const files, size, chunk = 6, 2 << 20, 48 << 10
	var queued atomic.Int64
	c.writeFault = func() error { queued.Add(1); time.Sleep(50 * time.Microsecond); return nil } // a slow disk
	var wg sync.WaitGroup
	errs := make(chan error, files)
	for i := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := "f" + string(rune('a'+i))
			want := data(size, int64(100+i))
			f, err := s.Open(ctx, name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
			if err != nil {
				errs <- err
				return
			}
			defer f.Close(ctx) //nolint:errcheck
			got := make([]byte, chunk)
			for off := size / chunk * chunk; off >= 0; off -= chunk {
				end := min(off+chunk, size)
				if off == end {
					continue
				}
				if _, err := f.WriteAt(ctx, want[off:end], int64(off)); err != nil {
					errs <- err
					return
				}
				if off%(5*chunk) == 0 { // read back what was just written, now and then
					n, _ := f.ReadAt(ctx, got, int64(off))
					if !bytes.Equal(got[:n], want[off:off+n]) || n == 0 {
						errs <- errors.New(name + ": a read back during the writes differs")
						return
					}
				}
			}
			f.Stat(ctx) //nolint:errcheck
			if got, _ := os.ReadFile(filepath.Join(remote, name)); !bytes.Equal(got, want) {
				errs <- errors.New(name + ": the server's copy differs")
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("concurrent writers did not finish: a deadlock")
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := queued.Load(); n < files*size/chunk {
		t.Errorf("%d writes reached the writer; backwards writes are not gathered", n)
	}
	for i := range files {
		name := "f" + string(rune('a'+i))
		if got := readAll(t, s, name); !bytes.Equal(got, data(size, int64(100+i))) {
			t.Errorf("%s read after the writes differs", name)
		}
	}
}

// putRemote puts b at name on the server, with an mtime long past (its record is
// committed at once: not racy).
func putRemote(t *testing.T, remote, name string, b []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(remote, name), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(filepath.Join(remote, name), time.Now(), time.Unix(1e9, 0)); err != nil {
		t.Fatal(err)
	}
}

// openRemote puts b at name on the server and opens it read-only through s.
func openRemote(t *testing.T, s *Source, remote, name string, b []byte) backend.File {
	t.Helper()
	putRemote(t, remote, name, b)
	f, err := s.Open(context.Background(), name, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// What a cold read fetches goes to the data file as written data does: through the
// writer, with direct I/O (not left in the page cache).
func TestFillsQueuedAndDirect(t *testing.T) {
	c, s, _, remote := setup(t, t.TempDir(), Options{})
	t.Cleanup(c.Close)
	var writes atomic.Int64
	c.writeFault = func() error { writes.Add(1); return nil }
	want := data(4<<20, 23)
	putRemote(t, remote, "r", want)
	if got := readAll(t, s, "r"); !bytes.Equal(got, want) {
		t.Fatal("the cold read differs")
	}
	c.Stores()[0].flush()
	// 100 KiB reads: the first two held in memory (memToFileLocked writes them), the
	// others gathered per MiB (the first MiB from 200 KiB on): one queued write per
	// MiB.
	queuedDirect(t, c, s, "r", writes.Load(), 4)
}

// A cold read's fills are gathered per MiB whatever order the kernel's read-ahead
// READs come in (256 KiB each, two in flight, answered in either order): one queued
// write per MiB, the file's last part one of its own; what a read stopped in the
// middle of a MiB left is written too (at the close) and found after a remount.
func TestFillsGatheredPerMiB(t *testing.T) {
	dir := t.TempDir()
	c, s, _, remote := setup(t, dir, Options{})
	var writes atomic.Int64
	c.writeFault = func() error { writes.Add(1); return nil }
	const piece = 256 << 10
	want := data(4<<20+100<<10, 30)
	putRemote(t, remote, "r", want)
	putRemote(t, remote, "half", want)
	ctx := context.Background()
	read := func(name string, order []int, end int) {
		t.Helper()
		f, err := s.Open(ctx, name, os.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range order {
			off := i * piece
			got := make([]byte, min(piece, end-off))
			if n, err := f.ReadAt(ctx, got, int64(off)); n != len(got) || !bytes.Equal(got, want[off:off+n]) {
				t.Fatalf("%s: the read at %d differs (%d bytes, %v)", name, off, n, err)
			}
		}
		f.Close(ctx) //nolint:errcheck
	}
	// Neighbours swapped, inside a MiB and across a MiB's end (4 pieces a MiB; the
	// first two are held in memory, as a fresh entry's start is), then the 100 KiB
	// past the last MiB.
	read("r", []int{0, 1, 2, 4, 3, 6, 5, 8, 7, 9, 10, 12, 11, 14, 13, 15, 16}, len(want))
	c.Stores()[0].flush()
	queuedDirect(t, c, s, "r", writes.Load(), 5)

	// A read that stops at 1.75 MiB with a gap, out of order: 0 1 3 2 4 6 (5 never).
	writes.Store(0)
	read("half", []int{0, 1, 3, 2, 4, 6}, len(want))
	c.Stores()[0].flush()
	if n := writes.Load(); n != 3 {
		t.Errorf("a MiB and a half read with a gap reached the data file in %d queued writes, want 3 (the MiB, and the gap's two sides)", n)
	}
	c.Close()
	c, s, cb, _ := setupOn(t, dir, remote, Options{})
	read("half", []int{0, 1, 2, 3, 4, 6}, len(want))
	if n := cb.read.Load(); n != 0 {
		t.Errorf("after a remount, %d bytes of what was read before came from the server", n)
	}
	c.Close()
	remountAndRead(t, dir, remote, "r", want)
}

// A cold read never waits for the cache's disk: with the writer held back, a read of
// more than the writer's queue holds finishes, also across the background flush, and
// what it fetched past the queue is written through the page cache — the whole file
// is cached, a later mount reads it without the server.
func TestFillsDoNotWaitForTheDisk(t *testing.T) {
	dir := t.TempDir()
	c, s, _, remote := setup(t, dir, Options{})
	var queued atomic.Int64
	gate := make(chan struct{})
	c.writeFault = func() error { queued.Add(1); <-gate; return nil }
	release := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release)
	want := data((writeQueue+8)<<20, 29)
	f := openRemote(t, s, remote, "r", want)
	ctx := context.Background()
	done := make(chan error)
	go func() {
		got := make([]byte, 1<<20)
		for off := 0; off < len(want); off += len(got) {
			if off == (writeQueue+4)<<20 {
				// The queue is full: the background flush (once a second) now
				// waits for the writer.
				time.Sleep(1100 * time.Millisecond)
			}
			n, err := f.ReadAt(ctx, got, int64(off))
			if n != len(got) || !bytes.Equal(got, want[off:off+n]) {
				done <- fmt.Errorf("the read at %d differs (%d bytes, %v)", off, n, err)
				return
			}
		}
		done <- f.Close(ctx)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		release()
		t.Fatal("a cold read waited for the held writer")
	}
	if n := queued.Load(); n > writeQueue+1 {
		t.Errorf("%d writes reached the held writer, want at most %d", n, writeQueue+1)
	}
	release()
	c.Close()
	remountAndRead(t, dir, remote, "r", want)
}

// TestQueuedCopiesSized: a write waits for the writer in a copy of its own size, and
// one that continues it moves both into a buffer of bufpool.Max, where the next are
// gathered — while the writer is held, 32 random 4 KiB writes held 32 MiB before.
func TestQueuedCopiesSized(t *testing.T) {
	c, s, _, _ := setup(t, t.TempDir(), Options{})
	t.Cleanup(c.Close)
	ctx := context.Background()
	release := holdWriter(t, c)
	want := data(4<<20, 23)
	f := writeBig(t, s, "w", want)
	defer f.Close(ctx) //nolint:errcheck
	defer release()    // before the close, which waits for the writer
	s.st.mu.Lock()
	e := s.st.entries["w"]
	s.st.mu.Unlock()
	gathered := func() (n, size int) {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.gather.n, len(*e.gather.buf)
	}
	write := func(p []byte, off int) {
		t.Helper()
		if _, err := f.WriteAt(ctx, p, int64(off)); err != nil {
			t.Fatal(err)
		}
		copy(want[off:], p)
	}
	const small = 4 << 10
	for i := range writeQueue / 2 {
		off := (4<<20 - small) - i*3*small // backwards, apart: nothing is gathered
		write(data(small, int64(i)), off)
		if n, size := gathered(); n != small || size != small {
			t.Fatalf("random write %d waits with %d bytes in a copy of %d", i, n, size)
		}
	}
	write(data(small, 99), 4<<20-small-(writeQueue/2-1)*3*small+small) // continues the last
	if n, size := gathered(); n != 2*small || size != bufpool.Max {
		t.Fatalf("a continued write: %d bytes gathered in a copy of %d, want %d in %d", n, size, 2*small, bufpool.Max)
	}
	release()
	if got := readAll(t, s, "w"); !bytes.Equal(got, want) {
		t.Fatal("the file read after the queued writes differs")
	}
}

// Cold readers of one file at once, each in its own order and with its own handle,
// fill the same MiBs in turn: every read sees the file, and a later mount reads all
// of it from the cache.
func TestConcurrentColdReadersFill(t *testing.T) {
	dir := t.TempDir()
	c, s, _, remote := setup(t, dir, Options{})
	const piece = 256 << 10
	want := data(8<<20, 31)
	putRemote(t, remote, "r", want)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := s.Open(ctx, "r", os.O_RDONLY, 0)
			if err != nil {
				errs <- err
				return
			}
			defer f.Close(ctx) //nolint:errcheck
			n := len(want) / piece
			for k := range n {
				i := (k*(2*r+1) + r) % n // each reader its own order through every piece
				got := make([]byte, piece)
				if m, err := f.ReadAt(ctx, got, int64(i*piece)); m != piece || !bytes.Equal(got, want[i*piece:(i+1)*piece]) {
					errs <- fmt.Errorf("reader %d: the read at %d differs (%d bytes, %v)", r, i*piece, m, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	c.Close()
	remountAndRead(t, dir, remote, "r", want)
}

// A gathered MiB of fills that cannot be written (the writer behind, then a full
// disk for the write made at once) drops what the cache holds of the file: the spans
// named those bytes from their fill, and neither this mount nor the next may serve
// the holes left in the data file (it fails if the failure is not the entry's).
func TestFailedFillWriteDropsTheData(t *testing.T) {
	dir := t.TempDir()
	c, s, _, remote := setup(t, dir, Options{})
	release := holdWriter(t, c)
	var fails atomic.Int64
	c.writeNowFault = func() error { // the disk full for a moment: holes in the middle
		if fails.Add(1) <= 2 {
			return syscall.ENOSPC
		}
		return nil
	}
	want := data((writeQueue+8)<<20, 32)
	f := openRemote(t, s, remote, "r", want)
	ctx := context.Background()
	got := make([]byte, 1<<20)
	for off := 0; off < len(want); off += len(got) {
		if n, err := f.ReadAt(ctx, got, int64(off)); n != len(got) || !bytes.Equal(got, want[off:off+n]) {
			t.Fatalf("the cold read at %d differs (%d bytes, %v)", off, n, err)
		}
	}
	release()
	f.Close(ctx) //nolint:errcheck
	c.writeNowFault = nil
	if got := readAll(t, s, "r"); !bytes.Equal(got, want) {
		t.Fatal("the file read after failed fill writes differs")
	}
	c.Close()
	c, s, _, _ = setupOn(t, dir, remote, Options{})
	t.Cleanup(c.Close)
	if got := readAll(t, s, "r"); !bytes.Equal(got, want) {
		t.Fatal("after a remount, the file read after failed fill writes differs")
	}
}
