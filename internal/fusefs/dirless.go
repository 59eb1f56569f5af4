package fusefs

import (
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/muxfs/muxfs/internal/backend"
)

// dirless serves directories without OPENDIR. Every directory a walk enters costs the
// kernel a synchronous OPENDIR round trip before its READDIRPLUSes, and a RELEASEDIR
// after; answering the first OPENDIR with ENOSYS (on a kernel that offers
// FUSE_NO_OPENDIR_SUPPORT, Linux 5.1+) makes the kernel open directories by itself from
// then on, keeping what it has read of a listing in its own cache until told to drop
// it. A walk of a tree the kernel holds then sends no request at all, and one it does
// not hold sends only its READDIRPLUSes.
//
// go-fuse's node bridge needs a handle for READDIRPLUS, so dirless opens one in process
// when the kernel starts reading a listing, and keeps it for that directory until the
// listing has been read to its end (or looks abandoned: see maxCursors).
//
// What OPENDIR did for coherency (compare the listing with the one the kernel cached)
// is done by expiry instead: the FS drops a listing from the kernel's cache when muxfs'
// own copy of it expires (FS.holdListing), so the kernel never keeps a listing longer
// than cache_timeout. Changes made through the mount are seen by the kernel at once:
// it drops its own copy of a directory it changes.
type dirless struct {
	fuse.RawFileSystem
	fsys *FS
	// supported reports whether the kernel offers FUSE_NO_OPENDIR_SUPPORT (known from
	// INIT, which comes before any OPENDIR).
	supported func() bool

	mu      sync.Mutex
	cursors map[uint64]cursor // directory node ID -> handle of a listing being read
}

type cursor struct {
	fh   uint64
	used time.Time
}

// maxCursors bounds the handles kept for listings whose reader stopped before their
// end (closedir early); beyond it the least recently used one is closed.
const maxCursors = 256

func newDirless(inner fuse.RawFileSystem, fsys *FS, supported func() bool) *dirless {
	return &dirless{RawFileSystem: inner, fsys: fsys, supported: supported, cursors: map[uint64]cursor{}}
}

func (d *dirless) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if !d.supported() {
		// An old kernel would pass ENOSYS on to the application.
		return d.RawFileSystem.OpenDir(cancel, in, out)
	}
	d.fsys.noOpendir.Store(true)
	return fuse.ENOSYS
}

func (d *dirless) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return d.read(cancel, in, out, d.RawFileSystem.ReadDir)
}

func (d *dirless) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return d.read(cancel, in, out, d.RawFileSystem.ReadDirPlus)
}

func (d *dirless) read(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList,
	read func(<-chan struct{}, *fuse.ReadIn, *fuse.DirEntryList) fuse.Status) fuse.Status {
	if in.Fh != 0 {
		// Opened by OPENDIR (a kernel without NO_OPENDIR): the bridge's own path.
		return read(cancel, in, out)
	}
	id := in.NodeId
	c, ok := d.take(id)
	if ok && in.Offset == 0 {
		// The listing starts again (rewinddir, or the last reader went away early):
		// read it afresh rather than from the old handle's snapshot.
		d.release(id, c.fh)
		ok = false
	}
	if !ok {
		var open fuse.OpenOut
		st := d.RawFileSystem.OpenDir(cancel, &fuse.OpenIn{InHeader: in.InHeader, Flags: syscall.O_RDONLY}, &open)
		if st != fuse.OK {
			return st
		}
		c.fh = open.Fh
	}
	// The bridge seeks the handle itself when the offset is not where it stopped
	// (another reader of the same directory, or an interrupted read).
	fwd := *in
	fwd.Fh = c.fh
	st := read(cancel, &fwd, out)
	if st != fuse.OK || out.Offset == in.Offset {
		// An error, or nothing more: the listing has been read to its end.
		d.release(id, c.fh)
		return st
	}
	c.used = time.Now()
	d.put(id, c)
	return st
}

// take removes and returns the handle kept for directory id, so that no other request
// uses it meanwhile.
func (d *dirless) take(id uint64) (cursor, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	c, ok := d.cursors[id]
	delete(d.cursors, id)
	return c, ok
}

// put keeps c for the next READDIRPLUS of directory id, closing what it displaces.
func (d *dirless) put(id uint64, c cursor) {
	var drop []uint64 // pairs: node ID, handle
	d.mu.Lock()
	if prev, ok := d.cursors[id]; ok {
		// Two readers of one directory at once: one handle is enough.
		drop = append(drop, id, prev.fh)
	}
	d.cursors[id] = c
	if len(d.cursors) > maxCursors {
		oldest := id
		for k, v := range d.cursors {
			if v.used.Before(d.cursors[oldest].used) {
				oldest = k
			}
		}
		drop = append(drop, oldest, d.cursors[oldest].fh)
		delete(d.cursors, oldest)
	}
	d.mu.Unlock()
	for i := 0; i < len(drop); i += 2 {
		d.release(drop[i], drop[i+1])
	}
}

func (d *dirless) release(id, fh uint64) {
	d.RawFileSystem.ReleaseDir(&fuse.ReleaseIn{InHeader: fuse.InHeader{NodeId: id}, Fh: fh})
}

// holdListing records that the kernel keeps the listing of directory n, which muxfs
// trusts until expires (zero: forever, a listing made only of the mount table).
func (f *FS) holdListing(n *node, expires time.Time) {
	if expires.IsZero() {
		return
	}
	f.heldMu.Lock()
	defer f.heldMu.Unlock()
	if f.held == nil {
		f.held = map[*node]time.Time{}
	}
	f.held[n] = expires
}

// expireListings drops from the kernel's cache each listing muxfs no longer trusts, and
// every listing when a union member leaves or returns, checking every tick until the
// server stops. The next readdir of such a directory
// reaches muxfs, which lists it again.
func (f *FS) expireListings(server *fuse.Server, tick time.Duration) {
	done := make(chan struct{})
	go func() { server.Wait(); close(done) }()
	t := time.NewTicker(tick)
	defer t.Stop()
	members := f.table.Membership()
	for {
		var now time.Time
		select {
		case <-done:
			return
		case now = <-t.C:
		case <-backend.HealthChanged():
			now = time.Now()
		}
		// A union member that left (its server is down) or came back changes
		// every merged listing: drop them all.
		changed := false
		if m := f.table.Membership(); !slices.Equal(m, members) {
			members, changed = m, true
		}
		f.heldMu.Lock()
		var old []*node
		for n, at := range f.held {
			if changed || !now.Before(at) {
				old = append(old, n)
				delete(f.held, n)
			}
		}
		f.heldMu.Unlock()
		for _, n := range old {
			// ENOENT when the kernel has forgotten the directory: nothing to drop.
			n.NotifyContent(0, 0)
		}
	}
}
