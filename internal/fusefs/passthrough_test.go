package fusefs

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/muxfs/muxfs/internal/backend"
	"github.com/muxfs/muxfs/internal/diskcache"
)

// TestSmallFilesThroughPageCache: a small file the persistent cache holds whole is
// read through the page cache, not handed to the kernel (passthrough): opened and read
// again, and stat'ed between, it costs no READ and no GETATTR request (a passthrough
// read marks the access time stale, so each later stat would ask). A large one is
// still handed over where the kernel lets muxfs (as root).
func TestSmallFilesThroughPageCache(t *testing.T) {
	root := t.TempDir()
	local, err := backend.NewLocal(root)
	if err != nil {
		t.Fatal(err)
	}
	c, err := diskcache.Open(t.TempDir(), diskcache.Options{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Store("test:" + root)
	if err != nil {
		t.Fatal(err)
	}
	up := func() backend.State { return backend.StateUp }
	mp, reqs := mountLogged(t, diskcache.Wrap(local, st, true, true, up, slog.New(slog.DiscardHandler)))

	small := bytes.Repeat([]byte("h"), 20<<10)
	large := bytes.Repeat([]byte("d"), passthroughMin)
	os.WriteFile(filepath.Join(root, "small.h"), small, 0o644) //nolint:errcheck
	os.WriteFile(filepath.Join(root, "large"), large, 0o644)   //nolint:errcheck
	read := func(name string, want []byte) {
		t.Helper()
		got, err := os.ReadFile(filepath.Join(mp, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("reading %s: %d bytes, %v", name, len(got), err)
		}
		if _, err := os.Stat(filepath.Join(mp, name)); err != nil {
			t.Fatal(err)
		}
	}
	read("small.h", small) // fetched into the persistent cache and the page cache
	read("small.h", small)
	from := logSize(t, reqs)
	for range 3 {
		read("small.h", small)
	}
	for _, op := range []string{"READ", "GETATTR"} {
		if n := requestsSince(t, reqs, op, from); n != 0 {
			t.Errorf("three more opens, reads and stats of a cached small file sent %d %s requests", n, op)
		}
	}
	if n := requestsSince(t, reqs, "OPEN", from); n != 3 {
		t.Errorf("%d OPEN requests for three opens; want each checked (close-to-open)", n)
	}
	if n := requestsSince(t, reqs, "FLUSH", from); n != 0 {
		t.Errorf("closing a read-only file three times sent %d FLUSH requests; want none", n)
	}
	from = logSize(t, reqs)
	if err := os.WriteFile(filepath.Join(mp, "written"), small, 0o644); err != nil {
		t.Fatal(err)
	}
	if n := requestsSince(t, reqs, "FLUSH", from); n != 1 {
		t.Errorf("closing a file written to sent %d FLUSH requests; want 1 (its errors are reported there)", n)
	}

	read("large", large)
	if os.Geteuid() != 0 {
		return // passthrough needs CAP_SYS_ADMIN
	}
	// The kernel sends the first open's RELEASE after close(2) has returned: until it
	// is served the file counts as open through the page cache, and an open then gets
	// no passthrough (the kernel refuses to mix the two). A loaded machine serves it
	// late, so the next opens may have to wait for it.
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		from = logSize(t, reqs)
		read("large", large)
		if requestsSince(t, reqs, "BACKING_OPEN", from) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a large file held whole was not handed to the kernel (passthrough)")
		}
	}
}
