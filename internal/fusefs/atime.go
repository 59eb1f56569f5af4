package fusefs

import (
	"context"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// After the kernel reads part of a listing from muxfs (any READDIR it does not serve
// from its own cache) it marks the directory's access time stale
// (fuse_invalidate_atime), so the next stat of that directory is a GETATTR request
// even though its attributes are otherwise valid: a second walk of a tree (the hot
// `find`, `ls -l` after `ls`) paid one FUSE round trip per directory, 23–27 µs here,
// which no answer from memory can shorten. The kernel forgets the mark when it next
// takes attributes for the directory, so muxfs stats such a directory through its own
// mount once the mark is set: the GETATTR is paid in the background of the first walk
// and the next walk asks nothing.
//
// When is the mark set? In the reading thread, after muxfs' answer to its last
// READDIR has reached it; a GETATTR answered before that clears nothing. So the stat
// waits for the same thread's next listing (the walk's next directory): by then the
// mark is set, and the thread is inside a system call on the mount, which keeps the
// mount busy anyway. A stat sent at any other moment could make an unmount that
// follows a listing fail with EBUSY (measured: 3 of 15 `fusermount3 -u` right after
// `ls -lR`, with stats sent 2 ms after each listing's end). The last directory a
// thread lists is not refreshed.
//
// The stat moves a GETATTR from the next walk into this one, where it is free while
// the walk waits for the server, but not where the walk only uses the CPU: a `find`
// right after a remount, every listing answered from the persistent cache's store,
// took 0.28–0.36 s with the stats against 0.23–0.25 without (and the next one 0.023
// against 0.06). Listings from the store are therefore not followed by a stat.

// listedCap bounds the threads whose listed directories wait for their next listing:
// threads that list nothing more (an `ls` that exits) leave theirs behind, and past
// the cap all waiting ones are dropped (their next stat asks, as without this).
const listedCap = 1024

// listedPerThread bounds the directories one thread may have read to their end
// before it opens another listing.
const listedPerThread = 64

type listedDirs struct {
	mu    sync.Mutex
	byTID map[uint32][]*node
}

// listed notes that thread tid is reading n's listing from muxfs.
func (f *FS) listed(n *node, tid uint32) {
	if !f.restat || tid == 0 {
		return
	}
	l := &f.listedDirs
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byTID == nil || len(l.byTID) >= listedCap {
		l.byTID = map[uint32][]*node{}
	}
	if len(l.byTID[tid]) < listedPerThread {
		l.byTID[tid] = append(l.byTID[tid], n)
	}
}

// requestTID is the thread that made the request behind ctx (the FUSE header's pid is
// the caller's thread ID); 0 when unknown.
func requestTID(ctx context.Context) uint32 {
	if caller, ok := fuse.FromContext(ctx); ok {
		return caller.Pid
	}
	return 0
}

// listing is called when thread tid opens a listing: the directories it read before
// are statted through the mount, in the background. Errors are ignored: a directory
// removed or renamed since has nothing to refresh.
func (f *FS) listing(tid uint32) {
	if !f.restat || tid == 0 {
		return
	}
	l := &f.listedDirs
	l.mu.Lock()
	dirs := l.byTID[tid]
	delete(l.byTID, tid)
	l.mu.Unlock()
	if len(dirs) == 0 {
		return
	}
	go func() {
		for _, n := range dirs {
			vp, ok := n.vpath()
			if !ok {
				continue
			}
			p := f.mountpoint
			if vp != "/" {
				p += vp
			}
			var st unix.Stat_t
			unix.Lstat(p, &st) //nolint:errcheck // see above
		}
	}()
}
