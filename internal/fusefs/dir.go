package fusefs

import (
	"context"
	"encoding/binary"
	"hash/fnv"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/muxfs/muxfs/internal/backend"
	"github.com/muxfs/muxfs/internal/mux"
)

// dirEntry is one name of a merged listing.
type dirEntry struct {
	name     string
	found    mux.Found
	junction bool // a directory of the mount table: resolved on lookup, not from here
	ino      uint64
	mode     uint32
}

// dirHandle is an open directory: a snapshot of the merged listing, taken at opendir
// (and again on rewind). Its attributes answer the kernel's READDIRPLUS lookups, so
// `ls -l` costs one listing per member, not one request per file.
//
// A big listing of one member is read while it arrives (streamAfter): the kernel's
// first READDIRPLUS is answered once enough entries are in, and each later one waits
// only for the entries it takes.
type dirHandle struct {
	n   *node
	vp  string
	l   *mux.Layer
	rel string
	// stream: the listing may be handed out before its end (see streamAfter); hold:
	// the kernel keeps it, until its expiry (FS.holdListing).
	stream, hold bool

	mu      sync.Mutex
	arrived *sync.Cond // signalled as entries arrive, and at the end
	gen     int        // the load the entries come from: a rewind starts another
	done    bool       // the listing is whole, or ended by err
	err     syscall.Errno
	entries entryList
	byName  map[string]int
	// moves is the inode table's count of moves when the entries' numbers were
	// taken: while it stays, Lookup uses them instead of asking the table again.
	moves   uint64
	pos     int
	dropped int       // names from the server that cannot be shown
	expires time.Time // when the earliest member listing stops being trusted
	served  bool      // the kernel read entries from this listing (atime.go)
	tid     uint32    // the thread that opened it (atime.go)
	stored  bool      // the listing came from the persistent cache's store (atime.go)
}

// entryList holds a listing's entries in chunks, so that a big listing grows without
// copying what it already has: by append, the 100,000 entries of one directory (150
// bytes each) were copied about four times over as the slice grew (47 MB allocated
// for one `ls -f`, MUXFS_MEMPROFILE).
type entryList struct {
	chunks [][]dirEntry
	n      int
}

const entryChunk = 1024

func (l *entryList) len() int { return l.n }

func (l *entryList) at(i int) *dirEntry { return &l.chunks[i/entryChunk][i%entryChunk] }

// push adds e. The first chunk grows by append, so that a small directory's handle
// holds no more than it needs; the next ones are made whole.
func (l *entryList) push(e dirEntry) {
	switch {
	case l.n == 0:
		l.chunks = append(l.chunks, nil)
	case l.n%entryChunk == 0:
		l.chunks = append(l.chunks, make([]dirEntry, 0, entryChunk))
	}
	c := &l.chunks[len(l.chunks)-1]
	*c = append(*c, e)
	l.n++
}

// streamAfter is how many entries of a listing still arriving let the kernel start
// reading it: about one READDIRPLUS answer (128 KiB, ~800 entries), since an answer
// waits for its buffer to fill anyway. OpenSSH's server sends 100 entries per reply
// and lstats each, so a directory of 100,000 files takes it about 2 s of CPU here;
// waiting for all of it before the first answer, and only then making the kernel's
// 100,000 inodes, put the two one after the other (`ls -f` 3.3 s against sshfs' 2.0).
const streamAfter = 1000

var _ = (fs.NodeOpendirHandler)((*node)(nil))

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	ctx = uninterruptible(ctx)
	vp, l, rel, errno := n.where()
	if errno != 0 {
		return nil, 0, errno
	}
	h := &dirHandle{n: n, vp: vp, l: l, rel: rel, tid: requestTID(ctx)}
	h.arrived = sync.NewCond(&h.mu)
	// The kernel may keep this listing and answer the next readdir itself, as long as
	// the listing has not changed since it was cached: a warm find or ls -R then never
	// reaches muxfs. (The kernel drops it on its own when entries are added or removed
	// through the mount.) Opened in process for the kernel's readdir (dirless), which
	// keeps what it reads until muxfs' own copy expires, the listing is held; opened
	// by OPENDIR, its checksum tells the kernel whether its copy is still good, and
	// the checksum needs the whole listing at once.
	opendir := n.fsys.cacheDirs && !n.fsys.noOpendir.Load()
	h.stream = !opendir
	h.hold = n.fsys.cacheDirs && !opendir
	n.fsys.listing(h.tid)
	if errno := h.load(ctx); errno != 0 {
		return nil, 0, errno
	}
	if !opendir {
		return h, 0, 0
	}
	sum := h.checksum()
	n.mu.Lock()
	prev := n.listingSum
	n.listingSum = sum
	n.mu.Unlock()
	if prev == sum {
		return h, fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE, 0
	}
	if prev != 0 {
		// Changed since the kernel cached it: drop its copy before it is read (safe
		// inside OPENDIR: the kernel holds nothing the notification needs).
		n.NotifyContent(0, 0)
	}
	return h, fuse.FOPEN_CACHE_DIR, 0
}

// checksum identifies the listing: names, types and inode numbers.
func (h *dirHandle) checksum() uint64 {
	d := fnv.New64a()
	var buf [8]byte
	for i := range h.entries.len() {
		e := h.entries.at(i)
		d.Write([]byte(e.name))
		binary.LittleEndian.PutUint64(buf[:], e.ino^uint64(e.mode)<<40)
		d.Write(buf[:])
	}
	return d.Sum64() | 1
}

// load takes the listing afresh. It returns once the listing is whole, or, for a big
// listing of one member (h.stream), once streamAfter entries are in; the rest is
// added as it arrives (Readdirent waits for it).
func (h *dirHandle) load(ctx context.Context) syscall.Errno {
	n := h.n
	branch, dirs, _ := n.state()
	parentIno := uint64(rootIno)
	if _, p := n.Parent(); p != nil {
		parentIno = p.StableAttr().Ino
	}
	var head entryList
	head.push(dirEntry{name: ".", ino: n.StableAttr().Ino, mode: syscall.S_IFDIR})
	head.push(dirEntry{name: "..", ino: parentIno, mode: syscall.S_IFDIR})
	byName := map[string]int{}
	for _, name := range n.fsys.table.JunctionChildren(h.vp) {
		byName[name] = head.len()
		head.push(dirEntry{name: name, junction: true, mode: syscall.S_IFDIR,
			ino: n.fsys.junctionIno(ctx, join(h.vp, name))})
	}
	moves := n.fsys.inodes.movesNow()
	h.mu.Lock()
	h.gen++
	gen := h.gen
	h.entries, h.byName, h.pos, h.dropped, h.moves = head, byName, 0, 0, moves
	h.done, h.err, h.stored = false, 0, false
	h.mu.Unlock()

	var expiry backend.ListingExpiry
	ctx = backend.WithListingExpiry(ctx, &expiry)
	if branch < 0 || h.l == nil {
		h.finish(gen, &expiry, 0)
		return 0
	}
	if h.stream && len(dirs) == 1 {
		return h.loadStreaming(ctx, gen, dirs[0], &expiry)
	}
	lists := make([][]backend.Entry, len(dirs))
	errs := make([]error, len(dirs))
	mux.Each(len(dirs), func(k int) {
		lists[k], errs[k] = h.l.Branches[dirs[k]].Backend.ReadDir(ctx, h.rel)
	})
	for _, err := range errs {
		// A member whose directory vanished drops out of the merge.
		if err != nil && !(len(dirs) > 1 && backend.ToErrno(err) == syscall.ENOENT) {
			// Ended, so that a read of the handle after a failed rewind gets the
			// error rather than waiting for entries that will not come.
			errno := n.fsys.toErrno(err)
			h.finish(gen, &expiry, errno)
			return errno
		}
	}
	for k, list := range lists {
		h.add(gen, dirs[k], list, true)
	}
	h.finish(gen, &expiry, 0)
	return 0
}

// loadStreaming lists member i's directory on another goroutine, handing its parts
// to the handle as they arrive (backend.WithListingProgress), and returns once the
// listing is whole or streamAfter entries are in. An error before that fails the
// open, as for any listing; one after it ends the listing where it got to.
func (h *dirHandle) loadStreaming(ctx context.Context, gen, i int, expiry *backend.ListingExpiry) syscall.Errno {
	started := make(chan struct{})
	var once sync.Once
	start := func() { once.Do(func() { close(started) }) }
	var streamed atomic.Bool // set before started is closed by the parts
	go func() {
		// A part may come again if the fetch starts over: each name is taken once
		// (merge off), and the whole listing at the end adds what the parts missed.
		pctx := backend.WithListingProgress(ctx, func(part []backend.Entry) {
			if h.add(gen, i, part, false) >= streamAfter {
				streamed.Store(true)
				start()
			}
		})
		list, err := h.l.Branches[i].Backend.ReadDir(pctx, h.rel)
		var errno syscall.Errno
		if err != nil {
			errno = h.n.fsys.toErrno(err)
		} else {
			h.add(gen, i, list, false)
		}
		h.finish(gen, expiry, errno)
		start()
	}()
	<-started
	if streamed.Load() {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// add merges member i's entries into listing gen, if that is still the handle's,
// and returns how many entries the handle holds. merge: a name the listing already
// has is another member's, and a directory there joins it (a union directory);
// otherwise it is left as it is.
func (h *dirHandle) add(gen, i int, list []backend.Entry, merge bool) int {
	n := h.n
	h.mu.Lock()
	defer h.mu.Unlock()
	if gen != h.gen {
		return 0
	}
	first := h.entries.len()
	var names []string
	for _, e := range list {
		if !validRemoteName(e.Name) {
			if e.Name != "." && e.Name != ".." {
				h.dropped++
			}
			continue
		}
		if at, ok := h.byName[e.Name]; ok {
			prev := h.entries.at(at)
			if merge && !prev.junction && prev.found.Attr.IsDir() && e.Attr.IsDir() {
				prev.found.Dirs = append(prev.found.Dirs, i)
			}
			continue
		}
		f := mux.Found{Index: i, Attr: e.Attr}
		if e.Attr.IsDir() {
			f.Dirs = []int{i}
		}
		h.byName[e.Name] = h.entries.len()
		h.entries.push(dirEntry{name: e.Name, found: f, mode: e.Attr.Type()})
		names = append(names, e.Name)
	}
	if len(names) > 0 {
		inos := make([]uint64, len(names))
		n.fsys.inodes.getIn(h.l.Branches[i].ID, h.rel, names, inos)
		for k, ino := range inos {
			h.entries.at(first + k).ino = ino
		}
	}
	h.arrived.Broadcast()
	return h.entries.len()
}

// finish marks listing gen whole (or ended by errno), and hands its expiry to the
// kernel's copy if the kernel keeps it.
func (h *dirHandle) finish(gen int, expiry *backend.ListingExpiry, errno syscall.Errno) {
	h.mu.Lock()
	if gen != h.gen {
		h.mu.Unlock()
		return
	}
	h.done, h.err = true, errno
	h.expires, h.stored = expiry.At(), expiry.Stored()
	dropped := h.dropped
	h.arrived.Broadcast()
	h.mu.Unlock()
	if dropped > 0 {
		h.n.fsys.log.Warn("server sent invalid file names (with '/', NUL, '.' or '..'); they are not shown",
			"dir", h.vp, "count", dropped)
	}
	if h.hold && errno == 0 {
		h.n.fsys.holdListing(h.n, expiry.At())
	}
}

// junctionIno is the number a mount-table directory gets, as Lookup would give it.
func (f *FS) junctionIno(ctx context.Context, vp string) uint64 {
	l, rel, found, synthetic, err := f.resolve(ctx, vp)
	return f.inoOf(vp, l, rel, found, err != nil || synthetic)
}

var _ = (fs.FileReaddirenter)((*dirHandle)(nil))

func (h *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.served {
		// The kernel marks the directory's atime stale after this READDIR's answer
		// reaches the reading thread: have it cleared at that thread's next listing.
		// Noted here, not at RELEASEDIR, which the kernel sends asynchronously and
		// may deliver after several more listings of the same thread.
		h.served = true
		if !h.stored {
			h.n.fsys.listed(h.n, h.tid)
		}
	}
	for h.pos >= h.entries.len() && !h.done {
		h.arrived.Wait()
	}
	if h.pos >= h.entries.len() {
		return nil, h.err
	}
	e := h.entries.at(h.pos)
	h.pos++
	return &fuse.DirEntry{Name: e.name, Mode: e.mode, Ino: e.ino, Off: uint64(h.pos)}, 0
}

var _ = (fs.FileSeekdirer)((*dirHandle)(nil))

func (h *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	ctx = uninterruptible(ctx)
	if off == 0 {
		// rewinddir: show what is there now, as a local file system would.
		return h.load(ctx)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for uint64(h.entries.len()) < off && !h.done {
		h.arrived.Wait()
	}
	h.pos = int(min(off, uint64(h.entries.len())))
	return 0
}

var _ = (fs.FileLookuper)((*dirHandle)(nil))

// Lookup answers READDIRPLUS from the listing's attributes, without a request.
func (h *dirHandle) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ctx = uninterruptible(ctx)
	h.mu.Lock()
	at, ok := h.byName[name]
	var e dirEntry
	if ok {
		e = *h.entries.at(at)
	}
	moves := h.moves
	h.mu.Unlock()
	if !ok || e.junction {
		return h.n.Lookup(ctx, name, out)
	}
	ino := e.ino
	if h.n.fsys.inodes.moved(moves) {
		// A rename or delete since the listing may have moved the number to another
		// name: this name's is whatever the table says now.
		ino = h.n.fsys.inodes.get(h.l.Branches[e.found.Index].ID, backend.Child(h.rel, name))
	}
	return h.n.child(ctx, name, ino, e.found, false, out), 0
}

// placeNew decides where a new entry name below n goes (the layer's placement policy)
// and returns its path there.
func (n *node) placeNew(ctx context.Context, name string) (vp string, l *mux.Layer, rel string, idx int, errno syscall.Errno) {
	if errno := checkName(name); errno != 0 {
		return "", nil, "", -1, errno
	}
	pvp, l, prel, errno := n.where()
	if errno != 0 {
		return "", nil, "", -1, errno
	}
	vp = join(pvp, name)
	if n.fsys.table.Junction(vp) {
		return "", nil, "", -1, syscall.EEXIST
	}
	if l == nil {
		return "", nil, "", -1, syscall.EROFS
	}
	_, dirs, _ := n.state()
	idx, err := l.Place(ctx, prel, dirs)
	if err != nil {
		return "", nil, "", -1, n.fsys.toErrno(err)
	}
	if !slices.Contains(dirs, idx) {
		// The policy created the parent path on that branch: it joins the merge.
		n.mu.Lock()
		n.dirs = append(append([]int(nil), n.dirs...), idx)
		slices.Sort(n.dirs)
		n.mu.Unlock()
	}
	return vp, l, backend.Child(prel, name), idx, 0
}

// newEntry makes the inode for an entry just created on branch idx.
func (n *node) newEntry(ctx context.Context, name, vp string, l *mux.Layer, rel string, idx int, a backend.Attr, out *fuse.EntryOut) *fs.Inode {
	found := mux.Found{Index: idx, Attr: a}
	if a.IsDir() {
		found.Dirs = []int{idx}
	}
	n.fsys.inodes.forget(l.Branches[idx].ID, rel)
	return n.child(ctx, name, n.fsys.inoOf(vp, l, rel, found, false), found, false, out)
}

var _ = (fs.NodeMkdirer)((*node)(nil))

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ctx = uninterruptible(ctx)
	vp, l, rel, idx, errno := n.placeNew(ctx, name)
	if errno != 0 {
		return nil, errno
	}
	b := l.Branches[idx].Backend
	a, err := b.Mkdir(ctx, rel, mode)
	if err != nil {
		return nil, n.fsys.toErrno(err)
	}
	return n.newEntry(ctx, name, vp, l, rel, idx, a, out), 0
}

var _ = (fs.NodeCreater)((*node)(nil))

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ctx = uninterruptible(ctx)
	vp, l, rel, idx, errno := n.placeNew(ctx, name)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	b := l.Branches[idx].Backend
	f, err := b.Open(ctx, rel, openFlags(flags)|os.O_CREATE, mode)
	if err != nil {
		return nil, nil, 0, n.fsys.toErrno(err)
	}
	inode := n.newEntry(ctx, name, vp, l, rel, idx, f.OpenedAttr(), out)
	child := inode.Operations().(*node)
	h := child.addHandle(ctx, f, openFlags(flags)|os.O_WRONLY)
	h.mode = child.openMode(false, false, f.OpenedAttr())
	var fuseFlags uint32
	if h.mode == modeDirect {
		fuseFlags = fuse.FOPEN_DIRECT_IO
	}
	return inode, h, fuseFlags, 0
}

var _ = (fs.NodeSymlinker)((*node)(nil))

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ctx = uninterruptible(ctx)
	vp, l, rel, idx, errno := n.placeNew(ctx, name)
	if errno != 0 {
		return nil, errno
	}
	b := l.Branches[idx].Backend
	a, err := b.Symlink(ctx, target, rel)
	if err != nil {
		return nil, n.fsys.toErrno(err)
	}
	return n.newEntry(ctx, name, vp, l, rel, idx, a, out), 0
}

var _ = (fs.NodeLinker)((*node)(nil))

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ctx = uninterruptible(ctx)
	if errno := checkName(name); errno != 0 {
		return nil, errno
	}
	tn, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	_, tl, trel, errno := tn.where()
	if errno != 0 {
		return nil, errno
	}
	tb, _, _ := tn.state()
	pvp, l, prel, errno := n.where()
	if errno != 0 {
		return nil, errno
	}
	if n.fsys.table.Junction(join(pvp, name)) {
		return nil, syscall.EEXIST
	}
	_, pdirs, _ := n.state()
	switch {
	case tb < 0 || tl == nil:
		return nil, syscall.EPERM
	case l != tl || !slices.Contains(pdirs, tb):
		// A hard link cannot span sources.
		return nil, syscall.EXDEV
	case l.Branches[tb].ReadOnly:
		return nil, syscall.EROFS
	}
	rel := backend.Child(prel, name)
	b := l.Branches[tb]
	if err := b.Backend.Link(ctx, trel, rel); err != nil {
		return nil, n.fsys.toErrno(err)
	}
	a, err := b.Backend.Lstat(ctx, rel)
	if err != nil {
		return nil, n.fsys.toErrno(err)
	}
	tn.mu.Lock()
	tn.nlink = max(tn.nlink+1, 2)
	tn.mu.Unlock()
	n.fsys.inodes.alias(b.ID, rel, tn.StableAttr().Ino)
	tn.report(&out.Attr, a)
	return tn.EmbeddedInode(), 0
}

// holders returns the branches of l where rel exists, in order. With one branch it
// asks nothing: the operation itself will say if rel is missing.
func holders(ctx context.Context, l *mux.Layer, rel string) ([]int, []backend.Attr, error) {
	if len(l.Branches) == 1 {
		return []int{0}, nil, nil
	}
	attrs := make([]backend.Attr, len(l.Branches))
	errs := make([]error, len(l.Branches))
	mux.Each(len(l.Branches), func(i int) {
		attrs[i], errs[i] = l.Branches[i].Backend.Lstat(ctx, rel)
	})
	var idx []int
	var out []backend.Attr
	for i, err := range errs {
		if err == nil {
			idx = append(idx, i)
			out = append(out, attrs[i])
		} else if e := backend.ToErrno(err); e != syscall.ENOENT && e != syscall.ENOTDIR {
			return nil, nil, err
		}
	}
	if len(idx) == 0 {
		return nil, nil, syscall.ENOENT
	}
	return idx, out, nil
}

func anyReadOnly(l *mux.Layer, idx []int) bool {
	for _, i := range idx {
		if l.Branches[i].ReadOnly {
			return true
		}
	}
	return false
}

// dropChild records that name below n no longer exists: its inode number is retired
// and a still-open file sees its link count fall.
func (n *node) dropChild(l *mux.Layer, rel, name string, idx []int) {
	for _, i := range idx {
		n.fsys.inodes.forget(l.Branches[i].ID, rel)
	}
	if ch := n.GetChild(name); ch != nil {
		if cn, ok := ch.Operations().(*node); ok {
			cn.mu.Lock()
			if cn.nlink > 0 {
				cn.nlink--
			}
			cn.mu.Unlock()
		}
	}
}

var _ = (fs.NodeUnlinker)((*node)(nil))

// Unlink removes name from every member that has it, so that no shadowed copy
// reappears in its place.
func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	ctx = uninterruptible(ctx)
	l, rel, idx, _, errno := n.removal(ctx, name)
	if errno != 0 {
		return errno
	}
	return n.removeFrom(l, rel, name, idx, func(b backend.Backend) error { return b.Unlink(ctx, rel) })
}

var _ = (fs.NodeRmdirer)((*node)(nil))

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	ctx = uninterruptible(ctx)
	l, rel, idx, attrs, errno := n.removal(ctx, name)
	if errno != 0 {
		return errno
	}
	if len(idx) > 1 {
		// Empty in the union means empty on every member: check all before
		// removing any, so a refusal changes nothing.
		for k, i := range idx {
			if !attrs[k].IsDir() {
				return syscall.ENOTDIR
			}
			if err := emptyDir(ctx, l.Branches[i].Backend, rel); err != nil {
				return n.fsys.toErrno(err)
			}
		}
	}
	return n.removeFrom(l, rel, name, idx, func(b backend.Backend) error { return b.Rmdir(ctx, rel) })
}

// removal finds what Unlink or Rmdir of name below n removes: the layer, name's path
// in it, and the members that hold it (with their attributes, in a union). A mount
// point and a name on a read-only member are refused before anything is removed.
func (n *node) removal(ctx context.Context, name string) (l *mux.Layer, rel string, idx []int, attrs []backend.Attr, errno syscall.Errno) {
	pvp, l, prel, errno := n.where()
	if errno != 0 {
		return nil, "", nil, nil, errno
	}
	if n.fsys.table.Junction(join(pvp, name)) {
		return nil, "", nil, nil, syscall.EBUSY
	}
	if l == nil {
		return nil, "", nil, nil, syscall.ENOENT
	}
	rel = backend.Child(prel, name)
	idx, attrs, err := holders(ctx, l, rel)
	if err != nil {
		return nil, "", nil, nil, n.fsys.toErrno(err)
	}
	if anyReadOnly(l, idx) {
		return nil, "", nil, nil, syscall.EROFS
	}
	return l, rel, idx, attrs, 0
}

// removeFrom runs remove on each member in idx, in order, and records name as gone.
func (n *node) removeFrom(l *mux.Layer, rel, name string, idx []int, remove func(backend.Backend) error) syscall.Errno {
	for _, i := range idx {
		if err := remove(l.Branches[i].Backend); err != nil {
			return n.fsys.toErrno(err)
		}
	}
	n.dropChild(l, rel, name, idx)
	return 0
}

var _ = (fs.NodeRenamer)((*node)(nil))

// Rename moves name within one layer. Across layers (different sources) it returns
// EXDEV, and mv copies instead. In a union the entry moves on every member that holds
// it, and copies of the target name on other members are removed, so the result looks
// exactly like rename(2) on one file system.
func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	ctx = uninterruptible(ctx)
	if errno := checkName(newName); errno != 0 {
		return errno
	}
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	sdir, sok := n.vpath()
	ddir, dok := np.vpath()
	if !sok || !dok {
		return syscall.ENOENT
	}
	svp, dvp := join(sdir, name), join(ddir, newName)
	if n.fsys.table.Junction(svp) || n.fsys.table.Junction(dvp) {
		return syscall.EBUSY
	}
	sl, srel := n.fsys.table.Enclosing(svp)
	dl, drel := n.fsys.table.Enclosing(dvp)
	switch {
	case sl == nil:
		return syscall.ENOENT
	case dl == nil:
		return syscall.EROFS
	case sl != dl:
		return syscall.EXDEV
	case flags&unixRenameExchange != 0:
		return syscall.EINVAL // SFTP cannot swap two names atomically
	}
	l := sl
	src, srcAttrs, err := holders(ctx, l, srel)
	if err != nil {
		return n.fsys.toErrno(err)
	}
	var dst []int
	var dstAttrs []backend.Attr
	var all []int // the members holding the target, and its attributes on each
	var attrs []backend.Attr
	if len(l.Branches) > 1 || flags&unixRenameNoreplace != 0 {
		if len(l.Branches) == 1 {
			if a, err := l.Branches[0].Backend.Lstat(ctx, drel); err == nil {
				all, attrs = []int{0}, []backend.Attr{a}
			}
		} else if all, attrs, err = holders(ctx, l, drel); err != nil && backend.ToErrno(err) != syscall.ENOENT {
			return n.fsys.toErrno(err)
		}
		if len(all) > 0 && flags&unixRenameNoreplace != 0 {
			return syscall.EEXIST
		}
		for k, i := range all {
			if !slices.Contains(src, i) {
				dst = append(dst, i)
				dstAttrs = append(dstAttrs, attrs[k])
			}
		}
	}
	_, pdirs, _ := np.state()
	if anyReadOnly(l, src) || anyReadOnly(l, dst) {
		return syscall.EROFS
	}
	for _, i := range src {
		if len(l.Branches) > 1 && !slices.Contains(pdirs, i) {
			return syscall.EXDEV // the target directory is not on that member
		}
	}
	if len(l.Branches) > 1 {
		if err := replaceable(ctx, l, srcAttrs, all, attrs, drel); err != nil {
			return n.fsys.toErrno(err)
		}
	}
	for _, i := range src {
		if err := l.Branches[i].Backend.Rename(ctx, srel, drel); err != nil {
			return n.fsys.toErrno(err)
		}
	}
	for k, i := range dst {
		var err error
		if dstAttrs[k].IsDir() {
			err = l.Branches[i].Backend.Rmdir(ctx, drel)
		} else {
			err = l.Branches[i].Backend.Unlink(ctx, drel)
		}
		if err != nil {
			return n.fsys.toErrno(err)
		}
	}
	np.dropChild(l, drel, newName, append(append([]int(nil), src...), dst...))
	for _, i := range src {
		n.fsys.inodes.move(l.Branches[i].ID, srel, drel)
	}
	return 0
}

// replaceable checks, before a rename in a union, that the target can be replaced on
// every member that holds it (targets, with their attributes): the rename is made
// member by member, on the source's and then removing the target from the others, and
// a refusal on one after another has done it would leave the rename half made and
// reported as failed. The answers are a local rename's: a directory replaced must be
// empty (ENOTEMPTY), a directory replaces only a directory (ENOTDIR), and a file only
// a file (EISDIR).
func replaceable(ctx context.Context, l *mux.Layer, srcAttrs []backend.Attr, targets []int, attrs []backend.Attr, drel string) error {
	if len(srcAttrs) == 0 {
		return nil
	}
	srcDir := srcAttrs[0].IsDir()
	for k, i := range targets {
		switch {
		case !attrs[k].IsDir() && srcDir:
			return syscall.ENOTDIR
		case attrs[k].IsDir() && !srcDir:
			return syscall.EISDIR
		case attrs[k].IsDir():
			if err := emptyDir(ctx, l.Branches[i].Backend, drel); err != nil {
				return err
			}
		}
	}
	return nil
}

// emptyDir returns ENOTEMPTY unless the directory rel of b holds no name but . and ..
// (which SFTP servers list).
func emptyDir(ctx context.Context, b backend.Backend, rel string) error {
	ents, err := b.ReadDir(ctx, rel)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Name != "." && e.Name != ".." {
			return syscall.ENOTEMPTY
		}
	}
	return nil
}

// renameat2 flags (linux/fs.h).
const (
	unixRenameNoreplace = 1
	unixRenameExchange  = 2
)
