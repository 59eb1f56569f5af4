package e2e

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMetadataCacheAndRefresh: listings and names are cached for cache_timeout; file
// contents are checked at every open (close-to-open); `muxfs refresh` forgets a subtree
// at once; -o cache=no shows every change immediately.
func TestMetadataCacheAndRefresh(t *testing.T) {
	e := newEnv(t, 1)
	writeFile(t, e.data[0]+"/dir/f", "first version")
	mp := e.mount(e.source(0, ""))

	if got := strings.Join(names(t, mp+"/dir"), " "); got != "f" {
		t.Fatalf("listing: %q", got)
	}
	if readString(t, mp+"/dir/f") != "first version" {
		t.Fatal("first read")
	}
	// Changed on the server behind muxfs' back, to a different size: the next open
	// must see it (close-to-open), although the names are cached.
	writeFile(t, e.data[0]+"/dir/f", "second, longer version")
	if got := readString(t, mp+"/dir/f"); got != "second, longer version" {
		t.Errorf("after a change on the server, open+read gave %q", got)
	}
	// A new name on the server is not seen while the listing is cached...
	writeFile(t, e.data[0]+"/dir/new", "n")
	if got := strings.Join(names(t, mp+"/dir"), " "); got != "f" {
		t.Fatalf("expected the cached listing, got %q", got)
	}
	// ...until refresh.
	if out, err := exec.Command(muxfsBin, "refresh", mp+"/dir").CombinedOutput(); err != nil {
		t.Fatalf("muxfs refresh: %v %s", err, out)
	}
	if got := strings.Join(names(t, mp+"/dir"), " "); got != "f new" {
		t.Errorf("after refresh: %q", got)
	}
	if readString(t, mp+"/dir/new") != "n" {
		t.Error("refreshed name unreadable")
	}
	// Changes made through the mount are seen at once, cache or not.
	writeFile(t, mp+"/dir/mine", "m")
	if got := strings.Join(names(t, mp+"/dir"), " "); got != "f mine new" {
		t.Errorf("after a create through the mount: %q", got)
	}
	if out, err := exec.Command(muxfsBin, "refresh", "/").CombinedOutput(); err == nil || !strings.Contains(string(out), "not inside a muxfs mount") {
		t.Errorf("refresh outside a mount: %v %s", err, out)
	}

	t.Run("cache=no", func(t *testing.T) {
		mp := e.mount("-o", "cache=no", e.source(0, ""))
		names(t, mp+"/dir")
		writeFile(t, e.data[0]+"/dir/uncached", "u")
		if got := strings.Join(names(t, mp+"/dir"), " "); !strings.Contains(got, "uncached") {
			t.Errorf("with cache=no a new name must show at once: %q", got)
		}
	})

	// sshfs 3 spells cache_timeout dcache_timeout.
	for _, opt := range []string{"cache_timeout", "dcache_timeout"} {
		t.Run(opt, func(t *testing.T) {
			mp := e.mount("-o", opt+"=1", e.source(0, ""))
			names(t, mp+"/dir")
			writeFile(t, e.data[0]+"/dir/later-"+opt, "l")
			time.Sleep(1500 * time.Millisecond)
			if got := strings.Join(names(t, mp+"/dir"), " "); !strings.Contains(got, "later-"+opt) {
				t.Errorf("after %s a new name must show: %q", opt, got)
			}
		})
	}
}

// TestSymlinkTargetsCached: a symlink's target is cached like sshfs' (link timeout):
// replaced on the server it shows after `muxfs refresh` or dcache_link_timeout;
// replaced through the mount, at once.
func TestSymlinkTargetsCached(t *testing.T) {
	e := newEnv(t, 1)
	os.MkdirAll(e.data[0]+"/links", 0o755) //nolint:errcheck
	replace := func(target, at string) {
		t.Helper()
		os.Remove(at) //nolint:errcheck
		if err := os.Symlink(target, at); err != nil {
			t.Fatal(err)
		}
	}
	readlink := func(p, want string) {
		t.Helper()
		if got, err := os.Readlink(p); err != nil || got != want {
			t.Errorf("readlink %s: %q %v, want %q", p, got, err, want)
		}
	}
	replace("one", e.data[0]+"/links/l")
	mp := e.mount(e.source(0, ""))
	readlink(mp+"/links/l", "one")
	replace("two", e.data[0]+"/links/l")
	readlink(mp+"/links/l", "one") // within the timeout: cached
	if out, err := exec.Command(muxfsBin, "refresh", mp+"/links").CombinedOutput(); err != nil {
		t.Fatalf("muxfs refresh: %v %s", err, out)
	}
	readlink(mp+"/links/l", "two")
	// ln -sfn through the mount: seen at once.
	if out, err := exec.Command("ln", "-sfn", "three", mp+"/links/l").CombinedOutput(); err != nil {
		t.Fatalf("ln -sfn: %v %s", err, out)
	}
	readlink(mp+"/links/l", "three")
	readlink(e.data[0]+"/links/l", "three")

	t.Run("dcache_link_timeout", func(t *testing.T) {
		mp := e.mount("-o", "dcache_link_timeout=1", e.source(0, ""))
		readlink(mp+"/links/l", "three")
		replace("four", e.data[0]+"/links/l")
		time.Sleep(1500 * time.Millisecond)
		readlink(mp+"/links/l", "four")
	})
}

// TestReplacedByAnotherKindOfFile: a file replaced on the server by a symlink while
// open through the mount keeps its own attributes for fstat (go-fuse gives the node's
// type to whatever muxfs answers, so the symlink's size and mode passed for the open
// file's: posixtest's OpenSymlinkRace took that for an attack under load); a path
// whose name the kernel still holds shows the symlink.
func TestReplacedByAnotherKindOfFile(t *testing.T) {
	e := newEnv(t, 1)
	for _, name := range []string{"open", "named"} {
		writeFile(t, e.data[0]+"/"+name, "")
		if err := os.Chmod(e.data[0]+"/"+name, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The kernel keeps names but asks for attributes each time, as it does once a
	// name's attributes have expired.
	mp := e.mount("-o", "cache=no,entry_timeout=60,attr_timeout=0", e.source(0, ""))
	fd, err := syscall.Open(mp+"/open", syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd) //nolint:errcheck
	if _, err := os.Lstat(mp + "/named"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"open", "named"} {
		if err := os.Remove(e.data[0] + "/" + name); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/etc/passwd", e.data[0]+"/"+name); err != nil {
			t.Fatal(err)
		}
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		t.Fatalf("fstat of the open file: %v", err)
	}
	if st.Mode != syscall.S_IFREG|0o600 || st.Size != 0 {
		t.Errorf("fstat of the open file: mode %o size %d, want %o and 0", st.Mode, st.Size, syscall.S_IFREG|0o600)
	}
	if fi, err := os.Lstat(mp + "/named"); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("lstat of a name the kernel holds: %v (%v), want the symlink", fi, err)
	}
}

// TestWriteErrorReported: with write-behind, a write the server refuses (a full disk)
// must still fail the writer: at a later write or at close, never silently.
func TestWriteErrorReported(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	e := newEnv(t, 1)
	small := e.data[0] + "/small"
	os.MkdirAll(small, 0o755) //nolint:errcheck
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", small).CombinedOutput(); err != nil {
		t.Skipf("cannot mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", small).Run() }) //nolint:errcheck
	mp := e.mount(e.source(0, ""))
	out, err := exec.Command("dd", "if=/dev/zero", "of="+mp+"/small/big", "bs=64k", "count=64").CombinedOutput()
	if err == nil {
		t.Fatalf("writing 4 MiB to a 1 MiB file system succeeded:\n%s", out)
	}
	if !strings.Contains(string(out), "No space left") {
		t.Errorf("want ENOSPC, got:\n%s", out)
	}
}
