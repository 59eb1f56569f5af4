package fusefs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/muxfs/muxfs/internal/backend"
)

// statCounting counts the Stat calls of the files it opens: the round trip that
// close(2) of a handle open for writing waits for.
type statCounting struct {
	backend.Backend
	stats atomic.Int64
}

func (b *statCounting) Open(ctx context.Context, p string, flags int, mode uint32) (backend.File, error) {
	f, err := b.Backend.Open(ctx, p, flags, mode)
	if err != nil {
		return nil, err
	}
	return &statCountingFile{File: f, b: b}, nil
}

type statCountingFile struct {
	backend.File
	b *statCounting
}

func (f *statCountingFile) Stat(ctx context.Context) (backend.Attr, error) {
	f.b.stats.Add(1)
	return f.File.Stat(ctx)
}

// TestCloseWaitsOnlyAfterChanges: close(2) asks the server for the file (after every
// write is acknowledged) only when something went out through the handle; a file
// created or opened for writing and closed untouched keeps the attributes of its open
// (bonnie++'s creates, lock files), with the changes made through other ways since.
func TestCloseWaitsOnlyAfterChanges(t *testing.T) {
	root, local := localDir(t)
	b := &statCounting{Backend: local}
	mp, _ := mountLogged(t, b)

	closeStats := func(name string, use func(f *os.File) error, flags int) int64 {
		t.Helper()
		f, err := os.OpenFile(filepath.Join(mp, name), flags, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if err := use(f); err != nil {
			t.Fatal(err)
		}
		before := b.stats.Load()
		if err := f.Close(); err != nil {
			t.Fatalf("close %s: %v", name, err)
		}
		return b.stats.Load() - before
	}
	nothing := func(*os.File) error { return nil }
	create := os.O_WRONLY | os.O_CREATE | os.O_EXCL

	if n := closeStats("empty", nothing, create); n != 0 {
		t.Errorf("close of a created, untouched file asked the server %d times, want 0", n)
	}
	if n := closeStats("empty", nothing, os.O_RDWR); n != 0 {
		t.Errorf("close of a file opened for writing, untouched, asked the server %d times, want 0", n)
	}
	if n := closeStats("written", func(f *os.File) error { _, err := f.Write([]byte("data")); return err }, create); n != 1 {
		t.Errorf("close after a write asked the server %d times, want 1", n)
	}
	if n := closeStats("chmodded", func(f *os.File) error { return f.Chmod(0o640) }, create); n != 1 {
		t.Errorf("close after an fchmod asked the server %d times, want 1", n)
	}

	for name, want := range map[string]struct {
		size int64
		mode os.FileMode
	}{"empty": {0, 0o600}, "written": {4, 0o600}, "chmodded": {0, 0o640}} {
		for _, dir := range []string{mp, root} {
			st, err := os.Stat(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if st.Size() != want.size || st.Mode().Perm() != want.mode {
				t.Errorf("%s in %s: size %d mode %v, want %d %v", name, dir, st.Size(), st.Mode().Perm(), want.size, want.mode)
			}
		}
	}
}

// drainLogging records, in order, the Drain and Sync calls of the files it opens,
// each named by the order of its open.
type drainLogging struct {
	backend.Backend
	mu     sync.Mutex
	opened int
	log    []string
}

func (b *drainLogging) Open(ctx context.Context, p string, flags int, mode uint32) (backend.File, error) {
	f, err := b.Backend.Open(ctx, p, flags, mode)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.opened++
	return &drainLoggingFile{File: f, b: b, name: fmt.Sprintf("f%d", b.opened)}, nil
}

func (b *drainLogging) note(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.log = append(b.log, s)
}

func (b *drainLogging) take() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.log
	b.log = nil
	return l
}

type drainLoggingFile struct {
	backend.File
	b    *drainLogging
	name string
}

func (f *drainLoggingFile) Drain(ctx context.Context) {
	f.b.note("drain " + f.name)
	f.File.Drain(ctx)
}

func (f *drainLoggingFile) Sync(ctx context.Context) error {
	f.b.note("sync " + f.name)
	return f.File.Sync(ctx)
}

// TestOtherWritersDrained: writes through one descriptor may still be on their way to
// the server when another descriptor of the same file reads, writes or fsyncs, and
// the server orders two handles' requests in no particular way: muxfs waits for them
// first (e2e's TestRandomOpsMatchModel finds what goes wrong otherwise). With a single
// handle nothing is waited for.
func TestOtherWritersDrained(t *testing.T) {
	_, local := localDir(t)
	b := &drainLogging{Backend: local}
	mp, _ := mountLogged(t, b)
	p := filepath.Join(mp, "file")

	a, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.WriteAt([]byte("one writer"), 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := b.take(); !slices.Equal(got, []string{"sync f1"}) {
		t.Errorf("one writer: %q, want only its sync", got)
	}

	c, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b.take() // the open drains f1, as before
	if _, err := a.WriteAt([]byte("first"), 0); err != nil {
		t.Fatal(err)
	}
	if got := b.take(); !slices.Equal(got, []string{"drain f2"}) {
		t.Errorf("write through the first descriptor: %q, want f2 drained", got)
	}
	if err := c.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := b.take(); !slices.Equal(got, []string{"drain f1", "sync f2"}) {
		t.Errorf("fsync through a second descriptor: %q, want f1 drained before f2's sync", got)
	}
	if _, err := c.WriteAt([]byte("second"), 0); err != nil {
		t.Fatal(err)
	}
	if got := b.take(); !slices.Equal(got, []string{"drain f1"}) {
		t.Errorf("write through a second descriptor: %q, want f1 drained", got)
	}
}

// TestReleaseKeepsTruncation: a handle's release hands what its writes made of the file
// to the handles still open (their views answer stats while they write); a truncation
// through another handle meanwhile — the kernel sends RELEASE after close(2) has
// returned, so the program has gone on — must not be undone by it (seen in the fsx
// test under CPU load: a stat, and the truncation's own answer, gave the size from
// before it).
func TestReleaseKeepsTruncation(t *testing.T) {
	_, local := localDir(t)
	mp, _ := mountLogged(t, local)
	p := filepath.Join(mp, "file")
	keep, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	big := make([]byte, 100_000)
	for i := range 2000 {
		other, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.WriteAt(big, 0); err != nil {
			t.Fatal(err)
		}
		if err := other.Close(); err != nil {
			t.Fatal(err)
		}
		if err := keep.Truncate(10); err != nil {
			t.Fatal(err)
		}
		if got := fsize(t, keep); got != 10 {
			t.Fatalf("round %d: size %d after truncating to 10 while another handle was released", i, got)
		}
	}
}

// TestReleaseHandsOnGrowth: a writer that grew the file, closed while another
// descriptor stays open, hands its view of the file to that descriptor at RELEASE,
// which the kernel sends after close(2) has returned; a stat made meanwhile (the
// program has gone on) must see the growth — before the hand-over the closed writer
// answers it, after it the other descriptor (seen in the fsx test under CPU load: a
// file read whole right after a close ended where the other descriptor's last write
// did). The release is held where it has left the writers and not yet handed its view
// on; a stat then may wait for it, but not answer the size from before the writes.
func TestReleaseHandsOnGrowth(t *testing.T) {
	// paused has room: a release that comes after the test gave up does not hang.
	paused, proceed := make(chan struct{}, 1), make(chan struct{})
	var first sync.Once // the writer's release; not the other descriptor's, at the end
	testHookHandOn = func() {
		first.Do(func() {
			paused <- struct{}{}
			<-proceed
		})
	}
	t.Cleanup(func() { testHookHandOn = nil }) // after the unmount, registered before it
	_, local := localDir(t)
	mp, _ := mountLoggedWith(t, local, Options{})
	p := filepath.Join(mp, "file")
	keep, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	writer, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	const size = 100_000
	if _, err := writer.WriteAt(make([]byte, size), 0); err != nil {
		t.Fatal(err)
	}
	if err := writer.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-paused:
	case <-time.After(10 * time.Second):
		close(proceed)
		t.Fatal("no release within 10 s of close(2)")
	}
	stat := make(chan error, 1)
	var got int64
	go func() {
		st, err := keep.Stat()
		if err == nil {
			got = st.Size()
		}
		stat <- err
	}()
	select {
	case err := <-stat:
		// Answered while the release was held.
		close(proceed)
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(200 * time.Millisecond):
		// Waiting for the release, as it may.
		close(proceed)
		if err := <-stat; err != nil {
			t.Fatal(err)
		}
	}
	if got != size {
		t.Errorf("size %d right after closing a descriptor that wrote %d bytes", got, size)
	}
}

// statHeld holds each of the next held Stats of the first file it opens after the
// server answered it and before the answer returns, until the test lets it go: a
// writer's close between its stat and taking it as its view.
type statHeld struct {
	backend.Backend
	opened  atomic.Int32
	held    atomic.Int32
	statted chan struct{}
	proceed chan struct{}
}

func (b *statHeld) Open(ctx context.Context, p string, flags int, mode uint32) (backend.File, error) {
	f, err := b.Backend.Open(ctx, p, flags, mode)
	if err != nil {
		return nil, err
	}
	return &statHeldFile{File: f, b: b, first: b.opened.Add(1) == 1}, nil
}

type statHeldFile struct {
	backend.File
	b     *statHeld
	first bool
}

func (f *statHeldFile) Stat(ctx context.Context) (backend.Attr, error) {
	a, err := f.File.Stat(ctx)
	if f.first && f.b.held.Add(-1) >= 0 {
		f.b.statted <- struct{}{}
		<-f.b.proceed
	}
	return a, err
}

// TestCloseKeepsTruncation: close(2) of a written descriptor takes the server's size
// after its writes as the file's (the handle's view answers stats while another
// descriptor writes, and is handed on at release); a truncation through another
// descriptor by another thread, made after the server answered that stat, must not be
// undone by it — whether close's next stat goes through or meets a truncation too,
// every time.
func TestCloseKeepsTruncation(t *testing.T) {
	for _, truncations := range []int{1, 3} {
		t.Run(fmt.Sprint(truncations), func(t *testing.T) {
			_, local := localDir(t)
			b := &statHeld{Backend: local, statted: make(chan struct{}), proceed: make(chan struct{})}
			mp, _ := mountLoggedWith(t, b, Options{})
			p := filepath.Join(mp, "file")
			writer, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			keep, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer keep.Close()
			if _, err := writer.WriteAt(make([]byte, 100_000), 0); err != nil {
				t.Fatal(err)
			}
			b.held.Store(int32(truncations))
			closed := make(chan error, 1)
			go func() { closed <- writer.Close() }()
			want := int64(0)
			for i := range truncations {
				select {
				case <-b.statted:
				case <-time.After(10 * time.Second):
					t.Fatalf("close(2) asked the server for no stat %d within 10 s", i+1)
				}
				want = int64(10 + i)
				err := keep.Truncate(want)
				b.proceed <- struct{}{}
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := <-closed; err != nil {
				t.Fatal(err)
			}
			if got := fsize(t, keep); got != want {
				t.Errorf("size %d after truncating to %d while another descriptor was closed", got, want)
			}
		})
	}
}

// heldWrites opens files whose writes reach the directory only once the handle is
// flushed, drained, synced, statted or closed: a server behind muxfs' write-behind,
// which answers a write before the server has it.
type heldWrites struct {
	backend.Backend
}

func (b *heldWrites) Open(ctx context.Context, p string, flags int, mode uint32) (backend.File, error) {
	f, err := b.Backend.Open(ctx, p, flags, mode)
	if err != nil {
		return nil, err
	}
	return &heldWritesFile{File: f}, nil
}

type heldWritesFile struct {
	backend.File
	mu   sync.Mutex
	held []heldWrite
}

type heldWrite struct {
	p   []byte
	off int64
}

func (f *heldWritesFile) WriteAt(_ context.Context, p []byte, off int64) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held = append(f.held, heldWrite{append([]byte(nil), p...), off})
	return len(p), nil
}

// send writes what is held.
func (f *heldWritesFile) send(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.held {
		if _, err := f.File.WriteAt(ctx, w.p, w.off); err != nil {
			return err
		}
	}
	f.held = nil
	return nil
}

func (f *heldWritesFile) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if err := f.send(ctx); err != nil {
		return 0, err
	}
	return f.File.ReadAt(ctx, p, off)
}

func (f *heldWritesFile) Flush(ctx context.Context) error {
	if err := f.send(ctx); err != nil {
		return err
	}
	return f.File.Flush(ctx)
}

func (f *heldWritesFile) Drain(ctx context.Context) {
	f.send(ctx) //nolint:errcheck // a local write does not fail here
	f.File.Drain(ctx)
}

func (f *heldWritesFile) Stat(ctx context.Context) (backend.Attr, error) {
	if err := f.send(ctx); err != nil {
		return backend.Attr{}, err
	}
	return f.File.Stat(ctx)
}

func (f *heldWritesFile) SetAttr(ctx context.Context, set backend.SetAttr) error {
	if err := f.send(ctx); err != nil {
		return err
	}
	return f.File.SetAttr(ctx, set)
}

func (f *heldWritesFile) Sync(ctx context.Context) error {
	if err := f.send(ctx); err != nil {
		return err
	}
	return f.File.Sync(ctx)
}

func (f *heldWritesFile) Close(ctx context.Context) error {
	if err := f.send(ctx); err != nil {
		f.File.Close(ctx) //nolint:errcheck // the write's error is the one to report
		return err
	}
	return f.File.Close(ctx)
}

// TestLookupWhileWriting: while a file is being written, the server may not have every
// write yet; a lookup of its name (the kernel looks a name up again once its entry
// timed out, and each entry of a READDIRPLUS is one) must answer the size the writes
// made, not the server's — the kernel takes that size as the file's, for the writer
// too. Reproduced over SFTP first: 8 MiB written, then stat(2) of the path with
// entry_timeout=0, which showed 1–8 MB, as did fstat(2) of the writer.
func TestLookupWhileWriting(t *testing.T) {
	root, local := localDir(t)
	// Names looked up at every use, attributes kept as answered (a GETATTR would
	// answer the writers' view).
	mp, _ := mountLoggedWith(t, &heldWrites{Backend: local}, Options{AttrTimeout: time.Minute})
	p := filepath.Join(mp, "file")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const size = 100_000
	if _, err := f.WriteAt(make([]byte, size), 0); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(root, "file")); err != nil || st.Size() != 0 {
		t.Fatalf("the directory shows the write before a flush (%v, %v): the test's backend does not hold it", st, err)
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != size {
		t.Errorf("stat of the path while writing: size %d, want %d", st.Size(), size)
	}
	entries, err := os.ReadDir(mp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if info.Size() != size {
			t.Errorf("the listing's entry while writing: size %d, want %d", info.Size(), size)
		}
	}
	if got := fsize(t, f); got != size {
		t.Errorf("fstat of the writer after those: size %d, want %d", got, size)
	}
}

// openNoting records, for each open of the files it opens, whether the open said the
// file was being written (backend.BeingWritten).
type openNoting struct {
	backend.Backend
	mu    sync.Mutex
	noted []bool
}

func (b *openNoting) Open(ctx context.Context, p string, flags int, mode uint32) (backend.File, error) {
	b.mu.Lock()
	b.noted = append(b.noted, backend.BeingWritten(ctx))
	b.mu.Unlock()
	return b.Backend.Open(ctx, p, flags, mode)
}

func (b *openNoting) last() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.noted[len(b.noted)-1]
}

// TestOpenWhileWritten: an open of a file that another descriptor is writing tells
// the source so, which then asks the server rather than trust attributes it was given
// meanwhile (-o nocto: a read through a new descriptor came back short, the server's
// size from before the writes, over SFTP); an open of a file nobody writes does not.
func TestOpenWhileWritten(t *testing.T) {
	_, local := localDir(t)
	b := &openNoting{Backend: local}
	mp, _ := mountLogged(t, b)
	p := filepath.Join(mp, "file")
	if err := os.WriteFile(p, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	readOpen := func() bool {
		t.Helper()
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		return b.last()
	}
	// The kernel sends RELEASE after close(2) has returned: the writer of WriteFile
	// may still count for a moment.
	for deadline := time.Now().Add(5 * time.Second); readOpen(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("an open of a file nobody writes said it was being written")
		}
	}
	w, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Write([]byte("more")); err != nil {
		t.Fatal(err)
	}
	if !readOpen() {
		t.Error("an open of a file another descriptor is writing did not say so")
	}
}
