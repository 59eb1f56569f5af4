package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
)

// TestFuseMountsUnder: only FUSE mounts below the run's directory are taken, and a
// mount comes before the one it is mounted in.
func TestFuseMountsUnder(t *testing.T) {
	mounts := map[string]string{
		"/tmp/run":               "tmpfs",
		"/tmp/run/mnt/a":         "fuse.muxfs",
		"/tmp/run/mnt/a/b/c":     "fuse.sshfs",
		"/tmp/run/mnt/a/b":       "fuse.rclone",
		"/tmp/run/data":          "ext4",
		"/tmp/run2/mnt":          "fuse.muxfs",
		"/tmp/other/mnt":         "fuse.sshfs",
		"/tmp/run/mnt/zzzzzzzzz": "fuse",
	}
	got := fuseMountsUnder(mounts, "/tmp/run")
	want := map[string]bool{"/tmp/run/mnt/a": true, "/tmp/run/mnt/a/b": true, "/tmp/run/mnt/a/b/c": true, "/tmp/run/mnt/zzzzzzzzz": true}
	if len(got) != len(want) {
		t.Fatalf("got %q, want the %d FUSE mounts under /tmp/run", got, len(want))
	}
	for _, mp := range got {
		if !want[mp] {
			t.Errorf("%s taken, not a FUSE mount under /tmp/run", mp)
		}
	}
	at := func(mp string) int { return slices.Index(got, mp) }
	if !(at("/tmp/run/mnt/a/b/c") < at("/tmp/run/mnt/a/b") && at("/tmp/run/mnt/a/b") < at("/tmp/run/mnt/a")) {
		t.Errorf("order %q: each mount must come before the one it is in", got)
	}
}

// withDir is a file system whose root holds one empty directory, to mount on.
type withDir struct{ fs.Inode }

func (n *withDir) OnAdd(ctx context.Context) {
	n.AddChild("inner", n.NewPersistentInode(ctx, &fs.Inode{}, fs.StableAttr{Mode: syscall.S_IFDIR}), false)
}

// TestTeardownRun: the teardown leaves nothing mounted under the run's directory, a
// FUSE mount inside another included, before its own steps run (newest first), and
// does all that once however often it is called (the signal and the normal end may
// race).
func TestTeardownRun(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	root := t.TempDir()
	outer := filepath.Join(root, "mnt", "outer")
	if err := os.MkdirAll(outer, 0o755); err != nil {
		t.Fatal(err)
	}
	srv, err := fs.Mount(outer, &withDir{}, &fs.Options{})
	if err != nil {
		t.Skipf("cannot mount here: %v", err)
	}
	inner := filepath.Join(outer, "inner")
	t.Cleanup(func() {
		for _, mp := range []string{inner, outer} {
			if isMounted(mp) {
				syscall.Unmount(mp, syscall.MNT_DETACH) //nolint:errcheck // the test has failed already
			}
		}
	})
	if _, err := fs.Mount(inner, &fs.Inode{}, &fs.Options{}); err != nil {
		t.Fatalf("mount inside the mount: %v", err)
	}

	tear := teardown{root: root}
	var steps []string
	tear.push(func() {
		steps = append(steps, "first pushed")
		for _, mp := range []string{inner, outer} {
			if isMounted(mp) {
				t.Errorf("%s still mounted when the steps run", mp)
			}
		}
	})
	tear.push(func() { steps = append(steps, "last pushed") })
	tear.run()
	tear.run()
	if want := []string{"last pushed", "first pushed"}; !slices.Equal(steps, want) {
		t.Errorf("steps ran %q, want %q", steps, want)
	}
	srv.Wait() // the outer mount's server ends with its unmount
}

// TestAwaitExit: the process whose command line ends with the mount point is waited
// for and killed at the limit; one mounted at a longer path (muxfs-nocto beside
// muxfs) is neither waited for nor killed.
func TestAwaitExit(t *testing.T) {
	mp := filepath.Join(t.TempDir(), "mnt", "muxfs")
	// start runs a process whose command line ends with arg; the channel is closed
	// when it has ended.
	start := func(arg string) chan struct{} {
		c := exec.Command("sh", "-c", "sleep 30", "sh", arg)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		ended := make(chan struct{})
		go func() { c.Wait(); close(ended) }()          //nolint:errcheck // killed is how it ends
		t.Cleanup(func() { c.Process.Kill(); <-ended }) //nolint:errcheck // ended already, in the passing case
		return ended
	}
	other := start(mp + "-nocto")
	daemon := start(mp)
	began := time.Now()
	awaitExit(mp, 300*time.Millisecond)
	if d := time.Since(began); d < 300*time.Millisecond {
		t.Fatalf("returned after %v with the process still there", d)
	}
	select {
	case <-daemon:
	case <-time.After(5 * time.Second):
		t.Fatal("the process mounted at the point was not killed")
	}
	select {
	case <-other:
		t.Fatal("the process of the longer path was killed")
	case <-time.After(200 * time.Millisecond):
	}
	began = time.Now()
	awaitExit(mp, 10*time.Second)
	if d := time.Since(began); d > 2*time.Second {
		t.Fatalf("waited %v with no process mounted at the point", d)
	}
}
