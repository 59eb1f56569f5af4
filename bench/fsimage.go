package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// The bench's files (the server's data, muxfs' cache, the mount points) live on a
// fresh ext4 with a journal, made for the run in a sparse image on a loop device.
// This machine's root file system is an ext4 without a journal, and without one ext4
// does not reuse an inode freed in the last minutes: each create scans past them
// (find_inode_bit → recently_deleted in perf). After an untar's rm -rf a create
// there cost 0.34–0.94 ms of kernel time against 24 µs on a journaled ext4, growing
// with every workload that deleted files before — and muxfs, which keeps a cache
// file per file, paid it twice per create. A user's disk has a journal.
const fsNote = "the bench's files (server data, muxfs' cache) are on a fresh journaled ext4 in a loop-mounted image (direct I/O), made for the run"

// fsImage makes the file system and mounts it at dir; undo unmounts and frees it.
func fsImage(dir string, gib int) (undo func(), err error) {
	img := strings.TrimSuffix(dir, "/") + ".img"
	if err := run("truncate", "-s", fmt.Sprintf("%dG", gib), img); err != nil {
		return nil, err
	}
	out, err := exec.Command("losetup", "--find", "--show", "--direct-io=on", img).Output()
	if err != nil {
		os.Remove(img)
		return nil, fmt.Errorf("losetup %s: %v", img, err)
	}
	dev := strings.TrimSpace(string(out))
	undo = func() {
		// A process that was killed just before may hold files there a moment longer;
		// past that, detach it lazily so that the device goes once it is free.
		for try := 0; run("umount", dir) != nil && isMounted(dir); try++ {
			if try == 10 {
				run("umount", "-l", dir) //nolint:errcheck // best effort at exit
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		run("losetup", "-d", dev) //nolint:errcheck
		os.Remove(img)
	}
	if err := run("mkfs.ext4", "-q", "-F", dev); err != nil {
		undo()
		return nil, err
	}
	if err := run("mount", dev, dir); err != nil {
		undo()
		return nil, err
	}
	return undo, nil
}
