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
// walk finds them in the cache. Only one level is fetched per listing the walk itself
// asks for: a large tree is never crawled unasked.
type Prefetcher struct {
	slots chan struct{}
	mu    sync.Mutex
	busy  map[key]bool
}

// NewPrefetcher allows parallel listings at a time (per mount).
func NewPrefetcher(parallel int) *Prefetcher {
	return &Prefetcher{slots: make(chan struct{}, parallel), busy: map[key]bool{}}
}

// maxQueued bounds how many subdirectories one listing schedules.
const maxQueued = 256

func (pf *Prefetcher) children(s *Source, dir string, list []backend.Entry) {
	queued := 0
	for _, e := range list {
		if !e.Attr.IsDir() || e.Name == "." || e.Name == ".." {
			continue
		}
		if queued++; queued > maxQueued {
			return
		}
		p := e.Name
		if dir != "" {
			p = dir + "/" + e.Name
		}
		if _, cached := s.meta.listing(s.id, p, time.Now()); cached {
			continue
		}
		k := key{s.id, p}
		pf.mu.Lock()
		if pf.busy[k] {
			pf.mu.Unlock()
			continue
		}
		pf.busy[k] = true
		pf.mu.Unlock()
		go func() {
			defer func() {
				pf.mu.Lock()
				delete(pf.busy, k)
				pf.mu.Unlock()
			}()
			pf.slots <- struct{}{}
			defer func() { <-pf.slots }()
			if _, ok := s.meta.listing(s.id, p, time.Now()); ok {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s.fetchListing(ctx, p) //nolint:errcheck // a failed prefetch leaves the walk to ask itself
		}()
	}
}
