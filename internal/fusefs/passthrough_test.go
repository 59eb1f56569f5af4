package fusefs

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/muxfs/muxfs/internal/backend"
	"github.com/muxfs/muxfs/internal/diskcache"
)

// TestSmallFilesThroughPageCache: a small file the persistent cache holds whole is
// read through the page cache, not handed to the kernel (passthrough): opened and read
// again, and stat'ed between, it costs no READ and no GETATTR request (a passthrough
// read marks the access time stale, so each later stat would ask). A large one is
// still handed over where the kernel lets muxfs (as root).
func TestSmallFilesThroughPageCache(t *testing.T) {
	root, local := localDir(t)
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
	from := fsize(t, reqs)
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
	from = fsize(t, reqs)
	if err := os.WriteFile(filepath.Join(mp, "written"), small, 0o644); err != nil {
		t.Fatal(err)
	}
	if n := requestsSince(t, reqs, "FLUSH", from); n != 1 {
		t.Errorf("closing a file written to sent %d FLUSH requests; want 1 (its errors are reported there)", n)
	}

	// A large file read through the page cache stays there when opened again: the
	// kernel holds its pages, so the reread sends no READ and gets no passthrough
	// (which would read the cache's data file from the disk). The first open's
	// RELEASE comes after close(2) has returned, and until it is served the file
	// counts as open through the page cache, which would keep passthrough off anyway:
	// the reread waits for it.
	// What muxfs decides is the open: no passthrough, and the kernel's pages kept
	// (without KEEP_CACHE the kernel drops them all and reads the whole file again,
	// 8 READs of 128 KiB). The kernel may still reclaim a few pages on its own (once in
	// some hundred runs on a loaded machine, 3 READs), so only a whole read fails.
	fromPages := func(name, what string) {
		t.Helper()
		from := fsize(t, reqs)
		read(name, large)
		if n := requestsSince(t, reqs, "BACKING_OPEN", from); n != 0 {
			t.Errorf("%s was handed to the kernel (passthrough), want its pages:\n%s", what, logSince(t, reqs, from))
		}
		if n := requestsSince(t, reqs, "READ", from); n >= len(large)>>17 {
			t.Errorf("%s sent %d READ requests (the whole file), want its pages:\n%s", what, n, logSince(t, reqs, from))
		}
	}
	from = fsize(t, reqs)
	read("large", large)
	awaitRequests(t, reqs, "RELEASE", from, 1)
	fromPages("large", "a reread of a large file this mount has just read")
	// So does one it has just written (its pages hold what was written), opened again
	// before the kernel's RELEASE of the writer, as a linker opens the object a
	// compiler has just closed: RELEASE comes after close(2), here not at all while a
	// duplicate of the writer's descriptor stays open.
	w, err := os.Create(filepath.Join(mp, "large-written"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(large); err != nil {
		t.Fatal(err)
	}
	dup, err := syscall.Dup(int(w.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil { // FLUSH: the server has every write
		t.Fatal(err)
	}
	fromPages("large-written", "reading a large file this mount has just written")
	syscall.Close(dup)
	if os.Geteuid() != 0 {
		return // passthrough needs CAP_SYS_ADMIN
	}
	// Another mount of the same cache holds no pages of it: the kernel reads the
	// cache's file itself (passthrough).
	mp2, reqs2 := mountLogged(t, diskcache.Wrap(local, st, true, true, up, slog.New(slog.DiscardHandler)))
	from = fsize(t, reqs2)
	got, err := os.ReadFile(filepath.Join(mp2, "large"))
	if err != nil || !bytes.Equal(got, large) {
		t.Fatalf("reading large through a new mount: %d bytes, %v", len(got), err)
	}
	if requestsSince(t, reqs2, "BACKING_OPEN", from) == 0 {
		t.Errorf("a large file held whole was not handed to the kernel (passthrough) by a new mount:\n%s", logSince(t, reqs2, from))
	}
}
