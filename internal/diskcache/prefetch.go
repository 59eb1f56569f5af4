package diskcache

import (
	"context"
	"os"
	"path"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/muxfs/muxfs/internal/backend"
	"github.com/muxfs/muxfs/internal/bufpool"
)

// Content prefetch. A walk that reads whole files (grep -r, a build reading its
// sources) opens one file after another, and each open and first read is a round trip
// to the server: over a slow link that is most of its time. Once muxfs sees whole
// small files read, it fetches the other small files of every directory the walk
// lists, several at once, into the cache; the walk's open then finds its file cached,
// and costs the one request of its close-to-open check (Source.openCached).
//
// The walk is recognised at its first whole read, after it has listed a directory
// or more (and the listing prefetch has fetched more ahead of it): the directories
// listed just before are scheduled then (recentDirs). A directory the walk enters
// goes to the front of the queue, and an open of a file whose fetch is under way
// waits for it (awaitFetch) rather than asking the server for the same bytes.
const (
	// prefetchMaxSize: larger files are left to the read path's own read-ahead.
	prefetchMaxSize = 256 << 10
	// prefetchParallel bounds the files fetched at a time, per source.
	prefetchParallel = 16
	// prefetchPerDir bounds the files one directory schedules.
	prefetchPerDir = 1024
	// walkLinger: a walk counts as reading contents this long after its last whole
	// read of a small file.
	walkLinger = 2 * time.Second
	// recentDirs bounds the directories listed before a walk is recognised that are
	// scheduled when it is.
	recentDirs = 64
)

type prefetcher struct {
	mu        sync.Mutex
	walkUntil time.Time
	dirs      map[string]time.Time // directories scheduled, when
	busy      map[string]bool      // files queued or being fetched
	// queue holds the files scheduled and not started, fetched in order by up to
	// prefetchParallel workers. A directory the walk is reading moves to the front
	// (toFront): the listings fetched ahead of a walk schedule whole levels of the
	// tree, so the order scheduled is not the walk's, and a cold `grep -r` read files
	// of the directory it was in before their prefetch had started.
	queue   []prefetchJob
	queued  map[string]int // of the queue's files, how many each directory has
	workers int
	// fetching holds, for each file being fetched, a channel closed when it is done.
	fetching map[string]chan struct{}
	// openTook is how long the last fetch's open took, in ns: what an open on the
	// server costs now, which bounds awaitFetch.
	openTook atomic.Int64
	// recent: directories listed while no walk was seen, newest last.
	recent []recentDir
}

type recentDir struct {
	dir string
	at  time.Time
}

type prefetchJob struct {
	dir, path string
	listed    backend.Attr
}

func newPrefetcher() *prefetcher {
	return &prefetcher{dirs: map[string]time.Time{}, busy: map[string]bool{}, queued: map[string]int{},
		fetching: map[string]chan struct{}{}}
}

// wholeRead notes that a small file was read from start to end: a content walk.
func (s *Source) wholeRead(p string) {
	dir := path.Dir(p)
	if dir == "." {
		dir = ""
	}
	pf := s.pf
	now := time.Now()
	pf.mu.Lock()
	var before []recentDir
	if !now.Before(pf.walkUntil) {
		before, pf.recent = pf.recent, nil // a walk starts
	}
	pf.walkUntil = now.Add(walkLinger)
	pf.mu.Unlock()
	for _, r := range before {
		if now.Sub(r.at) < walkLinger {
			s.prefetchStored(r.dir)
		}
	}
	s.prefetchStored(dir)
	pf.toFront(dir) // the walk reads this directory now
}

// prefetchStored schedules the files of dir's stored listing, unless done lately.
func (s *Source) prefetchStored(dir string) {
	pf := s.pf
	pf.mu.Lock()
	done := pf.scheduledLocked(dir, time.Now())
	pf.mu.Unlock()
	if !done {
		if list, _, ok := s.st.LoadListing(dir); ok {
			s.prefetchDir(dir, list)
		}
	}
}

// toFront moves the queued files of dir ahead of the others, keeping their order.
func (pf *prefetcher) toFront(dir string) {
	pf.mu.Lock()
	defer pf.mu.Unlock()
	if pf.queued[dir] == 0 || pf.queue[0].dir == dir {
		return
	}
	front := make([]prefetchJob, 0, len(pf.queue))
	for _, j := range pf.queue {
		if j.dir == dir {
			front = append(front, j)
		}
	}
	for _, j := range pf.queue {
		if j.dir != dir {
			front = append(front, j)
		}
	}
	pf.queue = front
}

// listed is told of every listing fetched or handed out (entered: to a user, the walk
// entering the directory): during a content walk, the small files in it are fetched
// ahead, those of a directory entered first.
func (s *Source) listed(dir string, list []backend.Entry, entered bool) {
	pf := s.pf
	now := time.Now()
	pf.mu.Lock()
	walking := now.Before(pf.walkUntil)
	if !walking {
		if len(pf.recent) == recentDirs {
			pf.recent = append(pf.recent[:0], pf.recent[1:]...)
		}
		pf.recent = append(pf.recent, recentDir{dir, now})
	}
	pf.mu.Unlock()
	if walking {
		s.prefetchDir(dir, list)
		if entered {
			pf.toFront(dir)
		}
	}
}

// scheduledLocked reports whether dir's files were scheduled within walkLinger.
func (pf *prefetcher) scheduledLocked(dir string, now time.Time) bool {
	t, done := pf.dirs[dir]
	return done && now.Sub(t) < walkLinger
}

// prefetchDir schedules the small regular files of dir.
func (s *Source) prefetchDir(dir string, list []backend.Entry) {
	pf := s.pf
	now := time.Now()
	pf.mu.Lock()
	if pf.scheduledLocked(dir, now) {
		pf.mu.Unlock()
		return
	}
	pf.dirs[dir] = now
	if len(pf.dirs) > 4096 {
		for d, t := range pf.dirs {
			if now.Sub(t) >= walkLinger {
				delete(pf.dirs, d)
			}
		}
	}
	pf.mu.Unlock()
	if s.Offline() {
		return
	}
	queued := 0
	for _, e := range list {
		if e.Attr.Type() != syscall.S_IFREG || e.Attr.Size == 0 || e.Attr.Size > prefetchMaxSize {
			continue
		}
		if queued++; queued > prefetchPerDir {
			return
		}
		p := backend.Child(dir, e.Name)
		pf.mu.Lock()
		if !pf.busy[p] {
			pf.busy[p] = true
			pf.queue = append(pf.queue, prefetchJob{dir: dir, path: p, listed: e.Attr})
			pf.queued[dir]++
			if pf.workers < prefetchParallel {
				pf.workers++
				go s.prefetchWorker()
			}
		}
		pf.mu.Unlock()
	}
}

// prefetchWorker fetches queued files, first in the queue first, until none is left.
func (s *Source) prefetchWorker() {
	pf := s.pf
	for {
		pf.mu.Lock()
		if len(pf.queue) == 0 {
			pf.workers--
			pf.mu.Unlock()
			return
		}
		j := pf.queue[0]
		pf.queue[0] = prefetchJob{}
		pf.queue = pf.queue[1:]
		if pf.queued[j.dir]--; pf.queued[j.dir] == 0 {
			delete(pf.queued, j.dir)
		}
		done := make(chan struct{})
		pf.fetching[j.path] = done
		pf.mu.Unlock()
		s.prefetchFile(j.path, j.listed)
		pf.mu.Lock()
		delete(pf.busy, j.path)
		delete(pf.fetching, j.path)
		pf.mu.Unlock()
		close(done)
	}
}

// prefetchFile makes sure p is cached whole, as the server has it now.
func (s *Source) prefetchFile(p string, listed backend.Attr) {
	if s.st.holdsWhole(p, listed) {
		return // as the listing, just fetched, says the server has it
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	bf, err := s.Backend.Open(ctx, p, os.O_RDONLY, 0)
	if err != nil {
		return
	}
	s.pf.openTook.Store(int64(time.Since(start)))
	a := bf.OpenedAttr()
	f := &file{File: bf, e: s.st.acquire(p, a), s: s, prefetch: true}
	defer f.Close(ctx) //nolint:errcheck // read-only: nothing to lose
	// The bytes go into the cache on their way; the buffer only receives them, so a
	// pooled one serves file after file (a fresh one per file was a tenth of what a
	// cold `grep -r` allocated).
	bp := bufpool.Get(int(min(a.Size+1, bufpool.Max)))
	defer bufpool.Put(bp)
	for off := int64(0); off < a.Size; {
		n, err := f.ReadAt(ctx, (*bp)[:min(int64(len(*bp)), a.Size+1-off)], off)
		off += int64(n)
		if err != nil || n == 0 {
			break
		}
	}
}

// openCached opens a file the cache holds whole with one request, its close-to-open
// check (LSTAT: size and mtime as the server has them now), instead of the OPEN and
// FSTAT of a remote open; the data then comes from the cache alone. ok false: not
// cached whole, changed, or not plainly readable — open it on the server.
//
// A file the content prefetch is fetching is checked the same way, the fetch
// finishing meanwhile.
func (s *Source) openCached(ctx context.Context, p string) (backend.File, bool) {
	start := time.Now()
	fetch := s.pf.fetchOf(p)
	if fetch == nil && !s.st.holdsSome(p) {
		return nil, false
	}
	a, err := s.Backend.Lstat(ctx, p)
	if err != nil {
		return nil, false
	}
	s.pf.awaitFetch(ctx, fetch, start)
	return s.openWhole(p, a)
}

// fetchOf returns the channel closed when the prefetch's fetch of p is done, nil if
// none is under way.
func (pf *prefetcher) fetchOf(p string) chan struct{} {
	pf.mu.Lock()
	defer pf.mu.Unlock()
	return pf.fetching[p]
}

// awaitFetch waits for a fetch (nil: none) to finish, at most until two server
// opens' time after start: an open on the server, and the first read that follows
// it, would take about that long.
func (pf *prefetcher) awaitFetch(ctx context.Context, fetch chan struct{}, start time.Time) {
	took := time.Duration(pf.openTook.Load())
	if fetch == nil || took == 0 {
		return
	}
	t := time.NewTimer(time.Until(start.Add(2 * took)))
	defer t.Stop()
	select {
	case <-fetch:
	case <-t.C:
	case <-ctx.Done():
	}
}

// OpenTrusted opens p from the cache alone, taking a as the server's attributes: the
// caller got them from the server recently enough for its consistency rule (-o nocto).
// ok false: offline, not cached whole at that version, or not plainly readable.
func (s *Source) OpenTrusted(p string, a backend.Attr) (backend.File, bool) {
	if !s.data || s.Offline() {
		return nil, false
	}
	s.pf.awaitFetch(context.Background(), s.pf.fetchOf(p), time.Now())
	return s.openWhole(p, a)
}

// openWhole opens p from the cache if it holds all of the version with attributes a.
func (s *Source) openWhole(p string, a backend.Attr) (backend.File, bool) {
	// A file nobody may read is left to the server's own permission check.
	if a.Type() != syscall.S_IFREG || a.Mode&0o444 == 0 {
		return nil, false
	}
	e := s.st.acquire(p, a)
	if !e.holdsWhole() {
		e.release()
		return nil, false
	}
	return &cachedFile{e: e, src: s.String(), attr: &a, s: s}, true
}

// holdsWhole reports whether the cache holds all of the file with attributes a.
func (st *Store) holdsWhole(p string, a backend.Attr) bool {
	r, ok := st.wholeRecord(p)
	return ok && r.Size == a.Size && r.Mtime == a.Mtime.UnixNano()
}

// holdsSome reports, without asking anyone, whether the cache holds a whole version
// of p (maybe not the server's current one).
func (st *Store) holdsSome(p string) bool {
	_, ok := st.wholeRecord(p)
	return ok
}

// wholeRecord returns p's record, from its entry in use or the database, if the
// cache holds all of that version.
func (st *Store) wholeRecord(p string) (record, bool) {
	st.mu.Lock()
	e := st.entries[p]
	gone := st.gone[p]
	st.mu.Unlock()
	if e != nil {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.rec, e.valid && !e.detached && e.rec.Spans.covers(0, e.rec.Size)
	}
	r, ok := st.load(p)
	return r, ok && !gone && r.Spans.covers(0, r.Size)
}

func (e *entry) holdsWhole() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.valid && !e.detached && e.rec.Spans.covers(0, e.rec.Size)
}

// fetchWhole fetches, in the background, the rest of a file that is being read at
// random (a database, an index, fio): once it is all in the cache, every read is a
// local one. Only files up to Options.FetchWhole (and a quarter of the cache) are
// fetched, once per version, through a handle of their own, so the reader's requests
// are not queued behind the fetch on the same handle.
func (s *Source) fetchWhole(e *entry, a backend.Attr) {
	o := s.st.c.opts
	if o.FetchWhole <= 0 || a.Size > o.FetchWhole || (o.MaxSize > 0 && a.Size > o.MaxSize/4) {
		return
	}
	e.mu.Lock()
	if e.fetching || !e.valid || e.detached {
		e.mu.Unlock()
		return
	}
	e.fetching = true
	gen := e.gen
	e.mu.Unlock()
	// A reference of its own: the fetch may outlive the reader.
	if own := s.st.acquire(e.path, a); own != e {
		own.release() // the path's entry changed meanwhile
		return
	}
	go func() {
		defer e.release()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		bf, err := s.Backend.Open(ctx, e.path, os.O_RDONLY, 0)
		if err != nil {
			return
		}
		defer bf.Close(ctx) //nolint:errcheck // read-only: nothing to lose
		if b := bf.OpenedAttr(); b.Size != a.Size || !b.Mtime.Equal(a.Mtime) {
			return // changed since: the reader's next open starts afresh
		}
		const chunk = 1 << 20
		buf := make([]byte, chunk)
		for off := int64(0); off < a.Size; off += chunk {
			end := min(off+chunk, a.Size)
			if !e.current(gen) {
				return
			}
			if e.covers(off, end) {
				continue
			}
			n, err := bf.ReadAt(ctx, buf[:end-off], off)
			if n > 0 {
				e.fill(buf[:n], off, a)
			}
			if err != nil || n < int(end-off) {
				return
			}
		}
		s.log.Debug("cache: fetched a file read at random whole", "source", s.String(), "path", e.path, "bytes", a.Size)
	}()
}

// current reports whether the entry still caches the version of generation gen.
func (e *entry) current(gen uint64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.valid && !e.detached && e.gen == gen && !e.st.full()
}

func (e *entry) covers(off, end int64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rec.Spans.covers(off, end)
}
