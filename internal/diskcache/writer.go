package diskcache

import (
	"errors"
	"os"
	"slices"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/muxfs/muxfs/internal/bufpool"
)

// Data written through the mount reaches the cache's data file in the background.
// A write's copy into the data file sat in the path of every FUSE WRITE, and a
// sequential writer waits for each of those one after the other: on the bench's
// machine 64 KiB writes of 512 MiB ran at 196–286 MB/s with that copy and 342–424
// without (docs/design.md, "Persistent cache"). The write now queues a copy of its
// data for the cache's writer goroutine and returns. What a cold read fetches goes the
// same way (entry.fill), but never waits for room in the queue: while the writer is
// behind, a fill is written through the page cache at once.
//
// The rule that keeps this invisible: an entry's spans name queued data at once, and
// everything that reads, syncs, truncates or replaces the data file first waits for
// the entry's queued writes (drainLocked: from resetLocked, and through settleLocked,
// which drops the data if a queued write failed, from fileLocked, closeFileLocked and
// flush before it syncs). Writes of one entry are written in the order queued (one writer),
// so a later write of the same bytes lands last. Once the kernel reads the data file
// itself (passthrough), nothing of muxfs' stands between it and a queued write: writes
// to that entry are then made before the FUSE WRITE is answered, as before.
//
// A sequential writer's writes are gathered into writes of 1 MiB (queueLocked): one
// write to the data file and one wake-up of the writer per MiB instead of per 64 KiB
// FUSE WRITE took the same `dd` from 195–212 to 256–284 MB/s (four alternated
// rounds; `-o cache=memory` 288–358, sshfs 288–321). What is gathered is handed over
// whenever anything needs the data file (drainLocked), and when the writes end (a
// close's or an fsync's stat, the last release), so it never waits for a commit.
//
// Aligned writes of 64 KiB or more (a sequential writer's, all of them but maybe the
// last; see directMin for the small ones) go in with direct I/O, through a second
// descriptor of the data file: a buffered write copies into newly allocated
// page-cache pages, and that copy was 36% of muxfs' CPU samples in a
// 1 GiB write on the bench's machine (a virtual machine whose fresh pages fault to
// the host); the same write with direct I/O moved 224–239 MB/s against 176–196
// buffered in alternated rounds (docs/design.md). The pages are not wanted anyway:
// the mount's own pages hold what was written, and a big data file leaves the page
// cache once synced (dropPages). The kernel keeps the two descriptors coherent (a
// direct write writes back and drops the page-cache pages it overlaps), and the
// writer waits for each direct write, which only the queue's bound can make a FUSE
// WRITE wait for. A file system that refuses direct I/O (tmpfs before Linux 6.6,
// some network file systems) gets buffered writes, tried once per cache.

// writeQueue bounds the writes waiting for the writer: up to this many copies of at
// most max_write (1 MiB) each are held at once, besides one write being gathered per
// file being written; a writer that gets further ahead waits for the disk.
const writeQueue = 32

// cacheWrite is a write queued for the writer: (*buf)[lo:lo+n] at off.
type cacheWrite struct {
	q      *writeCount
	f      *os.File
	direct *os.File // f opened for direct I/O, if the write may go through it
	buf    *[]byte
	lo, n  int
	off    int64
}

// bytes is what the write writes.
func (w *cacheWrite) bytes() []byte { return (*w.buf)[w.lo : w.lo+w.n] }

// directAlign is the alignment of direct I/O's offsets, lengths and buffers: the
// page size, which covers every block size up to it.
const directAlign = 4096

// writeCount counts an entry's queued writes. It has its own lock, not the entry's: a
// goroutine that holds an entry's lock may wait for room in the queue, which only the
// writer makes, so the writer must never wait for an entry's lock.
type writeCount struct {
	mu           sync.Mutex
	done         sync.Cond // signalled as writes complete; L is mu
	queued, made uint64
	failed       bool
}

// queueLocked queues p, to be written to the data file f at off. A write that
// continues the one before it (a sequential writer's) is gathered with it into one
// buffer of up to bufpool.Max, handed to the writer when full or when anything needs
// the data file (drainLocked): one write to the data file and one wake-up of the
// writer per MiB, not per FUSE WRITE. A fill is handed over at once by the caller.
// Every write starts in a copy of its own size, moved to one of bufpool.Max when the
// next write continues it: a random writer's 4 KiB writes each held 1 MiB while
// queued. The caller holds e.mu; if the queue is full it waits for the writer.
func (e *entry) queueLocked(f *os.File, p []byte, off int64) {
	// The fills gathered so far go first: a fill gathered before this write and
	// written after it would put back the bytes it replaces.
	e.sendWindowsLocked()
	if g := e.gather; g != nil && g.f == f && off == g.off+int64(g.n) && g.n+len(p) <= bufpool.Max {
		if g.n+len(p) > len(*g.buf) {
			grown := bufpool.Get(bufpool.Max)
			copy(*grown, (*g.buf)[:g.n])
			bufpool.Put(g.buf)
			g.buf = grown
		}
		g.n += copy((*g.buf)[g.n:], p)
	} else {
		e.sendLocked()
		var buf *[]byte
		if len(p) > bufpool.Max {
			b := make([]byte, len(p))
			buf = &b
		} else {
			buf = bufpool.Get(len(p))
		}
		e.gather = &cacheWrite{f: f, buf: buf, n: copy(*buf, p), off: off}
	}
	if e.gather.n >= bufpool.Max {
		e.sendLocked()
	}
}

// sendLocked hands the write being gathered and the fills being gathered, if any, to
// the writer.
func (e *entry) sendLocked() {
	e.sendWindowsLocked()
	w := e.gather
	if w == nil {
		return
	}
	e.gather = nil
	e.queueWriteLocked(w)
}

// queueWriteLocked hands w to the writer, waiting for room in the queue.
func (e *entry) queueWriteLocked(w *cacheWrite) {
	if w.n >= directMin && aligned(w.bytes(), w.off) {
		w.direct = e.directLocked()
	}
	q := &e.writes
	q.mu.Lock()
	if q.done.L == nil {
		q.done.L = &q.mu
	}
	q.queued++
	q.mu.Unlock()
	w.q = q
	e.st.c.writes <- *w
}

// A cold read's fills are gathered per aligned MiB of the file (fillWindow) and go to
// the data file in one write once the cache holds all of that MiB. The kernel's
// read-ahead READs are 256 KiB (its 128 KiB read-ahead, doubled for a sequential
// reader) with two in flight, answered in either order (55 of 130 came out of order
// in a cold 32 MiB read on the bench's machine), so gathering only the fill that
// continues the one before, as writes are, would still split most MiBs. Each READ
// one direct write of its own left the writer behind: in a cold 256 MiB read at
// 0 ms, 5–31% of the fills found the queue full and went through the page cache
// instead (docs/design.md, "Persistent cache", has the figures of the change).

// fillWindows is how many MiBs are gathered at once per file: the two read-ahead READs
// in flight straddle a MiB's end now and then, and with one window the later MiB's
// READ, answered first, sent the earlier MiB in two parts (1.5 writes per MiB in a
// cold 256 MiB read, against 1.0 with two).
const fillWindows = 2

// fillWindow gathers fills of the file's [off, off+bufpool.Max).
type fillWindow struct {
	f    *os.File // the data file: open while a window is, since whatever closes it drains first
	buf  *[]byte  // bufpool.Max bytes, buf[i] the file's byte off+i
	off  int64
	have spans // what the fills put in buf, in the file's offsets
}

// windowLocked gathers the fill p at off into the entry's fill windows, and reports
// whether it did. A fill smaller than directMin or not at a page's start — a random
// reader's — is not gathered: it would hold a MiB of memory for bytes that are
// written alone anyway. The caller holds e.mu.
func (e *entry) windowLocked(f *os.File, p []byte, off int64) bool {
	if len(p) < directMin || off%directAlign != 0 {
		return false
	}
	for len(p) > 0 {
		base := off &^ (bufpool.Max - 1)
		n := min(len(p), int(base+bufpool.Max-off))
		w := e.windowAtLocked(f, base)
		copy((*w.buf)[off-base:], p[:n])
		w.have, _ = w.have.add(off, off+int64(n))
		if e.fullLocked(w) {
			e.sendWindowLocked(w)
		}
		p, off = p[n:], off+int64(n)
	}
	return true
}

// windowAtLocked returns the fill window of f's MiB at base, opened if need be; the
// oldest window goes to the writer to make room.
func (e *entry) windowAtLocked(f *os.File, base int64) *fillWindow {
	for _, w := range e.windows {
		if w.off == base {
			return w
		}
	}
	if len(e.windows) == fillWindows {
		e.sendWindowLocked(e.windows[0])
	}
	w := &fillWindow{f: f, buf: bufpool.Get(bufpool.Max), off: base}
	e.windows = append(e.windows, w)
	return w
}

// fullLocked reports whether w's MiB (up to the file's end) is all there: gathered in
// w, or stored before it (the start of a file, which a fresh entry keeps in memory:
// keepInMemLocked).
func (e *entry) fullLocked(w *fillWindow) bool {
	end := min(w.off+bufpool.Max, e.rec.Size)
	at := w.off
	for _, sp := range w.have {
		if sp.Off > at && !e.rec.Spans.covers(at, sp.Off) {
			return false
		}
		at = max(at, sp.End)
	}
	return at >= end || e.rec.Spans.covers(at, end)
}

// sendWindowsLocked hands every fill window to the writer, oldest first.
func (e *entry) sendWindowsLocked() {
	for len(e.windows) > 0 {
		e.sendWindowLocked(e.windows[0])
	}
}

// sendWindowLocked hands what the fill window w gathered to the writer: one write per
// range of it (a window holds one at least: it is opened for a fill), which is one
// write for a whole MiB. A fill never waits for room in
// the queue: while the writer is behind, the window is written at once through the
// page cache (writerBehind), and a failure of that write is the entry's as a queued
// write's would be (the spans name the bytes since their fill).
func (e *entry) sendWindowLocked(w *fillWindow) {
	e.windows = slices.DeleteFunc(e.windows, func(o *fillWindow) bool { return o == w })
	for i, sp := range w.have {
		cw := &cacheWrite{f: w.f, buf: w.buf, lo: int(sp.Off - w.off), n: int(sp.End - sp.Off), off: sp.Off}
		if i < len(w.have)-1 {
			// A MiB filled in parts (read at random, or left when the read
			// stopped): the last range keeps the window's buffer, the others
			// copies of their own.
			cw.buf, cw.lo = bufpool.Get(cw.n), 0
			copy(*cw.buf, (*w.buf)[sp.Off-w.off:sp.End-w.off])
		}
		if !e.st.c.writerBehind() {
			e.queueWriteLocked(cw)
			continue
		}
		if err := e.st.c.writeNow(w.f, cw.bytes(), cw.off); err != nil {
			q := &e.writes
			q.mu.Lock()
			q.failed = true
			q.mu.Unlock()
		}
		bufpool.Put(cw.buf)
	}
}

// writerBehind reports whether the queue is full: a fill then writes through the page
// cache instead of waiting for the disk (storeLocked). A fill that finds room may
// still wait briefly, if other files' writes take it first.
func (c *Cache) writerBehind() bool { return len(c.writes) == cap(c.writes) }

// directMin is the smallest write that goes in with direct I/O. A direct write waits
// for the disk, and the writer makes one at a time: a random writer's 4 KiB writes,
// each a direct write of its own, filled the queue at the disk's pace, and the FUSE
// WRITEs waited for it (docs/design.md, "Random small writes", has the figures).
// Buffered, a small write is a copy into a page or a few; what direct I/O spares, the copy into
// freshly allocated pages, is paid per byte and matters for the megabytes a
// sequential writer or a cold read moves.
const directMin = 64 << 10

// aligned reports whether a write of p at off may use direct I/O.
func aligned(p []byte, off int64) bool {
	return len(p) > 0 && len(p)%directAlign == 0 && off%directAlign == 0 &&
		uintptr(unsafe.Pointer(&p[0]))%directAlign == 0
}

// directLocked returns the entry's data file opened for direct I/O, opening it if
// need be; nil if the cache's file system refuses it. The data file is open (e.f),
// and its path names it: an entry detached from its path caches no writes.
func (e *entry) directLocked() *os.File {
	if e.direct != nil || e.st.c.noDirect.Load() {
		return e.direct
	}
	f, err := os.OpenFile(e.st.dataPath(e.path), os.O_WRONLY|unix.O_DIRECT, 0)
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			e.st.c.noDirect.Store(true)
		}
		return nil
	}
	e.direct = f
	return f
}

// drainLocked waits until every write queued for the entry so far is in its data
// file, and reports whether one of them failed (a full disk): the spans then name
// bytes that are not there.
func (e *entry) drainLocked() (failed bool) {
	e.sendLocked()
	q := &e.writes
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.made < q.queued {
		q.done.Wait()
	}
	failed, q.failed = q.failed, false
	return failed
}

// lockSettled takes e's lock once every write queued for its data file so far is in,
// having dropped the data if one failed (settleLocked). It waits for the writer
// without the lock: the once-a-second flush must not hold up a cold read, whose fills
// go through the same queue, for as long as a slow disk takes to catch up.
func (e *entry) lockSettled() {
	e.mu.Lock()
	e.sendLocked()
	q := &e.writes
	q.mu.Lock()
	n := q.queued
	q.mu.Unlock()
	e.mu.Unlock()
	q.mu.Lock()
	for q.made < n {
		q.done.Wait()
	}
	failed := q.failed
	q.mu.Unlock()
	e.mu.Lock()
	if failed {
		e.settleLocked()
	}
}

// writer writes the queued data to the data files, in order, until the queue is
// closed.
func (c *Cache) writer() {
	defer close(c.writerDone)
	for w := range c.writes {
		var err error
		if c.writeFault != nil {
			err = c.writeFault()
		}
		if err == nil {
			err = c.write(w)
		}
		bufpool.Put(w.buf)
		w.q.mu.Lock()
		w.q.failed = w.q.failed || err != nil
		w.q.made++
		w.q.done.Broadcast()
		w.q.mu.Unlock()
	}
}

// write writes one queued write, with direct I/O if it may; a refusal of direct I/O
// (a buffer or an offset of the wrong alignment for this file system) turns it off.
func (c *Cache) write(w cacheWrite) error {
	p := w.bytes()
	if w.direct != nil && !c.noDirect.Load() {
		_, err := w.direct.WriteAt(p, w.off)
		if !errors.Is(err, unix.EINVAL) {
			return err
		}
		c.noDirect.Store(true)
	}
	_, err := w.f.WriteAt(p, w.off)
	return err
}
