package fusefs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/muxfs/muxfs/internal/backend"
)

// inParts lists directory dir as the SFTP backend does, handing it out in parts of
// 100 entries (backend.WithListingProgress) before returning the whole. After the
// first hold entries it waits until release is closed. Then it hands every part out
// again when again is set (a fetch that started over), and fails with fail if set.
type inParts struct {
	backend.Backend
	dir     string
	hold    int
	held    chan struct{} // closed once it waits at hold
	release chan struct{}
	again   bool
	fail    error
	once    sync.Once
}

func (b *inParts) ReadDir(ctx context.Context, p string) ([]backend.Entry, error) {
	list, err := b.Backend.ReadDir(ctx, p)
	if err != nil || p != b.dir {
		return list, err
	}
	progress := backend.ListingProgress(ctx)
	send := func(hold bool) {
		for i := 0; i < len(list); i += 100 {
			if hold && i >= b.hold {
				b.once.Do(func() { close(b.held) })
				<-b.release
				hold = false
			}
			if progress != nil {
				progress(list[i:min(i+100, len(list))])
			}
		}
	}
	send(true)
	if b.again {
		send(false)
	}
	if b.fail != nil {
		return nil, b.fail
	}
	return list, nil
}

// bigDirMounted mounts a local directory holding dir "big" of n empty files, listed
// through b (its Backend is set here), and returns the mount point and the names.
func bigDirMounted(t *testing.T, b *inParts, n int) (string, map[string]bool) {
	t.Helper()
	root, local := localDir(t)
	names := map[string]bool{}
	if err := os.Mkdir(filepath.Join(root, "big"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		name := fmt.Sprintf("out-%05d", i)
		names[name] = true
		if err := os.WriteFile(filepath.Join(root, "big", name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b.Backend, b.dir = local, "big"
	b.held, b.release = make(chan struct{}), make(chan struct{})
	mp, _ := mountLoggedWith(t, b, Options{CacheDirs: true, DirTimeout: time.Minute,
		EntryTimeout: time.Minute, AttrTimeout: time.Minute})
	return mp, names
}

// readNames reads the rest of f, 100 entries at a time, adding each name to seen and
// telling read how many it has after each part. It returns the error that ended it
// (nil at the end), or a name that is not one of want or came twice.
func readNames(f *os.File, want, seen map[string]bool, read chan<- int) error {
	for {
		ents, err := f.ReadDir(100)
		for _, e := range ents {
			if !want[e.Name()] || seen[e.Name()] {
				return fmt.Errorf("%q listed twice, or not in the directory", e.Name())
			}
			seen[e.Name()] = true
		}
		if read != nil {
			read <- len(seen)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// openHeldListing mounts directory "big" of 3,000 files whose listing is held after
// 2,000 entries until b.release is closed, and opens it (closed at the test's end).
func openHeldListing(t *testing.T) (b *inParts, mp string, names map[string]bool, f *os.File) {
	t.Helper()
	b = &inParts{hold: 2 * streamAfter}
	mp, names = bigDirMounted(t, b, 3000)
	f, err := os.Open(filepath.Join(mp, "big"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return b, mp, names, f
}

// TestBigListingReadWhileArriving: the kernel reads a big listing while the rest of
// it is still on its way from the server (`ls -f` of a directory of 100,000 files
// waited about 1 s for the whole before its first entry, and only then did the
// kernel's inodes get made), and the whole listing arrives, each name once.
func TestBigListingReadWhileArriving(t *testing.T) {
	b, _, names, f := openHeldListing(t)
	seen := map[string]bool{}
	read := make(chan int, 100)
	done := make(chan error, 1)
	go func() { done <- readNames(f, names, seen, read) }()
	select {
	case <-read:
	case <-time.After(10 * time.Second):
		close(b.release)
		<-done
		t.Fatalf("no entry read while the listing was held after %d entries", b.hold)
	}
	select {
	case <-b.held:
	default:
		t.Fatal("the first entries were read before the listing reached its hold")
	}
	// The reader goes on to the entries that arrived, then waits for the rest
	// (a reader that found the end there would stop short).
	time.Sleep(300 * time.Millisecond)
	close(b.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(seen) != len(names) {
		t.Errorf("%d of %d names listed", len(seen), len(names))
	}
}

// TestBigListingStartedOver: a listing whose fetch started over (a lost connection)
// hands out its first parts twice; each name is still listed once.
func TestBigListingStartedOver(t *testing.T) {
	b := &inParts{hold: 1 << 30, again: true}
	mp, names := bigDirMounted(t, b, 2500)
	ents, err := os.ReadDir(filepath.Join(mp, "big"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range ents {
		if !names[e.Name()] || seen[e.Name()] {
			t.Fatalf("%q listed twice, or not in the directory", e.Name())
		}
		seen[e.Name()] = true
	}
	if len(seen) != len(names) {
		t.Errorf("%d of %d names listed", len(seen), len(names))
	}
}

// TestBigListingFailsPartWay: a listing that fails after the kernel started reading it
// ends with the error, after the entries that came before it; one that fails before
// fails the open (here, the first read: the kernel opens directories itself).
func TestBigListingFailsPartWay(t *testing.T) {
	fail := &backend.Error{Op: "readdir", Path: "big", Errno: syscall.EIO, Cause: errors.New("connection lost")}
	b := &inParts{hold: 2 * streamAfter, fail: fail}
	mp, names := bigDirMounted(t, b, 3000)
	close(b.release)
	f, err := os.Open(filepath.Join(mp, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := map[string]bool{}
	err = readNames(f, names, seen, nil)
	if !errors.Is(err, syscall.EIO) {
		t.Errorf("listing ended with %v, want EIO", err)
	}
	if len(seen) < streamAfter {
		t.Errorf("%d entries before the error, want the %d or more that arrived", len(seen), streamAfter)
	}

	small := &inParts{hold: 1 << 30, fail: fail}
	mp2, _ := bigDirMounted(t, small, streamAfter/2)
	if _, err := os.ReadDir(filepath.Join(mp2, "big")); !errors.Is(err, syscall.EIO) {
		t.Errorf("a listing failed before it was read: %v, want EIO", err)
	}
}

// TestListedNameRenamedBeforeLookup: a listing hands the kernel the inode numbers it
// took when it arrived, but a file renamed through the mount in between takes its
// number with it. The old name, still in the listing, must then not get the renamed
// file's number (the kernel would show the two names as one file).
func TestListedNameRenamedBeforeLookup(t *testing.T) {
	b, mp, names, f := openHeldListing(t)
	if _, err := f.ReadDir(100); err != nil {
		t.Fatal(err)
	}
	<-b.held
	// The last entry before the hold has its number from the listing, and the kernel
	// has not looked it up yet (it reads a few dozen entries ahead of the reader).
	old, renamed := filepath.Join(mp, "big", "out-01999"), filepath.Join(mp, "big", "renamed")
	if err := os.Rename(old, renamed); err != nil {
		t.Fatal(err)
	}
	close(b.release)
	if err := readNames(f, names, map[string]bool{}, nil); err != nil {
		t.Fatal(err)
	}
	var st, rst syscall.Stat_t
	if err := syscall.Lstat(renamed, &rst); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Lstat(old, &st); err == nil && st.Ino == rst.Ino {
		t.Errorf("the old name, listed before the rename, has the renamed file's number %d", st.Ino)
	}
}
