package fusefs

import (
	"context"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/muxfs/muxfs/internal/backend"
	"github.com/muxfs/muxfs/internal/procs"
)

// openFlags keeps the open(2) flags a backend acts on; the kernel has dealt with the
// rest (O_CREAT and O_EXCL arrive through Create, O_NOFOLLOW through lookup).
func openFlags(flags uint32) int {
	return int(flags) & (os.O_RDONLY | os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC | os.O_EXCL)
}

func writes(flags int) bool {
	return flags&(os.O_WRONLY|os.O_RDWR) != 0 || flags&os.O_TRUNC != 0
}

var _ = (fs.NodeOpener)((*node)(nil))

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	ctx = uninterruptible(ctx)
	_, l, rel, errno := n.where()
	if errno != 0 {
		return nil, 0, errno
	}
	branch, _, _ := n.state()
	if branch < 0 || l == nil {
		return nil, 0, syscall.EISDIR
	}
	b := l.Branches[branch]
	fl := openFlags(flags)
	if writes(fl) && b.ReadOnly {
		return nil, 0, syscall.EROFS
	}
	// Another handle's writes may still be in flight on another session: a new
	// opener must see them (close-to-open within the mount), and attributes a source
	// gave while they were (a lookup's) may predate them — with -o nocto a read-only
	// open would trust those and read a stale end of the file from the cache.
	if n.drainWriters(ctx, nil) {
		ctx = backend.WithBeingWritten(ctx)
	}
	f, err := b.Backend.Open(ctx, rel, fl, 0)
	if err != nil {
		return nil, 0, n.fsys.toErrno(err)
	}
	var privs backend.SetAttr
	if fl&os.O_TRUNC != 0 {
		// The open truncated the file, and the kernel sends no SETATTR for it
		// (CAP_ATOMIC_O_TRUNC, fs.go): the other handles' views shrink with it, and
		// the set-ID bits go as a truncation's would (dropsPrivs).
		trunc := backend.SetAttr{Valid: backend.SetSize}
		n.fst().changes.Add(1)
		n.otherNamesChanged()
		n.applyToViews(trunc)
		if m, ok := withoutPrivs(f.OpenedAttr().Mode); ok && dropsPrivs(ctx, trunc) {
			privs = backend.SetAttr{Valid: backend.SetMode, Mode: m}
			if err := f.SetAttr(ctx, privs); err != nil {
				f.Close(ctx) //nolint:errcheck // the change's error is the one to report
				return nil, 0, n.fsys.toErrno(err)
			}
		}
	}
	h := n.addHandle(ctx, f, fl)
	if privs.Valid != 0 {
		h.applied(privs)
	}
	var fuseFlags uint32
	keep := n.keepCache(f.OpenedAttr()) && fl&os.O_TRUNC == 0
	if keep {
		fuseFlags |= fuse.FOPEN_KEEP_CACHE
	}
	if !writes(fl) {
		// Closing a read-only handle has nothing to wait for or report (Flush
		// returns at once), and muxfs keeps no locks for the kernel to drop: no
		// FLUSH request at each close(2), one round trip through the kernel less
		// per file for a grep or a compiler reading headers (Linux 5.16+; older
		// kernels ignore the flag).
		fuseFlags |= fuse.FOPEN_NOFLUSH
	}
	pf, _ := f.(passthroughFder)
	if pf != nil && (writes(fl) || f.OpenedAttr().Size < passthroughMin) {
		pf = nil
	}
	if pf != nil {
		if _, ok := pf.PassthroughFd(); !ok {
			pf = nil
		}
	}
	mode := n.openMode(pf != nil, keep, f.OpenedAttr())
	h.mode = mode
	switch mode {
	case modePassthrough:
		return &passthroughHandle{fileHandle: h, pf: pf}, fuseFlags, 0
	case modeDirect:
		fuseFlags |= fuse.FOPEN_DIRECT_IO
	}
	return h, fuseFlags, 0
}

// I/O modes of an open handle, as the kernel sees them.
const (
	modeCached      = iota // through the page cache and muxfs
	modeDirect             // through muxfs, around the page cache
	modePassthrough        // the kernel reads the cache file itself
)

// openMode decides a new handle's I/O mode and counts it: passthrough if asked for
// and possible (no page-cached handle open, and any passthrough handle open shows the
// same version of the file, a) and the kernel holds no pages of a (below); direct while
// passthrough handles are open; cached otherwise. keep: the open keeps the kernel's
// pages (KEEP_CACHE); without it the kernel drops them.
//
// A file this mount has just read (or written) through the page cache is not handed
// to the kernel when opened again: the kernel already holds its pages, and a reread
// from them runs at memory speed, where passthrough would read the cache's data file
// from the disk (its writes bypass the page cache: diskcache's writer); measured in
// docs/design.md, "A reread stays in the page cache". Only for files up to
// pagedMax(): of a larger one, most pages have left memory by the time it is read
// again, and passthrough reads the rest faster than READs through muxfs.
func (n *node) openMode(passthrough, keep bool, a backend.Attr) int {
	f := n.fst()
	n.mu.Lock()
	defer n.mu.Unlock()
	if !keep {
		f.paged = false
	}
	same := f.ptOpen == 0 || sameVersion(f.ptAttr, a)
	paged := keep && f.paged && f.ptOpen == 0 && a.Size <= pagedMax()
	switch {
	case passthrough && f.cachedOpen == 0 && same && !paged:
		f.ptOpen++
		f.ptAttr = a
		return modePassthrough
	case f.ptOpen > 0:
		return modeDirect
	}
	f.cachedOpen++
	return modeCached
}

// closedMode uncounts a released handle.
func (n *node) closedMode(mode int) {
	f := n.fst()
	n.mu.Lock()
	defer n.mu.Unlock()
	switch mode {
	case modeCached:
		f.cachedOpen--
	case modePassthrough:
		f.ptOpen--
	}
}

// passthroughMin: smaller files are read through the page cache even when the
// persistent cache could hand them to the kernel whole. Every passthrough read marks
// the inode's access time stale in the kernel (fuse_file_accessed), so the next stat
// of the file — a compiler's of each header it includes again, a second grep's of
// each file — is a GETATTR request, and each open registers and drops a backing file
// (two ioctls). A small file read through the page cache costs one READ, served from
// the persistent cache, once; later opens keep its pages and send no READ and no
// GETATTR. Larger files keep passthrough: their reads would otherwise cross /dev/fuse
// 128 KiB at a time.
const passthroughMin = 1 << 20

// pagedMax is the largest file whose pages the kernel is trusted to still hold when it
// is opened again: a quarter of the machine's memory.
var pagedMax = sync.OnceValue(func() int64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return passthroughMin
	}
	return int64(si.Totalram) * int64(si.Unit) / 4
})

// passthroughFder is a backend file that may offer the kernel a local file holding its
// whole content (the persistent cache).
type passthroughFder interface{ PassthroughFd() (int, bool) }

// passthroughHandle is a read-only handle whose content the persistent cache holds
// whole: the kernel may read the cache file itself (FUSE passthrough), at local-disk
// speed. Only read-only handles are of this type: go-fuse gives the backing file of a
// node to every handle of that node that offers passthrough, and a write must never
// bypass muxfs. Where passthrough is refused (it needs CAP_SYS_ADMIN in this kernel),
// go-fuse stops asking and reads go through Read as usual.
type passthroughHandle struct {
	*fileHandle
	pf passthroughFder
}

func (h *passthroughHandle) PassthroughFd() (int, bool) { return h.pf.PassthroughFd() }

// asFileHandle returns the fileHandle of any of our handle types, or nil.
func asFileHandle(fh fs.FileHandle) *fileHandle {
	switch h := fh.(type) {
	case *fileHandle:
		return h
	case *passthroughHandle:
		return h.fileHandle
	}
	return nil
}

// keepCache compares the file as the server has it now (just opened) with the
// version the kernel's pages are of (seen). Unchanged: they stay valid (KEEP_CACHE).
// Changed behind our back: the kernel's attributes and pages are dropped here, before
// the open returns, so the opener reads the new content at its new size
// (close-to-open, as NFS does). Notifying inside OPEN is safe: the kernel holds no lock
// that the notification needs (libfuse lists the operations where it is not).
// SFTP v3 times are whole seconds: a same-size change within the second of the last
// one goes unseen, as with NFS and sshfs' auto_cache.
func (n *node) keepCache(a backend.Attr) bool {
	f := n.fst()
	n.mu.Lock()
	known := f.seenValid
	changed := known && !sameVersion(f.seen, a)
	n.seeLocked(a)
	n.mu.Unlock()
	if changed {
		n.NotifyContent(0, 0)
	}
	return known && !changed
}

// addHandle registers an open file with its node, so that other operations on the
// node can wait for its writes.
func (n *node) addHandle(ctx context.Context, f backend.File, flags int) *fileHandle {
	h := &fileHandle{f: f, n: n, st: n.fst(), writable: writes(flags), appending: flags&os.O_APPEND != 0, attr: f.OpenedAttr()}
	if c, ok := fuse.FromContext(ctx); ok {
		h.opener = c.Pid
	}
	if h.writable {
		n.mu.Lock()
		if h.st.writers == nil {
			h.st.writers = map[*fileHandle]struct{}{}
		}
		h.st.writers[h] = struct{}{}
		n.mu.Unlock()
	}
	return h
}

// writerHandles is a copy of the set of handles open for writing.
func (n *node) writerHandles() []*fileHandle {
	f := n.file.Load()
	if f == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	hs := make([]*fileHandle, 0, len(f.writers))
	for h := range f.writers {
		hs = append(hs, h)
	}
	return hs
}

// applyToViews records a change of attributes the server has made in the view of
// every handle writing the file (see viewMu).
func (n *node) applyToViews(set backend.SetAttr) {
	f := n.fst()
	f.viewMu.Lock()
	defer f.viewMu.Unlock()
	f.viewChanges++
	for _, h := range n.writerHandles() {
		h.applied(set)
	}
}

// writersAttr returns the file's attributes as the handles writing it have made them,
// or ok false when no handle is writing.
func (n *node) writersAttr() (a backend.Attr, ok bool) {
	// Under viewMu: a writer's release leaves the writers before it hands its view
	// to the others, and a stat between the two answered the size from before its
	// writes (seen in the fsx test under CPU load: a file read whole right after a
	// close ended where another descriptor's last write did).
	f := n.file.Load()
	if f == nil {
		return a, false // never opened: no writer
	}
	f.viewMu.Lock()
	defer f.viewMu.Unlock()
	for _, h := range n.writerHandles() {
		ha := h.localAttr()
		if !ok || ha.Size > a.Size {
			a, ok = ha, true
		}
	}
	return a, ok
}

// drainWriters waits until the server has every write made so far through the node's
// handles open for writing, but except's (whose own requests its backend file keeps
// in order). Each handle reaches the server through an SFTP handle of its own, often
// on another session, and the server applies two handles' requests in any order;
// but the kernel was answered for those writes already, so a read through another
// handle must see them and a write through another handle must land after them, as
// on a local file. A write that failed stays its writer's to report (at its next
// write, fsync or close), not the caller's. It reports whether there was any such
// handle.
func (n *node) drainWriters(ctx context.Context, except *fileHandle) (found bool) {
	f := n.file.Load()
	if f == nil {
		return false // never opened: no writer
	}
	var others []*fileHandle // nil, with no allocation, for a file with one writer
	n.mu.Lock()
	for h := range f.writers {
		if h != except {
			others = append(others, h)
		}
	}
	n.mu.Unlock()
	for _, h := range others {
		h.f.Drain(ctx)
	}
	return len(others) > 0
}

// fileHandle is an open file. Writes go out behind the caller (in a bounded window);
// flush (close(2)), fsync and release wait for all of them and report any failure.
type fileHandle struct {
	f         backend.File
	n         *node
	st        *fileState // n's file state, made at the latest by this handle's open
	writable  bool
	appending bool
	mode      int // modeCached, modeDirect or modePassthrough
	// paging: the kernel has read or written pages through this (page-cached) handle.
	paging atomic.Bool
	// changes: the node's count of changes (fileState.changes) when this handle last read.
	changes atomic.Uint64

	// For a handle open for writing: the file as its writes have made it, so that the
	// many stats of a compiler or linker need no round trip and no wait for writes in
	// flight. The mtime stays the server's until release, when the server's word is
	// taken again: a new mtime at every write would tell the kernel the file changed.
	mu   sync.Mutex
	attr backend.Attr
	sent bool // a write or an attribute change has gone out through the handle

	// use is held (read) by operations of the node that borrow this handle (a
	// setattr); released is set under it when the kernel releases the handle, after
	// which nobody may borrow it.
	use      sync.RWMutex
	released bool

	// opener is the thread that opened the handle (the kernel's request pid is the
	// calling thread's id), and closed is set at its first FLUSH: until then a change
	// of attributes that thread makes is its own, and its close(2) is still to come
	// (ownChange).
	opener uint32
	closed atomic.Bool
}

// ownChange tells whether a change of attributes without a handle comes from the
// thread that opened h for writing, before any close(2) of it: then that close waits
// for the change and reports its failure, as it does for the writes, and the change
// need not be waited for now. The kernel passes a handle with ftruncate only, not
// with fchmod, fchown or futimens, so this is how tar's changes to the file it is
// writing (three per file) are told from a chmod by path beside an open writer, or
// after close(2) while the RELEASE is still to come, which must be on the server when
// they return.
func (h *fileHandle) ownChange(ctx context.Context) bool {
	c, ok := fuse.FromContext(ctx)
	return ok && h.opener != 0 && c.Pid == h.opener && !h.closed.Load()
}

// localAttr is the file's attributes including this handle's writes so far.
func (h *fileHandle) localAttr() backend.Attr {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.attr
}

// sending records that a request that changes the file is about to go out through
// the handle, so that its close must wait for the server.
func (h *fileHandle) sending() {
	h.mu.Lock()
	h.sent = true
	h.mu.Unlock()
}

func (h *fileHandle) untouched() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.sent
}

func (h *fileHandle) wrote(off int64, n int, appending bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	end := off + int64(n)
	if appending {
		// The server appends at its end of the file, which is at least where the
		// kernel put it (off: the end as the mount knows it, other handles' writes
		// included) and may be further (another client appended).
		end = max(end, h.attr.Size+int64(n))
	}
	h.attr.Size = max(h.attr.Size, end)
}

// grew takes in the size and mtime another handle's writes gave the file, where they
// are beyond this handle's view.
func (h *fileHandle) grew(a backend.Attr) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.attr.Size = max(h.attr.Size, a.Size)
	if a.Mtime.After(h.attr.Mtime) {
		h.attr.Mtime = a.Mtime
	}
}

// applied records a change of attributes made while the handle is open, so that the
// stats answered from it (Getattr while writing) show it. Times are whole seconds, as
// the server keeps them (SFTP v3).
func (h *fileHandle) applied(set backend.SetAttr) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if set.Valid&backend.SetSize != 0 {
		h.attr.Size = set.Size
	}
	if set.Valid&backend.SetMode != 0 {
		h.attr.Mode = h.attr.Mode&syscall.S_IFMT | set.Mode&0o7777
	}
	if set.Valid&backend.SetOwner != 0 {
		h.attr.UID, h.attr.GID = set.UID, set.GID
	}
	if set.Valid&backend.SetTimes != 0 {
		h.attr.Atime, h.attr.Mtime = time.Unix(set.Atime.Unix(), 0), time.Unix(set.Mtime.Unix(), 0)
	}
}

var _ = (fs.FileReader)((*fileHandle)(nil))

func (h *fileHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	ctx = uninterruptible(ctx)
	h.n.drainWriters(ctx, h)
	if c := h.st.changes.Load(); h.changes.Swap(c) != c {
		h.f.Changed()
	}
	n, err := h.f.ReadAt(ctx, dest, off)
	if err != nil && err != io.EOF && n == 0 {
		return nil, h.n.fsys.toErrno(err)
	}
	procs.Moved(n) // a stream starting on a quiet mount gets every CPU at once
	if h.mode == modeCached && !h.paging.Load() {
		h.paging.Store(true)
		h.n.mu.Lock()
		h.st.paged = true
		h.n.mu.Unlock()
	}
	return fuse.ReadResultData(dest[:n]), 0
}

var _ = (fs.FileWriter)((*fileHandle)(nil))

func (h *fileHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	ctx = uninterruptible(ctx)
	h.st.statMu.RLock()
	defer h.st.statMu.RUnlock()
	h.n.drainWriters(ctx, h)
	h.st.changes.Add(1)
	h.sending()
	n, err := h.f.WriteAt(ctx, data, off)
	if err != nil {
		return uint32(n), h.n.fsys.toErrno(err)
	}
	procs.Moved(n)
	if h.mode == modeCached {
		// The written pages stay in the kernel's page cache: noted at flush and
		// release, once the version they make is known (written).
		h.paging.Store(true)
	}
	h.wrote(off, n, h.appending)
	return uint32(n), 0
}

var _ = (fs.FileFlusher)((*fileHandle)(nil))

// Flush is close(2): it returns once the server has every byte written through this
// handle, with the error of any write that failed (close-to-open consistency).
func (h *fileHandle) Flush(ctx context.Context) syscall.Errno {
	ctx = uninterruptible(ctx)
	h.closed.Store(true)
	if !h.writable || h.untouched() {
		// Nothing went to the server through this handle (a file created or opened
		// for writing and closed untouched: bonnie++'s creates, a lock file): the
		// file is as its open found it, with the changes since applied (applied) —
		// no round trip, as NFS closes a file with nothing dirty.
		return 0
	}
	a, err := h.settle(ctx)
	if err != nil {
		return h.n.fsys.toErrno(err)
	}
	h.n.otherNamesChanged()
	// Here, not only at release: the kernel sends RELEASE after close(2) has
	// returned, and an open made at once (a linker's of the object just written)
	// would otherwise find the version from before the writes and drop the pages.
	h.written(a)
	return 0
}

// settle makes the server's size and mtime after the handle's writes its view of the
// file: what a stat after close(2) must show. A change of attributes through another
// way while the stat is on its way (a truncation through another descriptor, by
// another thread) may have reached the server after it, and the views already have
// it: the stat is then taken again. Changed under every stat (a truncation in a
// loop), the handle keeps its view, whose size is right and whose mtime may be older
// than the server's.
func (h *fileHandle) settle(ctx context.Context) (backend.Attr, error) {
	for range 3 {
		h.st.viewMu.Lock()
		seen := h.st.viewChanges
		h.st.viewMu.Unlock()
		a, err := h.statWritten(ctx)
		if err != nil {
			return a, err
		}
		h.st.viewMu.Lock()
		adopted := h.st.viewChanges == seen
		if adopted {
			h.mu.Lock()
			h.attr = a
			h.mu.Unlock()
		}
		h.st.viewMu.Unlock()
		if adopted {
			return a, nil
		}
	}
	return h.localAttr(), nil
}

// statWritten flushes the handle and asks the server for the file's attributes,
// once the writes of the node's other handles are in too (see node.statMu).
func (h *fileHandle) statWritten(ctx context.Context) (backend.Attr, error) {
	h.st.statMu.Lock()
	defer h.st.statMu.Unlock()
	h.n.drainWriters(ctx, h)
	return h.f.Stat(ctx)
}

// written records that the kernel's pages of the file, as far as this handle wrote
// them, are of version a (the server's after every write of the handle): the next
// open keeps them.
func (h *fileHandle) written(a backend.Attr) {
	h.n.mu.Lock()
	defer h.n.mu.Unlock()
	h.n.seeLocked(a)
	if h.paging.Load() {
		h.st.paged = true
	}
}

// testHookHandOn, set by a test, runs in a writer's release between its leaving the
// writers and its handing its view on to the others.
var testHookHandOn func()

var _ = (fs.FileFsyncer)((*fileHandle)(nil))

func (h *fileHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	ctx = uninterruptible(ctx)
	// fsync(2) makes the file's data durable, whichever descriptor wrote it.
	h.n.drainWriters(ctx, h)
	return h.n.fsys.toErrno(h.f.Sync(ctx))
}

var _ = (fs.FileReleaser)((*fileHandle)(nil))

func (h *fileHandle) Release(ctx context.Context) syscall.Errno {
	ctx = uninterruptible(ctx)
	defer h.n.closedMode(h.mode)
	h.use.Lock()
	h.released = true
	h.use.Unlock()
	if h.writable {
		err := h.f.Close(ctx)
		h.st.viewMu.Lock()
		defer h.st.viewMu.Unlock()
		// As the last flush found the file (written), or as its open did if it
		// was never written to.
		a := h.localAttr()
		h.written(a)
		h.n.mu.Lock()
		delete(h.st.writers, h)
		h.n.mu.Unlock()
		if testHookHandOn != nil {
			testHookHandOn()
		}
		// The handles still writing answer the file's stats (writersAttr): what
		// this one's writes made of it must not leave with it.
		for _, o := range h.n.writerHandles() {
			o.grew(a)
		}
		return h.n.fsys.toErrno(err)
	}
	return h.n.fsys.toErrno(h.f.Close(ctx))
}
