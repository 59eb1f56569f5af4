package diskcache

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/muxfs/muxfs/internal/backend"
	"github.com/muxfs/muxfs/internal/bufpool"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// counting is a backend that counts the bytes read from it and can be made
// unreachable.
type counting struct {
	backend.Backend
	read   atomic.Int64
	lstats atomic.Int64
	opens  atomic.Int64
	down   atomic.Bool
	// duringUnlink, if set, runs while an unlink is in flight, before the server
	// acts on it.
	duringUnlink func()
	// duringOpen, if set, runs at each open, before the server acts on it.
	duringOpen func(p string)
}

func (c *counting) Unlink(ctx context.Context, p string) error {
	if c.duringUnlink != nil {
		c.duringUnlink()
	}
	return c.Backend.Unlink(ctx, p)
}

func (c *counting) Lstat(ctx context.Context, p string) (backend.Attr, error) {
	c.lstats.Add(1)
	return c.Backend.Lstat(ctx, p)
}

func (c *counting) Open(ctx context.Context, p string, flags int, mode uint32) (backend.File, error) {
	if c.down.Load() {
		return nil, &backend.Error{Op: "open", Path: p, Errno: syscall.EIO, Cause: backend.ErrUnavailable}
	}
	c.opens.Add(1)
	if c.duringOpen != nil {
		c.duringOpen(p)
	}
	f, err := c.Backend.Open(ctx, p, flags, mode)
	if err != nil {
		return nil, err
	}
	return &countingFile{File: f, c: c}, nil
}

func (c *counting) state() backend.State {
	if c.down.Load() {
		return backend.StateDown
	}
	return backend.StateUp
}

type countingFile struct {
	backend.File
	c *counting
}

func (f *countingFile) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(ctx, p, off)
	f.c.read.Add(int64(n))
	return n, err
}

// waitFor waits up to 10 s for cond; if it does not come, the test fails with the
// message what returns then.
func waitFor(t *testing.T, cond func() bool, what func() string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(what())
		}
	}
}

// setup serves a local directory (standing in for a server) through a store in a
// cache directory.
func setup(t *testing.T, cacheDir string, opts Options) (*Cache, *Source, *counting, string) {
	t.Helper()
	remote := t.TempDir()
	return setupOn(t, cacheDir, remote, opts)
}

func setupOn(t *testing.T, cacheDir, remote string, opts Options) (*Cache, *Source, *counting, string) {
	t.Helper()
	l, err := backend.NewLocal(remote)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(cacheDir, opts, quiet)
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Store("test:" + remote)
	if err != nil {
		t.Fatal(err)
	}
	cb := &counting{Backend: l}
	return c, Wrap(cb, st, true, true, cb.state, quiet), cb, remote
}

func readAll(t *testing.T, s *Source, p string) []byte {
	t.Helper()
	ctx := context.Background()
	f, err := s.Open(ctx, p, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close(ctx) //nolint:errcheck
	var out []byte
	buf := make([]byte, 100<<10)
	for off := int64(0); ; {
		n, err := f.ReadAt(ctx, buf, off)
		out = append(out, buf[:n]...)
		off += int64(n)
		if n == 0 || err != nil {
			return out
		}
	}
}

// remountAndRead opens the cache in dir again over remote (a new mount), and checks
// that p reads as want from the cache alone.
func remountAndRead(t *testing.T, dir, remote, p string, want []byte) *Source {
	t.Helper()
	c, s, cb, _ := setupOn(t, dir, remote, Options{})
	t.Cleanup(c.Close)
	if got := readAll(t, s, p); !bytes.Equal(got, want) {
		t.Fatalf("%s read after a remount differs", p)
	}
	if cb.read.Load() != 0 {
		t.Errorf("after a remount, %d bytes of %s came from the server", cb.read.Load(), p)
	}
	return s
}

func data(n int, seed int64) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

func TestReadThroughAndPersist(t *testing.T) {
	dir := t.TempDir()
	c, s, cb, remote := setup(t, dir, Options{})
	want := data(1<<20+123, 1)
	os.WriteFile(filepath.Join(remote, "f"), want, 0o644)                 //nolint:errcheck
	os.Chtimes(filepath.Join(remote, "f"), time.Now(), time.Unix(1e9, 0)) //nolint:errcheck // not racy
	if got := readAll(t, s, "f"); !bytes.Equal(got, want) {
		t.Fatal("first read differs")
	}
	first := cb.read.Load()
	if got := readAll(t, s, "f"); !bytes.Equal(got, want) {
		t.Fatal("cached read differs")
	}
	if cb.read.Load() != first {
		t.Errorf("the second read fetched %d bytes from the server", cb.read.Load()-first)
	}
	st, _ := os.Stat(dir)
	if st.Mode().Perm() != 0o700 {
		t.Errorf("cache directory mode %v, want 0700", st.Mode().Perm())
	}
	c.Close()

	// A new mount: the cache survives.
	s2 := remountAndRead(t, dir, remote, "f", want)
	f, _ := s2.Open(context.Background(), "f", os.O_RDONLY, 0)
	if _, ok := f.(interface{ PassthroughFd() (int, bool) }).PassthroughFd(); !ok {
		t.Error("a fully cached file is not offered for passthrough")
	}
	f.Close(context.Background()) //nolint:errcheck
}

func TestCoherency(t *testing.T) {
	c, s, _, remote := setup(t, t.TempDir(), Options{})
	defer c.Close()
	p := filepath.Join(remote, "f")
	os.WriteFile(p, []byte("old content"), 0o644) //nolint:errcheck
	os.Chtimes(p, time.Now(), time.Unix(1e9, 0))  //nolint:errcheck
	readAll(t, s, "f")
	os.WriteFile(p, []byte("new content"), 0o644)  //nolint:errcheck // same size
	os.Chtimes(p, time.Now(), time.Unix(1e9+5, 0)) //nolint:errcheck
	if got := string(readAll(t, s, "f")); got != "new content" {
		t.Errorf("changed behind the cache's back: got %q", got)
	}
}

func TestWritesFillTheCache(t *testing.T) {
	c, s, cb, remote := setup(t, t.TempDir(), Options{})
	defer c.Close()
	ctx := context.Background()
	want := data(300<<10, 2)
	f, err := s.Open(ctx, "w", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(ctx, want, 0) //nolint:errcheck
	f.Stat(ctx)             //nolint:errcheck // as close(2) does
	f.Close(ctx)            //nolint:errcheck
	if got := readAll(t, s, "w"); !bytes.Equal(got, want) {
		t.Fatal("read back differs")
	}
	if cb.read.Load() != 0 {
		t.Errorf("data written through the cache was fetched again (%d bytes)", cb.read.Load())
	}
	if got, _ := os.ReadFile(filepath.Join(remote, "w")); !bytes.Equal(got, want) {
		t.Error("the server's copy differs")
	}
}

func TestEvictionUnderLimit(t *testing.T) {
	c, s, _, remote := setup(t, t.TempDir(), Options{MaxSize: 1 << 20})
	defer c.Close()
	for i := 0; i < 6; i++ {
		p := filepath.Join(remote, string(rune('a'+i)))
		os.WriteFile(p, data(400<<10, int64(i)), 0o644) //nolint:errcheck
		os.Chtimes(p, time.Now(), time.Unix(1e9, 0))    //nolint:errcheck
	}
	ctx := context.Background()
	held, _ := s.Open(ctx, "a", os.O_RDONLY, 0) // in use: never evicted
	buf := make([]byte, 400<<10)
	held.ReadAt(ctx, buf, 0) //nolint:errcheck
	for i := 1; i < 6; i++ {
		readAll(t, s, string(rune('a'+i)))
		time.Sleep(5 * time.Millisecond)
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.used() > 1<<20 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if c.used() > 1<<20 {
		t.Errorf("cache holds %d bytes, limit 1 MiB", c.used())
	}
	if n, ok := held.(*file).e.readAt(buf, 0); !ok || n != len(buf) {
		t.Error("the file in use lost its cached data")
	}
	held.Close(ctx) //nolint:errcheck
}

func TestOffline(t *testing.T) {
	c, s, cb, remote := setup(t, t.TempDir(), Options{})
	defer c.Close()
	want := data(200<<10, 3)
	os.WriteFile(filepath.Join(remote, "cached"), want, 0o644)                 //nolint:errcheck
	os.WriteFile(filepath.Join(remote, "not-cached"), want, 0o644)             //nolint:errcheck
	os.Chtimes(filepath.Join(remote, "cached"), time.Now(), time.Unix(1e9, 0)) //nolint:errcheck
	readAll(t, s, "cached")
	cb.down.Store(true)
	if got := readAll(t, s, "cached"); !bytes.Equal(got, want) {
		t.Error("a cached file is not readable offline")
	}
	if _, err := s.Open(context.Background(), "not-cached", os.O_RDONLY, 0); err == nil {
		t.Error("opened a file the cache does not hold while offline")
	}
	_, err := s.Open(context.Background(), "cached", os.O_WRONLY, 0)
	if backend.ToErrno(err) != syscall.EROFS {
		t.Errorf("write open while offline: %v, want EROFS", err)
	}
	if _, err := s.Mkdir(context.Background(), "d", 0o755); backend.ToErrno(err) != syscall.EROFS {
		t.Error("mkdir while offline is not EROFS")
	}
}

func TestSourcesNeverShare(t *testing.T) {
	dir := t.TempDir()
	c1, s1, _, r1 := setup(t, dir, Options{})
	defer c1.Close()
	os.WriteFile(filepath.Join(r1, "same"), []byte("one"), 0o644) //nolint:errcheck
	readAll(t, s1, "same")
	c2, s2, _, r2 := setup(t, filepath.Join(dir, "other"), Options{})
	defer c2.Close()
	os.WriteFile(filepath.Join(r2, "same"), []byte("two"), 0o644) //nolint:errcheck
	if got := string(readAll(t, s2, "same")); got != "two" {
		t.Errorf("second source read %q", got)
	}
	if s1.st.dir == s2.st.dir || s1.st.dataPath("same") == s2.st.dataPath("same") {
		t.Error("two sources share cache files")
	}
}

func TestListings(t *testing.T) {
	c, s, _, _ := setup(t, t.TempDir(), Options{})
	defer c.Close()
	st := s.Store()
	list := []backend.Entry{{Name: "a", Attr: backend.Attr{Mode: syscall.S_IFREG | 0o644, Size: 3, Mtime: time.Unix(5, 0)}}}
	at := time.Unix(100, 0)
	st.SaveListing("d", list, at)
	st.flush()
	got, when, ok := st.LoadListing("d")
	if !ok || len(got) != 1 || got[0].Name != "a" || got[0].Attr.Size != 3 || !when.Equal(at) {
		t.Fatalf("listing round trip: %+v %v %v", got, when, ok)
	}
	st.ForgetTree("")
	if _, _, ok := st.LoadListing("d"); ok {
		t.Error("listing survived ForgetTree")
	}
}

// TestRenameOverCachedFile: a file renamed over a cached one (same size, same mtime,
// as ar and ranlib make them within a second) is read as itself, also while a handle
// of the old file is still open.
func TestRenameOverCachedFile(t *testing.T) {
	c, s, _, remote := setup(t, t.TempDir(), Options{})
	defer c.Close()
	ctx := context.Background()
	mtime := time.Unix(1e9, 0)
	for name, content := range map[string]string{"lib.a": "old content", "tmp": "new content"} {
		os.WriteFile(filepath.Join(remote, name), []byte(content), 0o644) //nolint:errcheck
		os.Chtimes(filepath.Join(remote, name), mtime, mtime)             //nolint:errcheck
	}
	old, err := s.Open(ctx, "lib.a", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	old.ReadAt(ctx, buf, 0) //nolint:errcheck // cached now
	if err := s.Rename(ctx, "tmp", "lib.a"); err != nil {
		t.Fatal(err)
	}
	if got := string(readAll(t, s, "lib.a")); got != "new content" {
		t.Errorf("after the rename: %q", got)
	}
	n, err := old.ReadAt(ctx, buf, 0)
	if got := string(buf[:n]); err != nil || got != "old content" {
		t.Errorf("the handle open before the rename reads %q, %v", got, err)
	}
	old.Close(ctx) //nolint:errcheck
	if got := string(readAll(t, s, "lib.a")); got != "new content" {
		t.Errorf("after the old handle closed: %q", got)
	}
}

// An unlink removes the cached data at once and deletes the record with the next
// commit (not one commit per file): until then the record counts as absent, so a new
// file at the path, even of the same size and mtime (an untar over a removed tree),
// is never served the old bytes.
func TestDroppedRecordCommittedLater(t *testing.T) {
	dir := t.TempDir()
	c, s, _, remote := setup(t, dir, Options{})
	mtime := time.Unix(1e9, 0)
	put := func(content string) {
		os.WriteFile(filepath.Join(remote, "a"), []byte(content), 0o644) //nolint:errcheck
		os.Chtimes(filepath.Join(remote, "a"), mtime, mtime)             //nolint:errcheck
	}
	put("old content")
	readAll(t, s, "a")
	c.Close() // commits the record
	c, s, cb, _ := setupOn(t, dir, remote, Options{})
	defer c.Close()
	if err := s.Unlink(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.st.dataPath("a")); !os.IsNotExist(err) {
		t.Errorf("cached data still there after the unlink: %v", err)
	}
	if _, ok := s.st.load("a"); !ok {
		t.Error("the record was deleted at once: one commit per unlink")
	}
	put("new content")
	before := cb.read.Load()
	if got := string(readAll(t, s, "a")); got != "new content" {
		t.Errorf("a new file at an unlinked path reads %q", got)
	}
	if cb.read.Load() == before {
		t.Error("the new file was not read from the server")
	}
	s.st.flush()
	s.st.mu.Lock()
	gone := len(s.st.gone)
	s.st.mu.Unlock()
	if gone != 0 {
		t.Errorf("%d deletions still pending after a commit", gone)
	}
}

// The cached data is removed while the unlink waits for the server; an open of the
// old file in that window caches it again, and that copy must not outlive the unlink
// either.
func TestUnlinkDropsDataCachedDuringIt(t *testing.T) {
	c, s, cb, remote := setup(t, t.TempDir(), Options{})
	defer c.Close()
	mtime := time.Unix(1e9, 0)
	put := func(content string) {
		os.WriteFile(filepath.Join(remote, "a"), []byte(content), 0o644) //nolint:errcheck
		os.Chtimes(filepath.Join(remote, "a"), mtime, mtime)             //nolint:errcheck
	}
	put("old content")
	readAll(t, s, "a")
	cb.duringUnlink = func() {
		if got := string(readAll(t, s, "a")); got != "old content" {
			t.Errorf("during the unlink: %q", got)
		}
	}
	if err := s.Unlink(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	cb.duringUnlink = nil
	if _, err := os.Stat(s.st.dataPath("a")); !os.IsNotExist(err) {
		t.Errorf("data cached during the unlink still there after it: %v", err)
	}
	put("new content")
	if got := string(readAll(t, s, "a")); got != "new content" {
		t.Errorf("a new file at the unlinked path reads %q", got)
	}
}

// A file open when it is unlinked reads on as before (POSIX), from the cache when
// it held the file whole; a new file at the path has its own data, which the old
// handle's close leaves alone.
func TestOpenFileOutlivesUnlink(t *testing.T) {
	c, s, cb, remote := setup(t, t.TempDir(), Options{})
	defer c.Close()
	ctx := context.Background()
	mtime := time.Unix(1e9, 0)
	put := func(content string) {
		os.WriteFile(filepath.Join(remote, "a"), []byte(content), 0o644) //nolint:errcheck
		os.Chtimes(filepath.Join(remote, "a"), mtime, mtime)             //nolint:errcheck
	}
	put("old content")
	readAll(t, s, "a")
	s.st.flush() // the record committed, as after a remount
	old, err := s.Open(ctx, "a", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := old.(*cachedFile); !ok {
		t.Fatalf("a file held whole opened as %T, not from the cache", old)
	}
	if err := s.Unlink(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	put("new content")
	if got := string(readAll(t, s, "a")); got != "new content" {
		t.Errorf("the new file reads %q", got)
	}
	buf := make([]byte, 64)
	n, err := old.ReadAt(ctx, buf, 0)
	if got := string(buf[:n]); err != nil || got != "old content" {
		t.Errorf("the handle open before the unlink reads %q, %v", got, err)
	}
	old.Close(ctx) //nolint:errcheck
	before := cb.read.Load()
	if got := string(readAll(t, s, "a")); got != "new content" {
		t.Errorf("after the old handle closed, the new file reads %q", got)
	}
	if cb.read.Load() != before {
		t.Error("the old handle's close dropped the new file's cached data")
	}
}

// A file opened whole from the cache and then changed on the server, which another
// open notices, reads on from the server: its cached copy is gone, and EIO would be
// wrong. The same after a truncate by path.
func TestCachedFileReadsServerAfterDrop(t *testing.T) {
	c, s, _, remote := setup(t, t.TempDir(), Options{})
	defer c.Close()
	ctx := context.Background()
	put := func(content string, sec int64) {
		mtime := time.Unix(1e9+sec, 0)
		os.WriteFile(filepath.Join(remote, "a"), []byte(content), 0o644) //nolint:errcheck
		os.Chtimes(filepath.Join(remote, "a"), mtime, mtime)             //nolint:errcheck
	}
	put("version one", 0)
	readAll(t, s, "a")
	buf := make([]byte, 64)
	for _, change := range []string{"changed on the server", "truncated by path"} {
		h, err := s.Open(ctx, "a", os.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := h.(*cachedFile); !ok {
			t.Fatalf("%s: a file held whole opened as %T", change, h)
		}
		want := ""
		if change == "changed on the server" {
			put("version two, longer", 1)
			want = "version two, longer"
			readAll(t, s, "a") // another open sees the change and drops the data
		} else {
			if _, err := s.SetAttr(ctx, "a", backend.SetAttr{Valid: backend.SetSize, Size: 7}); err != nil {
				t.Fatal(err)
			}
			want = "version"
		}
		n, err := h.ReadAt(ctx, buf, 0)
		if got := string(buf[:n]); got != want || (err != nil && err != io.EOF) {
			t.Errorf("%s: the handle open before reads %q, %v; want %q", change, got, err, want)
		}
		h.Close(ctx) //nolint:errcheck
		readAll(t, s, "a")
	}
}

// TestStatMovesOpenReadersOn: a file that grew on the server while a reader held it
// open reads on past its old end once a stat or a listing showed the new size (the
// kernel then asks for those bytes: `tail -f` of a job's log), through a handle
// opened on the server and through one opened from the cache alone.
func TestStatMovesOpenReadersOn(t *testing.T) {
	c, s, _, remote := setup(t, t.TempDir(), Options{})
	defer c.Close()
	ctx := context.Background()
	path := filepath.Join(remote, "log")
	for _, tc := range []struct {
		name  string
		whole bool // held whole before the open: opened from the cache
		learn func()
	}{
		{"stat", false, func() { s.Lstat(ctx, "log") }},                       //nolint:errcheck
		{"listing", false, func() { s.ReadDir(ctx, "") }},                     //nolint:errcheck
		{"stat, opened from the cache", true, func() { s.Lstat(ctx, "log") }}, //nolint:errcheck
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.WriteFile(path, []byte("line 0\n"), 0o644)   //nolint:errcheck
			os.Chtimes(path, time.Now(), time.Unix(1e9, 0)) //nolint:errcheck
			if tc.whole {
				readAll(t, s, "log")
			}
			h, err := s.Open(ctx, "log", os.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close(ctx) //nolint:errcheck
			if _, ok := h.(*cachedFile); ok != tc.whole {
				t.Fatalf("opened as %T", h)
			}
			buf := make([]byte, 64)
			if n, _ := h.ReadAt(ctx, buf, 0); string(buf[:n]) != "line 0\n" {
				t.Fatalf("first read: %q", buf[:n])
			}
			f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
			f.WriteString("line 1\n") //nolint:errcheck
			f.Close()
			os.Chtimes(path, time.Now(), time.Unix(1e9+1, 0)) //nolint:errcheck
			tc.learn()
			if n, err := h.ReadAt(ctx, buf, 7); string(buf[:n]) != "line 1\n" {
				t.Errorf("read past the old end after the %s: %q, %v", tc.name, buf[:n], err)
			}
		})
	}
}

// TestOldHandleFillsNotTheNewVersion: a reader of a file since replaced on the server
// reads the old file through its handle; once another open has moved the cache on to
// the new version, those bytes must not be cached as the new version's.
func TestOldHandleFillsNotTheNewVersion(t *testing.T) {
	c, s, _, remote := setup(t, t.TempDir(), Options{})
	defer c.Close()
	ctx := context.Background()
	path := filepath.Join(remote, "f")
	oldData, newData := data(256<<10, 1), data(256<<10, 2)
	os.WriteFile(path, oldData, 0o644)              //nolint:errcheck
	os.Chtimes(path, time.Now(), time.Unix(1e9, 0)) //nolint:errcheck
	old, err := s.Open(ctx, "f", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close(ctx)                                     //nolint:errcheck
	os.WriteFile(path+".new", newData, 0o644)                //nolint:errcheck
	os.Chtimes(path+".new", time.Now(), time.Unix(1e9+1, 0)) //nolint:errcheck
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	cur, err := s.Open(ctx, "f", os.O_RDONLY, 0) // moves the cache on to the new file
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	if _, err := old.ReadAt(ctx, buf, 128<<10); err != nil {
		t.Fatal(err)
	}
	cur.Close(ctx) //nolint:errcheck
	again, err := s.Open(ctx, "f", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close(ctx) //nolint:errcheck
	n, err := again.ReadAt(ctx, buf, 128<<10)
	if err != nil || !bytes.Equal(buf[:n], newData[128<<10:128<<10+n]) {
		t.Errorf("the range the old handle read: %d bytes, %v, not the new file's", n, err)
	}
}

// TestFetchWholeOnRandomReads: a file read at random is fetched whole in the
// background, after which reads no longer reach the server; a file larger than the
// limit is not.
func TestFetchWholeOnRandomReads(t *testing.T) {
	c, s, cb, remote := setup(t, t.TempDir(), Options{FetchWhole: 8 << 20})
	defer c.Close()
	ctx := context.Background()
	mtime := time.Unix(1e9, 0)
	for name, size := range map[string]int{"db": 4 << 20, "huge": 9 << 20} {
		os.WriteFile(filepath.Join(remote, name), data(size, 7), 0o644) //nolint:errcheck
		os.Chtimes(filepath.Join(remote, name), mtime, mtime)           //nolint:errcheck
	}
	randomReads := func(name string, size int) {
		f, err := s.Open(ctx, name, os.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close(ctx) //nolint:errcheck
		rng := rand.New(rand.NewSource(3))
		buf := make([]byte, 4096)
		want := data(size, 7)
		for i := 0; i < 40; i++ {
			off := int64(rng.Intn(size/4096)) * 4096
			if n, err := f.ReadAt(ctx, buf, off); err != nil || !bytes.Equal(buf[:n], want[off:off+int64(n)]) {
				t.Fatalf("read at %d: %v", off, err)
			}
		}
	}
	randomReads("db", 4<<20)
	waitFor(t, func() bool { return s.st.holdsWhole("db", backend.Attr{Size: 4 << 20, Mtime: mtime}) },
		func() string { return "a file read at random was not fetched whole" })
	before := cb.read.Load()
	randomReads("db", 4<<20)
	if cb.read.Load() != before {
		t.Errorf("reads after the whole fetch reached the server: %d bytes", cb.read.Load()-before)
	}
	randomReads("huge", 9<<20)
	time.Sleep(300 * time.Millisecond)
	if s.st.holdsWhole("huge", backend.Attr{Size: 9 << 20, Mtime: mtime}) {
		t.Error("a file over the limit was fetched whole")
	}
}

// TestRootListingPersists: the source's root ("" to the cache) is stored like any
// directory. bbolt refuses an empty key, and a refused key used to fail the whole
// commit, losing every listing saved with the root's.
func TestRootListingPersists(t *testing.T) {
	c, s, _, _ := setup(t, t.TempDir(), Options{})
	defer c.Close()
	st := s.Store()
	list := []backend.Entry{{Name: "a", Attr: backend.Attr{Mode: syscall.S_IFDIR | 0o755}}}
	at := time.Unix(100, 0)
	st.SaveListing("", list, at)
	st.SaveAttr("", backend.Attr{Mode: syscall.S_IFDIR | 0o755, Mtime: at})
	st.SaveListing("a", nil, at)
	st.flush()
	st.mu.Lock()
	queued := 0
	for _, q := range st.saves {
		queued += q.len()
	}
	st.mu.Unlock()
	if queued != 0 {
		t.Fatalf("%d saves still queued after the commit", queued)
	}
	for _, p := range []string{"", "a"} {
		if _, _, ok := st.LoadListing(p); !ok {
			t.Errorf("listing of %q not stored", p)
		}
	}
	if _, ok := st.LoadAttr(""); !ok {
		t.Error("root's attributes not stored")
	}
	st.ForgetTree("")
	st.flush()
	for _, p := range []string{"", "a"} {
		if _, _, ok := st.LoadListing(p); ok {
			t.Errorf("listing of %q survived ForgetTree", p)
		}
	}
}

// TestSymlinkTargetsStored: targets persist across a commit, and ForgetTree and
// ForgetListings drop them with the paths' other records, and no others.
func TestSymlinkTargetsStored(t *testing.T) {
	c, s, _, _ := setup(t, t.TempDir(), Options{})
	defer c.Close()
	st := s.Store()
	for _, p := range []string{"a/l", "a/b/l", "ab/l", "c/l"} {
		st.SaveLink(p, "to-"+p)
	}
	st.flush()
	if got, ok := st.LoadLink("a/b/l"); !ok || got != "to-a/b/l" {
		t.Fatalf("stored target: %q %v", got, ok)
	}
	st.ForgetTree("a")
	st.ForgetListings("c/l")
	st.flush()
	for p, kept := range map[string]bool{"a/l": false, "a/b/l": false, "ab/l": true, "c/l": false} {
		if _, ok := st.LoadLink(p); ok != kept {
			t.Errorf("%s: stored %v after forgetting a's tree and c/l, want %v", p, ok, kept)
		}
	}
	// ForgetListing drops a directory's listing, not its attributes.
	st.SaveListing("d", []backend.Entry{{Name: "x"}}, time.Now())
	st.SaveAttr("d", backend.Attr{Mode: syscall.S_IFDIR | 0o755})
	st.flush()
	st.ForgetListing("d")
	st.flush()
	if _, _, ok := st.LoadListing("d"); ok {
		t.Error("ForgetListing left the listing")
	}
	if _, ok := st.LoadAttr("d"); !ok {
		t.Error("ForgetListing dropped the directory's attributes")
	}
	// Saves still pending (not committed) are forgotten by the same rule: a sibling
	// whose name starts with the directory's is not below it.
	for _, p := range []string{"e", "e/l", "e/f/l", "ef/l"} {
		st.SaveLink(p, "to-"+p)
	}
	st.ForgetTree("e")
	st.flush()
	for p, kept := range map[string]bool{"e": false, "e/l": false, "e/f/l": false, "ef/l": true} {
		if _, ok := st.LoadLink(p); ok != kept {
			t.Errorf("pending %s: stored %v after forgetting e's tree, want %v", p, ok, kept)
		}
	}
	// Before the commit, a queued deletion hides the stored value, and a value saved
	// again after it is the one loaded, then committed.
	st.SaveLink("g/l", "old")
	st.flush()
	st.ForgetTree("g")
	if got, ok := st.LoadLink("g/l"); ok {
		t.Errorf("forgotten g/l loaded before the commit: %q", got)
	}
	st.SaveLink("g/l", "new")
	if got, ok := st.LoadLink("g/l"); !ok || got != "new" {
		t.Errorf("g/l saved again after its deletion was queued: %q %v", got, ok)
	}
	st.flush()
	if got, ok := st.LoadLink("g/l"); !ok || got != "new" {
		t.Errorf("g/l saved again after its deletion was queued, committed: %q %v", got, ok)
	}
}

// TestSmallFileHeldUntilCommit: a small file's data is kept in memory, served from
// there, and written to its data file by the commit that records it (not in the path
// of the read or write that brought it); the data is there after a remount.
func TestSmallFileHeldUntilCommit(t *testing.T) {
	dir := t.TempDir()
	c, s, cb, remote := setup(t, dir, Options{})
	ctx := context.Background()
	want := data(100<<10, 7)
	os.WriteFile(filepath.Join(remote, "f"), want, 0o644)                 //nolint:errcheck
	os.Chtimes(filepath.Join(remote, "f"), time.Now(), time.Unix(1e9, 0)) //nolint:errcheck // not racy
	if got := readAll(t, s, "f"); !bytes.Equal(got, want) {
		t.Fatal("first read differs")
	}
	name := s.st.dataPath("f")
	if _, err := os.Stat(name); err == nil {
		t.Error("a data file was made in the read's path")
	}
	fetched := cb.read.Load()
	if got := readAll(t, s, "f"); !bytes.Equal(got, want) {
		t.Fatal("read from memory differs")
	}
	if cb.read.Load() != fetched {
		t.Error("the second read went to the server")
	}

	// Written through the cache, then cut short: memory follows the truncate.
	w, err := s.Open(ctx, "w", os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	w.WriteAt(ctx, want, 0)                                             //nolint:errcheck
	w.SetAttr(ctx, backend.SetAttr{Valid: backend.SetSize, Size: 1000}) //nolint:errcheck
	// An old mtime before the close's stat: committed at the next flush (not racy).
	os.Chtimes(filepath.Join(remote, "w"), time.Now(), time.Unix(1e9, 0)) //nolint:errcheck
	w.Stat(ctx)                                                           //nolint:errcheck // as fusefs does at close: the cached data is this version
	w.Close(ctx)                                                          //nolint:errcheck
	fetched = cb.read.Load()
	if got := readAll(t, s, "w"); !bytes.Equal(got, want[:1000]) {
		t.Fatalf("written file reads %d bytes", len(got))
	}
	if cb.read.Load() != fetched {
		t.Error("the written file was read from the server")
	}

	s.st.flush()
	if _, err := os.Stat(name); err != nil {
		t.Fatalf("after the commit: %v", err)
	}
	if n := s.st.c.memUsed.Load(); n != 0 {
		t.Errorf("%d bytes still held in memory after the commit", n)
	}
	c.Close()

	c2, s2, cb2, _ := setupOn(t, dir, remote, Options{})
	defer c2.Close()
	if got := readAll(t, s2, "f"); !bytes.Equal(got, want) {
		t.Fatal("read after the remount differs")
	}
	if got := readAll(t, s2, "w"); !bytes.Equal(got, want[:1000]) {
		t.Fatal("written file after the remount differs")
	}
	if n := cb2.read.Load(); n != 0 {
		t.Errorf("reads after the remount fetched %d bytes from the server", n)
	}
}

// TestManySmallFilesFlushedEarly: past memFlushAt of data held in memory the cache
// commits at once instead of at its next round, so that a walk fetching file after
// file does not hold a round's worth.
func TestManySmallFilesFlushedEarly(t *testing.T) {
	defer func(d time.Duration) { flushTick = d }(flushTick)
	flushTick = time.Hour
	c, s, _, remote := setup(t, t.TempDir(), Options{})
	defer c.Close()
	const size, files = 200 << 10, memFlushAt/(200<<10) + 2
	for i := range files {
		p := filepath.Join(remote, fmt.Sprint(i))
		os.WriteFile(p, data(size, int64(i)), 0o644) //nolint:errcheck
		os.Chtimes(p, time.Now(), time.Unix(1e9, 0)) //nolint:errcheck // not racy
	}
	for i := range files {
		if got := readAll(t, s, fmt.Sprint(i)); len(got) != size {
			t.Fatalf("file %d read %d bytes", i, len(got))
		}
	}
	waitFor(t, func() bool { return s.st.c.memUsed.Load() <= memFlushAt }, func() string {
		return fmt.Sprintf("%d bytes still held in memory 10 s after passing %d", s.st.c.memUsed.Load(), memFlushAt)
	})
}

// dirtyPools leaves pooled buffers of up to 64 KiB full of junk, as used ones are: a
// buffer that is not cleared where it must read as zeros then shows it.
func dirtyPools() {
	var bs []*[]byte
	for n := 4 << 10; n <= 64<<10; n *= 2 {
		for range 4 {
			b := bufpool.Get(n)
			for i := range *b {
				(*b)[i] = 0xee
			}
			bs = append(bs, b)
		}
	}
	for _, b := range bs {
		bufpool.Put(b)
	}
}

// An assembler writes its object file out of order, leaving holes that it never
// writes, and reads back parts of it while writing. Those reads are served from what
// was written (no server read, no wait for the writes), and the file, holes included,
// is held whole afterwards: the linker's open is served from the cache.
func TestWrittenWithHolesStaysWhole(t *testing.T) {
	c, s, cb, remote := setup(t, t.TempDir(), Options{})
	dirtyPools() // the file is held in memory, in pooled buffers
	defer c.Close()
	ctx := context.Background()
	f, err := s.Open(ctx, "a.o", os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 26664)
	write := func(off int, p []byte) {
		t.Helper()
		if _, err := f.WriteAt(ctx, p, int64(off)); err != nil {
			t.Fatal(err)
		}
		copy(want[off:], p)
	}
	write(18944, data(1760, 3))
	buf := make([]byte, 16384)
	if n, err := f.ReadAt(ctx, buf, 0); n != len(buf) || err != nil || !bytes.Equal(buf, want[:16384]) {
		t.Fatalf("read back of the hole: %d bytes, %v", n, err)
	}
	write(64, data(12454, 4))   // leaves [12518, 12544) unwritten
	write(12544, data(6000, 5)) // leaves nothing: up to 18544, then [18544, 18944) unwritten
	write(20704, data(4800, 6))
	write(0, data(64, 7))
	write(25640, data(1024, 8))
	if n, err := f.ReadAt(ctx, buf[:4096], 20480); n != 4096 || err != nil || !bytes.Equal(buf[:4096], want[20480:24576]) {
		t.Fatalf("read back of written data: %d bytes, %v", n, err)
	}
	if cb.read.Load() != 0 {
		t.Errorf("the writer's reads fetched %d bytes from the server", cb.read.Load())
	}
	if _, err := f.Stat(ctx); err != nil { // as close(2) does
		t.Fatal(err)
	}
	f.Close(ctx) //nolint:errcheck
	if got, _ := os.ReadFile(filepath.Join(remote, "a.o")); !bytes.Equal(got, want) {
		t.Fatal("the server's copy differs")
	}

	g, err := s.Open(ctx, "a.o", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close(ctx) //nolint:errcheck
	if _, ok := g.(*cachedFile); !ok {
		t.Errorf("the written file is opened on the server (%T), not from the cache", g)
	}
	fd, ok := g.(interface{ PassthroughFd() (int, bool) }).PassthroughFd()
	if !ok {
		t.Fatal("the written file is not offered for passthrough")
	}
	got := make([]byte, len(want)+10)
	if n, _ := syscall.Pread(fd, got, 0); n != len(want) || !bytes.Equal(got[:n], want) {
		t.Errorf("the cache file holds %d bytes that differ from the file", n)
	}
	if cb.read.Load() != 0 {
		t.Errorf("%d bytes fetched from the server", cb.read.Load())
	}
}

// A file held whole stays whole through a truncate up and a write far past its end
// (beyond what is held in memory): the bytes in between are zeros, and a data file
// left by a crash at the file's place never shows through them.
func TestHolesPastTheEnd(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		ops  func(f backend.File)
	}{
		{"truncate up", func(f backend.File) {
			f.WriteAt(ctx, []byte("head"), 0)                                   //nolint:errcheck
			f.SetAttr(ctx, backend.SetAttr{Valid: backend.SetSize, Size: 1000}) //nolint:errcheck
			f.WriteAt(ctx, []byte("tail"), 1100)                                //nolint:errcheck
		}},
		{"truncate up past memory", func(f backend.File) {
			f.WriteAt(ctx, []byte("head"), 0)                                                //nolint:errcheck
			f.SetAttr(ctx, backend.SetAttr{Valid: backend.SetSize, Size: memFileMax + 4096}) //nolint:errcheck
		}},
		{"write past memory", func(f backend.File) {
			f.WriteAt(ctx, []byte("far"), memFileMax+100) //nolint:errcheck
		}},
	} {
		c, s, cb, remote := setup(t, t.TempDir(), Options{})
		stale := s.st.dataPath("t")
		os.MkdirAll(filepath.Dir(stale), 0o700)                              //nolint:errcheck
		os.WriteFile(stale, bytes.Repeat([]byte{0xee}, 2*memFileMax), 0o600) //nolint:errcheck
		f, err := s.Open(ctx, "t", os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		tc.ops(f)
		f.Stat(ctx)  //nolint:errcheck // as close(2) does
		f.Close(ctx) //nolint:errcheck
		want, _ := os.ReadFile(filepath.Join(remote, "t"))
		if got := readAll(t, s, "t"); !bytes.Equal(got, want) {
			t.Errorf("%s: the cached file differs from the server's", tc.name)
		}
		if cb.read.Load() != 0 {
			t.Errorf("%s: %d bytes fetched from the server", tc.name, cb.read.Load())
		}
		c.Close()
	}
}

// An append lands at the server's end of the file, which another client may have
// moved: the appender's reads are not served from where the cache put the data.
func TestAppendReadsFromServer(t *testing.T) {
	c, s, _, remote := setup(t, t.TempDir(), Options{})
	defer c.Close()
	ctx := context.Background()
	p := filepath.Join(remote, "log")
	os.WriteFile(p, []byte("abc"), 0o644)        //nolint:errcheck
	os.Chtimes(p, time.Now(), time.Unix(1e9, 0)) //nolint:errcheck
	readAll(t, s, "log")                         // cached whole
	f, err := s.Open(ctx, "log", os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close(ctx) //nolint:errcheck
	other, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	other.Write([]byte("XYZ")) //nolint:errcheck // another client appends
	other.Close()
	if _, err := f.WriteAt(ctx, []byte("def"), 3); err != nil { // the kernel's idea of the end
		t.Fatal(err)
	}
	buf := make([]byte, 9)
	n, _ := f.ReadAt(ctx, buf, 0)
	want, _ := os.ReadFile(p)
	if !bytes.Equal(buf[:n], want[:n]) {
		t.Errorf("the appender read %q; the server holds %q", buf[:n], want)
	}
}

// residentPages counts the pages of the file at p that are in the page cache.
func residentPages(t *testing.T, p string) int {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m) //nolint:errcheck
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestBigDataFilesLeaveThePageCache: once synced, the data file of a big cached file
// leaves the page cache (the mount's own pages hold what is being read; a second copy
// doubled the memory of a cold read), and reads from the cache still give the data.
// A small file's stay, and so do the pages a read from the cache brings in.
func TestBigDataFilesLeaveThePageCache(t *testing.T) {
	dir := t.TempDir()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil || fs.Type == unix.TMPFS_MAGIC {
		t.Skip("the page cache of tmpfs is its storage")
	}
	c, s, cb, remote := setup(t, dir, Options{})
	defer c.Close()
	big, small := data(dropPagesMin+1<<20, 3), data(1<<20, 4)
	for name, b := range map[string][]byte{"big": big, "small": small} {
		os.WriteFile(filepath.Join(remote, name), b, 0o644)                    //nolint:errcheck
		os.Chtimes(filepath.Join(remote, name), time.Now(), time.Unix(1e9, 0)) //nolint:errcheck // not racy
		readAll(t, s, name)
	}
	st := c.Stores()[0]
	st.flush()
	if n := residentPages(t, st.dataPath("big")); n > 0 {
		t.Errorf("%d pages of the big file's synced data file are still in the page cache", n)
	}
	if n := residentPages(t, st.dataPath("small")); n == 0 {
		t.Error("the small file's data file left the page cache")
	}
	// Read again from the cache, through a handle kept open while a record due for
	// a commit without new data (its last use, refreshed once a minute) is flushed:
	// the pages the read brought in stay.
	before := cb.read.Load()
	ctx := context.Background()
	f, err := s.Open(ctx, "big", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close(ctx) //nolint:errcheck
	got := make([]byte, len(big))
	if n, err := f.ReadAt(ctx, got, 0); n != len(big) || !bytes.Equal(got, big) {
		t.Fatalf("the big file read from the cache differs (%d bytes, %v)", n, err)
	}
	if cb.read.Load() != before {
		t.Errorf("the big file was fetched again (%d bytes)", cb.read.Load()-before)
	}
	st.mu.Lock()
	e := st.entries["big"]
	st.mu.Unlock()
	e.mu.Lock()
	e.dirty = true
	e.mu.Unlock()
	st.flush()
	if n := residentPages(t, st.dataPath("big")); n == 0 {
		t.Error("the pages a read from the cache brought in were dropped: a second read would go to the disk")
	}
}

// TestSmallFilesStoredInline: a whole small file's bytes are committed into the
// database with its record — no data file — read back from there after a remount, and
// follow every change: a write keeps it inline, growing past inlineMax moves it to a
// data file, an unlink or an eviction deletes its bytes with its record.
func TestSmallFilesStoredInline(t *testing.T) {
	dir := t.TempDir()
	c, s, _, remote := setup(t, dir, Options{})
	ctx := context.Background()
	old := func(name string) { // not racy: committed at the next flush
		os.Chtimes(filepath.Join(remote, name), time.Now(), time.Unix(1e9, 0)) //nolint:errcheck
	}
	want := data(10<<10, 9)
	for _, name := range []string{"s", "t", "u"} {
		os.WriteFile(filepath.Join(remote, name), want, 0o644) //nolint:errcheck
		old(name)
		readAll(t, s, name)
	}
	s.st.flush()
	for _, name := range []string{"s", "t", "u"} {
		if _, err := os.Stat(s.st.dataPath(name)); err == nil {
			t.Errorf("%s: a data file was made for a small file", name)
		}
	}
	if n := s.st.inline.Load(); n != 3*10<<10 {
		t.Errorf("%d bytes stored inline, want %d", n, 3*10<<10)
	}
	if n := s.st.c.memUsed.Load(); n != 0 {
		t.Errorf("%d bytes still held in memory after the commit", n)
	}
	c.Close()

	c, s, cb, _ := setupOn(t, dir, remote, Options{})
	defer c.Close()
	if got := readAll(t, s, "s"); !bytes.Equal(got, want) || cb.read.Load() != 0 {
		t.Fatalf("after a remount: read %d bytes, %d of them from the server", len(got), cb.read.Load())
	}
	write := func(name string, p []byte, off int64) {
		t.Helper()
		f, err := s.Open(ctx, name, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(ctx, p, off); err != nil {
			t.Fatal(err)
		}
		old(name)
		f.Stat(ctx)  //nolint:errcheck // as fusefs does at close
		f.Close(ctx) //nolint:errcheck
		s.st.flush()
	}
	// A write over part of it: the rest comes from the database, the whole stays inline.
	write("s", []byte("hello"), 100)
	copy(want[100:], "hello")
	if got := readAll(t, s, "s"); !bytes.Equal(got, want) || cb.read.Load() != 0 {
		t.Fatalf("after a write: %d bytes from the server, content equal: %v", cb.read.Load(), bytes.Equal(got, want))
	}
	if _, err := os.Stat(s.st.dataPath("s")); err == nil {
		t.Error("a write made a data file for a file still small")
	}
	// Grown past inlineMax: a data file, and the database's copy goes.
	big := data(inlineMax+1, 10)
	write("t", big, 0)
	if _, err := os.Stat(s.st.dataPath("t")); err != nil {
		t.Errorf("grown past inlineMax, no data file: %v", err)
	}
	if got := readAll(t, s, "t"); !bytes.Equal(got, big) || cb.read.Load() != 0 {
		t.Fatal("grown file reads wrong or from the server")
	}
	if err := s.Unlink(ctx, "u"); err != nil {
		t.Fatal(err)
	}
	s.st.flush()
	if n := s.st.inline.Load(); n != 10<<10 {
		t.Errorf("%d bytes stored inline after growing one file and unlinking another, want %d", n, 10<<10)
	}
	if !s.st.evictOne("s") || s.st.inline.Load() != 0 {
		t.Errorf("evicted: %d bytes still stored inline", s.st.inline.Load())
	}
	if got := readAll(t, s, "s"); !bytes.Equal(got, want) || cb.read.Load() != int64(len(want)) {
		t.Fatal("after the eviction, not read again from the server")
	}
}

// TestCommitInFlightKeepsQueue: while a commit is writing the database (its queue taken
// out, the transaction not done: long under load, behind the data files' syncs), a
// load still sees the queued changes, and a subtree forgotten meanwhile does not come
// back when the commit lands. Loading the database's old value there answered a
// listing forgotten by a rename through the mount (seen in the namespace test under
// CPU load).
func TestCommitInFlightKeepsQueue(t *testing.T) {
	c, s, _, _ := setup(t, t.TempDir(), Options{})
	defer c.Close()
	st := s.Store()
	old := []backend.Entry{{Name: "old"}}
	st.SaveListing("a", old, time.Now())
	st.SaveListing("b", old, time.Now())
	st.flush()
	st.ForgetListing("a")                  // queued: the commit below deletes it
	st.SaveListing("d/e", old, time.Now()) // queued: the commit below puts it

	tx, done := commitHeld(t, st)
	if _, _, ok := st.LoadListing("a"); ok {
		t.Error("a listing forgotten before the commit was loaded while it ran")
	}
	if _, _, ok := st.LoadListing("d/e"); !ok {
		t.Error("a listing saved before the commit was missing while it ran")
	}
	st.ForgetTree("d")
	st.ForgetListing("b")
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	<-done
	st.flush()
	for _, p := range []string{"a", "b", "d/e"} {
		if _, _, ok := st.LoadListing(p); ok {
			t.Errorf("listing of %s loaded after it was forgotten", p)
		}
	}
}

// TestForgetTreeAcrossCommit: a commit that lands between ForgetTree's scan of the
// database and its look at the queues (its values are then in neither) makes it scan
// again.
func TestForgetTreeAcrossCommit(t *testing.T) {
	c, s, _, _ := setup(t, t.TempDir(), Options{})
	defer c.Close()
	st := s.Store()
	st.SaveListing("d/e", []backend.Entry{{Name: "old"}}, time.Now())
	tx, done := commitHeld(t, st)
	scans := 0
	st.forgetScanned = func() {
		scans++
		if scans == 1 {
			if err := tx.Rollback(); err != nil {
				t.Error(err)
			}
			<-done
		}
	}
	st.ForgetTree("d")
	st.forgetScanned = nil
	if scans != 2 {
		t.Errorf("ForgetTree scanned %d times, want 2 (again after the commit)", scans)
	}
	st.flush()
	if _, _, ok := st.LoadListing("d/e"); ok {
		t.Error("a listing committed during ForgetTree's scan outlived it")
	}
}

// commitHeld starts a commit of st and returns once it has taken its queue: it then
// waits for the database's writer lock, held by the transaction returned, until that
// is rolled back; done is closed when the commit is over.
func commitHeld(t *testing.T, st *Store) (tx *bolt.Tx, done chan struct{}) {
	t.Helper()
	tx, err := st.db.Begin(true)
	if err != nil {
		t.Fatal(err)
	}
	done = make(chan struct{})
	go func() {
		defer close(done)
		st.flush()
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		st.mu.Lock()
		taken := st.committing[metaDirs].len() > 0
		st.mu.Unlock()
		if taken {
			return tx, done
		}
		if time.Now().After(deadline) {
			tx.Rollback() //nolint:errcheck // failing anyway
			t.Fatal("the commit never took its queue")
		}
	}
}

// TestClearDuringCommit: what a commit writing when the cache is cleared stores does
// not outlive the clear, whichever transaction lands first.
func TestClearDuringCommit(t *testing.T) {
	c, s, _, _ := setup(t, t.TempDir(), Options{})
	defer c.Close()
	st := s.Store()
	st.SaveListing("c", []backend.Entry{{Name: "old"}}, time.Now())
	tx, done := commitHeld(t, st)
	cleared := make(chan error)
	go func() { cleared <- st.Clear() }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		st.mu.Lock()
		_, queued := st.saves[metaDirs].get("c")
		st.mu.Unlock()
		if queued {
			break
		}
		if time.Now().After(deadline) {
			tx.Rollback() //nolint:errcheck // failing anyway; the commit and the clear go on
			<-done
			<-cleared
			t.Fatal("the clear never queued the deletion of what the commit is writing")
		}
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	<-done
	if err := <-cleared; err != nil {
		t.Fatal(err)
	}
	st.flush()
	if _, _, ok := st.LoadListing("c"); ok {
		t.Error("a listing committed while the cache was cleared outlived the clear")
	}
}

// TestRequeueUnderNewer: the changes of a commit that failed are queued again, except
// where a newer change to the same key was queued since.
func TestRequeueUnderNewer(t *testing.T) {
	failed := newMetaSaves()
	failed[metaDirs].set("a", []byte("old a"))
	failed[metaDirs].set("b", []byte("old b"))
	failed[metaDirs].forget("c")
	failed[metaDirs].forget("d")
	now := newMetaSaves()
	now[metaDirs].forget("a")
	now[metaDirs].set("c", []byte("new c"))
	now.requeue(failed)
	for p, want := range map[string]string{"a": "", "b": "old b", "c": "new c", "d": ""} {
		v, queued := now[metaDirs].get(p)
		if !queued || string(v) != want {
			t.Errorf("%s: queued %v %q, want %q", p, queued, v, want)
		}
	}
}

// TestOwnTimesChangeOpensAtOnce: after muxfs changes by path the times of a file the
// cache holds whole (rsync -a, touch), the next open goes to the server without first
// asking for the file's attributes: the cache holds another version. Both with the
// entry still in use (dirty, before its commit) and with its record alone.
func TestOwnTimesChangeOpensAtOnce(t *testing.T) {
	ctx := context.Background()
	for _, committed := range []bool{false, true} {
		t.Run(fmt.Sprintf("committed=%v", committed), func(t *testing.T) {
			c, s, cb, remote := setup(t, t.TempDir(), Options{})
			defer c.Close()
			want := data(3000, 7)
			if err := os.WriteFile(filepath.Join(remote, "f"), want, 0o644); err != nil {
				t.Fatal(err)
			}
			readAll(t, s, "f")
			if committed {
				s.st.flush()
			}
			before, read := cb.lstats.Load(), cb.read.Load()
			if got := readAll(t, s, "f"); !bytes.Equal(got, want) || cb.lstats.Load() != before+1 || cb.read.Load() != read {
				t.Fatalf("held whole: want one stat and no read from the server, got %d and %d bytes",
					cb.lstats.Load()-before, cb.read.Load()-read)
			}
			old := time.Unix(1_500_000_000, 0)
			if _, err := s.SetAttr(ctx, "f", backend.SetAttr{Valid: backend.SetTimes, Atime: old, Mtime: old}); err != nil {
				t.Fatal(err)
			}
			before = cb.lstats.Load()
			if got := readAll(t, s, "f"); !bytes.Equal(got, want) {
				t.Fatal("read after the change differs")
			}
			if n := cb.lstats.Load() - before; n != 0 {
				t.Errorf("the open after the change asked for the attributes first (%d stats)", n)
			}
		})
	}
}
