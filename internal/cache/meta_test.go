package cache

import (
	"context"
	"fmt"
	"os"
	"path"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/muxfs/muxfs/internal/backend"
)

// counting is a local backend that counts the requests reaching it.
type counting struct {
	backend.Backend
	lstats, readdirs, readlinks atomic.Int64
}

func (c *counting) Readlink(ctx context.Context, p string) (string, error) {
	c.readlinks.Add(1)
	return c.Backend.Readlink(ctx, p)
}

func (c *counting) Lstat(ctx context.Context, p string) (backend.Attr, error) {
	c.lstats.Add(1)
	return c.Backend.Lstat(ctx, p)
}

func (c *counting) ReadDir(ctx context.Context, p string) ([]backend.Entry, error) {
	c.readdirs.Add(1)
	return c.Backend.ReadDir(ctx, p)
}

func newSource(t *testing.T, ttl time.Duration, pf *Prefetcher) (*Source, *counting, string) {
	t.Helper()
	dir := t.TempDir()
	l, err := backend.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	c := &counting{Backend: l}
	return Wrap(c, 0, NewMeta(ttl), pf), c, dir
}

func TestHitsAndMissesFromListing(t *testing.T) {
	s, c, dir := newSource(t, time.Minute, nil)
	ctx := context.Background()
	os.WriteFile(dir+"/a", []byte("a"), 0o644) //nolint:errcheck
	if _, err := s.ReadDir(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadDir(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if a, err := s.Lstat(ctx, "a"); err != nil || a.Size != 1 {
		t.Fatalf("lstat from listing: %+v %v", a, err)
	}
	if _, err := s.Lstat(ctx, "missing.h"); err != syscall.ENOENT {
		t.Fatalf("a name absent from a fresh listing: %v, want ENOENT", err)
	}
	if c.readdirs.Load() != 1 || c.lstats.Load() != 0 {
		t.Errorf("requests reaching the source: %d readdir, %d lstat; want 1 and 0", c.readdirs.Load(), c.lstats.Load())
	}
}

func TestChangesInvalidate(t *testing.T) {
	s, _, dir := newSource(t, time.Minute, nil)
	ctx := context.Background()
	s.ReadDir(ctx, "") //nolint:errcheck
	f, err := s.Open(ctx, "new", os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lstat(ctx, "new"); err != nil {
		t.Errorf("a file created through the cache must be visible at once: %v", err)
	}
	f.WriteAt(ctx, []byte("12345"), 0) //nolint:errcheck
	if a, _ := s.Lstat(ctx, "new"); a.Size != 5 {
		t.Errorf("size after a write: %d", a.Size)
	}
	f.Close(ctx) //nolint:errcheck
	if _, err := s.Mkdir(ctx, "d", 0o755); err != nil {
		t.Fatal(err)
	}
	s.ReadDir(ctx, "d")                  //nolint:errcheck
	os.WriteFile(dir+"/d/x", nil, 0o644) //nolint:errcheck
	if err := s.Rename(ctx, "d", "e"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lstat(ctx, "e/x"); err != nil {
		t.Errorf("after renaming a directory its old listing must not answer: %v", err)
	}
	if _, err := s.Lstat(ctx, "d"); backend.ToErrno(err) != syscall.ENOENT {
		t.Errorf("the old name after rename: %v", err)
	}
	// A change behind the cache's back is seen after Refresh.
	s.ReadDir(ctx, "")                       //nolint:errcheck
	os.WriteFile(dir+"/outside", nil, 0o644) //nolint:errcheck
	if _, err := s.Lstat(ctx, "outside"); err != syscall.ENOENT {
		t.Fatalf("expected the cached listing to hide a change made elsewhere, got %v", err)
	}
	s.Refresh("")
	if _, err := s.Lstat(ctx, "outside"); err != nil {
		t.Errorf("after refresh: %v", err)
	}
}

// TestSetAttrCachesResult: a change by path keeps the attributes it left, so the
// stat that follows it (the kernel's answer to the change, tar's) asks nothing; it and
// a mkdir keep their directory's listing, so an untar's next lookups there ask
// nothing either.
func TestSetAttrCachesResult(t *testing.T) {
	s, c, dir := newSource(t, time.Minute, nil)
	ctx := context.Background()
	os.Mkdir(dir+"/d", 0o755) //nolint:errcheck
	if _, err := s.ReadDir(ctx, ""); err != nil {
		t.Fatal(err)
	}
	before := c.lstats.Load() + c.readdirs.Load()
	when := time.Unix(1e9, 0)
	if _, err := s.SetAttr(ctx, "d", backend.SetAttr{Valid: backend.SetMode | backend.SetTimes, Mode: 0o700, Atime: when, Mtime: when}); err != nil {
		t.Fatal(err)
	}
	a, err := s.Lstat(ctx, "d")
	if err != nil || a.Mode&0o7777 != 0o700 || !a.Mtime.Equal(when) {
		t.Fatalf("stat after the change: %+v %v", a, err)
	}
	// The directory's listing still answers for the names not there, and a directory
	// made beside keeps it too, with the new one in it.
	if _, err := s.Lstat(ctx, "next"); err != syscall.ENOENT {
		t.Errorf("a missing name after a change beside it: %v", err)
	}
	if _, err := s.Mkdir(ctx, "d2", 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lstat(ctx, "next"); err != syscall.ENOENT {
		t.Errorf("a missing name after a mkdir beside it: %v", err)
	}
	if ents, err := s.ReadDir(ctx, ""); err != nil || len(ents) != 2 {
		t.Errorf("listing after a mkdir: %v %v", ents, err)
	}
	if _, err := s.Lstat(ctx, "d2/x"); err != syscall.ENOENT {
		t.Errorf("a name in a directory just made: %v", err)
	}
	if n := c.lstats.Load() + c.readdirs.Load() - before; n != 0 {
		t.Errorf("the stats after a change asked the source %d times", n)
	}
	// A change that fails may have been made in part: nothing of p is kept.
	if _, err := s.SetAttr(ctx, "gone", backend.SetAttr{Valid: backend.SetMode, Mode: 0o700}); err == nil {
		t.Fatal("a change of a missing name succeeded")
	}
}

func TestExpiry(t *testing.T) {
	s, c, dir := newSource(t, 50*time.Millisecond, nil)
	ctx := context.Background()
	s.Lstat(ctx, "late")                  //nolint:errcheck
	os.WriteFile(dir+"/late", nil, 0o644) //nolint:errcheck
	if _, err := s.Lstat(ctx, "late"); err != syscall.ENOENT {
		t.Fatal("a cached miss should hold within the TTL")
	}
	time.Sleep(80 * time.Millisecond)
	if _, err := s.Lstat(ctx, "late"); err != nil {
		t.Errorf("after the TTL: %v", err)
	}
	if c.lstats.Load() != 2 {
		t.Errorf("lstats: %d", c.lstats.Load())
	}
}

// TestSymlinkTargets: a symlink's target is answered from the cache for LinkTTL;
// a change made through the cache (a new symlink, unlink, rename) or a refresh drops
// it at once, and a change on the server shows once LinkTTL has passed.
func TestSymlinkTargets(t *testing.T) {
	s, c, dir := newSource(t, time.Minute, nil)
	ctx := context.Background()
	readlink := func(p, want string) {
		t.Helper()
		if got, err := s.Readlink(ctx, p); err != nil || got != want {
			t.Fatalf("readlink %s: %q %v, want %q", p, got, err, want)
		}
	}
	os.Mkdir(dir+"/d", 0o755)     //nolint:errcheck
	os.Symlink("one", dir+"/d/l") //nolint:errcheck
	readlink("d/l", "one")
	readlink("d/l", "one")
	if n := c.readlinks.Load(); n != 1 {
		t.Fatalf("readlinks reaching the source: %d, want 1", n)
	}
	// Replaced on the server: the cached target holds until a refresh.
	os.Remove(dir + "/d/l")       //nolint:errcheck
	os.Symlink("two", dir+"/d/l") //nolint:errcheck
	readlink("d/l", "one")
	s.Refresh("d")
	readlink("d/l", "two")
	// Changes through the cache are seen at once.
	if err := s.Unlink(ctx, "d/l"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Symlink(ctx, "three", "d/l"); err != nil {
		t.Fatal(err)
	}
	readlink("d/l", "three")
	if err := s.Rename(ctx, "d", "e"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Readlink(ctx, "d/l"); err == nil {
		t.Error("readlink of a renamed-away symlink succeeded")
	}
	readlink("e/l", "three")
	if _, err := s.Symlink(ctx, "four", "e/m"); err != nil {
		t.Fatal(err)
	}
	if err := s.Rename(ctx, "e/m", "e/l"); err != nil {
		t.Fatal(err)
	}
	readlink("e/l", "four")

	// LinkTTL on its own.
	s.meta.LinkTTL = 50 * time.Millisecond
	os.Symlink("five", dir+"/n") //nolint:errcheck
	readlink("n", "five")
	os.Remove(dir + "/n")       //nolint:errcheck
	os.Symlink("six", dir+"/n") //nolint:errcheck
	readlink("n", "five")
	time.Sleep(80 * time.Millisecond)
	readlink("n", "six")

	s.Refresh("")
	if len(s.meta.links) != 0 || s.meta.entries != 0 || len(s.meta.kids) != 0 {
		t.Errorf("left after a refresh of everything: %d links, count %d, index %v", len(s.meta.links), s.meta.entries, s.meta.kids)
	}
}

// TestStaleAnswerNotStored: an answer fetched while a change was made must not be
// cached, since it may predate the change.
func TestStaleAnswerNotStored(t *testing.T) {
	m := NewMeta(time.Minute)
	st := m.stamp(0, "dir")
	m.Invalidate(0, "dir/new") // a create in dir while its listing was being fetched
	m.putListing(0, "dir", nil, time.Now(), time.Now(), st)
	if _, _, ok := m.listing(0, "dir", time.Now()); ok {
		t.Error("a listing fetched across a change was stored")
	}
}

func TestTrim(t *testing.T) {
	m := NewMeta(time.Minute)
	m.MaxEntries = 100
	now := time.Now()
	for i := 0; i < 1000; i++ {
		m.putAttr(0, string(rune('a'+i%26))+string(rune(i)), backend.Attr{}, false, now, m.stamp(0, string(rune('a'+i%26))+string(rune(i))))
	}
	if m.entries > 100 || len(m.attrs) > 100 {
		t.Errorf("cache grew to %d entries (limit 100)", len(m.attrs))
	}
	for i := 0; i < 1000; i++ {
		p := fmt.Sprintf("link%d", i)
		m.putLink(0, p, "target", now, m.stamp(0, p))
	}
	if m.entries > 100 || len(m.attrs)+len(m.links) > 100 {
		t.Errorf("cache grew to %d entries with symlinks (limit 100)", len(m.attrs)+len(m.links))
	}
}

func TestPrefetch(t *testing.T) {
	s, c, dir := newSource(t, time.Minute, NewPrefetcher(4))
	ctx := context.Background()
	for _, d := range []string{"a", "b", "c"} {
		os.MkdirAll(dir+"/"+d+"/sub", 0o755) //nolint:errcheck
	}
	s.ReadDir(ctx, "") //nolint:errcheck
	deadline := time.Now().Add(5 * time.Second)
	for c.readdirs.Load() < 4 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	before := c.readdirs.Load()
	for _, d := range []string{"a", "b", "c"} {
		if _, err := s.ReadDir(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if before < 4 {
		t.Errorf("subdirectories were not listed ahead: %d listings", before)
	}
}

// TestPrefetchDeeperWhenFollowed: listing a directory lists one level below it; once
// the walk asks for a listing fetched ahead, the prefetch goes maxDepth levels below
// the walk, and no further.
func TestPrefetchDeeperWhenFollowed(t *testing.T) {
	s, c, dir := newSource(t, time.Minute, NewPrefetcher(4))
	ctx := context.Background()
	os.MkdirAll(dir+"/a/1/2/3/4/5/6/7/8/9/10", 0o755) //nolint:errcheck
	settle := func() int64 {
		for last := int64(-1); ; {
			time.Sleep(100 * time.Millisecond)
			n := c.readdirs.Load()
			if n == last {
				return n
			}
			last = n
		}
	}
	s.ReadDir(ctx, "") //nolint:errcheck
	if n := settle(); n != 2 {
		t.Fatalf("a listing nobody follows: %d listings, want 2 (the root and a)", n)
	}
	s.ReadDir(ctx, "a") //nolint:errcheck // fetched ahead: the walk follows
	// maxDepth levels below a: down to a/1/…/8, not a/1/…/9.
	if n := settle(); n != 2+maxDepth {
		t.Errorf("a followed walk: %d listings, want %d (down to a/1/…/%d)", n, 2+maxDepth, maxDepth)
	}
}

// memPersist is an in-memory Persister.
type memPersist struct {
	mu    sync.Mutex
	dirs  map[string][]backend.Entry
	at    map[string]time.Time
	attrs map[string]backend.Attr
	links map[string]string
}

func newMemPersist() *memPersist {
	return &memPersist{dirs: map[string][]backend.Entry{}, at: map[string]time.Time{}, attrs: map[string]backend.Attr{},
		links: map[string]string{}}
}

func (m *memPersist) SaveListing(p string, list []backend.Entry, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dirs[p], m.at[p] = list, at
}

func (m *memPersist) LoadListing(p string) ([]backend.Entry, time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.dirs[p]
	return l, m.at[p], ok
}

func (m *memPersist) SaveAttr(p string, a backend.Attr) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.attrs[p] = a
}

func (m *memPersist) LoadAttr(p string) (backend.Attr, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a, ok := m.attrs[p]
	return a, ok
}

func (m *memPersist) SaveLink(p, target string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.links[p] = target
}

func (m *memPersist) LoadLink(p string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.links[p]
	return t, ok
}

func (m *memPersist) ForgetListings(dirs ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range dirs {
		delete(m.dirs, d)
		delete(m.attrs, d)
		delete(m.links, d)
	}
}

func (m *memPersist) ForgetListing(d string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.dirs, d)
}

func (m *memPersist) ForgetTree(string) {}

func (m *memPersist) Listed(string, []backend.Entry) {}

// TestStoredListings: a listing stored by an earlier mount answers at once, without a
// request; one this mount fetched itself is fetched again once it is older than the
// TTL (answered meanwhile from the store, the new answer arriving behind it). Which
// listings came from the store is reported to the caller.
func TestStoredListings(t *testing.T) {
	ctx := context.Background()
	store := newMemPersist()
	s, c, dir := newSource(t, 50*time.Millisecond, nil)
	s.SetPersist(store, func() bool { return false })
	os.WriteFile(dir+"/a", []byte("a"), 0o644) //nolint:errcheck
	var fetched backend.ListingExpiry
	if _, err := s.ReadDir(backend.WithListingExpiry(ctx, &fetched), ""); err != nil || c.readdirs.Load() != 1 {
		t.Fatalf("first listing: %v, %d requests", err, c.readdirs.Load())
	}
	if fetched.Stored() {
		t.Error("a listing fetched from the server is reported as from the store")
	}
	time.Sleep(80 * time.Millisecond) // past the TTL
	if list, err := s.ReadDir(ctx, ""); err != nil || len(list) != 1 {
		t.Fatalf("stored listing: %v %v", list, err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for c.readdirs.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if c.readdirs.Load() < 2 {
		t.Error("an old listing fetched by this mount was not fetched again")
	}

	// A new mount over the same store: its first use needs no request.
	s2, c2, _ := newSource(t, time.Minute, nil)
	s2.SetPersist(store, func() bool { return false })
	var stored backend.ListingExpiry
	if list, err := s2.ReadDir(backend.WithListingExpiry(ctx, &stored), ""); err != nil || len(list) != 1 || c2.readdirs.Load() != 0 {
		t.Errorf("remounted: %v %v, %d requests", list, err, c2.readdirs.Load())
	}
	if !stored.Stored() {
		t.Error("a listing answered from the store is not reported as such (fusefs statting it after a remount slows the walk)")
	}
}

// TestWriteKeepsStoredDirectory: a create and a write through a handle drop the
// stored listing of the file's directory (it holds the file's old size) but not the
// directory's own attributes, which an offline mount needs to reach the directory at
// all.
func TestWriteKeepsStoredDirectory(t *testing.T) {
	ctx := context.Background()
	store := newMemPersist()
	s, _, dir := newSource(t, time.Minute, nil)
	s.SetPersist(store, func() bool { return false })
	os.Mkdir(dir+"/d", 0o755)                    //nolint:errcheck
	os.WriteFile(dir+"/d/f", []byte("a"), 0o644) //nolint:errcheck
	if _, err := s.Lstat(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadDir(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	for _, flags := range []int{os.O_WRONLY, os.O_WRONLY | os.O_CREATE | os.O_EXCL} {
		name := "d/f"
		if flags&os.O_CREATE != 0 {
			name = "d/new"
		}
		writeThrough(t, s, name, flags, "longer")
	}
	if _, ok := store.LoadAttr("d"); !ok {
		t.Error("the directory's stored attributes went with a write in it")
	}
	if _, _, ok := store.LoadListing("d"); ok {
		t.Error("the directory's stored listing, with the file's old size, is still there")
	}
}

// TestPrefetchFromStore: after a remount the listing prefetch loads what the store
// holds ahead of the walk, with no request to the source.
func TestPrefetchFromStore(t *testing.T) {
	ctx := context.Background()
	store := newMemPersist()
	s, _, dir := newSource(t, time.Minute, nil)
	s.SetPersist(store, func() bool { return false })
	for _, d := range []string{"a/1", "b/2", "c/3"} {
		os.MkdirAll(dir+"/"+d, 0o755) //nolint:errcheck
	}
	for _, d := range []string{"", "a", "b", "c", "a/1", "b/2", "c/3"} {
		if _, err := s.ReadDir(ctx, d); err != nil {
			t.Fatal(err)
		}
	}

	s2, c2, _ := newSource(t, time.Minute, NewPrefetcher(4))
	s2.SetPersist(store, func() bool { return false })
	s2.ReadDir(ctx, "") //nolint:errcheck // from the store
	s2.ReadDir(ctx, "") //nolint:errcheck // from memory: schedules the level below
	deadline := time.Now().Add(2 * time.Second)
	for {
		_, _, ok := s2.meta.listing(s2.id, "c", time.Now())
		if ok || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, d := range []string{"a", "b", "c"} {
		if _, _, ok := s2.meta.listing(s2.id, d, time.Now()); !ok {
			t.Errorf("%s was not loaded ahead of the walk", d)
		}
	}
	if n := c2.readdirs.Load(); n != 0 {
		t.Errorf("the prefetch asked the source for %d stored listings", n)
	}
}

// TestCreatedKeepsListings: a directory made through muxfs is known empty, a file
// created in it joins its listing, and a file being written is asked for again while
// the other names are still answered: an untar looks up its next names for free.
func TestCreatedKeepsListings(t *testing.T) {
	m := NewMeta(time.Minute)
	now := time.Now()
	m.MadeDir(0, "d", now)
	if _, found, ok := m.lookup(0, "d/a", now); !ok || found {
		t.Fatalf("a name in a directory just made: found %v, known %v; want a known miss", found, ok)
	}
	m.Created(0, "d/a", backend.Attr{Mode: 0o100600, Size: 0})
	if a, found, ok := m.lookup(0, "d/a", now); !ok || !found || a.Mode != 0o100600 {
		t.Fatalf("a file just created: %v %v %v", a, found, ok)
	}
	before, _, _ := m.listing(0, "d", now)
	m.Created(0, "d/b", backend.Attr{Mode: 0o100644})
	if len(before) != 1 {
		t.Errorf("a listing handed out changed under its holder: %d entries", len(before))
	}
	m.Dirtied(0, "d/a")
	if _, _, ok := m.lookup(0, "d/a", now); ok {
		t.Error("a file being written is still answered from the listing")
	}
	if _, found, ok := m.lookup(0, "d/c", now); !ok || found {
		t.Error("the other names of the directory are no longer answered")
	}
	if _, _, ok := m.listing(0, "d", now); ok {
		t.Error("a listing with a file being written is handed out whole")
	}
	m.Created(0, "d/a", backend.Attr{Mode: 0o100600, Size: 5})
	if a, found, ok := m.lookup(0, "d/a", now); !ok || !found || a.Size != 5 {
		t.Errorf("reopened for writing: %v %v %v", a, found, ok)
	}
}

// A symlink made through the cache joins its directory's listing with the attributes
// its creation returned, and its target is known: the lookups, the readlink and the
// listing that follow ask the source nothing.
func TestSymlinkKeepsListing(t *testing.T) {
	s, c, dir := newSource(t, time.Minute, nil)
	ctx := context.Background()
	os.WriteFile(dir+"/f", []byte("f"), 0o644) //nolint:errcheck
	if _, err := s.ReadDir(ctx, ""); err != nil {
		t.Fatal(err)
	}
	made, err := s.Symlink(ctx, "somewhere/else", "l")
	if err != nil {
		t.Fatal(err)
	}
	if made.Type() != syscall.S_IFLNK || made.Size != int64(len("somewhere/else")) {
		t.Errorf("symlink returned type %o size %d", made.Type(), made.Size)
	}
	lstats, readlinks := c.lstats.Load(), c.readlinks.Load()
	if a, err := s.Lstat(ctx, "l"); err != nil || a.Type() != syscall.S_IFLNK {
		t.Errorf("lstat of the new symlink: type %o, %v", a.Type(), err)
	}
	if _, err := s.Lstat(ctx, "missing"); backend.ToErrno(err) != syscall.ENOENT {
		t.Errorf("lstat of a missing name: %v", err)
	}
	if got, err := s.Readlink(ctx, "l"); err != nil || got != "somewhere/else" {
		t.Errorf("readlink of the new symlink: %q, %v", got, err)
	}
	if names := sortedNames(t, s, ""); names != "[f l]" {
		t.Errorf("listing after the symlink: %v", names)
	}
	if n, m, r := c.lstats.Load()-lstats, c.readlinks.Load()-readlinks, c.readdirs.Load(); n != 0 || m != 0 || r != 1 {
		t.Errorf("after the symlink, %d LSTATs, %d READLINKs and %d READDIRs reached the source; want 0, 0 and 1", n, m, r)
	}
}

// sortedNames lists dir through s and returns its names, sorted, as fmt prints them.
func sortedNames(t *testing.T, s *Source, dir string) string {
	t.Helper()
	got, err := s.ReadDir(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range got {
		names = append(names, e.Name)
	}
	slices.Sort(names)
	return fmt.Sprint(names)
}

// TestRemovalsKeepListings: an unlink, an rmdir and a rename through the cache keep
// their directories' listings, changed as the server's are, so the directory's other
// names (a build's after `make clean`, an rm -rf's) are still answered without a
// request; the old name of a directory renamed answers nothing below it.
func TestRemovalsKeepListings(t *testing.T) {
	s, c, dir := newSource(t, time.Minute, nil)
	ctx := context.Background()
	for _, f := range []string{"a", "b", "sub/x"} {
		os.MkdirAll(path.Dir(dir+"/"+f), 0o755)   //nolint:errcheck
		os.WriteFile(dir+"/"+f, []byte(f), 0o644) //nolint:errcheck
	}
	os.Mkdir(dir+"/empty", 0o755) //nolint:errcheck
	before, err := s.ReadDir(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	held := fmt.Sprint(before)
	s.ReadDir(ctx, "sub") //nolint:errcheck
	if err := s.Unlink(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Rmdir(ctx, "empty"); err != nil {
		t.Fatal(err)
	}
	if err := s.Rename(ctx, "b", "c"); err != nil {
		t.Fatal(err)
	}
	if err := s.Rename(ctx, "sub", "sub2"); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(before) != held {
		t.Errorf("a listing handed out changed under its holder: %v, was %v", before, held)
	}
	for name, want := range map[string]syscall.Errno{"a": syscall.ENOENT, "empty": syscall.ENOENT, "b": syscall.ENOENT, "c": 0, "sub": syscall.ENOENT, "sub2": 0, "missing": syscall.ENOENT} {
		a, err := s.Lstat(ctx, name)
		if backend.ToErrno(err) != want {
			t.Errorf("lstat %s: %v, want errno %d", name, err, want)
		}
		if name == "c" && a.Size != 1 {
			t.Errorf("the new name of b has size %d, want b's 1", a.Size)
		}
	}
	if n := c.lstats.Load(); n != 0 {
		t.Errorf("%d LSTATs reached the source; the listing answers every name", n)
	}
	if names := sortedNames(t, s, ""); names != "[c sub2]" || c.readdirs.Load() != 2 {
		t.Errorf("listing after the changes: %v after %d READDIRs; want [c sub2] from the cache (2)", names, c.readdirs.Load())
	}
	if _, err := s.Lstat(ctx, "sub2/x"); err != nil || c.lstats.Load() != 1 {
		t.Errorf("below the renamed directory: %v after %d LSTATs; want the source's answer", err, c.lstats.Load())
	}
	// An unlinked name of a file with other names: they lost a link.
	os.Link(dir+"/c", dir+"/c2") //nolint:errcheck
	s.Refresh("")
	s.ReadDir(ctx, "") //nolint:errcheck
	if err := s.Unlink(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if a, err := s.Lstat(ctx, "c2"); err != nil || a.Nlink != 1 {
		t.Errorf("the other name of a file unlinked: %+v, %v; want 1 link", a, err)
	}
	// The same for a file replaced by a rename.
	os.Link(dir+"/c2", dir+"/c3")              //nolint:errcheck
	os.WriteFile(dir+"/n", []byte("n"), 0o644) //nolint:errcheck
	s.Refresh("")
	s.ReadDir(ctx, "") //nolint:errcheck
	if err := s.Rename(ctx, "n", "c2"); err != nil {
		t.Fatal(err)
	}
	if a, err := s.Lstat(ctx, "c3"); err != nil || a.Nlink != 1 {
		t.Errorf("the other name of a file replaced by a rename: %+v, %v; want 1 link", a, err)
	}
}

// TestListingChangesCopyOnce: changing a cached listing copies it only if it has been
// handed out since it last changed, so filling a directory through muxfs costs time in
// proportion to its size, not to its square. Each copy of this listing is about a
// megabyte; copying it at each of 500 creates allocated half a gigabyte.
func TestListingChangesCopyOnce(t *testing.T) {
	m := NewMeta(time.Minute)
	now := time.Now()
	const n = 10_000
	list := make([]backend.Entry, n)
	for i := range list {
		list[i] = backend.Entry{Name: fmt.Sprint(i), Attr: backend.Attr{Mode: 0o100644}}
	}
	m.putListing(0, "d", list, now, now, m.stamp(0, "d"))
	m.Created(0, "d/0", backend.Attr{Mode: 0o100600})
	if list[0].Attr.Mode != 0o100644 {
		t.Fatal("the listing given to the cache changed under its holder")
	}
	held, _, _ := m.listing(0, "d", now)
	m.Removed(0, "d/1", false)
	if held[1].Name != "1" || len(held) != n {
		t.Fatal("a listing handed out changed under its holder")
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	start := ms.TotalAlloc
	for i := range 500 {
		m.Created(0, fmt.Sprintf("d/new%d", i), backend.Attr{Mode: 0o100644})
		m.Removed(0, fmt.Sprintf("d/%d", 2+i), false)
	}
	runtime.ReadMemStats(&ms)
	size := uint64(n) * uint64(unsafe.Sizeof(backend.Entry{}))
	if got := ms.TotalAlloc - start; got > 4*size {
		t.Errorf("1,000 changes to a %d-entry listing allocated %d bytes; a copy is %d", n, got, size)
	}
	got, _, _ := m.listing(0, "d", now)
	if len(got) != n-1 {
		t.Errorf("listing has %d entries, want %d", len(got), n-1)
	}
	for _, name := range []string{"0", "new499", "502"} {
		if _, found, ok := m.lookup(0, "d/"+name, now); !ok || !found {
			t.Errorf("%s missing from the listing", name)
		}
	}
	for _, name := range []string{"1", "501"} {
		if _, found, ok := m.lookup(0, "d/"+name, now); !ok || found {
			t.Errorf("%s removed but still listed", name)
		}
	}
}

// TestListingExpiryReported: a listing answered under backend.WithListingExpiry says
// when the cache stops trusting it — fetched now: a TTL from now; answered from
// memory later: still the fetch's expiry, not a fresh TTL.
func TestListingExpiryReported(t *testing.T) {
	s, _, _ := newSource(t, time.Minute, nil)
	before := time.Now()
	var e backend.ListingExpiry
	if _, err := s.ReadDir(backend.WithListingExpiry(context.Background(), &e), ""); err != nil {
		t.Fatal(err)
	}
	fetched := e.At()
	if fetched.Before(before.Add(time.Minute)) || fetched.After(time.Now().Add(time.Minute)) {
		t.Fatalf("expiry of a fetched listing: %v, want a minute after the fetch (%v)", fetched, before)
	}
	time.Sleep(50 * time.Millisecond)
	var again backend.ListingExpiry
	if _, err := s.ReadDir(backend.WithListingExpiry(context.Background(), &again), ""); err != nil {
		t.Fatal(err)
	}
	// (The fetch reports the time it started plus the TTL; the cache's own expiry
	// counts from a moment later.)
	if d := again.At().Sub(fetched); d < 0 || d > 5*time.Millisecond {
		t.Errorf("expiry of the cached listing: %v after the fetch's, want the fetch's", d)
	}
	if _, err := s.ReadDir(context.Background(), ""); err != nil {
		t.Errorf("without a collector: %v", err)
	}
}

// A directory made through the cache comes with its attributes: looking it up and
// listing it afterwards asks the source nothing.
func TestMkdirKeepsAttributes(t *testing.T) {
	s, c, _ := newSource(t, time.Minute, nil)
	ctx := context.Background()
	made, err := s.Mkdir(ctx, "m", 0o750)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Lstat(ctx, "m")
	if err != nil || !a.IsDir() || a.Mode&0o777 != made.Mode&0o777 || !a.Mtime.Equal(made.Mtime) {
		t.Errorf("lookup after mkdir: %+v, %v; mkdir answered %+v", a, err, made)
	}
	s.ReadDir(ctx, "m") //nolint:errcheck
	if n, m := c.lstats.Load(), c.readdirs.Load(); n != 0 || m != 0 {
		t.Errorf("after mkdir, %d LSTATs and %d READDIRs reached the source", n, m)
	}
}

func TestInvalidateTree(t *testing.T) {
	m := NewMeta(time.Minute)
	now := time.Now()
	put := func(src int, p string) { m.putAttr(src, p, backend.Attr{}, false, now, m.stamp(src, p)) }
	list := func(src int, p string) { m.putListing(src, p, []backend.Entry{{Name: "x"}}, now, now, m.stamp(src, p)) }
	for _, src := range []int{0, 1} {
		put(src, "p")
		list(src, "p")
		put(src, "p/a")
		list(src, "p/a")
		put(src, "p/a/b/c/d") // nothing cached at p/a/b or p/a/b/c
		list(src, "p/a/b/c")
		put(src, "p/ab") // shares p/a's prefix, not its subtree
		put(src, "q")
	}
	has := func(src int, p string) (attr, listing bool) {
		_, attr = m.attrs[key{src, p}]
		_, listing = m.dirs[key{src, p}]
		return
	}
	m.InvalidateTree(0, "p/a")
	for _, p := range []string{"p/a", "p/a/b/c/d", "p/a/b/c"} {
		if a, l := has(0, p); a || l {
			t.Errorf("%s still cached after its tree was dropped", p)
		}
		if a, l := has(1, p); !a && !l {
			t.Errorf("%s of the other source dropped", p)
		}
	}
	if a, l := has(0, "p"); !a || l {
		t.Errorf("parent: attributes kept %v (want true), listing kept %v (want false)", a, l)
	}
	if a, _ := has(0, "p/ab"); !a {
		t.Error("p/ab dropped with p/a")
	}
	m.InvalidateTree(-1, "")
	if len(m.attrs)+len(m.dirs) != 0 || m.entries != 0 {
		t.Errorf("left after dropping everything: %d attributes, %d listings, count %d", len(m.attrs), len(m.dirs), m.entries)
	}
	if len(m.kids) != 0 {
		t.Errorf("index not emptied: %v", m.kids)
	}
}

// BenchmarkRmdirInBigCache is an rmdir's invalidation with 200,000 entries cached
// elsewhere: it must not depend on them.
func BenchmarkRmdirInBigCache(b *testing.B) {
	m := NewMeta(time.Hour)
	now := time.Now()
	for i := 0; i < 200_000; i++ {
		p := fmt.Sprintf("big/d%d/f%d", i/100, i)
		m.putAttr(0, p, backend.Attr{}, false, now, m.stamp(0, p))
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p := fmt.Sprintf("gone/d%d", i)
		m.MadeDir(0, p, now)
		m.InvalidateTree(0, p)
	}
}

// BenchmarkCreateInBigDir is a create recorded in the listing of a directory that
// holds 100,000 names (a data set untarred through muxfs): it must not depend on them.
func BenchmarkCreateInBigDir(b *testing.B) {
	m := NewMeta(time.Hour)
	now := time.Now()
	m.MadeDir(0, "big", now)
	for i := 0; i < 100_000; i++ {
		m.Created(0, fmt.Sprintf("big/f%d", i), backend.Attr{Mode: 0o100644})
	}
	m.listing(0, "big", now) // handed out once: the next change copies it
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m.Created(0, fmt.Sprintf("big/new%d", i), backend.Attr{Mode: 0o100644})
	}
}

// trusting is a source that can open a file with no request (as the persistent cache
// does for a file it holds whole); it records the attributes it was vouched.
type trusting struct {
	*counting
	mu      sync.Mutex
	trusted map[string]backend.Attr
}

func (t *trusting) OpenTrusted(p string, a backend.Attr) (backend.File, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.trusted[p] = a
	return nil, false // as if not cached: the caller opens the file as usual
}

// TestNoCTO: with close-to-open off, a read-only open offers the source the attributes
// it gave within the TTL — never a stored listing's from an earlier mount, nor those of
// a file being written, nor anything with close-to-open on.
func TestNoCTO(t *testing.T) {
	ctx := context.Background()
	l, err := backend.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	src := &trusting{counting: &counting{Backend: l}, trusted: map[string]backend.Attr{}}
	store := newMemPersist()
	mount := func(noCTO bool) *Source {
		s := Wrap(src, 0, NewMeta(time.Minute), nil)
		s.SetPersist(store, func() bool { return false })
		s.SetNoCTO(noCTO)
		return s
	}
	offered := func(p string) (backend.Attr, bool) {
		src.mu.Lock()
		defer src.mu.Unlock()
		a, ok := src.trusted[p]
		delete(src.trusted, p)
		return a, ok
	}
	open := func(s *Source, p string, flags int) {
		t.Helper()
		f, err := s.Open(ctx, p, flags, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		f.Close(ctx) //nolint:errcheck
	}
	w := mount(true)
	open(w, "a", os.O_CREATE|os.O_WRONLY)
	open(w, "b", os.O_CREATE|os.O_WRONLY)
	if _, ok := offered("a"); ok {
		t.Error("an open for writing was offered trusted attributes")
	}
	s := mount(true)
	if _, err := s.ReadDir(ctx, ""); err != nil {
		t.Fatal(err)
	}
	open(s, "a", os.O_RDONLY)
	if a, ok := offered("a"); !ok || a.Type() != syscall.S_IFREG {
		t.Errorf("nocto, fresh listing: offered %v %+v", ok, a)
	}

	// A remount finds the listing stored an hour ago: answered at its first use, but
	// not trusted for an open. With nocto that open asks as usual and has the listing
	// fetched again behind it; the directory's next opens are then trusted. A walk
	// that only lists fetches nothing again.
	list, _, _ := store.LoadListing("")
	store.SaveListing("", list, time.Now().Add(-time.Hour))
	s = mount(true)
	readdirs := src.readdirs.Load()
	if _, err := s.ReadDir(ctx, ""); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if src.readdirs.Load() != readdirs {
		t.Error("a stored listing was fetched again with no open in its directory")
	}
	open(s, "a", os.O_RDONLY)
	if _, ok := offered("a"); ok {
		t.Error("attributes from a listing stored an hour ago were trusted")
	}
	for deadline := time.Now().Add(5 * time.Second); src.readdirs.Load() == readdirs; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("nocto: the old listing was not fetched again after an open in its directory")
		}
	}
	// The refetch lands in the cache just after the request returns.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, ok := s.meta.recent(0, "b", time.Now()); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the listing fetched again is not recent")
		}
	}
	lstats := src.lstats.Load()
	open(s, "b", os.O_RDONLY)
	if _, ok := offered("b"); !ok || src.lstats.Load() != lstats {
		t.Errorf("the next file of the directory listed again: offered %v, %d lstats", ok, src.lstats.Load()-lstats)
	}
	if src.readdirs.Load() != readdirs+1 {
		t.Errorf("%d listings fetched again, want 1", src.readdirs.Load()-readdirs)
	}
	// Being written through the mount: asked again.
	f, err := s.Open(ctx, "a", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(ctx, []byte("x"), 0) //nolint:errcheck
	open(s, "a", os.O_RDONLY)
	if _, ok := offered("a"); ok {
		t.Error("a file being written was opened on trusted attributes")
	}
	// Looked up after the write: the server's answer, which may predate writes the
	// mount has answered (write-behind). An open the mount says is of a file being
	// written (fusefs: another handle writes it) does not trust it.
	if _, err := s.Lstat(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	r, err := s.Open(backend.WithBeingWritten(ctx), "a", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	r.Close(ctx) //nolint:errcheck
	if _, ok := offered("a"); ok {
		t.Error("a file being written, looked up after its write, was opened on trusted attributes")
	}
	f.Close(ctx) //nolint:errcheck

	s = mount(false)
	s.ReadDir(ctx, "") //nolint:errcheck
	open(s, "a", os.O_RDONLY)
	if _, ok := offered("a"); ok {
		t.Error("close-to-open on, yet attributes were offered")
	}
}

// TestNoCTOWalkFetchesAhead: with nocto, while files are being opened, a walk that
// reaches a directory stored by an earlier mount has it fetched again and its
// subdirectories fetched ahead, so that the opens in them are trusted.
// storedTree makes files (with their directories) on a local source, and a cache in
// front of it with an in-memory persistent store.
func storedTree(t *testing.T, files ...string) (*trusting, *memPersist, *Source) {
	t.Helper()
	dir := t.TempDir()
	for _, f := range files {
		os.MkdirAll(path.Dir(dir+"/"+f), 0o755)   //nolint:errcheck
		os.WriteFile(dir+"/"+f, []byte(f), 0o644) //nolint:errcheck
	}
	l, err := backend.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	src := &trusting{counting: &counting{Backend: l}, trusted: map[string]backend.Attr{}}
	store := newMemPersist()
	s := Wrap(src, 0, NewMeta(time.Minute), nil)
	s.SetPersist(store, func() bool { return false })
	return src, store, s
}

func TestNoCTOWalkFetchesAhead(t *testing.T) {
	ctx := context.Background()
	src, store, s := storedTree(t, "top", "d/x", "d/e/y")
	for _, d := range []string{"", "d", "d/e"} {
		if _, err := s.ReadDir(ctx, d); err != nil {
			t.Fatal(err)
		}
		list, _, _ := store.LoadListing(d)
		store.SaveListing(d, list, time.Now().Add(-time.Hour))
	}

	s = Wrap(src, 0, NewMeta(time.Minute), NewPrefetcher(4))
	s.SetPersist(store, func() bool { return false })
	s.SetNoCTO(true)
	base := src.readdirs.Load()
	s.ReadDir(ctx, "") //nolint:errcheck // from the store
	f, err := s.Open(ctx, "top", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Close(ctx)        //nolint:errcheck
	s.ReadDir(ctx, "d") //nolint:errcheck // from the store, while opening files
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		_, ok := s.meta.recent(0, "d/e/y", time.Now())
		_, ok2 := s.meta.recent(0, "d/x", time.Now())
		if ok && ok2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("d and d/e not fetched again (%d listings fetched)", src.readdirs.Load()-base)
		}
	}
	if n := src.readdirs.Load() - base; n != 3 {
		t.Errorf("%d listings fetched, want 3 (the root after the open, d, and d/e ahead)", n)
	}
}

// TestNoCTOWalkLoadsYoungListings: while a walk opens files with close-to-open off, the
// prefetch loads a stored listing younger than the TTL (its opens may trust it) instead
// of fetching it again.
func TestNoCTOWalkLoadsYoungListings(t *testing.T) {
	ctx := context.Background()
	src, store, s := storedTree(t, "top", "d/x")
	if _, err := s.ReadDir(ctx, "d"); err != nil {
		t.Fatal(err)
	}

	s = Wrap(src, 0, NewMeta(time.Minute), NewPrefetcher(4))
	s.SetPersist(store, func() bool { return false })
	s.SetNoCTO(true)
	f, err := s.Open(ctx, "top", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Close(ctx) //nolint:errcheck
	base := src.readdirs.Load()
	if _, err := s.ReadDir(ctx, ""); err != nil { // not stored: fetched, d prefetched
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, ok := s.meta.recent(0, "d/x", time.Now()); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("d's stored listing not loaded ahead of the walk")
		}
	}
	if n := src.readdirs.Load() - base; n != 1 {
		t.Errorf("%d listings fetched, want 1 (the root; d is stored and young)", n)
	}
}

// TestSymlinkTargetsOffline: targets read while online are kept by the persistent
// store and answer an offline mount; a symlink changed through the mount is forgotten.
func TestSymlinkTargetsOffline(t *testing.T) {
	_, c, dir := newSource(t, time.Minute, nil)
	ctx := context.Background()
	store := newMemPersist()
	offline := false
	s := Wrap(c, 0, NewMeta(time.Minute), nil)
	s.SetPersist(store, func() bool { return offline })
	os.Symlink("target", dir+"/l") //nolint:errcheck
	os.Symlink("other", dir+"/m")  //nolint:errcheck
	for _, p := range []string{"l", "m"} {
		if _, err := s.Readlink(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := store.LoadLink("m"); !ok {
		t.Fatal("a target read online not stored")
	}
	if err := s.Unlink(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if _, ok := store.LoadLink("m"); ok {
		t.Error("an unlinked symlink's target still stored")
	}

	s = Wrap(c, 0, NewMeta(time.Minute), nil) // a remount, offline
	s.SetPersist(store, func() bool { return offline })
	offline = true
	before := c.readlinks.Load()
	if got, err := s.Readlink(ctx, "l"); err != nil || got != "target" {
		t.Errorf("offline readlink: %q %v", got, err)
	}
	if _, err := s.Readlink(ctx, "never-read"); backend.ToErrno(err) != syscall.EIO {
		t.Errorf("offline readlink of an uncached symlink: %v, want EIO", err)
	}
	if n := c.readlinks.Load() - before; n != 0 {
		t.Errorf("%d readlinks reached the source while offline", n)
	}
}

// gated lists directory path once, then holds that first answer until released.
type gated struct {
	backend.Backend
	path             string
	once             sync.Once
	entered, release chan struct{}
}

func (g *gated) ReadDir(ctx context.Context, p string) ([]backend.Entry, error) {
	list, err := g.Backend.ReadDir(ctx, p)
	if p == g.path {
		g.once.Do(func() {
			close(g.entered)
			<-g.release
		})
	}
	return list, err
}

// TestListingAfterOwnChange: a listing asked for after a change through the mount does
// not take the answer of a request sent before it (the prefetch listing ahead, under
// load), although concurrent fetches of a directory share one request: neither a name
// removed since, nor the failure to list a directory made since.
func TestListingAfterOwnChange(t *testing.T) {
	for _, c := range []struct {
		name, dir string
		change    func(s *Source) error
		check     func(list []backend.Entry, err error) string
	}{
		{"rmdir", "d", func(s *Source) error { return s.Rmdir(context.Background(), "d/x") },
			func(list []backend.Entry, err error) string {
				if err != nil || slices.ContainsFunc(list, func(e backend.Entry) bool { return e.Name == "x" }) {
					return fmt.Sprintf("%v %v, want a listing without x", list, err)
				}
				return ""
			}},
		// The namespace test's sequence: mkdir, then a file written in it, which
		// drops the directory's listing, so the next listing is fetched.
		{"mkdir", "n", func(s *Source) error {
			ctx := context.Background()
			if _, err := s.Mkdir(ctx, "n", 0o755); err != nil {
				return err
			}
			f, err := s.Open(ctx, "n/c", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
			if err != nil {
				return err
			}
			return f.Close(ctx)
		}, func(list []backend.Entry, err error) string {
			if err != nil || !slices.ContainsFunc(list, func(e backend.Entry) bool { return e.Name == "c" }) {
				return fmt.Sprintf("%v %v, want the new directory's listing", list, err)
			}
			return ""
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.MkdirAll(dir+"/d/x", 0o755); err != nil {
				t.Fatal(err)
			}
			l, err := backend.NewLocal(dir)
			if err != nil {
				t.Fatal(err)
			}
			g := &gated{Backend: l, path: c.dir, entered: make(chan struct{}), release: make(chan struct{})}
			s := Wrap(g, 0, NewMeta(time.Minute), nil)
			early := make(chan struct{})
			go func() {
				s.ReadDir(context.Background(), c.dir) //nolint:errcheck // sent before the change
				close(early)
			}()
			<-g.entered
			if err := c.change(s); err != nil {
				t.Fatal(err)
			}
			type answer struct {
				list []backend.Entry
				err  error
			}
			late := make(chan answer)
			go func() {
				list, err := s.ReadDir(context.Background(), c.dir) // joins the request in flight
				late <- answer{list, err}
			}()
			time.Sleep(100 * time.Millisecond)
			close(g.release)
			<-early
			if a := <-late; c.check(a.list, a.err) != "" {
				t.Errorf("listing %s after the %s: %s", c.dir, c.name, c.check(a.list, a.err))
			}
		})
	}
}

// racingPersist makes a change through the source while it stores, or loads, a listing
// of dir: the change runs at once, and the save or load goes on when the change is done
// or has waited 100 ms (it is held back until the copy is done, as it must be).
type racingPersist struct {
	*memPersist
	dir    string
	change func()
	once   sync.Once
	done   chan struct{}
}

func (r *racingPersist) race(p string) {
	if p != r.dir {
		return
	}
	r.once.Do(func() {
		r.done = make(chan struct{})
		go func() {
			defer close(r.done)
			r.change()
		}()
		select {
		case <-r.done:
		case <-time.After(100 * time.Millisecond):
		}
	})
}

func (r *racingPersist) SaveListing(p string, list []backend.Entry, at time.Time) {
	r.race(p)
	r.memPersist.SaveListing(p, list, at)
}

func (r *racingPersist) SaveAttr(p string, a backend.Attr) {
	r.race(p)
	r.memPersist.SaveAttr(p, a)
}

func (r *racingPersist) SaveLink(p, target string) {
	r.race(p)
	r.memPersist.SaveLink(p, target)
}

// wait waits for the change to be done.
func (r *racingPersist) wait() {
	if r.done != nil {
		<-r.done
	}
}

// racing returns a racingPersist that makes change when dir is stored (or loaded,
// wrapped in racingLoad); a failed change fails t.
func racing(t *testing.T, dir string, change func() error) *racingPersist {
	r := &racingPersist{memPersist: newMemPersist(), dir: dir}
	r.change = func() {
		if err := change(); err != nil {
			t.Error(err)
		}
	}
	return r
}

// racingLoad is racingPersist on a load: what it loads was read before the change.
type racingLoad struct{ *racingPersist }

func (r *racingLoad) LoadListing(p string) ([]backend.Entry, time.Time, bool) {
	list, at, ok := r.memPersist.LoadListing(p)
	r.race(p)
	return list, at, ok
}

func hasName(list []backend.Entry, name string) bool {
	return slices.ContainsFunc(list, func(e backend.Entry) bool { return e.Name == name })
}

// TestStoredListingAfterRacingChange: a listing fetched before a change through the
// mount is not left in the persistent cache when the change comes between the check
// that nothing changed and the save: the next mount (or the memory copy's expiry)
// would answer it.
func TestStoredListingAfterRacingChange(t *testing.T) {
	s, _, dir := newSource(t, time.Minute, nil)
	ctx := context.Background()
	if err := os.MkdirAll(dir+"/d/x", 0o755); err != nil {
		t.Fatal(err)
	}
	p := racing(t, "d", func() error { return s.Rmdir(ctx, "d/x") })
	s.SetPersist(p, func() bool { return false })
	if _, err := s.ReadDir(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	p.wait()
	if list, _, ok := p.LoadListing("d"); ok && hasName(list, "x") {
		t.Errorf("the stored listing of d still has x, removed through the mount: %v", list)
	}
}

// TestStoredAfterRacingRemoval: attributes (of a lookup, of an open) and a symlink
// target asked of the source before a removal through the mount are not stored after
// the removal forgot them: an offline mount answers from them, and would show the
// name still there.
func TestStoredAfterRacingRemoval(t *testing.T) {
	ctx := context.Background()
	file := func(p string) error { return os.WriteFile(p, []byte("x"), 0o644) }
	attrKept := func(p *memPersist) bool { _, ok := p.LoadAttr("x"); return ok }
	for _, c := range []struct {
		name string
		make func(p string) error
		ask  func(s *Source) error
		kept func(p *memPersist) bool
	}{
		{"lstat", file, func(s *Source) error { _, err := s.Lstat(ctx, "x"); return err }, attrKept},
		{"open", file, func(s *Source) error {
			f, err := s.Open(ctx, "x", os.O_RDONLY, 0)
			if err == nil {
				err = f.Close(ctx)
			}
			return err
		}, attrKept},
		{"readlink", func(p string) error { return os.Symlink("target", p) },
			func(s *Source) error { _, err := s.Readlink(ctx, "x"); return err },
			func(p *memPersist) bool { _, ok := p.LoadLink("x"); return ok }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, _, dir := newSource(t, time.Minute, nil)
			if err := c.make(dir + "/x"); err != nil {
				t.Fatal(err)
			}
			p := racing(t, "x", func() error { return s.Unlink(ctx, "x") })
			s.SetPersist(p, func() bool { return false })
			if err := c.ask(s); err != nil {
				t.Fatal(err)
			}
			p.wait()
			if c.kept(p.memPersist) {
				t.Errorf("x, removed through the mount, is still stored after the %s", c.name)
			}
		})
	}
}

// TestLoadedListingAfterRacingChange: a stored listing loaded just before a change
// through the mount forgets it (the prefetch loading ahead while the kernel renames)
// is not kept in memory after the change: a directory renamed over another was listed
// as the one it replaced (the namespace test under CPU load).
func TestLoadedListingAfterRacingChange(t *testing.T) {
	s, _, dir := newSource(t, time.Minute, nil)
	ctx := context.Background()
	if err := os.MkdirAll(dir+"/d/x", 0o755); err != nil {
		t.Fatal(err)
	}
	p := &racingLoad{racing(t, "d", func() error { return s.Rename(ctx, "d/x", "e") })}
	p.memPersist.SaveListing("d", []backend.Entry{{Name: "x", Attr: backend.Attr{Mode: syscall.S_IFDIR | 0o755}}}, time.Now())
	s.SetPersist(p, func() bool { return false })
	if _, err := s.ReadDir(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	p.wait()
	if list, err := s.ReadDir(ctx, "d"); err != nil || hasName(list, "x") {
		t.Errorf("d after renaming d/x away: %v %v, want no x", list, err)
	}
}

// TestRenameOfWrittenFileKeepsListing: a file just written, whose attributes are not
// known, renamed in its directory (git's config.lock to config): the directory's
// listing still answers for the names missing from it — the lock's next create looks
// one up — and the new name is asked for.
func TestRenameOfWrittenFileKeepsListing(t *testing.T) {
	s, c, _ := newSource(t, time.Minute, nil)
	ctx := context.Background()
	if _, err := s.Mkdir(ctx, "git", 0o755); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		writeThrough(t, s, "git/config.lock", os.O_WRONLY|os.O_CREATE|os.O_EXCL, "[core]")
		if err := s.Rename(ctx, "git/config.lock", "git/config"); err != nil {
			t.Fatal(err)
		}
		before := c.lstats.Load()
		for _, name := range []string{"git/config.lock", "git/hooks"} {
			if _, err := s.Lstat(ctx, name); backend.ToErrno(err) != syscall.ENOENT {
				t.Fatalf("round %d: lstat %s: %v", round, name, err)
			}
		}
		if n := c.lstats.Load() - before; n != 0 {
			t.Errorf("round %d: %d LSTATs for names missing from a directory muxfs made", round, n)
		}
		if a, err := s.Lstat(ctx, "git/config"); err != nil || a.Size != 6 || c.lstats.Load() != before+1 {
			t.Errorf("round %d: the renamed file: %+v, %v after %d LSTATs; want its size from the source", round, a, err, c.lstats.Load()-before)
		}
	}
	if names := sortedNames(t, s, "git"); names != "[config]" {
		t.Errorf("listing: %v", names)
	}
}

// TestLookupsMissingInADirectoryListIt: a second lookup the cache cannot answer in a
// directory nobody listed (git status stats every tracked file, in the index's order)
// lists that directory in the background, and the next names are answered from the
// listing — not the names missing from it, which may have been made since; a
// directory larger than missListMax is not listed for lookups.
func TestLookupsMissingInADirectoryListIt(t *testing.T) {
	s, c, dir := newSource(t, time.Minute, NewPrefetcher(4))
	ctx := context.Background()
	for _, d := range []string{"small", "big"} {
		os.Mkdir(dir+"/"+d, 0o755) //nolint:errcheck
	}
	for i := range 20 {
		os.WriteFile(fmt.Sprintf("%s/small/f%02d", dir, i), nil, 0o644) //nolint:errcheck
	}
	for i := range 4000 {
		os.WriteFile(fmt.Sprintf("%s/big/a-rather-long-file-name-%04d", dir, i), nil, 0o644) //nolint:errcheck
	}
	// The directories' own attributes, as the kernel's lookups of them fetch them (a
	// listing of their parent would list them ahead).
	for _, d := range []string{"small", "big"} {
		if _, err := s.Lstat(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"small/f00", "small/f01"} {
		if _, err := s.Lstat(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, _, ok := s.meta.listing(0, "small", time.Now()); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("two lookups missing in a directory did not list it")
		}
	}
	before := c.lstats.Load()
	for i := 2; i < 20; i++ {
		if _, err := s.Lstat(ctx, fmt.Sprintf("small/f%02d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.lstats.Load() - before; n != 0 {
		t.Errorf("%d LSTATs after the directory was listed", n)
	}
	// A name missing from that listing is still asked for: made on the server since
	// (a job's new output), it is found.
	os.WriteFile(dir+"/small/new", nil, 0o644) //nolint:errcheck
	if _, err := s.Lstat(ctx, "small/new"); err != nil {
		t.Errorf("a name made on the server after the listing: %v", err)
	}
	if _, err := s.Lstat(ctx, "small/none"); backend.ToErrno(err) != syscall.ENOENT {
		t.Errorf("a missing name: %v", err)
	}

	if st, err := os.Stat(dir + "/big"); err != nil || st.Size() <= missListMax {
		t.Skipf("this file system gives a directory of 4,000 names %d bytes", st.Size())
	}
	readdirs := c.readdirs.Load()
	for i := range 3 {
		s.Lstat(ctx, fmt.Sprintf("big/a-rather-long-file-name-%04d", i)) //nolint:errcheck
	}
	time.Sleep(50 * time.Millisecond)
	if n := c.readdirs.Load() - readdirs; n != 0 {
		t.Errorf("a directory larger than missListMax was listed for %d lookups", 3)
	}
}

// writeThrough writes data at the start of p through s, opened with flags, and
// closes it.
func writeThrough(t *testing.T, s *Source, p string, flags int, data string) {
	t.Helper()
	ctx := context.Background()
	f, err := s.Open(ctx, p, flags, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(ctx, []byte(data), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestOwnChangesMoveDirectoryTimes: a name made or removed through the cache moves
// its directory's mtime on the source, and the next stat of the directory — and the
// listing of its parent — say so (rsync -a sets a directory's times again only if a
// stat shows them moved), while the directory's own listing is still answered.
func TestOwnChangesMoveDirectoryTimes(t *testing.T) {
	s, c, dir := newSource(t, time.Minute, nil)
	store := newMemPersist()
	s.SetPersist(store, func() bool { return false })
	ctx := context.Background()
	if _, err := s.Mkdir(ctx, "d", 0o755); err != nil {
		t.Fatal(err)
	}
	writeThrough(t, s, "d/old", os.O_WRONLY|os.O_CREATE, "x")
	if _, err := s.Mkdir(ctx, "d/sub", 0o755); err != nil {
		t.Fatal(err)
	}
	past := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	// A file just written, and a hard link, are asked for again with their
	// directory's listing, as before; the other changes keep the listing.
	ops := []struct {
		name    string
		do      func() error
		relists bool
	}{
		{"create", func() error {
			f, err := s.Open(ctx, "d/new", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
			if err == nil {
				err = f.Close(ctx)
			}
			return err
		}, true},
		{"rename within", func() error { return s.Rename(ctx, "d/new", "d/renamed") }, false},
		{"rename out", func() error { return s.Rename(ctx, "d/renamed", "out") }, false},
		{"rename in", func() error { return s.Rename(ctx, "out", "d/back") }, false},
		{"unlink", func() error { return s.Unlink(ctx, "d/back") }, false},
		{"mkdir", func() error { _, err := s.Mkdir(ctx, "d/sub2", 0o755); return err }, false},
		{"rmdir", func() error { return s.Rmdir(ctx, "d/sub2") }, false},
		{"symlink", func() error { _, err := s.Symlink(ctx, "old", "d/ln"); return err }, false},
		{"link", func() error { return s.Link(ctx, "d/old", "d/hard") }, true},
	}
	for _, op := range ops {
		for _, d := range []string{"d", "d/sub"} {
			set := backend.SetAttr{Valid: backend.SetTimes, Atime: past, Mtime: past}
			if _, err := s.SetAttr(ctx, d, set); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.ReadDir(ctx, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ReadDir(ctx, "d"); err != nil {
			t.Fatal(err)
		}
		if err := op.do(); err != nil {
			t.Fatalf("%s: %v", op.name, err)
		}
		readdirs := c.readdirs.Load()
		if _, err := s.ReadDir(ctx, "d"); err != nil || !op.relists && c.readdirs.Load() != readdirs {
			t.Errorf("%s: the directory's own listing was asked for again (%v)", op.name, err)
		}
		truth, err := os.Lstat(dir + "/d")
		if err != nil || truth.ModTime().Equal(past) {
			t.Fatalf("%s: the source's directory kept its old mtime (%v)", op.name, err)
		}
		if a, err := s.Lstat(ctx, "d"); err != nil || !a.Mtime.Equal(truth.ModTime()) {
			t.Errorf("%s: stat of the directory says mtime %v (%v), the source %v", op.name, a.Mtime, err, truth.ModTime())
		}
		list, err := s.ReadDir(ctx, "")
		i := slices.IndexFunc(list, func(e backend.Entry) bool { return e.Name == "d" })
		if err != nil || i < 0 || !list[i].Attr.Mtime.Equal(truth.ModTime()) {
			t.Errorf("%s: its parent's listing says %v (%v), the source %v", op.name, list, err, truth.ModTime())
		}
		// A remount answers from the stored listing: it must not hold the old times.
		if list, _, ok := store.LoadListing(""); ok && slices.ContainsFunc(list, func(e backend.Entry) bool { return e.Name == "d" && e.Attr.Mtime.Equal(past) }) {
			t.Errorf("%s: the stored listing of its parent keeps the old times", op.name)
		}
		if a, err := s.Lstat(ctx, "d/sub"); err != nil || !a.Mtime.Equal(past) {
			t.Errorf("%s: a directory beside the change lost its cached times: %v, %v", op.name, a.Mtime, err)
		}
	}
}

// TestCloseKeepsSettledAttributes: a file closed after a Stat (the FUSE layer's at
// close(2), which waits for every write) keeps that Stat's answer for the stats after
// it (make's of every object before it runs ar), unless the path changed after the
// Stat; a file closed unstatted is asked for again, as before.
func TestCloseKeepsSettledAttributes(t *testing.T) {
	ctx := context.Background()
	s, c, dir := newSource(t, time.Minute, nil)
	if _, err := s.ReadDir(ctx, ""); err != nil {
		t.Fatal(err)
	}
	write := func(p, data string, between func(f backend.File)) {
		t.Helper()
		f, err := s.Open(ctx, p, os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(ctx, []byte(data), 0); err != nil {
			t.Fatal(err)
		}
		if between != nil {
			between(f)
		}
		if err := f.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	stat := func(f backend.File) {
		if _, err := f.Stat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	asks := func(p string, want int64, size int64) {
		t.Helper()
		before := c.lstats.Load()
		a, err := s.Lstat(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if a.Size != size {
			t.Errorf("%s: size %d, want %d", p, a.Size, size)
		}
		if got := c.lstats.Load() - before; got != want {
			t.Errorf("%s: the stat after close sent %d LSTATs, want %d", p, got, want)
		}
		entries, _ := s.ReadDir(ctx, "")
		for _, e := range entries {
			if e.Name == path.Base(p) && e.Attr.Size != size {
				t.Errorf("%s: size %d in the listing, want %d", p, e.Attr.Size, size)
			}
		}
	}

	write("settled", "12345", stat)
	asks("settled", 0, 5)
	if st, _ := os.Stat(dir + "/settled"); st.ModTime().UnixNano() != mustLstat(t, s, "settled").Mtime.UnixNano() {
		t.Error("the kept mtime is not the source's")
	}

	write("unstatted", "123", nil)
	asks("unstatted", 1, 3)

	// Written after its Stat: the Stat's answer is old.
	write("written-after", "1", func(f backend.File) {
		stat(f)
		if _, err := f.WriteAt(ctx, []byte("23"), 1); err != nil {
			t.Fatal(err)
		}
	})
	asks("written-after", 1, 3)

	// Changed by another way after the Stat (another descriptor's write, a
	// truncation by path): its close keeps nothing.
	write("changed-beside", "1234", func(f backend.File) {
		stat(f)
		if err := os.Truncate(dir+"/changed-beside", 2); err != nil {
			t.Fatal(err)
		}
		s.Changed("changed-beside")
	})
	asks("changed-beside", 1, 2)
}

func mustLstat(t *testing.T, s *Source, p string) backend.Attr {
	t.Helper()
	a, err := s.Lstat(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
