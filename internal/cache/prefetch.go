package cache

import (
	"context"
	"sync"
	"time"

	"github.com/muxfs/muxfs/internal/backend"
)

// Prefetcher lists directories ahead of a walk. The kernel walks a tree one directory
// at a time, so a cold `find` or `ls -R` pays a round trip after another; when a
// directory is listed, its subdirectories are listed too, several at once, so that the
// walk finds them in the cache. One level is fetched per listing the walk itself asks
// for; only while the walk is seen following the listings fetched ahead (it asks for
// one of them) does the prefetch go further down, up to maxDepth levels below what the
// walk has reached: a large tree is never crawled unasked.
type Prefetcher struct {
	parallel int
	mu       sync.Mutex
	busy     map[key]bool
	ahead    map[key]bool // listings fetched ahead that no walk has asked for yet
	deep     time.Time    // until when a walk is known to follow the prefetch
	// todo holds the listings to fetch, taken newest first by up to parallel workers.
	// A walk goes depth first (find, ls -R, du take a directory's first
	// subdirectory's whole tree before its second); fetching the children of the
	// listing that arrived last, first child first, follows the same order, so the
	// walk's next directories come before the rest of the tree's breadth.
	todo    []task
	workers int
	// misses: when a lookup last missed in each directory (missed).
	misses map[key]time.Time
}

type task struct {
	s     *Source
	k     key
	depth int
	names bool // for lookups missing in it (missed), not for a walk
}

// NewPrefetcher allows parallel listings at a time (per mount).
func NewPrefetcher(parallel int) *Prefetcher {
	return &Prefetcher{parallel: parallel, busy: map[key]bool{}, ahead: map[key]bool{}, misses: map[key]time.Time{}}
}

const (
	// maxQueued bounds how many subdirectories one listing schedules.
	maxQueued = 256
	// maxDepth: how many levels below the walk the prefetch may go while followed
	// (measured in design.md, "Listing ahead").
	maxDepth = 8
	// followed: how long a walk counts as following after it last used a listing
	// fetched ahead.
	followed = 2 * time.Second
	// missListMax: the largest directory (its size as the server gives it) that
	// lookups missing in it have listed (missed). ext4 gives a directory of 1,500
	// short names about 64 KiB.
	missListMax = 64 << 10
)

// missed is told of a lookup the cache could not answer. A second one in the same
// directory within `followed` lists that directory, in the background: a run of
// lookups of names in a directory nobody listed — git status stats every tracked file
// in the index's order, a build stats its sources and headers — then finds the rest
// in its listing instead of paying a round trip each. Names missing from that listing
// are still asked for (dirEntry.names): a lookup of a name made outside the mount
// since must find it. A directory whose attributes are not known, or larger than
// missListMax, is left alone: a few lookups in a directory of 100,000 names must not
// cost its listing.
func (pf *Prefetcher) missed(s *Source, dir string) {
	k := key{s.id, dir}
	now := time.Now()
	pf.mu.Lock()
	if len(pf.misses) > 4096 {
		pf.misses = map[key]time.Time{}
	}
	last, seen := pf.misses[k]
	pf.misses[k] = now
	pf.mu.Unlock()
	if !seen || now.Sub(last) > followed {
		return
	}
	a, found, ok := s.meta.lookup(s.id, dir, now)
	if !ok || !found || !a.IsDir() || a.Size > missListMax || s.meta.hasListing(s.id, dir, now) {
		return
	}
	pf.enqueue([]task{{s, k, maxDepth, true}})
}

// children is told of a listing the walk asked for.
func (pf *Prefetcher) children(s *Source, dir string, list []backend.Entry) {
	k := key{s.id, dir}
	pf.mu.Lock()
	if pf.ahead[k] {
		delete(pf.ahead, k)
		pf.deep = time.Now().Add(followed)
	}
	pf.mu.Unlock()
	pf.schedule(s, dir, list, 1)
}

func (pf *Prefetcher) schedule(s *Source, dir string, list []backend.Entry, depth int) {
	var tasks []task
	for _, e := range list {
		if !e.Attr.IsDir() || e.Name == "." || e.Name == ".." {
			continue
		}
		if len(tasks) == maxQueued {
			break
		}
		p := backend.Child(dir, e.Name)
		if _, _, cached := s.meta.listing(s.id, p, time.Now()); cached {
			continue
		}
		tasks = append(tasks, task{s, key{s.id, p}, depth, false})
	}
	pf.enqueue(tasks)
}

// enqueue queues tasks, the first to be taken first, and starts workers for them.
func (pf *Prefetcher) enqueue(tasks []task) {
	pf.mu.Lock()
	defer pf.mu.Unlock()
	// Pushed last child first: the first child is taken first.
	for i := len(tasks) - 1; i >= 0; i-- {
		if t := tasks[i]; !pf.busy[t.k] {
			pf.busy[t.k] = true
			pf.todo = append(pf.todo, t)
		}
	}
	for pf.workers < pf.parallel && pf.workers < len(pf.todo) {
		pf.workers++
		go pf.work()
	}
}

// work fetches listings, newest first, until none is left.
func (pf *Prefetcher) work() {
	for {
		pf.mu.Lock()
		if len(pf.todo) == 0 {
			pf.workers--
			pf.mu.Unlock()
			return
		}
		t := pf.todo[len(pf.todo)-1]
		pf.todo = pf.todo[:len(pf.todo)-1]
		pf.mu.Unlock()
		if t.names {
			pf.fetchNames(t.s, t.k)
		} else {
			pf.fetch(t.s, t.k, t.depth)
		}
	}
}

// fetchNames lists a directory for the lookups missing in it (missed).
func (pf *Prefetcher) fetchNames(s *Source, k key) {
	defer func() {
		pf.mu.Lock()
		delete(pf.busy, k)
		pf.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.fetchNames(ctx, k.path)
}

func (pf *Prefetcher) fetch(s *Source, k key, depth int) {
	defer func() {
		pf.mu.Lock()
		delete(pf.busy, k)
		pf.mu.Unlock()
	}()
	if _, _, ok := s.meta.listing(s.id, k.path, time.Now()); ok {
		return
	}
	// A listing the persistent cache holds, unused in this mount or younger than the
	// TTL, is loaded from it: after a remount the stored tree is read ahead of the
	// walk, in parallel, with no request. Only the rest is asked of the source — and,
	// while a walk opens files with close-to-open off, every listing older than the
	// TTL: its opens trust only what the source said within the TTL.
	now := time.Now()
	list, ok := s.storedListing(context.Background(), k.path, now, false, s.opening(now))
	if !ok {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		if list, err = s.fetchListing(ctx, k.path); err != nil {
			return // a failed prefetch leaves the walk to ask itself
		}
	}
	pf.mu.Lock()
	if len(pf.ahead) > 65536 {
		pf.ahead = map[key]bool{} // walks that went elsewhere: forget them
	}
	pf.ahead[k] = true
	deeper := depth < maxDepth && time.Now().Before(pf.deep)
	pf.mu.Unlock()
	if deeper {
		pf.schedule(s, k.path, list, depth+1)
	}
}
