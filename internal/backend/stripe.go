package backend

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/muxfs/muxfs/internal/sftp"
)

// Striping. OpenSSH gives a session channel a window of 2 MiB: over a long round trip
// one session carries at most 2 MiB per RTT, whatever the link (95 MB/s at 21 ms), and
// an open file is pinned to one session. A big sequential read over such a link also
// reads through handles of the same file opened on the pool's other sessions, its
// read-ahead chunks dealt round-robin, so that n sessions carry n windows; a big
// sequential write is dealt over such handles the same way (see noteWriteLocked for
// what keeps its requests in order). Below stripeMinRTT one window moves more than one
// ssh process can decrypt, and more sessions only add work; small files and random
// reads and writes never stripe.
var stripeMinRTT = 5 * time.Millisecond // a variable for tests

// A file is striped from its third sequential read (the window doubles at each: 512 KiB,
// 1 MiB, 2 MiB), if it is big enough for the sessions' handshakes to pay; and once a
// full write window was written to it in order.
const (
	stripeMinSize    = 32 << 20
	stripeAfter      = 2 << 20
	stripeWriteAfter = writeWindow
)

// stripe holds the extra handles of a file read or written through several sessions.
type stripe struct {
	mu sync.Mutex
	// decided: whether the link is slow enough (slow) was asked of the pool once,
	// not at every read or write; slow is cleared for good when a second open of the
	// file's path failed or reached another file.
	decided, slow bool
	warmed        bool // the pool was asked to open its missing sessions (warmLocked)
	extra         []handle
	// candidates: extra handles opened for writing, to be checked (checkCandidatesLocked)
	// before any write goes through them.
	candidates []handle
	opening    map[*sftp.Client]bool // sessions an extra handle is being opened on
	choosing   bool                  // an openExtra is choosing a session (or waiting for the pool to have one)
	closed     bool
	// wrote: a write went through an extra handle; reads of the file then wait for
	// such writes (settle). Set once, read without the lock.
	wrote atomic.Bool
}

// readHandles returns the handles a read-ahead deals its chunks over: h, and the live
// extra handles once the stream is at full window on a file worth it over a slow link;
// more are opened in the background, up to one per session of the pool.
func (f *sftpFile) readHandles(h handle, window int) []handle {
	hs := []handle{h}
	if !f.readOnly || f.opened.Size < stripeMinSize {
		return hs
	}
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	if window < stripeAfter {
		f.warmLocked(h)
		return hs
	}
	return append(hs, f.widenLocked(h)...)
}

// slowLocked tells whether the file's link is slow enough to stripe over, asking the
// pool once. The caller holds f.st.mu.
func (f *sftpFile) slowLocked(h handle) bool {
	if !f.st.decided {
		rtt := h.m.pool.MinRTT()
		f.st.decided, f.st.slow = true, rtt > 0 && rtt >= stripeMinRTT
	}
	return f.st.slow
}

// warmLocked has the pool open its missing sessions, once per file, when a big file's
// sequential read has begun over a slow link: the handshakes (about nine round trips
// each) then overlap the read-ahead's growth to a full window, which striping waits
// for. A write needs no such start: its window is full as soon as the writer has
// written 8 MiB, at once. The caller holds f.st.mu.
func (f *sftpFile) warmLocked(h handle) {
	if f.st.warmed || f.st.closed {
		return
	}
	f.st.warmed = true
	if f.slowLocked(h) {
		h.m.pool.warm()
	}
}

// widenLocked returns the live extra handles of a file to be striped, h being its own,
// and opens one more in the background while the pool has sessions the file does not
// use — on a slow link only. The caller holds f.st.mu.
func (f *sftpFile) widenLocked(h handle) []handle {
	if !f.slowLocked(h) {
		return nil
	}
	live := f.st.extra[:0]
	for _, x := range f.st.extra {
		switch {
		case x.c.Err() != nil:
		case x.c == h.c || x.m != h.m:
			// The main handle moved (a reopen) onto this session or another member.
			x.c.CloseAsync(x.h)
		default:
			live = append(live, x)
		}
	}
	f.st.extra = live
	if f.st.opening == nil {
		f.st.opening = map[*sftp.Client]bool{}
	}
	used := append([]handle{h}, live...)
	used = append(used, f.st.candidates...)
	if !f.st.closed && !f.st.choosing && len(used)+len(f.st.opening) < h.m.pool.ep.MaxConns {
		f.st.choosing = true
		go f.openExtra(h, used)
	}
	return live
}

// openExtra opens the file on a session of h's pool that hs does not use. An open by
// path may reach another file if the path changed since: a handle for reading is kept
// only if it shows the file as opened (type, owner, size, mtime); one for writing, whose
// file changes as it is written, becomes a candidate, checked when no write is in
// flight (checkCandidatesLocked).
func (f *sftpFile) openExtra(h handle, hs []handle) {
	f.st.mu.Lock()
	c := h.m.pool.spare(func(c *sftp.Client) bool {
		for _, x := range hs {
			if x.c == c {
				return true
			}
		}
		return f.st.opening[c]
	})
	f.st.choosing = false // the next read may choose another
	if c == nil {
		f.st.mu.Unlock()
		return
	}
	f.st.opening[c] = true
	f.st.mu.Unlock()
	defer func() {
		f.st.mu.Lock()
		delete(f.st.opening, c)
		f.st.mu.Unlock()
	}()
	ctx, cancel := f.s.deadline(context.Background())
	defer cancel()
	flags := os.O_RDONLY
	if !f.readOnly {
		flags = os.O_WRONLY
	}
	xh, err := c.Open(ctx, h.m.abs(f.path), openFlags(flags), sftp.Attrs{})
	if err != nil {
		if !connLost(err) {
			// The path no longer opens so (the file removed, made read-only for
			// a writer that created it): every later try would fail as well.
			f.st.mu.Lock()
			f.st.slow = false
			f.st.mu.Unlock()
		}
		return
	}
	if !f.readOnly {
		f.st.mu.Lock()
		defer f.st.mu.Unlock()
		if f.st.closed {
			c.CloseAsync(xh)
			return
		}
		f.st.candidates = append(f.st.candidates, handle{m: h.m, c: c, h: xh})
		return
	}
	fa, err := c.Fstat(ctx, xh)
	same := err == nil && fa.Mode == f.lstat.Mode && fa.UID == f.lstat.UID && fa.GID == f.lstat.GID &&
		attrFromSFTP(fa).Size == f.opened.Size && attrFromSFTP(fa).Mtime.Equal(f.opened.Mtime)
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	if !same || f.st.closed {
		if !same && err == nil {
			f.st.slow = false // the path names another file now
		}
		c.CloseAsync(xh)
		return
	}
	f.st.extra = append(f.st.extra, handle{m: h.m, c: c, h: xh})
	f.s.striped.Add(1)
}

// closeExtra closes the extra handles of a file whose close waits for nothing (opened
// for reading, or unusable); none is opened after.
func (f *sftpFile) closeExtra() {
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	f.st.closed = true
	for _, x := range append(f.st.extra, f.st.candidates...) {
		x.c.CloseAsync(x.h)
	}
	f.st.extra, f.st.candidates = nil, nil
}

// closeWritten closes the extra handles of a file opened for writing, once every
// write is acknowledged, all at once; wait returns the first failure: a server may
// report an error of the data written through a handle only when it is closed (a
// network file system's write-back). None is opened after.
func (f *sftpFile) closeWritten(ctx context.Context) (wait func() error) {
	f.st.mu.Lock()
	f.st.closed = true
	xs := append(f.st.extra, f.st.candidates...)
	f.st.extra, f.st.candidates = nil, nil
	f.st.mu.Unlock()
	errs := make(chan error, len(xs))
	for _, x := range xs {
		go func() { errs <- x.c.CloseHandle(ctx, x.h) }()
	}
	return func() error {
		var first error
		for range xs {
			if err := <-errs; err != nil && !connLost(err) && first == nil {
				first = err
			}
		}
		return first
	}
}

// handles is how many handles the file's writes are dealt over: its own and the
// extra ones.
func (f *sftpFile) handles() int {
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	return 1 + len(f.st.extra)
}

// noteWriteLocked records a write of n bytes at off, before it is queued, and tells
// whether it continues the file's run of writes in order. Writes on
// different sessions may reach the server in any order, so a write goes on an extra
// handle only if it can overlap nothing in flight: it continues the file's run of
// writes in order, and every request pending on the file is such a write
// (writeBehind.others, checked in startLocked). A write elsewhere therefore first waits
// for every write in flight on a striped file, and is itself one of the others until
// acknowledged; any other request waits until no write is in flight on an extra handle
// (settleLocked), and then goes on the file's own handle, behind its writes. Once a
// full window went out in order over a slow link, extra handles are opened.
func (f *sftpFile) noteWriteLocked(ctx context.Context, off int64, n int) (inOrder bool) {
	wb := &f.wb
	inOrder = off == wb.nextOff && f.flags&os.O_APPEND == 0 // an append lands at the end, wherever that is
	if !inOrder {
		wb.run = 0
		if f.striping() {
			f.drainLocked(ctx)
		}
	}
	wb.nextOff = off + int64(n)
	wb.run += int64(n)
	// A link the write-behind finds narrow (pace.go) gains nothing from more
	// windows, and each extra session's handshake would queue behind the writes;
	// one bound by its windows (a long link) gains as a fast one.
	if inOrder && wb.run >= stripeWriteAfter && (wb.pace.limit() == 0 || wb.pace.windowBound()) {
		f.stripeWritesLocked(ctx)
	}
	return inOrder
}

// striping tells whether writes may be in flight on extra handles.
func (f *sftpFile) striping() bool { return f.wb.onExtra > 0 || f.handles() > 1 }

// settleLocked waits until no write is in flight on an extra handle (sending a held
// write first, which may go on one): what the caller sends next on the file's own
// handle then comes after every write before it.
func (f *sftpFile) settleLocked(ctx context.Context) {
	if !f.striping() {
		return
	}
	if f.wb.held.Load() {
		f.sendHeldLocked()
	}
	for f.wb.onExtra > 0 {
		f.waitOldestLocked(ctx)
	}
}

// settle is settleLocked for a caller not holding f.wb.mu.
func (f *sftpFile) settle(ctx context.Context) {
	f.wb.mu.Lock()
	defer f.wb.mu.Unlock()
	f.settleLocked(ctx)
}

// stripeWritesLocked opens extra handles for a file written in order over a slow link,
// and puts those opened to use once they are checked — all at once, when none is being
// opened on a session, since each check waits for every write in flight. A pool is
// filled a few sessions at a time (maxOpening), so with more sessions than that the
// handles opened on the first ones go to use while the rest are still connecting
// (with max_conns=8 at 200 ms, from 3.7 s rather than 8.5 s).
func (f *sftpFile) stripeWritesLocked(ctx context.Context) {
	h := f.handle()
	f.st.mu.Lock()
	if f.st.closed {
		f.st.mu.Unlock()
		return
	}
	f.widenLocked(h)
	var cands []handle
	if len(f.st.opening) == 0 {
		cands, f.st.candidates = f.st.candidates, nil
	}
	f.st.mu.Unlock()
	if len(cands) > 0 {
		f.checkCandidatesLocked(ctx, h, cands)
	}
}

// checkCandidatesLocked keeps the candidates that are handles of the file itself: once
// every write is acknowledged, the file stands still (for this mount), and an extra
// handle's FSTAT must then match the file's own in type, mode, owner, size and mtime.
// An open by path that reached another file (the file renamed or replaced since it was
// opened) fails this, and its handle is closed unused.
func (f *sftpFile) checkCandidatesLocked(ctx context.Context, h handle, cands []handle) {
	f.drainLocked(ctx)
	own, err := h.c.StartFstat(h.h)
	pend := make([]*sftp.PendingAttrs, len(cands))
	for i, x := range cands {
		pend[i], _ = x.c.StartFstat(x.h) // nil if its session is gone: nothing to compare
	}
	var oa sftp.Attrs
	if err == nil {
		oa, err = own.Wait(ctx)
	}
	ok := err == nil && f.wb.err == nil && f.handle() == h
	var keep []handle
	refused := false
	for i, x := range cands {
		var xa sftp.Attrs
		xerr := errNoFstat
		if pend[i] != nil {
			xa, xerr = pend[i].Wait(ctx)
		}
		if ok && xerr == nil && xa.Mode == oa.Mode && xa.UID == oa.UID && xa.GID == oa.GID &&
			xa.Size == oa.Size && attrFromSFTP(xa).Mtime.Equal(attrFromSFTP(oa).Mtime) {
			keep = append(keep, x)
			continue
		}
		if ok && xerr == nil {
			f.s.warn("a second open of %s reached another file (renamed or replaced since): its writes stay on one session", f.path)
			refused = true
		}
		x.c.CloseAsync(x.h)
	}
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	if refused {
		f.st.slow = false // no more opens by a path that names another file now
	}
	if f.st.closed {
		for _, x := range keep {
			x.c.CloseAsync(x.h)
		}
		return
	}
	f.st.extra = append(f.st.extra, keep...)
	f.s.striped.Add(int64(len(keep)))
}

var errNoFstat = errors.New("no FSTAT sent")

// dealLocked chooses the handle for the next write in order: the file's own (h) and
// its extra ones in turn. ok false: h.
func (f *sftpFile) dealLocked(h handle) (x handle, ok bool) {
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	n := len(f.st.extra)
	if n == 0 {
		return h, false
	}
	f.wb.turn = (f.wb.turn + 1) % (n + 1)
	if f.wb.turn == n {
		return h, false
	}
	x = f.st.extra[f.wb.turn]
	if x.c.Err() != nil || x.c == h.c || x.m != h.m {
		return h, false
	}
	return x, true
}

// extraLostLocked sends again, on the handles left, every write that was in flight on
// the lost session of an extra handle. They are all writes in order (nothing else is
// queued while one is on an extra handle), so the order they now arrive in does not
// matter.
func (f *sftpFile) extraLostLocked(dead *sftp.Client) {
	f.st.mu.Lock()
	live := f.st.extra[:0]
	for _, x := range f.st.extra {
		if x.c != dead {
			live = append(live, x)
		}
	}
	f.st.extra = live
	f.st.mu.Unlock()
	for i := range f.wb.pending {
		if pw := &f.wb.pending[i]; pw.c == dead {
			f.startLocked(pw)
		}
	}
}
