package fusefs

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/muxfs/muxfs/internal/backend"
)

// TestListedDirectoryRestatted: the kernel marks a directory's access time stale after
// reading its listing from muxfs, which would make the next stat of it a request;
// muxfs takes the directory's attributes again when the same thread opens its next
// listing, so a second walk of the tree asks nothing. The last directory listed is
// left marked (nothing follows it), which shows the kernel's mark is in effect here.
// With OPENDIR, the kernel's RELEASEDIR of a directory may come several listings
// later: muxfs must not wait for it (CI saw a directory missed that way).
func TestListedDirectoryRestatted(t *testing.T) {
	for _, mode := range []struct {
		name string
		o    Options
	}{
		{"dirless", Options{CacheDirs: true, DirTimeout: time.Minute}},
		{"opendir", Options{}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			local := dirTree(t, walkDirs)
			o := mode.o
			o.EntryTimeout, o.AttrTimeout = time.Minute, time.Minute
			mp, reqs := mountLoggedWith(t, local, o)
			from := listOnOneThread(t, mp, reqs, walkDirs)
			// The directories read before the last are statted in the background.
			refreshed := walkDirs[:len(walkDirs)-1]
			awaitRequests(t, reqs, "GETATTR", from, len(refreshed))
			time.Sleep(100 * time.Millisecond) // their answers reach the kernel
			from = fsize(t, reqs)
			for _, d := range refreshed {
				if _, err := os.Lstat(filepath.Join(mp, d)); err != nil {
					t.Fatal(err)
				}
			}
			if n := requestsSince(t, reqs, "GETATTR", from); n != 0 {
				t.Errorf("stat of the listed directories sent %d GETATTR requests, want 0:\n%s", n, logSince(t, reqs, from))
			}
			if _, err := os.Lstat(filepath.Join(mp, walkDirs[len(walkDirs)-1])); err != nil {
				t.Fatal(err)
			}
			if n := requestsSince(t, reqs, "GETATTR", from); n != 1 {
				t.Errorf("stat of the last directory listed sent %d GETATTR requests, want 1 (the kernel's mark)", n)
			}
		})
	}
}

// walkDirs are the directories the tests list, one after another.
var walkDirs = []string{"d0", "d1", "d2", "d3"}

// dirTree serves a local tree of the given directories, each holding two more.
func dirTree(t *testing.T, dirs []string) backend.Backend {
	t.Helper()
	root, local := localDir(t)
	for _, d := range dirs {
		for _, f := range []string{"a", "b"} {
			if err := os.MkdirAll(filepath.Join(root, d, f), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	return local
}

// listOnOneThread looks the directories up, then lists each from one thread, as a walk
// does (the kernel names the calling thread in requests), and returns where go-fuse's
// log stood before the listings.
func listOnOneThread(t *testing.T, mp string, reqs *os.File, dirs []string) int64 {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for _, d := range dirs {
		if _, err := os.Lstat(filepath.Join(mp, d)); err != nil {
			t.Fatal(err)
		}
	}
	from := fsize(t, reqs)
	for _, d := range dirs {
		if _, err := os.ReadDir(filepath.Join(mp, d)); err != nil {
			t.Fatal(err)
		}
	}
	return from
}

// logSince is what go-fuse logged to f after offset from.
func logSince(t *testing.T, f *os.File, from int64) string {
	t.Helper()
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(b[from:])
}

// fromStore answers every listing as if from the persistent cache's store.
type fromStore struct{ backend.Backend }

func (b fromStore) ReadDir(ctx context.Context, p string) ([]backend.Entry, error) {
	backend.NoteListingStored(ctx)
	return b.Backend.ReadDir(ctx, p)
}

// TestStoredListingNotRestatted: listings answered from the persistent cache's store
// (a walk right after a remount, which only uses the CPU) are not followed by muxfs'
// stats, so the kernel's mark stays and the next stat asks.
func TestStoredListingNotRestatted(t *testing.T) {
	mp, reqs := mountLoggedWith(t, fromStore{dirTree(t, walkDirs)}, Options{CacheDirs: true, DirTimeout: time.Minute,
		EntryTimeout: time.Minute, AttrTimeout: time.Minute})
	from := listOnOneThread(t, mp, reqs, walkDirs)
	time.Sleep(200 * time.Millisecond)
	if n := requestsSince(t, reqs, "GETATTR", from); n != 0 {
		t.Errorf("listings from the store were followed by %d GETATTR requests, want 0:\n%s", n, logSince(t, reqs, from))
	}
	from = fsize(t, reqs)
	if _, err := os.Lstat(filepath.Join(mp, walkDirs[0])); err != nil {
		t.Fatal(err)
	}
	if n := requestsSince(t, reqs, "GETATTR", from); n != 1 {
		t.Errorf("stat of a directory listed from the store sent %d GETATTR requests, want 1 (the kernel's mark, kept)", n)
	}
}
