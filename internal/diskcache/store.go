// Package diskcache is muxfs' persistent local cache (the FS-Cache idea): the fetched
// ranges of remote files in sparse local files, and directory listings, kept across
// remounts and reboots in a cache directory, with their records in an embedded
// database (bbolt).
//
// Crash safety: a record in the database only ever names ranges whose data was synced
// to disk before the record was committed, and a file's record is deleted (and the
// deletion committed) before its cached data is first changed by a write. So after a
// crash at any moment the cache serves correct bytes or nothing.
package diskcache

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"golang.org/x/sys/unix"

	"github.com/muxfs/muxfs/internal/backend"
	"github.com/muxfs/muxfs/internal/bufpool"
)

// Options are the cache's limits.
type Options struct {
	MaxSize int64 // bytes of cached file data kept, over all sources of the mount; 0: no limit
	MinFree int64 // bytes to leave free on the cache's file system
	// FetchWhole: a file read at random and no larger than this is fetched whole in
	// the background (0: never).
	FetchWhole int64
}

// Cache is the persistent cache of one mount: a directory per source under Dir.
type Cache struct {
	Dir  string
	opts Options
	log  *slog.Logger

	mu     sync.Mutex
	stores []*Store
	quit   chan struct{}
	done   chan struct{}

	memUsed atomic.Int64 // bytes held in entries' mem, over all stores
	// flushSoon asks loop for a round before its tick: the data held in memory
	// passed memFlushAt.
	flushSoon chan struct{}

	writes     chan cacheWrite // to the writer (writer.go)
	writerDone chan struct{}
	noDirect   atomic.Bool // the cache's file system refused direct I/O (writer.go)
	// writeFault, in tests, runs before each queued write: it holds the writer
	// back, or fails the write as a full disk would.
	writeFault func() error
	// writeNowFault, in tests, runs before each write made outside the queue
	// (storeLocked), and fails it with its error.
	writeNowFault func() error
}

// DefaultDir is $XDG_CACHE_HOME/muxfs, else ~/.cache/muxfs.
func DefaultDir() (string, error) {
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "muxfs"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(home, ".cache", "muxfs"), nil
}

// Open opens (creating it 0700) the cache directory dir and starts the background
// work: syncing new data and records every second, and evicting beyond the limits.
func Open(dir string, opts Options, log *slog.Logger) (*Cache, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cache directory %s: %w", dir, err)
	}
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("cache directory %s: %w", dir, err)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Getuid() {
		return nil, fmt.Errorf("cache directory %s belongs to another user: give your own with --cache-dir", dir)
	}
	if st.Mode().Perm() != 0o700 {
		// Cached file contents are as private as the remote files: nobody else may
		// read them.
		if err := os.Chmod(dir, 0o700); err != nil {
			return nil, fmt.Errorf("cache directory %s: %w", dir, err)
		}
		log.Warn("cache directory was open to others; made it 0700", "dir", dir)
	}
	c := &Cache{Dir: dir, opts: opts, log: log, quit: make(chan struct{}), done: make(chan struct{}),
		writes: make(chan cacheWrite, writeQueue), writerDone: make(chan struct{}), flushSoon: make(chan struct{}, 1)}
	go c.loop()
	go c.writer()
	return c, nil
}

// Close syncs and closes every store.
func (c *Cache) Close() {
	close(c.quit)
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.stores {
		st.flush() // waits for the writer's queue (drainLocked)
		st.db.Close()
	}
	close(c.writes)
	<-c.writerDone
}

func (c *Cache) loop() {
	defer close(c.done)
	tick := time.NewTicker(flushTick)
	defer tick.Stop()
	for {
		select {
		case <-c.quit:
			return
		case <-tick.C:
		case <-c.flushSoon:
		}
		c.mu.Lock()
		stores := append([]*Store(nil), c.stores...)
		c.mu.Unlock()
		for _, st := range stores {
			st.flush()
		}
		c.evict(stores)
	}
}

// SourceKey is the directory name of a source's cache: sources with the same remote
// path on different servers never share entries.
func SourceKey(source string) string {
	sum := sha256.Sum256([]byte(source))
	return hex.EncodeToString(sum[:12])
}

var bucketFiles = []byte("files")

// bucketInline holds the bytes of small files, beside their records in bucketFiles.
// A cold `grep -r` over a source tree caches some 11,000 files: one data file each
// cost a create on the cache's file system (`perf`: a tenth of muxfs' CPU in the
// background commit), and every later read of one an open(2) and a close(2) in the
// reader's path. A file of at most inlineMax bytes, held whole in memory when its
// record is committed, is stored with its record in the same transaction instead —
// atomic with it, so crash safety needs no ordering of its own — and read back from
// the database's mapping. The bytes stored so are bounded by inlineTotalMax: the
// database is mapped whole at mount (MAP_POPULATE), and its file never shrinks.
var bucketInline = []byte("inline")

const (
	inlineMax      = 64 << 10
	inlineTotalMax = 256 << 20
)

// The metadata kept per path beside the file records, one bucket each, all queued
// for the next commit and forgotten alike: listings, the attributes of looked-up
// paths, and symlink targets.
const (
	metaDirs = iota
	metaAttrs
	metaLinks
	metaKinds
)

var metaBucket = [metaKinds][]byte{[]byte("dirs"), []byte("attrs"), []byte("links")}

// metaSaves are the changes to commit per metadata bucket.
type metaSaves [metaKinds]metaQueue

func newMetaSaves() (m metaSaves) {
	for i := range m {
		m[i] = metaQueue{put: map[string][]byte{}, del: map[string]bool{}}
	}
	return m
}

// metaQueue is what the next commit does to one metadata bucket: values to put and
// keys to delete, a key in one of them at most. They are kept apart so that forgetting
// a subtree (each rmdir of an `rm -rf`) looks only at the values, not at the
// thousands of deletions the unlinks before it queued: in one map, that scan was 8%
// of muxfs' CPU time in an `rm -rf` (perf, docs/design.md).
type metaQueue struct {
	put map[string][]byte
	del map[string]bool
}

func (q *metaQueue) set(p string, v []byte) {
	q.put[p] = v
	delete(q.del, p)
}

func (q *metaQueue) forget(p string) {
	delete(q.put, p)
	q.del[p] = true
}

// get returns the value queued for p (nil with queued true: a deletion).
func (q *metaQueue) get(p string) (v []byte, queued bool) {
	if v, ok := q.put[p]; ok {
		return v, true
	}
	return nil, q.del[p]
}

func (q *metaQueue) len() int { return len(q.put) + len(q.del) }

// requeue adds the changes of a commit that failed, except where a change to the same
// key was queued since: that one is newer.
func (m *metaSaves) requeue(failed metaSaves) {
	for kind := range m {
		q := &m[kind]
		for p, v := range failed[kind].put {
			if _, newer := q.get(p); !newer {
				q.set(p, v)
			}
		}
		for p := range failed[kind].del {
			if _, newer := q.get(p); !newer {
				q.forget(p)
			}
		}
	}
}

// Store opens the cache of one source, named as the user knows it.
func (c *Cache) Store(source string) (*Store, error) {
	dir := filepath.Join(c.Dir, SourceKey(source))
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o700); err != nil {
		return nil, err
	}
	if o, _, ok := readOrigin(dir); !ok || o.Source != source {
		if err := writeOrigin(dir, origin{Source: source}); err != nil {
			return nil, err
		}
	}
	// MAP_POPULATE reads the whole database in at once, sequentially: after a reboot
	// (an empty page cache) a walk of a remounted tree would otherwise fault its
	// B-tree pages in one random read at a time.
	db, err := bolt.Open(filepath.Join(dir, "meta.db"), 0o600, &bolt.Options{Timeout: 200 * time.Millisecond, MmapFlags: syscall.MAP_POPULATE})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("the cache of %s is in use by another muxfs mount", source)
	}
	if err != nil {
		return nil, fmt.Errorf("cache of %s: %w", source, err)
	}
	st := &Store{c: c, name: source, dir: dir, db: db, entries: map[string]*entry{},
		saves: newMetaSaves(), gone: map[string]bool{}}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range append([][]byte{bucketFiles, bucketInline}, metaBucket[:]...) {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		st.used.Store(cachedBytes(tx.Bucket(bucketFiles)))
		st.inline.Store(inlineBytes(tx.Bucket(bucketInline)))
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("cache of %s: %w", source, err)
	}
	c.mu.Lock()
	c.stores = append(c.stores, st)
	c.mu.Unlock()
	return st, nil
}

// Store is the cache of one source.
type Store struct {
	c    *Cache
	name string
	dir  string
	db   *bolt.DB

	mu      sync.Mutex
	entries map[string]*entry // open, or holding changes not yet committed
	saves   metaSaves         // listings, attributes and symlink targets to commit
	// committing are the saves a commit is writing: until its transaction is done,
	// loads still answer from them, not from the database's older values (a commit
	// waits for the data files' syncs first, which under load takes long enough for
	// a forgotten listing to be loaded again from the database). commits counts the
	// commits done, for ForgetTree.
	committing metaSaves
	commits    uint64
	// forgetScanned, when set (by a test), runs between ForgetTree's scan of the
	// database and its taking of mu: where a commit can land unseen by the scan.
	forgetScanned func()
	// gone are paths whose data file was removed (unlink, rename, truncate) and whose
	// record is deleted with the next commit, not one commit each (an rm -rf of a
	// cached tree). A record whose data file is gone names nothing, and until the
	// commit they count as absent.
	gone map[string]bool

	used         atomic.Int64 // bytes of file data held
	inline       atomic.Int64 // of them, bytes stored in the database (bucketInline)
	hits, misses atomic.Int64 // bytes read from the cache, and fetched from the server
}

// record is what the database holds of a cached file, in encodeRecord's form; the
// JSON names read the records of earlier versions.
type record struct {
	Size  int64 `json:"s"`
	Mtime int64 `json:"m"` // the server's, unix ns
	Spans spans `json:"r,omitempty"`
	Used  int64 `json:"u"` // last open, unix s: eviction takes the least recently used
	// Inline: the bytes are in bucketInline, not in a data file.
	Inline bool `json:"-"`
}

// entry is a cached file in use.
type entry struct {
	st   *Store
	path string

	mu    sync.Mutex
	rec   record // spans include those not yet synced
	f     *os.File
	refs  int
	valid bool // rec describes the file on the server (false while being written)
	// mine: while being written, the spans hold the file as it was plus this mount's
	// writes since, in order — what the server will hold once they are acknowledged,
	// so the writer's own reads are served from them (a compiler's assembler reads
	// back what it wrote).
	mine      bool
	appended  bool   // an append since: its data may not be where the server put it
	dirty     bool   // rec differs from the database
	gen       uint64 // bumped when a write begins: a sync in flight must not commit
	persisted bool   // the database has a record for the path
	detached  bool   // its path now names another file: never cached again (dropKeep)
	fetching  bool   // fetched whole in the background (read at random)
	stored    bool   // data written to the data file since a flush last took the entry
	// mem holds the data of a small file that has no data file: not yet committed
	// (see storeLocked; flush stores it in the database or writes it to a data file
	// before it commits the record), or loaded from the database (inlineLocked).
	mem []byte

	// writes counts the writes queued for the cache's writer (writer.go); gather is
	// the write being gathered for it, windows the fills; direct is f opened for its
	// direct I/O, once a write needed it.
	writes  writeCount
	gather  *cacheWrite
	windows []*fillWindow
	direct  *os.File
	// passthrough: the kernel was handed the data file to read it itself; writes
	// go into it before they are answered (writer.go).
	passthrough bool
}

var errDetached = errors.New("cache entry detached from its path")

// Bounds of the data held in memory until the next commit: per file (the content
// prefetch's small files, an untar's or a build's outputs) and in all. Past
// memFlushAt the commit comes before the next tick: a cold `grep -r` at 0 ms fetched
// about 30 MB a second, and each commit holds that data twice more for a moment
// (the inline copies, the database's pages), which with the garbage collector's
// headroom made a walk's peak memory 226–261 MB for 25 MB of live data at rest.
const (
	memFileMax  = 256 << 10
	memTotalMax = 64 << 20
	memFlushAt  = 8 << 20
)

// flushTick is how often the cache commits what it holds (a variable for tests).
var flushTick = time.Second

func (st *Store) dataPath(p string) string {
	sum := sha256.Sum256([]byte(p))
	h := hex.EncodeToString(sum[:16])
	return filepath.Join(st.dir, "data", h[:2], h)
}

func (st *Store) load(p string) (record, bool) {
	var r record
	found := false
	st.db.View(func(tx *bolt.Tx) error { //nolint:errcheck // a read error is a miss
		if v := tx.Bucket(bucketFiles).Get([]byte(p)); v != nil {
			var err error
			r, err = decodeRecord(v)
			found = err == nil
		}
		return nil
	})
	return r, found
}

// racyWindow: a file modified this recently may change again within the same second
// of mtime (SFTP v3 times are whole seconds), so its record is kept for this mount
// only and not committed: a later same-size change in that second could not be seen.
const racyWindow = 2 * time.Second

// acquire returns the cache entry for a file just opened on the server with
// attributes a: cached data is kept if the server's size and mtime match the record,
// else dropped (close-to-open, as NFS).
func (st *Store) acquire(p string, a backend.Attr) *entry {
	st.mu.Lock()
	e := st.entries[p]
	if e == nil {
		e = &entry{st: st, path: p}
		if st.gone[p] && st.commitGoneLocked() != nil {
			// The old record still stands: after a crash it would name this file's
			// data. Leave this one uncached.
			e.detached = true
		}
		if r, ok := st.load(p); ok {
			e.rec, e.persisted, e.valid = r, true, true
		}
		st.entries[p] = e
	}
	e.refs++
	st.mu.Unlock()

	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.valid || !e.sameVersionLocked(a) {
		e.resetLocked()
		e.rec.Size, e.rec.Mtime = a.Size, a.Mtime.UnixNano()
		e.valid = true
	}
	if now := time.Now().Unix(); now-e.rec.Used > 60 {
		e.rec.Used = now
		e.dirty = true
	}
	return e
}

// acquireOffline returns the entry of a file whose server cannot be reached, if the
// cache holds a record of it.
func (st *Store) acquireOffline(p string) *entry {
	st.mu.Lock()
	defer st.mu.Unlock()
	e := st.entries[p]
	if e == nil {
		r, ok := st.load(p)
		if !ok || st.gone[p] {
			return nil
		}
		e = &entry{st: st, path: p, rec: r, persisted: true, valid: true}
		st.entries[p] = e
	}
	if !e.valid {
		return nil
	}
	e.refs++
	return e
}

// resetLocked drops the cached data. The data file is replaced, not truncated: a
// reader the kernel serves straight from it (passthrough) keeps the old content.
func (e *entry) resetLocked() {
	e.drainLocked() // what a queued write failed to store goes with the rest
	e.closeLocked()
	e.gen++ // a commit in flight names the data dropped here
	e.mine, e.appended = false, false
	e.dropMemLocked()
	if e.detached {
		// Its data file's name, and the count, went when it was detached.
		e.rec.Spans = nil
		return
	}
	if e.rec.Spans != nil || e.persisted {
		os.Remove(e.st.dataPath(e.path))
	}
	e.st.used.Add(-e.rec.Spans.bytes())
	e.rec.Spans, e.rec.Inline = nil, false
	e.dirty = true
}

// inlineLocked loads the bytes of a record stored in the database (bucketInline)
// into mem, where they are read, written and flushed as those of a small file not yet
// committed. A value missing or not of the record's size names nothing: the spans go.
func (e *entry) inlineLocked() {
	if !e.rec.Inline || e.mem != nil || e.f != nil {
		return
	}
	var mem []byte
	e.st.db.View(func(tx *bolt.Tx) error { //nolint:errcheck // a read error is a miss
		if v := tx.Bucket(bucketInline).Get([]byte(e.path)); v != nil {
			mem = append([]byte(nil), v...)
		}
		return nil
	})
	if mem == nil || int64(len(mem)) != e.rec.Size || !e.holdsExactlyLocked() {
		e.st.used.Add(-e.rec.Spans.bytes())
		e.rec.Spans, e.rec.Inline = nil, false
		e.dirty = true
		return
	}
	// rec.Inline stays: until they change, these are the bytes in the database.
	e.st.c.memUsed.Add(int64(len(mem)))
	e.mem = mem
}

// closeFileLocked closes the data file, once every write queued for it is in.
func (e *entry) closeFileLocked() {
	if !e.settleLocked() {
		e.closeLocked() // a reset closed it already
	}
}

// settleLocked waits for the writes queued for the data file; if one failed, the data
// is dropped (resetLocked), and it reports so.
func (e *entry) settleLocked() (reset bool) {
	if e.drainLocked() {
		e.resetLocked()
		return true
	}
	return false
}

func (e *entry) closeLocked() {
	if e.f != nil {
		e.f.Close()
		e.f = nil
	}
	if e.direct != nil {
		e.direct.Close()
		e.direct = nil
	}
}

// fileLocked returns the data file, opened (or made) if need be, with every write
// queued for it in: what it holds is what the spans name.
func (e *entry) fileLocked() (*os.File, error) {
	e.settleLocked()
	return e.openLocked()
}

// openLocked returns the data file as fileLocked does, but with writes maybe still
// queued for it: to queue more.
func (e *entry) openLocked() (*os.File, error) {
	if e.f != nil {
		return e.f, nil
	}
	if e.detached {
		// The data file's name belongs to whatever the path names now.
		return nil, errDetached
	}
	e.inlineLocked()
	p := e.st.dataPath(e.path)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return nil, err
	}
	if e.mem != nil {
		return e.memToFileLocked(p)
	}
	flags := os.O_RDWR
	if e.rec.Spans == nil {
		// Nothing in it is named: a file left by a crash must not show through
		// the holes of this version (holdsExactlyLocked counts them as zeros).
		flags |= os.O_TRUNC
	}
	f, err := os.OpenFile(p, flags, 0o600)
	if errors.Is(err, os.ErrNotExist) {
		// A record whose data file is gone (removed by hand, or by a reset that
		// crashed before its record went) names nothing: holes would read as zeros.
		e.st.used.Add(-e.rec.Spans.bytes())
		e.rec.Spans = nil
		f, err = os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	}
	if err != nil {
		return nil, err
	}
	e.f = f
	return f, nil
}

// readAt serves [off, off+len(p)) from the cache if it holds all of it (up to the
// file's size). ok false: not all there.
func (e *entry) readAt(p []byte, off int64) (n int, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.valid && !e.mine {
		return 0, false
	}
	end := min(off+int64(len(p)), e.rec.Size)
	if off >= end {
		return 0, off >= e.rec.Size
	}
	if !e.rec.Spans.covers(off, end) {
		return 0, false
	}
	e.inlineLocked()
	if e.mem != nil {
		n = copy(p[:end-off], e.mem[off:end])
		e.st.hits.Add(int64(n))
		return n, true
	}
	f, err := e.fileLocked()
	if err != nil || !e.rec.Spans.covers(off, end) { // a queued write failed
		return 0, false
	}
	n, err = f.ReadAt(p[:end-off], off)
	if err != nil && n < int(end-off) {
		return 0, false
	}
	e.st.hits.Add(int64(n))
	return n, true
}

// fill stores data fetched from the server at off, through a handle opened on
// version v of the file: only into the entry of that version. Another open, or a
// stat, that found the file changed on the server has moved the entry on to the new
// version meanwhile, and a handle of the old one may read a file since replaced
// (its bytes would be cached as the new version's). The data goes to the data file
// through the writer, as a write's data does (writer.go: with direct I/O): a
// buffered pwrite in the read path cost 12–14% of muxfs' CPU samples in a cold
// 512 MiB read, its copy into new page-cache pages (docs/design.md, "Persistent
// cache").
func (e *entry) fill(p []byte, off int64, v backend.Attr) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.st.misses.Add(int64(len(p)))
	if !e.valid || e.detached || len(p) == 0 || e.st.full() || !e.sameVersionLocked(v) {
		return
	}
	e.storeLocked(p, off, true)
}

// seenListing does what seen does for each file of a listing of dir, with the store's
// lock taken once; only entries in memory are looked at.
func (st *Store) seenListing(dir string, list []backend.Entry) {
	type change struct {
		e *entry
		a backend.Attr
	}
	var changed []change
	st.mu.Lock()
	if len(st.entries) > 0 {
		for _, de := range list {
			if de.Attr.Type() != syscall.S_IFREG {
				continue
			}
			if e := st.entries[backend.Child(dir, de.Name)]; e != nil {
				changed = append(changed, change{e, de.Attr})
			}
		}
	}
	st.mu.Unlock()
	for _, c := range changed {
		c.e.moveOn(c.a)
	}
}

// sameVersionLocked reports whether the entry is of the version with attributes a.
func (e *entry) sameVersionLocked(a backend.Attr) bool {
	return e.rec.Size == a.Size && e.rec.Mtime == a.Mtime.UnixNano()
}

// seen takes attributes the server has just given for p (a stat, a listing): an
// entry of another version is moved on to this one, its data dropped, as the next
// open would do (acquire). Readers of a file that changed on the server then read
// its new content from the server instead of the old one (or an end of file where
// it has grown) from the cache: the kernel, shown the new size, asks for it
// (fusefs drops its pages of the old version). Entries being written through the
// mount are left alone: the server's word lags their writes.
func (st *Store) seen(p string, a backend.Attr) {
	st.mu.Lock()
	e := st.entries[p]
	st.mu.Unlock()
	if e != nil {
		e.moveOn(a)
	}
}

// changed takes the attributes the server answered to a change of p's attributes
// made through muxfs by path (times, mode, owner): what the cache holds of another
// version is moved on to this one, as the next open would move it. That open then
// goes to the server at once, instead of first asking for p's attributes to check a
// version that cannot be the server's: rsync -a sets the times of each file it wrote,
// by path, and opens it again, which took two round trips. An entry in use moves on
// as for a stat (seen); a record alone is acquired at the new version, as an open
// does.
func (st *Store) changed(p string, a backend.Attr) {
	if a.Type() != syscall.S_IFREG {
		return
	}
	st.mu.Lock()
	e := st.entries[p]
	st.mu.Unlock()
	if e != nil {
		e.moveOn(a)
		return
	}
	if r, ok := st.wholeRecord(p); ok && (r.Size != a.Size || r.Mtime != a.Mtime.UnixNano()) {
		st.acquire(p, a).release()
	}
}

// moveOn moves the entry on to the version with attributes a, if it is of another.
func (e *entry) moveOn(a backend.Attr) {
	if a.Type() != syscall.S_IFREG {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.valid || e.mine || e.detached || e.sameVersionLocked(a) {
		return
	}
	e.resetLocked()
	e.rec.Size, e.rec.Mtime = a.Size, a.Mtime.UnixNano()
}

// storeLocked keeps p at off and reports whether it did: in memory (a small file),
// queued for the writer (writer.go), or, while the kernel reads the data file itself
// (passthrough), written at once. A fill never waits for room in the writer's queue:
// while the disk is behind (on the bench's machine it was, for a tenth of a cold
// 512 MiB read) it writes p through the page cache, at once, which waits for the
// disk only past the kernel's dirty limit. Skipping those fills instead left holes
// that kept a re-read off passthrough.
func (e *entry) storeLocked(p []byte, off int64, fill bool) bool {
	e.inlineLocked()
	if !e.keepInMemLocked(p, off) {
		var f *os.File
		var err error
		if e.passthrough {
			f, err = e.fileLocked()
		} else {
			f, err = e.openLocked()
		}
		if err != nil {
			return false
		}
		switch {
		case fill && !e.passthrough && e.windowLocked(f, p, off):
			// Gathered: written once its MiB is complete (writer.go).
		case e.passthrough || (fill && e.st.c.writerBehind()):
			// Out of the queue's order, which is safe: a fill's bytes are the
			// server's, writes through muxfs included (a read is sent behind
			// the writes before it: sftpFile.ReadAt), and under passthrough
			// nothing is queued (fileLocked waited for it).
			if err := e.st.c.writeNow(f, p, off); err != nil {
				// A full disk. A fill's bytes stay uncached; a write's range
				// still holds what it replaced, which the spans name as current
				// (and the version the close records would too): the data goes,
				// as when a queued write fails.
				if !fill {
					e.resetLocked()
				}
				return false
			}
		default:
			e.queueLocked(f, p, off)
			if fill {
				// A small fill (a random reader's) is handed over at once: one
				// gathered with the writes would wait for room in the queue at
				// the release.
				e.sendLocked()
			}
		}
		e.stored = true
	}
	e.addSpanLocked(off, off+int64(len(p)))
	return true
}

// writeNow writes p at off in f at once, outside the writer's queue.
func (c *Cache) writeNow(f *os.File, p []byte, off int64) error {
	if c.writeNowFault != nil {
		if err := c.writeNowFault(); err != nil {
			return err
		}
	}
	_, err := f.WriteAt(p, off)
	return err
}

func (e *entry) addSpanLocked(off, end int64) {
	var gained int64
	e.rec.Spans, gained = e.rec.Spans.add(off, end)
	e.st.used.Add(gained)
	e.dirty = true
}

// holdsExactlyLocked reports whether the entry holds the whole file and nothing past
// its end. Past the end, the data file then has only holes and the in-memory copy
// nothing (fileLocked, keepInMemLocked), so what a write past the end or a truncate
// up leaves between the old end and the new bytes reads as the zeros the server
// holds there.
func (e *entry) holdsExactlyLocked() bool { return e.rec.holdsExactly() }

// holdsExactly reports whether the record names the whole file and nothing past it.
func (r record) holdsExactly() bool {
	return r.Spans.covers(0, r.Size) && r.Spans.bytes() == r.Size
}

// keepInMemLocked keeps p at off in e.mem if e is a small file with no data file yet,
// and reports whether it did. Creating a file on this machine's ext4 costs about
// 0.5 ms of CPU while the disk is busy — as much as an SFTP round trip, and in the
// path of every write of an untar and every fill of a cold grep; flush creates it
// in the background instead.
func (e *entry) keepInMemLocked(p []byte, off int64) bool {
	end := off + int64(len(p))
	fresh := e.f == nil && e.rec.Spans == nil && !e.persisted
	if (e.mem == nil && !fresh) || end > memFileMax {
		return false
	}
	had := int64(len(e.mem))
	grow := max(end-had, 0)
	switch used := e.st.c.memUsed.Add(grow); {
	case used > memTotalMax:
		e.st.c.memUsed.Add(-grow)
		return false
	case used > memFlushAt && used-grow <= memFlushAt:
		select {
		case e.st.c.flushSoon <- struct{}{}:
		default: // a round is asked for already
		}
	}
	if grow > 0 {
		// Pooled (bufpool): an untar's small files, written a tar record at a time,
		// made these copies a third of the bytes muxfs allocated, each growth a new
		// one, all garbage once flushed.
		if end > int64(cap(e.mem)) {
			grown := bufpool.Copy(e.mem, int(end))
			bufpool.Release(e.mem)
			e.mem = grown
		}
		e.mem = e.mem[:end]
		clear(e.mem[had:]) // a hole before off reads as zeros
	}
	copy(e.mem[off:], p)
	return true
}

func (e *entry) dropMemLocked() {
	e.st.c.memUsed.Add(-int64(len(e.mem)))
	bufpool.Release(e.mem)
	e.mem = nil
}

// memToFileLocked writes the data held in memory to a new data file at p.
func (e *entry) memToFileLocked(p string) (*os.File, error) {
	// Truncated: a file left by a crash holds nothing the spans name.
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	if _, err := f.WriteAt(e.mem, 0); err != nil {
		f.Close()
		os.Remove(p)
		return nil, err
	}
	e.f = f
	e.dropMemLocked()
	if e.rec.Inline {
		e.rec.Inline, e.dirty = false, true // the next commit drops the database's copy
	}
	return f, nil
}

// beginWriteLocked makes the cached data changeable: the database's record of the
// file is deleted, and the deletion committed, before the data file changes, so that
// a crash in the middle cannot leave a record naming changed data. The entry is valid
// again once the server's attributes after the writes are known (written).
func (e *entry) beginWriteLocked() error {
	e.gen++
	e.valid = false
	if !e.persisted {
		return nil
	}
	e.inlineLocked() // the bytes written over are kept in memory, not in the database
	err := e.st.db.Update(func(tx *bolt.Tx) error {
		_, err := e.st.deleteRecord(tx, e.path)
		return err
	})
	if err == nil {
		e.persisted = false
		e.rec.Inline = false
	}
	return err
}

// changeLocked prepares the entry for a change made through muxfs; false: the change
// is not to be cached (the entry is detached, or its record could not be withdrawn).
func (e *entry) changeLocked() bool {
	if e.detached {
		// What it holds is no longer the file's content: its holders read from
		// the server from now on.
		e.valid, e.mine = false, false
		return false
	}
	if e.beginWriteLocked() != nil {
		e.resetLocked()
		return false
	}
	return true
}

// write stores data written through muxfs, so that it is cached too. A file held
// whole stays whole when the write leaves a hole past its end (an assembler or a
// linker writes its sections out of order): the next open is served from the cache.
// placed: the server puts the data at off (not so for an append); only then are the
// writer's reads served from it before the server confirms the file's size.
func (e *entry) write(p []byte, off int64, placed bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.changeLocked() {
		return
	}
	end := e.rec.Size
	hole := off > end && e.holdsExactlyLocked()
	if e.storeLocked(p, off, false) && hole {
		e.addSpanLocked(end, off)
	}
	e.rec.Size = max(e.rec.Size, off+int64(len(p)))
	e.appended = e.appended || !placed
	e.mine = !e.appended
}

// truncate follows a size change made through muxfs.
func (e *entry) truncate(size int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.changeLocked() {
		return
	}
	e.mine = !e.appended
	if size > e.rec.Size && e.holdsExactlyLocked() && e.growLocked(size) {
		e.rec.Size = size
		return
	}
	ok := true
	e.inlineLocked()
	switch {
	case e.mem != nil:
		if size < int64(len(e.mem)) {
			e.st.c.memUsed.Add(size - int64(len(e.mem)))
			e.mem = e.mem[:size]
		}
	case e.f == nil && e.rec.Spans == nil:
		// Nothing cached: no data file to make for it.
	default:
		f, err := e.fileLocked()
		ok = err == nil && f.Truncate(size) == nil
	}
	if ok {
		before := e.rec.Spans.bytes()
		e.rec.Spans = e.rec.Spans.clip(size)
		e.st.used.Add(e.rec.Spans.bytes() - before)
	} else {
		e.resetLocked()
	}
	e.rec.Size = size
	e.dirty = true
}

// growLocked extends a file held exactly to size with zeros, and reports whether it
// did: the in-memory copy grows within its bound, else the data file gets a hole.
func (e *entry) growLocked(size int64) bool {
	if !e.keepInMemLocked(nil, size) {
		f, err := e.fileLocked()
		if err != nil || f.Truncate(size) != nil {
			return false
		}
	}
	e.addSpanLocked(e.rec.Size, size)
	return true
}

// written records the server's attributes after every write so far was acknowledged:
// the cached data is the file's content at that size and mtime.
func (e *entry) written(a backend.Attr) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.detached {
		return
	}
	e.sendLocked() // the writes are over (a close, an fsync): what they left gathered goes
	if e.rec.Size != a.Size {
		// Someone else changed the file meanwhile: what we hold is not its content.
		e.resetLocked()
	}
	e.rec.Size, e.rec.Mtime = a.Size, a.Mtime.UnixNano()
	e.valid, e.dirty, e.mine, e.appended = true, true, false, false
}

// release ends a use of the entry. An entry left invalid (writes whose outcome is not
// known) drops its data.
func (e *entry) release() {
	st := e.st
	st.mu.Lock()
	defer st.mu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.refs--
	if e.refs > 0 {
		return
	}
	e.sendLocked() // a gathered write is not held for the next commit
	if e.detached {
		// Its last holder is gone: so goes the data it kept readable (dropKeep).
		e.closeFileLocked()
		e.dropMemLocked()
		if st.entries[e.path] == e {
			delete(st.entries, e.path)
		}
		return
	}
	if !e.valid {
		e.resetLocked()
		e.dirty = false
	}
	if !e.dirty {
		e.closeFileLocked()
		e.dropMemLocked() // committed: in the database, or nothing
		delete(st.entries, e.path)
	}
}

// dropDuring runs op, a change on the server after which the data cached for paths is
// wrong (an unlink, a rename, a truncate by path), and drops that data. The data files
// are removed while op waits for the server: removing one costs the request ~0.2 ms of
// local disk time otherwise, a fifth of an unlink in an rm -rf (docs/design.md). A drop
// that op then fails to justify only costs a refetch. An open that saw the old file
// while op was in flight may have cached it again: the second drop, once op is done,
// catches that, so nothing of the old file outlives the acknowledged change.
func (st *Store) dropDuring(op func() error, keep bool, paths ...string) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, p := range paths {
			st.drop(p, keep)
		}
	}()
	err := op()
	<-done
	for _, p := range paths {
		st.drop(p, keep)
	}
	return err
}

// drop forgets what is cached at path p, which now names another file or none (an
// unlink, a rename, a truncate by path); a new open of p starts afresh. An entry
// still open elsewhere is detached from p. With keep (an unlink or a rename, which
// leave an open file's content as it was), its holders go on reading what it holds,
// from its open data file whose name is gone (dropKeep); otherwise (a truncate) they
// go to the server from now on.
func (st *Store) drop(p string, keep bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if e := st.entries[p]; e != nil {
		e.mu.Lock()
		e.gen++ // a commit in flight must not write its record
		if !keep || e.refs == 0 || !e.dropKeepLocked() {
			e.resetLocked()
			e.valid, e.dirty = false, false
		}
		if e.refs > 0 {
			e.detached = true
		}
		e.mu.Unlock()
		delete(st.entries, p)
	}
	if st.gone[p] {
		return
	}
	r, ok := st.load(p)
	if !ok {
		return
	}
	if !r.Inline {
		// An inline record's bytes are in the database, and go with it: there is no
		// data file to remove (a failed unlink(2) per file of an `rm -rf` of an
		// untarred tree, 4% of muxfs' CPU time in it).
		os.Remove(st.dataPath(p))
	}
	st.gone[p] = true
}

// dropKeepLocked keeps what a detached entry holds readable for its holders: the data
// file is opened (its name is removed; the open descriptor still reads it). It reports
// false when the entry holds nothing worth keeping.
func (e *entry) dropKeepLocked() bool {
	if !e.valid || e.rec.Spans == nil {
		return false
	}
	e.inlineLocked()
	if e.mem == nil {
		if _, err := e.fileLocked(); err != nil {
			return false
		}
	}
	os.Remove(e.st.dataPath(e.path))
	// Its record goes with the path: the bytes kept until the last close are no
	// longer the cache's to count.
	e.st.used.Add(-e.rec.Spans.bytes())
	return true
}

// commitGoneLocked deletes the records of the gone paths now. The caller holds st.mu.
func (st *Store) commitGoneLocked() error {
	freed, err := st.deleteRecords(st.gone)
	if err != nil {
		return err
	}
	st.used.Add(-freed)
	st.gone = map[string]bool{}
	return nil
}

// deleteRecords deletes the records of paths in one commit and returns the bytes of
// data they named.
func (st *Store) deleteRecords(paths map[string]bool) (freed int64, err error) {
	if len(paths) == 0 {
		return 0, nil
	}
	err = st.db.Update(func(tx *bolt.Tx) error {
		freed = 0
		return st.deleteIn(tx, paths, &freed)
	})
	return freed, err
}

func (st *Store) deleteIn(tx *bolt.Tx, paths map[string]bool, freed *int64) error {
	for p := range paths {
		r, err := st.deleteRecord(tx, p)
		if err != nil {
			return err
		}
		*freed += r.Spans.bytes()
	}
	return nil
}

// deleteRecord deletes p's record in tx, with its bytes if the database holds them,
// and returns it (zero if there was none or it was unreadable: it goes either way).
// The inline count follows once tx commits, as a failed commit deletes nothing.
func (st *Store) deleteRecord(tx *bolt.Tx, p string) (record, error) {
	var r record
	b := tx.Bucket(bucketFiles)
	if v := b.Get([]byte(p)); v != nil {
		r, _ = decodeRecord(v)
		if err := b.Delete([]byte(p)); err != nil {
			return r, err
		}
	}
	return r, st.deleteInline(tx, p)
}

// deleteInline deletes p's bytes from bucketInline in tx, if there are any.
func (st *Store) deleteInline(tx *bolt.Tx, p string) error {
	ib := tx.Bucket(bucketInline)
	v := ib.Get([]byte(p))
	if v == nil {
		return nil
	}
	n := int64(len(v))
	if err := ib.Delete([]byte(p)); err != nil {
		return err
	}
	tx.OnCommit(func() { st.inline.Add(-n) })
	return nil
}

// full reports whether the cache must not grow now.
func (st *Store) full() bool {
	o := st.c.opts
	return o.MaxSize > 0 && st.c.used() > o.MaxSize+o.MaxSize/10
}

func (c *Cache) used() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, st := range c.stores {
		n += st.used.Load()
	}
	return n
}

// flush makes new data durable and commits the records that name it: data files are
// synced first, then the records go into the database in one transaction.
func (st *Store) flush() {
	type pending struct {
		e    *entry
		rec  record
		gen  uint64
		f    *os.File // its data file, if open
		skip bool     // its data could not be written
		// inline: the bytes to store in the database with the record (inlineMax)
		inline []byte
		drop   bool // a big file filled since the last round: drop its pages once synced
	}
	st.mu.Lock()
	var todo []pending
	for _, e := range st.entries {
		e.mu.Lock()
		racy := time.Since(time.Unix(0, e.rec.Mtime)) < racyWindow
		if e.dirty && e.valid && !racy {
			rec := e.rec
			rec.Spans = append(spans(nil), e.rec.Spans...)
			todo = append(todo, pending{e: e, rec: rec, gen: e.gen, f: e.f,
				drop: e.stored && rec.Spans.bytes() >= dropPagesMin})
			e.stored = false
		}
		e.mu.Unlock()
	}
	saves, gone := st.saves, maps.Clone(st.gone)
	st.saves, st.committing = newMetaSaves(), saves
	st.mu.Unlock()
	metaDone := false
	defer func() {
		st.mu.Lock()
		defer st.mu.Unlock()
		if !metaDone {
			// Not committed: queued again, under the changes queued since.
			st.saves.requeue(saves)
		}
		st.committing = metaSaves{}
		st.commits++
	}()
	queued := len(todo) + len(gone)
	for _, q := range saves {
		queued += q.len()
	}
	if queued == 0 {
		return
	}
	// Records are committed only for data known to be on disk: a failed write or
	// sync leaves them dirty, to be tried again next round. Data held in memory goes
	// into the database with its record if it is a whole small file (bucketInline),
	// else to its data file now.
	unsynced := map[*os.File]bool{}
	var files []*os.File
	inlined := st.inline.Load()
	for i := range todo {
		t := &todo[i]
		// Spans name queued writes at once: they reach the data file before its
		// sync. One that failed drops the data (and changes gen: no commit).
		t.e.lockSettled()
		if t.e.gen == t.gen && t.f == nil {
			switch n := int64(len(t.e.mem)); {
			case t.e.mem == nil || t.rec.Inline: // nothing new, or already in the database
			case n == t.rec.Size && n <= inlineMax && t.rec.holdsExactly() && inlined+n <= inlineTotalMax:
				t.inline = append([]byte(nil), t.e.mem...)
				t.rec.Inline = true
				inlined += n
			default:
				if _, err := t.e.fileLocked(); err != nil {
					t.skip = true
				}
			}
			t.f = t.e.f
		}
		t.e.mu.Unlock()
		if t.f != nil {
			files = append(files, t.f)
		}
	}
	if len(files) > 64 {
		// Many files (an untar, a build): one syncfs of the cache's file system
		// costs far less than a sync per file.
		d, err := os.Open(st.dir)
		if err == nil {
			err = unix.Syncfs(int(d.Fd()))
			d.Close()
		}
		if err != nil {
			return
		}
	} else {
		for _, f := range files {
			if f.Sync() != nil {
				unsynced[f] = true
			}
		}
	}
	for _, t := range todo {
		if t.drop && t.f != nil && !unsynced[t.f] {
			dropPages(t.f)
		}
	}
	var committed []pending
	var freed int64
	err := st.db.Update(func(tx *bolt.Tx) error {
		fb, ib := tx.Bucket(bucketFiles), tx.Bucket(bucketInline)
		// Deletions first: a path dropped and cached anew has both.
		freed = 0
		if err := st.deleteIn(tx, gone, &freed); err != nil {
			return err
		}
		for _, t := range todo {
			t.e.mu.Lock()
			ok := t.e.gen == t.gen && t.e.valid && !unsynced[t.f] && !t.skip
			t.e.mu.Unlock()
			if !ok {
				continue // changed since, or its data could not be written or synced
			}
			v := encodeRecord(t.rec)
			if err := fb.Put([]byte(t.e.path), v); err != nil {
				return err
			}
			switch {
			case t.inline != nil:
				k := []byte(t.e.path)
				grow := int64(len(t.inline) - len(ib.Get(k)))
				if err := ib.Put(k, t.inline); err != nil {
					return err
				}
				tx.OnCommit(func() { st.inline.Add(grow) })
			case !t.rec.Inline:
				if err := st.deleteInline(tx, t.e.path); err != nil {
					return err
				}
			}
			committed = append(committed, t)
		}
		for kind, q := range saves {
			b := tx.Bucket(metaBucket[kind])
			for p := range q.del {
				if err := b.Delete(dbKey(p)); err != nil {
					return err
				}
			}
			for p, v := range q.put {
				if err := b.Put(dbKey(p), v); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		st.c.log.Warn("cache: could not commit records", "source", st.name, "err", err)
		return
	}
	metaDone = true
	st.used.Add(-freed)
	st.mu.Lock()
	defer st.mu.Unlock()
	// Paths stay gone until their deletion is committed; one dropped again since
	// (a new record of it committed in between) has nothing more to delete either.
	for p := range gone {
		delete(st.gone, p)
	}
	for _, t := range committed {
		e := t.e
		e.mu.Lock()
		e.persisted = true
		if t.inline != nil && e.gen == t.gen && e.f == nil && int64(len(e.mem)) == t.rec.Size {
			e.rec.Inline = true // its bytes in memory are those in the database now
		}
		if e.gen == t.gen && len(e.rec.Spans) == len(t.rec.Spans) && e.rec.Spans.bytes() == t.rec.Spans.bytes() && e.rec.Size == t.rec.Size && e.rec.Inline == t.rec.Inline {
			e.dirty = false
		}
		if !e.dirty && e.refs == 0 && st.entries[e.path] == e {
			e.closeFileLocked()
			e.dropMemLocked() // committed: it reads them back from the database
			delete(st.entries, e.path)
		}
		e.mu.Unlock()
	}
}

// evict removes the least recently used files, never those in use, while the cache is
// over its size limit or its file system short of free space.
func (c *Cache) evict(stores []*Store) {
	over := func() bool {
		if c.opts.MaxSize > 0 && c.used() > c.opts.MaxSize {
			return true
		}
		if c.opts.MinFree > 0 {
			var fs syscall.Statfs_t
			if syscall.Statfs(c.Dir, &fs) == nil && int64(fs.Bavail)*fs.Bsize < c.opts.MinFree {
				return true
			}
		}
		return false
	}
	if !over() {
		return
	}
	type cand struct {
		st    *Store
		path  string
		used  int64
		bytes int64
	}
	var all []cand
	for _, st := range stores {
		st.db.View(func(tx *bolt.Tx) error { //nolint:errcheck // a read error leaves nothing to evict
			return tx.Bucket(bucketFiles).ForEach(func(k, v []byte) error {
				if r, err := decodeRecord(v); err == nil {
					all = append(all, cand{st, string(k), r.Used, r.Spans.bytes()})
				}
				return nil
			})
		})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].used < all[j].used })
	target := c.opts.MaxSize - c.opts.MaxSize/10 // evict a little more, not at every tick
	evicted, freed := 0, int64(0)
	for _, cd := range all {
		if !over() && (c.opts.MaxSize == 0 || c.used() <= target) {
			break
		}
		if cd.st.evictOne(cd.path) {
			evicted++
			freed += cd.bytes
		}
	}
	if evicted > 0 {
		c.log.Info("cache: evicted least recently used files", "files", evicted, "bytes", freed)
	}
}

// evictOne drops a file's cached data unless it is in use.
func (st *Store) evictOne(p string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, busy := st.entries[p]; busy || st.gone[p] {
		return false
	}
	if _, ok := st.load(p); !ok {
		return false // nothing cached: no write (and no sync) needed
	}
	var r record
	err := st.db.Update(func(tx *bolt.Tx) error {
		var err error
		r, err = st.deleteRecord(tx, p)
		return err
	})
	if err != nil {
		return false
	}
	os.Remove(st.dataPath(p))
	st.used.Add(-r.Spans.bytes())
	return true
}

// rootKey stands for the source's root ("") in the listing and attribute buckets:
// bbolt refuses an empty key, and one refused key fails the whole commit. No other
// path is ".": paths are relative, and "." is never a name.
const rootKey = "."

func dbKey(p string) []byte {
	if p == "" {
		return []byte(rootKey)
	}
	return []byte(p)
}

func pathOf(k []byte) string {
	if string(k) == rootKey {
		return ""
	}
	return string(k)
}

// SaveListing keeps a listing fetched from the server (committed within a second).
func (st *Store) SaveListing(p string, list []backend.Entry, at time.Time) {
	v := encodeListing(list, at)
	st.mu.Lock()
	st.saves[metaDirs].set(p, v)
	st.mu.Unlock()
}

// LoadListing returns a stored listing and when it was fetched.
func (st *Store) LoadListing(p string) ([]backend.Entry, time.Time, bool) {
	v := st.loadQueued(metaDirs, p)
	if v == nil {
		return nil, time.Time{}, false
	}
	list, at, err := decodeListing(v)
	return list, at, err == nil
}

// loadQueued returns the value of key p of a metadata bucket: the one queued for the
// next commit, else the one a commit is writing, else the database's (nil: none, or a
// deletion queued).
func (st *Store) loadQueued(kind int, p string) []byte {
	st.mu.Lock()
	v, queued := st.saves[kind].get(p)
	if !queued {
		v, queued = st.committing[kind].get(p)
	}
	st.mu.Unlock()
	if queued {
		return v
	}
	st.db.View(func(tx *bolt.Tx) error { //nolint:errcheck // a read error is a miss
		if b := tx.Bucket(metaBucket[kind]).Get(dbKey(p)); b != nil {
			v = append([]byte(nil), b...)
		}
		return nil
	})
	return v
}

// SaveAttr keeps the attributes of a path looked up on the server, so that an
// offline mount can still answer for it.
func (st *Store) SaveAttr(p string, a backend.Attr) {
	v := encodeAttr(a)
	st.mu.Lock()
	st.saves[metaAttrs].set(p, v)
	st.mu.Unlock()
}

// LoadAttr returns stored attributes of a path.
func (st *Store) LoadAttr(p string) (backend.Attr, bool) {
	v := st.loadQueued(metaAttrs, p)
	if v == nil {
		return backend.Attr{}, false
	}
	a, err := decodeAttr(v)
	return a, err == nil
}

// SaveLink keeps the target of a symlink read on the server, so that an offline mount
// can still resolve it.
func (st *Store) SaveLink(p, target string) {
	st.mu.Lock()
	st.saves[metaLinks].set(p, []byte(target))
	st.mu.Unlock()
}

// LoadLink returns the stored target of a symlink.
func (st *Store) LoadLink(p string) (string, bool) {
	v := st.loadQueued(metaLinks, p)
	return string(v), v != nil
}

// ForgetListings drops what is stored of the given paths: their listings,
// attributes and symlink targets.
func (st *Store) ForgetListings(dirs ...string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, d := range dirs {
		for kind := range st.saves {
			st.saves[kind].forget(d)
		}
	}
}

// ForgetListing drops the stored listing of dir and nothing else.
func (st *Store) ForgetListing(dir string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.saves[metaDirs].forget(dir)
}

// ForgetTree drops the stored listings, attributes and symlink targets at and below
// dir ("" is everything).
func (st *Store) ForgetTree(dir string) {
	// Made once: an `rm -rf` makes an rmdir per directory, and each scans the values
	// still pending; a concatenation per pending key was about half of that scan's
	// time.
	below := dir + "/"
	under := func(p string) bool { return dir == "" || p == dir || strings.HasPrefix(p, below) }
	for {
		st.mu.Lock()
		commits := st.commits
		st.mu.Unlock()
		stored := st.storedUnder(dir)
		if st.forgetScanned != nil {
			st.forgetScanned()
		}
		st.mu.Lock()
		if st.commits != commits {
			// A commit landed values the scan may have missed: scan again.
			st.mu.Unlock()
			continue
		}
		for kind := range st.saves {
			q := &st.saves[kind]
			for p := range q.put {
				if under(p) {
					q.forget(p)
				}
			}
			// Values a commit is writing now: deleted by the next one.
			for p := range st.committing[kind].put {
				if under(p) {
					q.forget(p)
				}
			}
			for _, k := range stored[kind] {
				q.forget(k)
			}
		}
		st.mu.Unlock()
		return
	}
}

// storedUnder returns the keys at and below dir ("" is everything) in the database,
// per metadata bucket, read in one transaction.
func (st *Store) storedUnder(dir string) (stored [metaKinds][]string) {
	st.db.View(func(tx *bolt.Tx) error { //nolint:errcheck // a read error leaves nothing to drop
		prefix := []byte(dir + "/")
		if dir == "" {
			prefix = nil
		}
		for kind, bucket := range metaBucket {
			c := tx.Bucket(bucket).Cursor()
			if k, _ := c.Seek([]byte(dir)); dir != "" && k != nil && string(k) == dir {
				stored[kind] = append(stored[kind], dir)
			}
			for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
				stored[kind] = append(stored[kind], pathOf(k))
			}
		}
		return nil
	})
	return stored
}

// Stats are a store's numbers for `muxfs cache status`.
type Stats struct {
	Source   string `json:"source"`
	Dir      string `json:"dir"`
	Files    int    `json:"files"`
	Dirs     int    `json:"dirs"`
	Bytes    int64  `json:"bytes"`
	HitBytes int64  `json:"hit_bytes"`
	Fetched  int64  `json:"fetched_bytes"`
}

func (st *Store) Stats() Stats {
	s := Stats{Source: st.name, Dir: st.dir, Bytes: st.used.Load(), HitBytes: st.hits.Load(), Fetched: st.misses.Load()}
	st.db.View(func(tx *bolt.Tx) error { //nolint:errcheck // counts stay 0
		s.Files = tx.Bucket(bucketFiles).Stats().KeyN
		s.Dirs = tx.Bucket(metaBucket[metaDirs]).Stats().KeyN
		return nil
	})
	return s
}

// Clear drops everything cached for the source, except the data of files in use.
func (st *Store) Clear() error {
	st.mu.Lock()
	busy := map[string]bool{}
	for p := range st.entries {
		busy[p] = true
	}
	st.saves = newMetaSaves()
	// A commit writing now may land after this transaction: what it stores goes
	// with the next one.
	for kind, q := range st.committing {
		for p := range q.put {
			st.saves[kind].forget(p)
		}
	}
	st.mu.Unlock()
	var paths []string
	err := st.db.Update(func(tx *bolt.Tx) error {
		fb := tx.Bucket(bucketFiles)
		err := fb.ForEach(func(k, _ []byte) error {
			if !busy[string(k)] {
				paths = append(paths, string(k))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, p := range paths {
			if _, err := st.deleteRecord(tx, p); err != nil {
				return err
			}
		}
		for _, b := range metaBucket {
			if err := tx.DeleteBucket(b); err != nil {
				return err
			}
			if _, err := tx.CreateBucket(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, p := range paths {
		os.Remove(st.dataPath(p))
	}
	st.db.View(func(tx *bolt.Tx) error { //nolint:errcheck // used stays as it was
		st.used.Store(cachedBytes(tx.Bucket(bucketFiles)))
		return nil
	})
	return nil
}

// ReadStats reads the numbers of a source's cache directory that no mount is using.
func ReadStats(dir string) (Stats, error) {
	s := Stats{Dir: dir}
	if o, _, ok := readOrigin(dir); ok {
		s.Source = o.Source
	}
	db, err := bolt.Open(filepath.Join(dir, "meta.db"), 0o600, &bolt.Options{ReadOnly: true, Timeout: 100 * time.Millisecond})
	if err != nil {
		return s, err
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		fb, db := tx.Bucket(bucketFiles), tx.Bucket(metaBucket[metaDirs])
		if fb == nil || db == nil {
			return nil
		}
		s.Files, s.Dirs = fb.Stats().KeyN, db.Stats().KeyN
		s.Bytes = cachedBytes(fb)
		return nil
	})
	return s, err
}

// cachedBytes sums the data the records of a files bucket name.
func cachedBytes(b *bolt.Bucket) int64 {
	var n int64
	b.ForEach(func(_, v []byte) error { //nolint:errcheck // the callback never fails
		if r, err := decodeRecord(v); err == nil {
			n += r.Spans.bytes()
		}
		return nil
	})
	return n
}

// inlineBytes sums the bytes stored in an inline bucket.
func inlineBytes(b *bolt.Bucket) int64 {
	var n int64
	b.ForEach(func(_, v []byte) error { //nolint:errcheck // the callback never fails
		n += int64(len(v))
		return nil
	})
	return n
}

// SourceDirs lists the source directories of a cache directory.
func SourceDirs(cacheDir string) []string {
	ents, _ := os.ReadDir(cacheDir)
	var out []string
	for _, e := range ents {
		d := filepath.Join(cacheDir, e.Name())
		if _, err := os.Stat(filepath.Join(d, "meta.db")); e.IsDir() && err == nil {
			out = append(out, d)
		}
	}
	return out
}

// Stores lists the cache's open stores.
func (c *Cache) Stores() []*Store {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Store(nil), c.stores...)
}

// Name is the source the store caches.
func (st *Store) Name() string { return st.name }

// dropPagesMin: the data files of entries holding at least this much have their pages
// dropped from the page cache once synced after a fill (dropPages). Smaller files,
// and pages a read from the cache brought in (FUSE passthrough reads the data file
// through the page cache: a second read is a memory copy), stay.
const dropPagesMin = 16 << 20

// dropPages tells the kernel to drop a synced data file's pages from its page cache.
// A file being read through the mount is already in the page cache as the mount's own
// pages: a second copy of every byte would double the memory a cold read of a big
// file takes (FS-Cache's cachefiles writes with direct I/O for the same reason).
func dropPages(f *os.File) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) { //nolint:errcheck // advice only
		unix.Fadvise(int(fd), 0, 0, unix.FADV_DONTNEED) //nolint:errcheck // advice only
	})
}
