package fusefs

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/muxfs/muxfs/internal/backend"
	"github.com/muxfs/muxfs/internal/mux"
)

// node is every file, directory and symlink of the mount. It stays small: go-fuse
// keeps the tree and the path; the node remembers which branch of its layer holds it.
type node struct {
	fs.Inode
	fsys *FS

	mu     sync.Mutex
	branch int   // the winning branch's index in the layer; -1: made by the mount table
	dirs   []int // for a directory: the branches whose directories are merged here
	nlink  uint32

	// file is the state of a file opened or changed through the mount (fst), nil
	// until then.
	file atomic.Pointer[fileState]

	// For a directory: the checksum of the listing the kernel may have cached.
	listingSum uint64
}

// fileState is what a node holds once its file is opened or changed through the
// mount. It is kept apart because a listing makes a node for every entry, and most
// are never opened: with it inside, a node took 440 bytes (a directory of 100,000
// files listed with `ls -l` took 45 MB of nodes), 200 without. seen, seenValid,
// writers, paged and the open counts are guarded by the node's mu.
type fileState struct {
	// The version (size, mtime) the file's pages in the kernel's cache are of, and the
	// handles open for writing (their writes may still be in flight). Only an open
	// (keepCache, which drops the pages when the server's version differs) and the
	// mount's own writes set the version; a stat does not, since the kernel keeps a
	// file's pages whatever attributes it is told (muxfs invalidates them explicitly).
	seen      backend.Attr
	seenValid bool
	writers   map[*fileHandle]struct{}
	// changes counts the writes and changes of size made through the mount; a handle
	// that reads after one it has not seen drops what it read ahead (Read).
	changes atomic.Uint64
	// statMu is held shared by each write until it is queued, and exclusively while a
	// writer takes the server's word for the file after its writes (statWritten): that
	// word must include every write the mount has answered, through any handle, since
	// the persistent cache adopts it as the version of what it holds. Only writes
	// need it: the cache takes a write in before the server has it, and a change of
	// size only once the server made it.
	statMu sync.RWMutex
	// viewMu orders the handles' views of the file (fileHandle.attr) between a
	// change of size, which sets every writer's view, and a writer's release, which
	// hands its view to those still open: a release that took its view before a
	// truncation and handed it on after gave the others the size from before it
	// (the kernel sends RELEASE after close(2) has returned, while the program goes
	// on), and stats answered that size. viewChanges counts the changes applied to
	// the views, so that a writer's close, which makes the server's word after its
	// writes its view, can tell whether a change came between that word and now
	// (fileHandle.settle).
	viewMu      sync.Mutex
	viewChanges uint64
	// paged: the kernel's page cache may hold pages of that version, read or written
	// through a page-cached handle of this mount (openMode keeps later opens on them).
	paged bool

	// Open handles by kernel I/O mode. The kernel refuses (EIO) a passthrough open
	// while the inode has page-cached opens, and a page-cached open while it has
	// passthrough ones; direct-I/O opens mix with either. ptAttr is the file (size,
	// mtime) the passthrough handles' backing cache file holds: go-fuse hands that
	// same backing file to every later passthrough open of the node while one is open.
	cachedOpen int
	ptOpen     int
	ptAttr     backend.Attr
}

// fst is the node's file state, made on first use.
func (n *node) fst() *fileState {
	if f := n.file.Load(); f != nil {
		return f
	}
	n.file.CompareAndSwap(nil, &fileState{})
	return n.file.Load()
}

func (n *node) nlinkNow() uint32 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.nlink
}

// report fills out for the kernel with a, the file as a server showed it — or, while
// the file is being written through the mount, as its writers have made it
// (writersAttr): the server may not have every write yet, and the kernel takes the
// size of a LOOKUP's answer (a path's name looked up again once its entry timed out,
// each entry of a READDIRPLUS) as it takes a GETATTR's, shrinking the file it has
// just grown for the writer too.
func (n *node) report(out *fuse.Attr, a backend.Attr) {
	if w, ok := n.writersAttr(); ok {
		a = w
	} else {
		n.dropStalePages(a)
	}
	nlink := n.nlinkNow()
	if nlink == 0 {
		// Never looked up (the root): SFTP gives a link count only in listings, so
		// take the source's if it has one, else 1, which find and fts read as
		// "unknown" for a directory (sshfs shows the same), never 0 ("deleted").
		nlink = max(a.Nlink, 1)
	}
	fillAttr(out, a, n.StableAttr().Ino, nlink)
}

// dropStalePages drops the kernel's pages of the file when a, about to be reported,
// is another version than the one they are of. The kernel applies the size of an
// answer to the file it holds but keeps its pages (the data cache is under muxfs'
// control): after a file grew on the server, the last page read before kept zeros
// past the old end, and a reader that follows the file through one descriptor
// (`tail -f` of a job's log) read those zeros as the new bytes. Notifying from a
// GETATTR or a LOOKUP is safe: invalidating needs only the file's page locks, and
// the only request that holds them while it waits for muxfs is a WRITE, which
// another goroutine answers (and a file with writers is not notified here: report
// answers their view). The kernel then ignores this answer's attributes for the file
// (its attribute version moved) and asks again when it needs them.
func (n *node) dropStalePages(a backend.Attr) {
	f := n.file.Load()
	if f == nil {
		return // never opened: the kernel holds no pages muxfs let it keep
	}
	n.mu.Lock()
	stale := f.paged && f.seenValid && !sameVersion(f.seen, a)
	if stale {
		f.paged = false
	}
	n.mu.Unlock()
	if stale {
		n.NotifyContent(0, 0)
	}
}

// seeLocked records that the kernel's pages of the file are of version a; those of
// the version before, if it differs, are no longer known to be there (paged).
func (n *node) seeLocked(a backend.Attr) {
	f := n.fst()
	if !f.seenValid || !sameVersion(f.seen, a) {
		f.paged = false
	}
	f.seen, f.seenValid = a, true
}

// sameVersion: a and b are the same content as far as SFTP can tell (size and mtime).
func sameVersion(a, b backend.Attr) bool {
	return a.Size == b.Size && a.Mtime.Equal(b.Mtime)
}

// state is a consistent copy of the node's resolution.
func (n *node) state() (branch int, dirs []int, nlink uint32) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.branch, n.dirs, n.nlink
}

func (n *node) setFound(f mux.Found, synthetic bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if synthetic {
		n.branch, n.dirs, n.nlink = -1, nil, 2
		return
	}
	n.branch, n.dirs = f.Index, f.Dirs
	if f.Attr.Nlink != 0 {
		n.nlink = f.Attr.Nlink
	} else if n.nlink == 0 {
		n.nlink = 1
	}
}

// where is the node's path, the layer serving it and the path inside that layer;
// ENOENT if the node has been unlinked.
func (n *node) where() (vp string, l *mux.Layer, rel string, errno syscall.Errno) {
	vp, ok := n.vpath()
	if !ok {
		return "", nil, "", syscall.ENOENT
	}
	l, rel = n.fsys.table.Enclosing(vp)
	return vp, l, rel, 0
}

// resolve finds vp: a directory guaranteed by the mount table (merged with a real
// directory of the enclosing layer where there is one), or a name of the layer.
func (f *FS) resolve(ctx context.Context, vp string) (l *mux.Layer, rel string, found mux.Found, synthetic bool, err error) {
	l, rel = f.table.Enclosing(vp)
	if f.table.Junction(vp) {
		if l != nil {
			if fd, err := l.Resolve(ctx, rel); err == nil && fd.Attr.IsDir() {
				return l, rel, fd, false, nil
			}
		}
		return l, rel, mux.Found{Index: -1}, true, nil
	}
	if l == nil {
		return nil, "", mux.Found{}, false, syscall.ENOENT
	}
	found, err = l.Resolve(ctx, rel)
	return l, rel, found, false, err
}

// child makes (or finds again) the inode for name below n from a resolution.
func (n *node) child(ctx context.Context, name string, ino uint64, found mux.Found, synthetic bool, out *fuse.EntryOut) *fs.Inode {
	attr := found.Attr
	if synthetic {
		attr = n.fsys.syntheticAttr()
	}
	id := fs.StableAttr{Mode: attr.Type(), Ino: ino}
	// The node the kernel already has for this name must take the new resolution (a
	// union directory that another member now also holds, a file's new link count):
	// go-fuse keeps the node it has for the same StableAttr and drops a new one, and
	// NewInode cannot tell, since go-fuse matches them only after Lookup returns.
	if old := n.GetChild(name); old != nil && old.StableAttr() == id {
		if ch, ok := old.Operations().(*node); ok {
			ch.setFound(found, synthetic)
			ch.report(&out.Attr, attr)
			return old
		}
	}
	ch := &node{fsys: n.fsys}
	ch.setFound(found, synthetic)
	inode := n.NewInode(ctx, ch, id)
	ch.report(&out.Attr, attr)
	return inode
}

var _ = (fs.NodeLookuper)((*node)(nil))

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ctx = uninterruptible(ctx)
	if errno := checkName(name); errno != 0 {
		return nil, errno
	}
	dir, ok := n.vpath()
	if !ok {
		return nil, syscall.ENOENT
	}
	vp := join(dir, name)
	l, rel, found, synthetic, err := n.fsys.resolve(ctx, vp)
	if err != nil {
		return nil, n.fsys.toErrno(err)
	}
	return n.child(ctx, name, n.fsys.inoOf(vp, l, rel, found, synthetic), found, synthetic, out), 0
}

// inoOf is the inode number of the path vp, resolved to rel on l's member found.Index
// or, if synthetic (a directory of the mount table alone), of vp itself.
func (f *FS) inoOf(vp string, l *mux.Layer, rel string, found mux.Found, synthetic bool) uint64 {
	if synthetic {
		return f.inodes.get(-1, vp[1:])
	}
	return f.inodes.get(l.Branches[found.Index].ID, rel)
}

var _ = (fs.NodeGetattrer)((*node)(nil))

func (n *node) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	ctx = uninterruptible(ctx)
	ino := n.StableAttr().Ino
	// While the file is being written through the mount, its writers know its size
	// best: the server has not seen every write yet, and a smaller size from it would
	// make the kernel shrink the file it has just grown.
	if a, ok := n.writersAttr(); ok {
		fillAttr(&out.Attr, a, ino, n.nlinkNow())
		return 0
	}
	vp, l, rel, errno := n.where()
	if errno != 0 {
		// Unlinked while open: only the handle still reaches the file.
		return n.attrByHandle(ctx, fh, errno, out)
	}
	branch, _, _ := n.state()
	if branch < 0 || l == nil {
		fillAttr(&out.Attr, n.fsys.syntheticAttr(), ino, 2)
		return 0
	}
	a, err := l.Branches[branch].Backend.Lstat(ctx, rel)
	if err != nil && backend.ToErrno(err) == syscall.ENOENT && len(l.Branches) > 1 {
		// The holder lost it: the name may now resolve to another member.
		_, _, found, synthetic, rerr := n.fsys.resolve(ctx, vp)
		if rerr != nil {
			return n.fsys.toErrno(rerr)
		}
		n.setFound(found, synthetic)
		a, err = found.Attr, nil
	}
	if err != nil {
		return n.fsys.toErrno(err)
	}
	if a.Mode&syscall.S_IFMT != n.StableAttr().Mode&syscall.S_IFMT {
		// The path names another kind of file now: this node's was replaced behind
		// the kernel's back, or a lookup raced a rename (go-fuse's OpenSymlinkRace
		// under load). go-fuse would give the answer the node's type, so a symlink's
		// size and mode would pass for the open file's. Its handle still reaches
		// it; without one, ESTALE makes the kernel look the path up again.
		return n.attrByHandle(ctx, fh, syscall.ESTALE, out)
	}
	n.report(&out.Attr, a)
	return 0
}

// attrByHandle answers a GETATTR from the open handle fh (go-fuse gives the node's
// first open one when the kernel names none), for a node whose path no longer
// reaches its file; without a handle, with errno.
func (n *node) attrByHandle(ctx context.Context, fh fs.FileHandle, errno syscall.Errno, out *fuse.AttrOut) syscall.Errno {
	h := asFileHandle(fh)
	if h == nil {
		return errno
	}
	a, err := h.statWritten(ctx)
	if err != nil {
		return n.fsys.toErrno(err)
	}
	fillAttr(&out.Attr, a, n.StableAttr().Ino, n.nlinkNow())
	return 0
}

var _ = (fs.NodeSetattrer)((*node)(nil))

func (n *node) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	ctx = uninterruptible(ctx)
	_, l, rel, errno := n.where()
	if errno != 0 {
		return errno
	}
	branch, dirs, _ := n.state()
	if branch < 0 || l == nil {
		return syscall.EROFS
	}
	targets := []int{branch}
	if n.IsDir() && len(dirs) > 0 {
		targets = dirs // keep a merged directory's members alike
	}
	for _, i := range targets {
		if l.Branches[i].ReadOnly {
			return syscall.EROFS
		}
	}
	var set backend.SetAttr
	if m, ok := in.GetMode(); ok {
		set.Valid |= backend.SetMode
		set.Mode = m & 0o7777
	}
	if sz, ok := in.GetSize(); ok {
		set.Valid |= backend.SetSize
		set.Size = int64(sz)
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	atime, aok := in.GetATime()
	mtime, mok := in.GetMTime()
	// The file's attributes now, from the writers' view of the file if it is being
	// written (no request), asked for once if needed.
	var cur backend.Attr
	haveCur := false
	current := func() syscall.Errno {
		if haveCur {
			return 0
		}
		var ok bool
		if cur, ok = n.writersAttr(); !ok {
			var err error
			if cur, err = l.Branches[branch].Backend.Lstat(ctx, rel); err != nil {
				return n.fsys.toErrno(err)
			}
		}
		haveCur = true
		return 0
	}
	if (uok != gok) || (aok != mok) {
		// SFTP sets uid with gid and atime with mtime: fill the omitted one in.
		if errno := current(); errno != 0 {
			return errno
		}
		if !uok {
			uid = cur.UID
		}
		if !gok {
			gid = cur.GID
		}
		if !aok {
			atime = cur.Atime
		}
		if !mok {
			mtime = cur.Mtime
		}
	}
	if uok || gok {
		set.Valid |= backend.SetOwner
		set.UID, set.GID = uid, gid
	}
	if aok || mok {
		set.Valid |= backend.SetTimes
		set.Atime, set.Mtime = atime, mtime
	}
	if !n.IsDir() && set.Valid&backend.SetMode == 0 && dropsPrivs(ctx, set) {
		if errno := current(); errno != 0 {
			return errno
		}
		if m, ok := withoutPrivs(cur.Mode); ok {
			set.Valid |= backend.SetMode
			set.Mode = m
		}
	}
	if set.Valid == 0 {
		n.drainWriters(ctx, nil)
		return n.setattrAnswer(ctx, fh, out)
	}
	if set.Valid&backend.SetSize != 0 {
		n.fst().changes.Add(1)
	}
	var err error
	if h := n.setattrHandle(fh); h != nil {
		// Through an open handle: it cannot be a symlink, it works on an unlinked
		// file (ftruncate), and the change is queued behind the handle's own writes
		// instead of waiting for them first.
		defer h.use.RUnlock()
		n.drainWriters(ctx, h)
		h.sending()
		err = h.f.SetAttr(ctx, set)
		if err == nil && asFileHandle(fh) != h && !h.ownChange(ctx) {
			// A change by path (chmod after close(2), the RELEASE still to come)
			// has no close of its own to wait for it: the handle may have held it,
			// so it is on the server before the caller goes on. Drain, not Flush:
			// a failure of the writer's stays with the writer's close.
			h.f.Drain(ctx)
		}
	} else {
		n.drainWriters(ctx, nil)
		for _, i := range targets {
			if _, err = l.Branches[i].Backend.SetAttr(ctx, rel, set); err != nil {
				break
			}
		}
	}
	if err != nil {
		return n.fsys.toErrno(err)
	}
	n.applyToViews(set)
	n.otherNamesChanged()
	return n.setattrAnswer(ctx, fh, out)
}

// otherNamesChanged drops what the source's cache holds of the file's other names
// (hard links made through the mount, which share this node) after a change through
// one of them: attributes are cached by path, and the kernel, which keeps one inode
// for all the names, takes a stale size or mode from a lookup or a stat of another
// name as the file's.
func (n *node) otherNamesChanged() {
	branch, _, nlink := n.state()
	if nlink < 2 || branch < 0 {
		return
	}
	_, l, rel, errno := n.where()
	if errno != 0 || l == nil {
		return
	}
	b := l.Branches[branch]
	c, ok := backend.As[interface{ Changed(p string) }](b.Backend)
	if !ok {
		return
	}
	for _, p := range n.fsys.inodes.names(b.ID, n.StableAttr().Ino) {
		if p != rel {
			c.Changed(p)
		}
	}
}

// The mount clears set-user-ID and set-group-ID bits itself, as Linux does on a local
// file system (fs.go asks for it with CAP_HANDLE_KILLPRIV): otherwise the kernel sends
// a GETATTR before every change of owner to work out the mode, and tar, cp -a and
// rsync change the owner of every file they write. dropsPrivs tells a change that
// clears them: a change of owner (chown(2) clears them whoever calls it), a
// truncation by a caller other than root (who alone is taken to hold CAP_FSETID), and
// the SETATTR that changes nothing, which the kernel sends before a write or a chown
// that must clear them.
func dropsPrivs(ctx context.Context, set backend.SetAttr) bool {
	if set.Valid == 0 || set.Valid&backend.SetOwner != 0 {
		return true
	}
	if set.Valid&backend.SetSize == 0 {
		return false // tar's futimens and chmod: no look at the caller
	}
	caller, ok := fuse.FromContext(ctx)
	return ok && caller.Uid != 0
}

// withoutPrivs is mode's permission bits without set-user-ID, and without
// set-group-ID where the group may execute (without it, the bit marks mandatory
// locking, which a change of owner or content leaves); ok if that changed them.
func withoutPrivs(mode uint32) (uint32, bool) {
	m := mode & 0o7777
	m &^= syscall.S_ISUID
	if m&syscall.S_IXGRP != 0 {
		m &^= syscall.S_ISGID
	}
	return m, m != mode&0o7777
}

// setattrAnswer fills a SETATTR's answer: the attributes now, valid as long as a
// GETATTR's. go-fuse's bridge gives SETATTR answers no validity, and the kernel would
// then ask again at the next stat — the one that tar makes after every futimens.
func (n *node) setattrAnswer(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if errno := n.Getattr(ctx, fh, out); errno != 0 {
		return errno
	}
	if out.Timeout() == 0 {
		out.SetTimeout(n.fsys.attrTimeout)
	}
	return 0
}

// setattrHandle picks the open handle a setattr goes through, held against its
// release (h.use): the caller's if it may write (ftruncate), else a handle open for
// writing on the node, else none (the change goes by path).
func (n *node) setattrHandle(fh fs.FileHandle) *fileHandle {
	hs := n.writerHandles()
	if h := asFileHandle(fh); h != nil && h.writable {
		hs = append([]*fileHandle{h}, hs...)
	}
	for _, h := range hs {
		h.use.RLock()
		if !h.released {
			return h
		}
		h.use.RUnlock()
	}
	return nil
}

var _ = (fs.NodeReadlinker)((*node)(nil))

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	ctx = uninterruptible(ctx)
	_, l, rel, errno := n.where()
	if errno != 0 {
		return nil, errno
	}
	branch, _, _ := n.state()
	if branch < 0 || l == nil {
		return nil, syscall.EINVAL
	}
	t, err := l.Branches[branch].Backend.Readlink(ctx, rel)
	if err != nil {
		return nil, n.fsys.toErrno(err)
	}
	return []byte(t), 0
}

var _ = (fs.NodeStatfser)((*node)(nil))

// Statfs reports the layer's sources added up (a union's capacity is the sum of its
// members'); above every layer, all sources.
func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	ctx = uninterruptible(ctx)
	_, l, _, errno := n.where()
	if errno != 0 {
		return errno
	}
	var branches []*mux.Branch
	if l != nil {
		branches = l.Branches
	} else {
		for _, layer := range n.fsys.table.Layers() {
			branches = append(branches, layer.Branches...)
		}
	}
	const unit = 4096
	var sum backend.Statfs
	sum.Namemax = 255
	var firstErr error
	ok := false
	for _, b := range branches {
		st, err := b.Backend.Statfs(ctx, "")
		if err != nil {
			firstErr = err
			continue
		}
		ok = true
		bs := max(st.Bsize, 1)
		sum.Blocks += st.Blocks * bs / unit
		sum.Bfree += st.Bfree * bs / unit
		sum.Bavail += st.Bavail * bs / unit
		sum.Files += st.Files
		sum.Ffree += st.Ffree
		if st.Namemax != 0 {
			sum.Namemax = min(sum.Namemax, st.Namemax)
		}
	}
	if !ok && firstErr != nil {
		return n.fsys.toErrno(firstErr)
	}
	*out = fuse.StatfsOut{Blocks: sum.Blocks, Bfree: sum.Bfree, Bavail: sum.Bavail,
		Files: sum.Files, Ffree: sum.Ffree, Bsize: unit, Frsize: unit, NameLen: uint32(sum.Namemax)}
	return 0
}
