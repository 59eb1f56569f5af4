package diskcache

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/muxfs/muxfs/internal/backend"
)

// prefetchTree makes the directories dirs on the server, each with n small files,
// and returns their listings, stored as the memory cache stores them.
func prefetchTree(t *testing.T, s *Source, remote string, n int, dirs ...string) map[string][]backend.Entry {
	t.Helper()
	lists := map[string][]backend.Entry{}
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(remote, d), 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if err := os.WriteFile(filepath.Join(remote, d, fmt.Sprintf("f%02d", i)), []byte(d), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		list, err := s.ReadDir(context.Background(), d)
		if err != nil {
			t.Fatal(err)
		}
		s.st.SaveListing(d, list, time.Now())
		lists[d] = list
	}
	return lists
}

// TestPrefetchFollowsTheWalk: the content prefetch fetches files in the order they
// were scheduled, except that the directory the walk is in goes first. With a
// directory scheduled behind another (as listings fetched ahead of a walk schedule
// them) and the walk reading a file of the second, or entering it (its listing handed
// out), the second's files are fetched before the rest of the first's.
func TestPrefetchFollowsTheWalk(t *testing.T) {
	for _, tc := range []struct {
		name string
		walk func(s *Source, lists map[string][]backend.Entry)
	}{
		{"read", func(s *Source, _ map[string][]backend.Entry) { s.wholeRead("b/f00") }},
		{"entered", func(s *Source, lists map[string][]backend.Entry) { s.listed("b", lists["b"], true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, s, cb, remote := setup(t, t.TempDir(), Options{})
			const n = 40
			lists := prefetchTree(t, s, remote, n, "a", "b")
			// Every open waits for a token, so the fetches go one at a time once
			// the workers are all busy, and their order is the order of the opens.
			gate := make(chan struct{})
			var mu sync.Mutex
			var order []string
			cb.duringOpen = func(p string) {
				mu.Lock()
				order = append(order, p)
				mu.Unlock()
				<-gate
			}
			defer close(gate)
			opened := func() int {
				mu.Lock()
				defer mu.Unlock()
				return len(order)
			}
			waitOpened := func(k int) {
				t.Helper()
				waitFor(t, func() bool { return opened() >= k },
					func() string { return fmt.Sprintf("%d fetches started, want %d", opened(), k) })
			}
			s.pf.mu.Lock()
			s.pf.walkUntil = time.Now().Add(time.Hour)
			s.pf.mu.Unlock()
			s.listed("a", lists["a"], false) // fetched ahead of the walk
			s.listed("b", lists["b"], false)
			waitOpened(prefetchParallel)
			tc.walk(s, lists)
			for k := prefetchParallel; k < 2*n; k++ {
				gate <- struct{}{}
				waitOpened(k + 1)
			}
			mu.Lock()
			got := slices.Clone(order)
			mu.Unlock()
			slices.Sort(got[:prefetchParallel]) // the first workers start together
			var want []string
			for i := range n {
				want = append(want, fmt.Sprintf("a/f%02d", i))
			}
			first := want[:prefetchParallel]
			var rest []string
			for i := range n {
				rest = append(rest, fmt.Sprintf("b/f%02d", i))
			}
			rest = append(rest, want[prefetchParallel:]...)
			if !slices.Equal(got[:prefetchParallel], first) || !slices.Equal(got[prefetchParallel:], rest) {
				t.Errorf("fetched in the order\n%v\nwant a's first %d, then all of b, then the rest of a", got, prefetchParallel)
			}
		})
	}
}

// TestPrefetchTakesWhatWasListedBefore: the directories listed just before the walk's
// first whole read (it listed them on its way, or the listing prefetch fetched them
// ahead of it) are fetched once the walk is seen, not only those listed after.
func TestPrefetchTakesWhatWasListedBefore(t *testing.T) {
	_, s, cb, remote := setup(t, t.TempDir(), Options{})
	const n = 5
	lists := prefetchTree(t, s, remote, n, "a", "b", "c")
	s.listed("a", lists["a"], true)
	s.listed("b", lists["b"], false)
	time.Sleep(10 * time.Millisecond)
	if got := cb.opens.Load(); got != 0 {
		t.Fatalf("%d files fetched before any walk", got)
	}
	s.wholeRead("c/f00")
	waitFor(t, func() bool { return cb.opens.Load() >= 3*n }, func() string {
		return fmt.Sprintf("%d files fetched, want the %d of a, b and c", cb.opens.Load(), 3*n)
	})
	for _, d := range []string{"a", "b", "c"} {
		for i := range n {
			p := fmt.Sprintf("%s/f%02d", d, i)
			waitWhole(t, s, p)
		}
	}
}

// waitWhole waits until the cache holds all of p as the server has it.
func waitWhole(t *testing.T, s *Source, p string) {
	t.Helper()
	a, err := s.Backend.Lstat(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return s.st.holdsWhole(p, a) }, func() string { return p + " not cached whole" })
}

// TestOpenWaitsForTheFetch: an open of a file the prefetch is fetching does not open
// it on the server too. It checks the file as a cached one (close-to-open) while the
// fetch finishes, or, trusted (-o nocto), waits for the fetch; then it reads from the
// cache. Only the prefetch's open reaches the server.
func TestOpenWaitsForTheFetch(t *testing.T) {
	for _, trusted := range []bool{false, true} {
		t.Run(fmt.Sprintf("trusted=%v", trusted), func(t *testing.T) {
			_, s, cb, remote := setup(t, t.TempDir(), Options{})
			lists := prefetchTree(t, s, remote, 1, "a")
			// An open on the server took a minute, as far as the wait knows: the
			// test, not the bound, decides when the fetch ends.
			s.pf.openTook.Store(int64(time.Minute))
			release := make(chan struct{})
			cb.duringOpen = func(string) { <-release }
			s.pf.mu.Lock()
			s.pf.walkUntil = time.Now().Add(time.Hour)
			s.pf.mu.Unlock()
			s.listed("a", lists["a"], true)
			waitFor(t, func() bool { return s.pf.fetchOf("a/f00") != nil },
				func() string { return "the prefetch did not start" })
			type result struct {
				f  backend.File
				ok bool
			}
			done := make(chan result, 1)
			go func() {
				if trusted {
					f, ok := s.OpenTrusted("a/f00", lists["a"][0].Attr)
					done <- result{f, ok}
					return
				}
				f, err := s.Open(context.Background(), "a/f00", os.O_RDONLY, 0)
				done <- result{f, err == nil}
			}()
			select {
			case r := <-done:
				t.Fatalf("the open returned (ok %v) before the fetch ended", r.ok)
			case <-time.After(50 * time.Millisecond):
			}
			close(release)
			r := <-done
			if !r.ok {
				t.Fatal("the open failed")
			}
			defer r.f.Close(context.Background()) //nolint:errcheck
			if _, cached := r.f.(*cachedFile); !cached {
				t.Errorf("opened as %T, want the cached file", r.f)
			}
			if got := cb.opens.Load(); got != 1 {
				t.Errorf("%d opens reached the server, want the prefetch's one", got)
			}
		})
	}
}
