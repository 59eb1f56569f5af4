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

// TestPrefetchFollowsTheWalk: the content prefetch fetches files in the order they
// were scheduled, except that the directory the walk is reading goes first. With a
// directory scheduled behind another (as listings fetched ahead of a walk schedule
// them) and the walk reading a file of the second, the second's files are fetched
// before the rest of the first's.
func TestPrefetchFollowsTheWalk(t *testing.T) {
	_, s, cb, remote := setup(t, t.TempDir(), Options{})
	const n = 40
	var want []string
	for _, d := range []string{"a", "b"} {
		if err := os.MkdirAll(filepath.Join(remote, d), 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if err := os.WriteFile(filepath.Join(remote, d, fmt.Sprintf("f%02d", i)), []byte(d), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx := context.Background()
	lists := map[string][]backend.Entry{}
	for _, d := range []string{"a", "b"} {
		list, err := s.ReadDir(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		lists[d] = list
	}
	// Every open waits for a token, so the fetches go one at a time once the
	// workers are all busy, and their order is the order of the opens.
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
		deadline := time.Now().Add(10 * time.Second)
		for opened() < k {
			if time.Now().After(deadline) {
				t.Fatalf("%d fetches started, want %d", opened(), k)
			}
			time.Sleep(time.Millisecond)
		}
	}
	s.pf.mu.Lock()
	s.pf.walkUntil = time.Now().Add(time.Hour)
	s.pf.mu.Unlock()
	s.listed("a", lists["a"])
	s.listed("b", lists["b"])
	waitOpened(prefetchParallel)
	s.wholeRead("b/f00") // the walk reads in b
	for k := prefetchParallel; k < 2*n; k++ {
		gate <- struct{}{}
		waitOpened(k + 1)
	}
	mu.Lock()
	got := slices.Clone(order)
	mu.Unlock()
	slices.Sort(got[:prefetchParallel]) // the first workers start together
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
}
