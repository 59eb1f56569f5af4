package backend

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/muxfs/muxfs/internal/bufpool"
	"github.com/muxfs/muxfs/internal/sftp"
)

// Sizes of the windows that keep a stream's requests in flight. One SSH channel carries
// about 2 MiB at a time, so a few MiB per file keep the link busy without letting one
// file hog a session; the write window is bounded because an unbounded one overloads
// OpenSSH's sftp-server (design.md: 750 IOPS with sshfs' unbounded writes). On a
// narrow link both are smaller: what the link needs (pace.go).
const (
	readAheadStart = 512 << 10
	readAheadMax   = 8 << 20
	writeWindow    = 8 << 20
)

// writeBehind sends a file's writes without waiting for each acknowledgement, up to
// writeWindow bytes in flight. The first failure is kept and returned by the next
// write, flush, fsync or close, so no error is ever lost; flush returns only once the
// server has acknowledged everything. Each write's data is kept until it is
// acknowledged, so that a write lost with its connection is sent again after the
// reconnect: a write that the application was told succeeded is never dropped.
type writeBehind struct {
	mu      sync.Mutex // held across a whole write, flush or reopen
	pending []pendingWrite
	bytes   int
	err     error

	// held: the last pending write is not sent yet. A small write that follows
	// others still pending waits up to holdFor for the next ones, sequential, to join
	// it (Nagle's rule for a file's write stream): a program writing a byte or a
	// stdio buffer per system call then costs one SFTP WRITE per holdFor or per
	// MaxWrite bytes, not one per call, and ssh and the server do that much less
	// work. The application was answered already, as for every write behind; the
	// held data goes out at the latest with the next request of any kind on the file.
	// Set and cleared under mu; atomic so that a read can look without taking mu.
	held  atomic.Bool
	timer *time.Timer

	// Striping of writes (stripe.go). nextOff is where the last write queued ends, and
	// run how many bytes were written in order up to it. onExtra counts the pending
	// writes sent on extra handles, others the pending requests that are not in-order
	// writes (changes of attributes, writes elsewhere): an in-order write goes on an
	// extra handle only while others is 0, and nothing else is queued while onExtra
	// is not.
	nextOff int64
	run     int64
	onExtra int
	others  int
	turn    int

	// pace measures the link by the writes' acknowledgements (acked bytes so far),
	// to bound the window on a narrow link as a read-ahead's (pace.go).
	pace  pace
	acked int64
}

// holdFor bounds how long a small write waits for followers (see writeBehind.held).
const holdFor = time.Millisecond

type pendingWrite struct {
	off      int64
	data     []byte
	set      *sftp.Attrs  // an FSETSTAT queued among the writes instead of a WRITE
	res      *error       // where a change its caller waits for puts its answer, kept from wb.err
	c        *sftp.Client // the session it was last sent on
	w        *sftp.PendingWrite
	startErr error     // why sending failed, if it did
	job      *sendJob  // handed to the file's sender, not yet collected: w and startErr come from it (started)
	inOrder  bool      // a write continuing the file's run of writes in order (see writeBehind.run)
	extra    bool      // sent on an extra handle of a striped file, not the file's own
	queued   time.Time // when the writer handed it over: its latency runs from here to its answer
}

// other tells whether pw is anything but a write in order: such a request must not be
// overtaken by a write on another session.
func (pw *pendingWrite) other() bool { return pw.set != nil || !pw.inOrder }

// countLocked counts pw in (or, with d -1, out of) the file's pending requests.
func (wb *writeBehind) countLocked(pw *pendingWrite, d int) {
	wb.bytes += d * len(pw.data)
	if pw.other() {
		wb.others += d
	}
	if pw.extra {
		wb.onExtra += d
	}
}

// sendAsyncMin is the size from which a write is handed to the file's sender (see
// sender) rather than sent by the caller.
const sendAsyncMin = 32 << 10

// sender sends a file's large writes for the writer, so that the FUSE WRITE is
// answered once the data is copied, not once it is encrypted and written to the
// connection: the kernel's next WRITE (the application's next write(2)) then arrives
// while this one goes out, instead of after it. It runs as a goroutine only while it
// has jobs. The sender never takes the file's write-behind lock, so a caller holding
// it may wait for a job; every other request on the file's handle waits until the
// sender's queue is sent (wait), so requests still leave in the order they were made.
type sender struct {
	mu      sync.Mutex
	jobs    []*sendJob
	running bool
	last    *sendJob // the newest job queued
}

type sendJob struct {
	h    handle
	off  int64
	data []byte
	set  *sftp.Attrs   // an FSETSTAT instead of a WRITE
	done chan struct{} // closed once sent; then w or err is set
	w    *sftp.PendingWrite
	err  error
}

// busy tells whether the sender has jobs not yet sent: a request that must follow
// them is queued behind them or waits.
func (s *sender) busy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running
}

// push queues pw's WRITE or FSETSTAT on h.
func (s *sender) push(h handle, pw *pendingWrite) *sendJob {
	j := &sendJob{h: h, off: pw.off, data: pw.data, set: pw.set, done: make(chan struct{})}
	s.mu.Lock()
	s.jobs = append(s.jobs, j)
	s.last = j
	if !s.running {
		s.running = true
		go s.run()
	}
	s.mu.Unlock()
	return j
}

func (s *sender) run() {
	for {
		s.mu.Lock()
		if len(s.jobs) == 0 {
			s.running = false
			s.jobs = nil
			s.mu.Unlock()
			return
		}
		j := s.jobs[0]
		s.jobs[0] = nil
		s.jobs = s.jobs[1:]
		s.mu.Unlock()
		if j.set != nil {
			j.w, j.err = j.h.c.StartFsetstat(j.h.h, *j.set)
		} else {
			j.w, j.err = j.h.c.StartWrite(j.h.h, j.data, j.off)
		}
		close(j.done)
	}
}

// wait returns once every job queued so far is sent. A job waits for nothing but
// room on the connection, which the stall watchdog bounds.
func (s *sender) wait() {
	s.mu.Lock()
	j := s.last
	s.mu.Unlock()
	if j != nil {
		<-j.done
	}
}

// maxQueued bounds the requests in a file's queue whatever their size (tiny writes,
// attribute changes), as writeWindow bounds its bytes.
const maxQueued = 1024

// startLocked sends pw on the current handle: a large write through the file's
// sender, and anything else too while the sender has jobs (it must go after them);
// else at once.
func (f *sftpFile) startLocked(pw *pendingWrite) {
	h := f.handle()
	if pw.extra {
		pw.extra = false
		f.wb.onExtra--
	}
	if !pw.other() && f.wb.others == 0 {
		if x, ok := f.dealLocked(h); ok {
			h = x
			pw.extra = true
			f.wb.onExtra++
			f.st.wrote.Store(true)
		}
	}
	pw.c = h.c
	if (pw.set == nil && len(pw.data) >= sendAsyncMin) || f.snd.busy() {
		pw.w, pw.startErr = nil, nil
		pw.job = f.snd.push(h, pw)
		return
	}
	if pw.set != nil {
		pw.w, pw.startErr = h.c.StartFsetstat(h.h, *pw.set)
		return
	}
	pw.w, pw.startErr = h.c.StartWrite(h.h, pw.data, pw.off)
}

// started collects the sender's result for pw, once it is sent (the caller holds
// f.wb.mu, which the sender never takes).
func (pw *pendingWrite) started() {
	if j := pw.job; j != nil {
		<-j.done
		pw.w, pw.startErr, pw.job = j.w, j.err, nil
	}
}

// answered tells, without waiting, whether pw was sent and its answer is in.
func (pw *pendingWrite) answered() bool {
	if j := pw.job; j != nil {
		select {
		case <-j.done:
			pw.started()
		default:
			return false
		}
	}
	return pw.startErr == nil && pw.w != nil && pw.w.Ready()
}

// sendLocked sends a copy of data at off — or holds it for the writes that follow
// (see writeBehind.held) — and waits for the oldest writes while the window is full.
// A lost connection is dealt with when the write is waited for.
func (f *sftpFile) sendLocked(ctx context.Context, data []byte, off int64, inOrder bool) error {
	wb := &f.wb
	limit := f.handle().c.MaxWrite
	if wb.held.Load() {
		last := &wb.pending[len(wb.pending)-1]
		if last.set == nil && last.off+int64(len(last.data)) == off && len(last.data)+len(data) <= limit {
			last.data = bufpool.Append(last.data, data)
			wb.bytes += len(data)
			if len(last.data) == limit {
				f.sendHeldLocked()
			}
			return f.windowLocked(ctx)
		}
		f.sendHeldLocked()
	}
	if len(data) >= limit || len(wb.pending) == 0 {
		// Large, or nothing ahead of it to wait behind: at once.
		return f.queueLocked(ctx, pendingWrite{off: off, data: bufpool.Copy(data, 0), inOrder: inOrder})
	}
	// Held, in a copy of about its size (a random writer's small writes in flight are
	// bounded in bytes by the window, not each in memory), but with room for a whole
	// request if it continues the write before: a sequential writer's next writes
	// are merged into it, and growing it as they came copied most bytes twice.
	room := len(data)
	if inOrder {
		room = limit
	}
	pw := pendingWrite{off: off, data: bufpool.Copy(data, room), inOrder: inOrder}
	return f.holdLocked(ctx, pw)
}

// holdLocked queues pw unsent, as the held request (see writeBehind.held).
func (f *sftpFile) holdLocked(ctx context.Context, pw pendingWrite) error {
	wb := &f.wb
	pw.queued = time.Now()
	wb.pending = append(wb.pending, pw)
	wb.countLocked(&pw, 1)
	wb.held.Store(true)
	if wb.timer == nil {
		wb.timer = time.AfterFunc(holdFor, f.sendHeld)
	} else {
		wb.timer.Reset(holdFor)
	}
	return f.windowLocked(ctx)
}

// holdSetLocked queues a change of attributes that the server cannot refuse (nothing
// waits for it) held like a small write, and merges it into a change held before it:
// the times, owner and mode that tar, cp -p and rsync set on every file they write
// leave as one FSETSTAT, where each was a request of its own for ssh, sshd and the
// server's sftp-server. Held data goes out before anything that must follow it (a
// write, whose mtime a held change of times must not precede), so merging never
// moves a change past another request. A failure on record is left there for the
// handle's next write, flush or close.
func (f *sftpFile) holdSetLocked(ctx context.Context, a sftp.Attrs) {
	wb := &f.wb
	if wb.held.Load() {
		last := &wb.pending[len(wb.pending)-1]
		if last.set != nil && mergeable(*last.set, a) {
			mergeAttrs(last.set, a)
			return
		}
		f.sendHeldLocked()
	}
	f.holdLocked(ctx, pendingWrite{set: &a}) //nolint:errcheck // see above
}

// mergeable tells whether applying a then b equals applying their union at once. A
// server applies one request's attributes in an order of its own (OpenSSH: mode,
// times, then owner), and a change of owner clears the set-user-ID and set-group-ID
// bits of a file: a union holding both an owner and a mode with those bits could end
// with or without them depending on that order, so such changes stay apart.
func mergeable(a, b sftp.Attrs) bool {
	u := a
	mergeAttrs(&u, b)
	return u.Flags&sftp.AttrUIDGID == 0 || u.Flags&sftp.AttrPermissions == 0 ||
		u.Mode&(syscall.S_ISUID|syscall.S_ISGID) == 0
}

// mergeAttrs folds b into a: what b sets replaces what a set.
func mergeAttrs(a *sftp.Attrs, b sftp.Attrs) {
	if b.Flags&sftp.AttrPermissions != 0 {
		a.Mode = b.Mode
	}
	if b.Flags&sftp.AttrUIDGID != 0 {
		a.UID, a.GID = b.UID, b.GID
	}
	if b.Flags&sftp.AttrACModTime != 0 {
		a.Atime, a.Mtime = b.Atime, b.Mtime
	}
	if b.Flags&sftp.AttrSize != 0 {
		a.Size = b.Size
	}
	a.Flags |= b.Flags
}

// sendHeld sends the held write, if there still is one, when its time is up.
func (f *sftpFile) sendHeld() {
	f.wb.mu.Lock()
	defer f.wb.mu.Unlock()
	if f.wb.held.Load() {
		f.sendHeldLocked()
	}
}

// sendHeldLocked sends the held write. Should it fail to go out, the failure stays
// with it in the queue and is reported when it is waited for.
func (f *sftpFile) sendHeldLocked() {
	wb := &f.wb
	wb.timer.Stop()
	pw := &wb.pending[len(wb.pending)-1]
	pw.data = bufpool.Fit(pw.data) // the room left for merges is not kept while in flight
	f.startLocked(pw)
	// Cleared only once the write is on its way: a reader that finds nothing held
	// (sendHeldNow looks without the lock) must find it sent or with the sender.
	wb.held.Store(false)
}

// sendHeldNow puts every write on the wire (the held one, the sender's) before a
// request that must come after them.
func (f *sftpFile) sendHeldNow() {
	if f.wb.held.Load() {
		f.sendHeld()
	}
	f.snd.wait()
}

// queueLocked sends pw behind the file's requests in flight and waits for the oldest
// while the window is full.
func (f *sftpFile) queueLocked(ctx context.Context, pw pendingWrite) error {
	if err := f.enqueueLocked(pw); err != nil {
		return err
	}
	return f.windowLocked(ctx)
}

// enqueueLocked sends pw behind the file's requests in flight; it returns only pw's
// own failure to go out (a lost connection is dealt with when pw is waited for).
func (f *sftpFile) enqueueLocked(pw pendingWrite) error {
	wb := &f.wb
	if wb.held.Load() {
		f.sendHeldLocked()
	}
	pw.queued = time.Now()
	wb.pending = append(wb.pending, pw)
	last := &wb.pending[len(wb.pending)-1]
	wb.countLocked(last, 1)
	f.startLocked(last)
	if last.job == nil && last.startErr != nil && !connLost(last.startErr) {
		err := last.startErr
		wb.countLocked(last, -1)
		bufpool.Release(last.data)
		wb.pending = wb.pending[:len(wb.pending)-1]
		return err
	}
	return nil
}

// windowLocked waits for the oldest requests while the window is full, and returns the
// first failure on record.
func (f *sftpFile) windowLocked(ctx context.Context) error {
	wb := &f.wb
	// What is answered already is collected now: on a narrow link its
	// acknowledgements measure the link before the first window is full.
	for len(wb.pending) > 0 && wb.pending[0].answered() {
		f.waitOldestLocked(ctx)
	}
	for wb.bytes > f.writeWindowLocked() || len(wb.pending) > maxQueued {
		f.waitOldestLocked(ctx)
	}
	return wb.err
}

// writeWindowLocked is how many bytes of writes may be in flight: writeWindow per
// handle, as the read-ahead's, and on a narrow link no more than the link needs
// (pace.go), measured by the acknowledgements collected so far.
func (f *sftpFile) writeWindowLocked() int {
	window := writeWindow * f.handles()
	if l := f.wb.pace.limit(); l > 0 {
		window = min(window, max(l, paceMin))
	}
	return window
}

// waitOldestLocked collects the oldest write's acknowledgement. If its session was
// lost, the file is reopened (which sends every unacknowledged write again) and the
// write waited for anew — unless a failure is already on record: then the caller is
// about to hear of it, and must not wait for more reconnects first. (A change whose
// caller waits for its own answer, res, is not told of that failure: it is reopened
// for.)
func (f *sftpFile) waitOldestLocked(ctx context.Context) {
	wb := &f.wb
	if wb.held.Load() && len(wb.pending) == 1 {
		f.sendHeldLocked() // the held write is the last: it is the oldest now
	}
	var err error
	for attempt := 1; ; attempt++ {
		pw := &wb.pending[0]
		pw.started()
		err = pw.startErr
		if err == nil {
			err = pw.w.Wait(ctx)
		}
		if !connLost(err) || attempt == maxAttempts || wb.err != nil && pw.res == nil || ctx.Err() != nil {
			break
		}
		if err = f.reopenLocked(ctx, pw.c); err != nil {
			break
		}
	}
	if pw := &wb.pending[0]; err == nil && pw.set == nil {
		at := pw.w.Answered()
		wb.acked += int64(len(pw.data))
		wb.pace.chunk(pw.queued, at)
		wb.pace.reading(at, wb.acked)
	}
	wb.countLocked(&wb.pending[0], -1)
	bufpool.Release(wb.pending[0].data)
	switch {
	case wb.pending[0].res != nil:
		*wb.pending[0].res = err
	case err != nil && wb.err == nil:
		wb.err = err
	}
	wb.pending[0] = pendingWrite{}
	wb.pending = wb.pending[1:]
}

// flushLocked waits for every write in flight and returns the first error, once:
// after it is reported, the file is usable again.
func (f *sftpFile) flushLocked(ctx context.Context) error {
	f.drainLocked(ctx)
	err := f.wb.err
	f.wb.err = nil
	return err
}

// drainLocked waits for every write in flight; a failure stays on record.
func (f *sftpFile) drainLocked(ctx context.Context) {
	for len(f.wb.pending) > 0 {
		f.waitOldestLocked(ctx)
	}
}

// readAhead keeps the next part of a sequential read in flight. Reads at or near where
// the stream has got to (the kernel sends its read-ahead requests concurrently, so not
// always in order) are served from chunks already requested and grow the window up to
// readAheadMax; a read elsewhere drops everything, so random access costs nothing
// extra. A write to the file drops it too.
type readAhead struct {
	mu     sync.Mutex
	chunks []*raChunk // contiguous, in offset order
	next   int64      // end of the furthest read so far
	window int
	eofAt  int64 // a chunk found the end of the file here; -1 if unknown
	turn   int   // which handle requests the next chunk, when striped
	pace   pace  // what the chunks took: bounds the window on a narrow link
}

// raChunk is one READ of the read-ahead. Its bytes stay in the packet that carried
// them (sftp.Data), which goes back to the packet pool when the last holder lets go:
// the read-ahead itself, while the chunk is in its list, and each reader copying
// from it (readers copy outside readAhead.mu, so a chunk can leave the list while
// one still reads it).
type raChunk struct {
	off       int64
	size      int
	pr        *sftp.PendingRead
	sent      time.Time
	pace      *pace
	once      sync.Once
	data      sftp.Data
	err       error
	collected atomic.Bool
	refs      atomic.Int32
}

func newChunk(off int64, size int, pr *sftp.PendingRead, sent time.Time, p *pace) *raChunk {
	c := &raChunk{off: off, size: size, pr: pr, sent: sent, pace: p}
	c.refs.Store(1) // the read-ahead's list
	return c
}

// wait returns the chunk's bytes, collecting the answer once. The caller holds a
// reference.
func (c *raChunk) wait(ctx context.Context) ([]byte, error) {
	c.once.Do(func() {
		c.data, c.err = c.pr.WaitData(ctx)
		if c.err == nil {
			c.pace.chunk(c.sent, c.data.At)
		}
		c.collected.Store(true)
	})
	return c.data.B, c.err
}

func (c *raChunk) hold() { c.refs.Add(1) }

// unref lets go of the chunk. The last holder recycles its packet — once its answer
// is in: one nobody waited for is collected in the background (abandoned
// read-ahead must still be collected), without holding up the caller.
func (c *raChunk) unref() {
	if c.refs.Add(-1) != 0 {
		return
	}
	if c.collected.Load() {
		c.data.Release()
		return
	}
	go func() {
		c.wait(context.Background()) //nolint:errcheck // only to recycle the packet
		c.data.Release()
	}()
}

// sequentialSlack is how far from the stream's position a read still counts as part of
// it.
const sequentialSlack = 1 << 20

func (ra *readAhead) dropLocked() {
	for _, c := range ra.chunks {
		c.unref()
	}
	ra.chunks, ra.window, ra.eofAt = nil, 0, -1
}

// reset forgets the read-ahead: the file's content is changing.
func (ra *readAhead) reset() {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	ra.dropLocked()
}

// ReadAt reads len(p) bytes at off: from the read-ahead where it covers them, directly
// (as one pipelined burst) where not.
// A read lost with its session is done again on the reopened file.
func (f *sftpFile) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	ctx, cancel := f.s.deadline(ctx)
	defer cancel()
	f.sendHeldNow() // the server answers a handle's requests in order: the read sees it
	if f.st.wrote.Load() {
		f.settle(ctx) // and writes through other sessions (stripe.go) are waited for
	}
	for attempt := 1; ; attempt++ {
		h := f.handle()
		n, err := f.readAt(ctx, h, p, off)
		// The open's identity check is collected after the reads were sent (its
		// answer comes first), but before any data is returned.
		if cerr := f.checked(ctx); cerr != nil {
			err = cerr
		}
		if err == nil {
			if f.readOnly && n > 0 {
				f.seen.note(p[:n], off)
			}
			return n, nil
		}
		if !connLost(err) || attempt == maxAttempts || ctx.Err() != nil {
			return 0, f.s.fail(ctx, "read", f.path, err, nil)
		}
		f.wb.mu.Lock()
		err = f.reopenLocked(ctx, h.c)
		f.wb.mu.Unlock()
		if err != nil {
			return 0, f.s.fail(ctx, "read", f.path, err, nil)
		}
	}
}

// readAt serves a read from the read-ahead and h; any failure is an error (see
// readDirect).
func (f *sftpFile) readAt(ctx context.Context, h handle, p []byte, off int64) (int, error) {
	ra := &f.ra
	end := off + int64(len(p))
	ra.mu.Lock()
	covered := len(ra.chunks) > 0 && ra.chunks[0].off <= off && off < ra.chunks[len(ra.chunks)-1].off+int64(ra.chunks[len(ra.chunks)-1].size)
	near := covered || (off >= ra.next-sequentialSlack && off <= ra.next+sequentialSlack)
	if !near {
		ra.dropLocked()
	}
	var use []*raChunk
	for _, c := range ra.chunks {
		if c.off < end && c.off+int64(c.size) > off {
			c.hold()
			use = append(use, c)
		}
	}
	ra.mu.Unlock()

	n := 0
	atEOF := false
	for _, c := range use {
		pos := off + int64(n) - c.off
		if pos < 0 {
			break // a gap before this chunk: read it directly
		}
		// A chunk whose session was lost gives its error (and a direct read on
		// the current handle follows).
		data, err := c.wait(ctx)
		if err != nil && err != io.EOF {
			break
		}
		if pos < int64(len(data)) {
			n += copy(p[n:], data[pos:])
		}
		if len(data) < c.size {
			atEOF = true
			break
		}
		if n == len(p) {
			break
		}
	}
	for _, c := range use {
		c.unref() // copied from, or not got to
	}
	var err error
	if n < len(p) && !atEOF {
		var m int
		m, err = f.readDirect(ctx, h, p[n:], off+int64(n))
		if m < len(p)-n {
			atEOF = true
		}
		n += m
	}

	ra.mu.Lock()
	defer ra.mu.Unlock()
	ra.next = max(ra.next, off+int64(n))
	if !near {
		ra.next = off + int64(n)
	}
	if atEOF && err == nil {
		ra.eofAt = off + int64(n)
	}
	// Forget chunks the stream has passed.
	for len(ra.chunks) > 0 && ra.chunks[0].off+int64(ra.chunks[0].size) <= off-sequentialSlack {
		ra.chunks[0].unref()
		ra.chunks = ra.chunks[1:]
	}
	if err != nil {
		return 0, err
	}
	if near {
		ra.fillLocked(f.readHandles(h, ra.window))
	}
	return n, nil
}

// fillLocked grows the window and requests chunks up to next+window, dealt over hs
// in turn (one handle, or a striped file's; the window is readAheadMax per handle).
func (ra *readAhead) fillLocked(hs []handle) {
	if ra.window == 0 {
		ra.window = readAheadStart
	} else {
		ra.window = min(ra.window*2, readAheadMax*len(hs))
	}
	// On a narrow link, no more than the link needs (pace.go).
	var total int64
	for _, h := range hs {
		total += h.c.BytesIn()
	}
	ra.pace.reading(time.Now(), total)
	if l := ra.pace.limit(); l > 0 {
		ra.window = min(ra.window, max(l, paceMin))
	}
	from := ra.next
	if k := len(ra.chunks); k > 0 {
		from = max(from, ra.chunks[k-1].off+int64(ra.chunks[k-1].size))
		if ra.chunks[k-1].off+int64(ra.chunks[k-1].size) < ra.next {
			// The stream overtook the chunks: its reads are larger than the window,
			// which goes on growing (starting over would keep it below them).
			w := ra.window
			ra.dropLocked()
			ra.window = w
			from = ra.next
		}
	}
	for from < ra.next+int64(ra.window) {
		if ra.eofAt >= 0 && from >= ra.eofAt {
			return
		}
		h := hs[ra.turn%len(hs)]
		ra.turn++
		step := h.c.MaxRead
		sent := time.Now()
		pr, err := h.c.StartRead(h.h, step, from)
		if err != nil {
			return
		}
		ra.chunks = append(ra.chunks, newChunk(from, step, pr, sent, &ra.pace))
		from += int64(step)
	}
}
