package backend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"

	"github.com/muxfs/muxfs/internal/sftp"
)

func (s *SFTP) Statfs(ctx context.Context, p string) (Statfs, error) {
	if !s.exts().statvfs {
		// What sshfs reports without the extension: a large, empty file system, so that
		// programs checking free space before writing go ahead.
		return Statfs{Bsize: 4096, Blocks: 1 << 28, Bfree: 1 << 28, Bavail: 1 << 28, Files: 1 << 20, Ffree: 1 << 20, Namemax: 255}, nil
	}
	var st sftp.StatVFS
	err := s.do(ctx, false, func(ctx context.Context, m *member, c *sftp.Client, _ bool) error {
		var err error
		st, err = c.Statvfs(ctx, m.abs(p))
		return err
	})
	if err != nil {
		return Statfs{}, s.fail(ctx, "statfs", p, err, nil)
	}
	bs := st.Frsize
	if bs == 0 {
		bs = st.Bsize
	}
	return Statfs{Bsize: bs, Blocks: st.Blocks, Bfree: st.Bfree, Bavail: st.Bavail,
		Files: st.Files, Ffree: st.Ffree, Namemax: st.Namemax}, nil
}

func (s *SFTP) Open(ctx context.Context, p string, flags int, mode uint32) (File, error) {
	readOnly := flags&(os.O_WRONLY|os.O_RDWR) == 0
	// A create that was not asked to be exclusive is tried exclusive first: the
	// kernel asks to create only names it found missing, and an exclusive create
	// follows no symlink, so its handle needs no identity check — the first write
	// (a compiler's, a cp's, a shell redirection's) then waits for nothing. Where
	// the name exists after all, or the exclusive open fails for another reason,
	// the open is made as asked.
	tryExcl := flags&(os.O_CREATE|os.O_EXCL) == os.O_CREATE
	var a sftp.Attrs
	if flags&os.O_CREATE != 0 {
		a = sftp.Attrs{Flags: sftp.AttrPermissions, Mode: mode & 07777}
	}
	var f *sftpFile
	err := s.do(ctx, !readOnly, func(ctx context.Context, m *member, c *sftp.Client, retried bool) error {
		fl := flags
		if retried && fl&os.O_EXCL != 0 {
			// The lost first attempt may have created the file: an exclusive retry
			// would then fail although the caller's create succeeded, and a
			// non-exclusive one might open someone else's. Report the loss instead.
			return fmt.Errorf("connection lost during an exclusive create: %w", syscall.EIO)
		}
		if tryExcl && !retried {
			// Not on a retry: the lost attempt may have created the file.
			fl |= os.O_EXCL
		}
		h, at, err := c.OpenAndLstat(ctx, m.abs(p), openFlags(fl), a)
		if err != nil && fl != flags && !connLost(err) {
			fl = flags
			h, at, err = c.OpenAndLstat(ctx, m.abs(p), openFlags(fl), a)
		}
		if err != nil {
			return err
		}
		created := fl&(os.O_CREATE|os.O_EXCL) == os.O_CREATE|os.O_EXCL
		f = &sftpFile{s: s, path: p, flags: flags, readOnly: readOnly, created: created,
			opened: attrFromSFTP(at), lstat: at, cur: handle{m: m, c: c, h: h}}
		if created {
			// An exclusive create follows no symlink (it fails on any existing name):
			// the handle is the new file, and needs no identity check.
			return nil
		}
		f.check, err = startCheck(c, h, at)
		return err
	})
	if err != nil {
		return nil, s.fail(ctx, "open", p, err, func() syscall.Errno {
			st, ok := s.lstatQuiet(p)
			switch {
			case ok && st.Mode&syscall.S_IFMT == syscall.S_IFDIR:
				return syscall.EISDIR
			case ok && flags&os.O_EXCL != 0:
				return syscall.EEXIST
			}
			return syscall.EIO
		})
	}
	f.ra.eofAt = -1
	return f, nil
}

// startCheck begins making sure the handle is the file at the path, not what a symlink
// swapped in just before the OPEN pointed to (SFTP v3 opens follow symlinks). at is the
// path's lstat taken just after the open: it must not be a symlink. The open file's own
// attributes (FSTAT) must then match it in type, mode and owner; that answer is awaited
// before the handle is first used, so the open itself costs one round trip.
func startCheck(c *sftp.Client, h string, at sftp.Attrs) (*sftp.PendingAttrs, error) {
	if at.Mode&syscall.S_IFMT == syscall.S_IFLNK {
		c.CloseAsync(h)
		return nil, syscall.ELOOP
	}
	pending, err := c.StartFstat(h)
	if err != nil {
		c.CloseAsync(h)
		return nil, err
	}
	return pending, nil
}

// handle is an open SFTP handle and the session it belongs to (handles are per
// session).
type handle struct {
	m *member
	c *sftp.Client
	h string
}

// sftpFile is an open remote file, pinned to the session that opened it until that
// session is lost; it is then opened again by path on a live one (reopenLocked).
type sftpFile struct {
	s        *SFTP
	path     string
	flags    int // as opened, for reopening
	readOnly bool
	created  bool // this open created the file (O_EXCL) and its owner is unchanged
	opened   Attr // the file's attributes just after it was opened

	lstat    sftp.Attrs // the path's, just after the open
	checkMu  sync.Mutex
	check    *sftp.PendingAttrs // the open's identity check, until collected
	checkErr error

	hmu sync.Mutex // guards cur; taken after wb.mu
	cur handle

	wb   writeBehind
	snd  sender
	ra   readAhead
	st   stripe
	seen readSample
}

// readSample is the end of the last read a read-only handle answered: after a
// reconnect the file is opened again by path, and if the path now names another file
// (replaced on the server meanwhile, as an editor's or rsync's save does) the sample
// no longer matches, so the reader gets an error instead of the rest of another
// file's bytes. A file that only grew (a log being followed) still matches.
type readSample struct {
	mu   sync.Mutex
	off  int64
	n    int
	data [1024]byte
}

// note keeps the last bytes of p, read at off.
func (s *readSample) note(p []byte, off int64) {
	k := min(len(p), len(s.data))
	s.mu.Lock()
	s.off = off + int64(len(p)-k)
	s.n = copy(s.data[:], p[len(p)-k:])
	s.mu.Unlock()
}

// matches reports whether the file behind h holds the sample's bytes at its offset
// (true if nothing was read yet).
func (s *readSample) matches(ctx context.Context, c *sftp.Client, h string) (bool, error) {
	s.mu.Lock()
	off, want := s.off, append([]byte(nil), s.data[:s.n]...)
	s.mu.Unlock()
	if len(want) == 0 {
		return true, nil
	}
	got := make([]byte, len(want))
	n, err := c.Read(ctx, h, got, off)
	if err != nil && err != io.EOF {
		return false, err
	}
	return bytes.Equal(got[:n], want), nil
}

func (f *sftpFile) handle() handle {
	f.hmu.Lock()
	defer f.hmu.Unlock()
	return f.cur
}

// checked waits for the open's identity check; every use of the handle goes through it.
// A check lost with its session stays pending: the reopen that follows checks anew.
func (f *sftpFile) checked(ctx context.Context) error {
	f.checkMu.Lock()
	defer f.checkMu.Unlock()
	if f.check == nil {
		return f.checkErr
	}
	fa, err := f.check.Wait(ctx)
	switch {
	case connLost(err) || errors.Is(err, context.DeadlineExceeded):
		return err
	case err != nil:
		f.checkErr = err
	case fa.Mode != f.lstat.Mode || fa.UID != f.lstat.UID || fa.GID != f.lstat.GID:
		// The handle is unusable; EIO is what a stale handle gives elsewhere.
		f.s.warn("open of %s reached another file (a symlink was swapped in): refused", f.path)
		f.checkErr = syscall.EIO
	}
	f.check = nil
	return f.checkErr
}

// reopenLocked replaces a handle lost with its session (dead): the file is opened
// again by path on a live session — another member's if this one is down — checked to
// be the same kind of file with the same owner (and, read-only, to hold the bytes it
// last read: readSample), and every write it had not
// acknowledged is sent again at its offset, in the order first sent (with those never
// sent); writes in flight on a striped file's extra handles stay there. The caller
// holds f.wb.mu.
func (f *sftpFile) reopenLocked(ctx context.Context, dead *sftp.Client) error {
	if f.handle().c != dead {
		// Done already by another caller, or the lost session was an extra
		// handle's (stripe.go): its writes go again on the handles left.
		f.extraLostLocked(dead)
		return nil
	}
	if f.flags&os.O_APPEND != 0 && len(f.wb.pending) > 0 {
		// An append lands wherever the end is: sending it again could write it twice.
		return fmt.Errorf("connection lost with %d appended bytes unacknowledged; cannot tell whether they were written: %w", f.wb.bytes, syscall.EIO)
	}
	flags := f.flags &^ (os.O_CREATE | os.O_EXCL | os.O_TRUNC)
	var nh handle
	err := f.s.do(ctx, !f.readOnly, func(ctx context.Context, m *member, c *sftp.Client, _ bool) error {
		h, at, err := c.OpenAndLstat(ctx, m.abs(f.path), openFlags(flags), sftp.Attrs{})
		if err != nil {
			return err
		}
		fa, err := c.Fstat(ctx, h)
		same := err == nil && at.Mode&syscall.S_IFMT != syscall.S_IFLNK && fa.Mode&syscall.S_IFMT == f.lstat.Mode&syscall.S_IFMT && fa.UID == f.lstat.UID
		if same && f.readOnly {
			same, err = f.seen.matches(ctx, c, h)
		}
		if err == nil && !same {
			err = fmt.Errorf("%s was replaced by another file while the connection was lost: %w", f.path, syscall.ESTALE)
		}
		if err != nil {
			c.CloseAsync(h)
			return err
		}
		nh = handle{m: m, c: c, h: h}
		return nil
	})
	if err != nil {
		return err
	}
	f.hmu.Lock()
	f.cur = nh
	f.hmu.Unlock()
	f.checkMu.Lock()
	if f.check != nil {
		f.check, f.checkErr = nil, nil // the new handle was checked above
	}
	f.checkMu.Unlock()
	f.ra.reset()
	f.s.reopened.Add(1)
	f.snd.wait() // nothing still goes to the old handle while the writes are sent again
	resent := 0
	for i := range f.wb.pending {
		// Not a write in flight on a live extra handle: sent again elsewhere, its
		// first copy could land after a later request that must follow it.
		if pw := &f.wb.pending[i]; pw.c == dead || pw.c == nil {
			f.startLocked(pw)
			resent++
		}
	}
	f.s.log.Info("file reopened on a new session", "source", f.s.name, "path", f.path,
		"via", nh.m.name, "writes_resent", resent)
	if f.wb.held.Load() { // sent with the rest
		f.wb.held.Store(false)
		f.wb.timer.Stop()
	}
	return nil
}

// withHandle runs fn on the current handle, reopening the file and running fn again
// when the session is lost under it.
func (f *sftpFile) withHandle(ctx context.Context, fn func(h handle) error) error {
	for attempt := 1; ; attempt++ {
		h := f.handle()
		err := fn(h)
		if !connLost(err) || attempt == maxAttempts || ctx.Err() != nil {
			return err
		}
		f.wb.mu.Lock()
		err = f.reopenLocked(ctx, h.c)
		f.wb.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// readDirect reads len(p) bytes at off as one pipelined burst of MaxRead-sized
// requests. A short count means the end of the file; any failure is an error, since
// the kernel would take a short read for the end of the file.
func (f *sftpFile) readDirect(ctx context.Context, h handle, p []byte, off int64) (int, error) {
	step := h.c.MaxRead
	var reqs []*sftp.PendingRead
	var startErr error
	for o := 0; o < len(p); o += step {
		r, err := h.c.StartRead(h.h, min(step, len(p)-o), off+int64(o))
		if err != nil {
			startErr = err
			break
		}
		reqs = append(reqs, r)
	}
	total := 0
	var firstErr error
	contiguous := true
	for i, r := range reqs {
		chunk := p[i*step : min(len(p), (i+1)*step)]
		n, err := r.Wait(ctx, chunk)
		if !contiguous {
			continue // drain: every request must be collected
		}
		if err != nil {
			if err != io.EOF {
				firstErr = err
			}
			contiguous = false
			continue
		}
		total += n
		if n < len(chunk) && f.readOnly && off+int64(total) >= f.opened.Size {
			// Short at the size the file had when opened: the end of the file.
			// (A server returns a short read only at EOF for a regular file, but
			// asking again to be sure would cost every small file a round trip.)
			contiguous = false
			continue
		}
		if n < len(chunk) {
			// A short read not at EOF: fetch the rest of this chunk, and later
			// chunks stay valid only if the gap is filled.
			m, err := f.readFull(ctx, h, chunk[n:], off+int64(i*step+n))
			total += m
			if err != nil || m < len(chunk)-n {
				if err != io.EOF {
					firstErr = err
				}
				contiguous = false
			}
		}
	}
	if firstErr == nil && contiguous {
		firstErr = startErr
	}
	return total, firstErr
}

func (f *sftpFile) readFull(ctx context.Context, h handle, p []byte, off int64) (int, error) {
	total := 0
	for total < len(p) {
		n, err := h.c.Read(ctx, h.h, p[total:], off+int64(total))
		total += n
		if err != nil {
			return total, err
		}
		if n == 0 {
			return total, io.EOF
		}
	}
	return total, nil
}

// WriteAt sends p at off and returns without waiting for the server (write-behind, in
// a bounded window). A failure is returned by a later write, Flush, Sync or Close.
func (f *sftpFile) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	ctx, cancel := f.s.deadline(ctx)
	defer cancel()
	f.wb.mu.Lock()
	defer f.wb.mu.Unlock()
	if err := f.checkedLocked(ctx); err != nil {
		return 0, f.s.fail(ctx, "write", f.path, err, nil)
	}
	if f.wb.err != nil {
		return 0, f.s.fail(ctx, "write", f.path, f.flushLocked(ctx), nil)
	}
	f.ra.reset()
	inOrder := f.noteWriteLocked(ctx, off, len(p))
	for o := 0; o < len(p); {
		step := f.handle().c.MaxWrite
		chunk := p[o:min(len(p), o+step)]
		if err := f.sendLocked(ctx, chunk, off+int64(o), inOrder); err != nil {
			f.flushLocked(ctx) //nolint:errcheck // err is the one to report
			return 0, f.s.fail(ctx, "write", f.path, err, nil)
		}
		o += len(chunk)
	}
	return len(p), nil
}

// checkedLocked is checked for callers holding f.wb.mu: a check lost with its
// session is followed by a reopen, which checks the new handle.
func (f *sftpFile) checkedLocked(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		h := f.handle()
		err := f.checked(ctx)
		if !connLost(err) || attempt == maxAttempts {
			return err
		}
		if err := f.reopenLocked(ctx, h.c); err != nil {
			return err
		}
	}
}

// Flush waits until the server has acknowledged every write, and reports the first
// that failed.
func (f *sftpFile) Flush(ctx context.Context) error {
	if f.readOnly {
		return nil // nothing written, nothing to wait for
	}
	ctx, cancel := f.s.deadline(ctx)
	defer cancel()
	return f.ready(ctx)
}

// Drain waits until the server has acknowledged or refused every write queued, held
// or in flight; a failure stays on record for the handle's own next request.
func (f *sftpFile) Drain(ctx context.Context) {
	if f.readOnly {
		return
	}
	f.wb.mu.Lock()
	defer f.wb.mu.Unlock()
	if len(f.wb.pending) == 0 {
		return
	}
	ctx, cancel := f.s.deadline(ctx)
	defer cancel()
	f.drainLocked(ctx)
}

// Changed drops the read-ahead, which may hold bytes from before another handle's
// writes, or an end of the file from before it grew.
func (f *sftpFile) Changed() { f.ra.reset() }

// ready makes the handle safe to use for anything: its identity is checked and every
// write is acknowledged.
func (f *sftpFile) ready(ctx context.Context) error {
	f.wb.mu.Lock()
	defer f.wb.mu.Unlock()
	if err := f.checkedLocked(ctx); err != nil {
		return f.s.fail(ctx, "open", f.path, err, nil)
	}
	return f.s.fail(ctx, "write", f.path, f.flushLocked(ctx), nil)
}

func (f *sftpFile) OpenedAttr() Attr { return f.opened }

// Stat waits for every write and returns the file's attributes. The FSTAT is sent
// behind the writes in flight (requests on one file apply in order), so waiting for
// both is one round trip.
func (f *sftpFile) Stat(ctx context.Context) (Attr, error) {
	ctx, cancel := f.s.deadline(ctx)
	defer cancel()
	f.wb.mu.Lock()
	if err := f.checkedLocked(ctx); err != nil {
		f.wb.mu.Unlock()
		return Attr{}, f.s.fail(ctx, "open", f.path, err, nil)
	}
	f.settleLocked(ctx)
	if f.wb.held.Load() {
		f.sendHeldLocked() // before the FSTAT, which must see it
	}
	f.snd.wait()
	h := f.handle()
	pending, perr := h.c.StartFstat(h.h)
	werr := f.flushLocked(ctx)
	f.wb.mu.Unlock()
	if werr != nil {
		return Attr{}, f.s.fail(ctx, "write", f.path, werr, nil)
	}
	if perr == nil && f.handle() == h {
		if a, err := pending.Wait(ctx); !connLost(err) {
			return attrFromSFTP(a), f.s.fail(ctx, "fstat", f.path, err, nil)
		}
	}
	// The session was lost under the FSTAT: ask again on the file's new handle.
	var a sftp.Attrs
	err := f.withHandle(ctx, func(h handle) error {
		var err error
		a, err = h.c.Fstat(ctx, h.h)
		return err
	})
	if err != nil {
		return Attr{}, f.s.fail(ctx, "fstat", f.path, err, nil)
	}
	return attrFromSFTP(a), nil
}

// SetAttr changes the open file's attributes through its handle, queued behind its
// writes (requests on one file apply in order), so that waiting for those writes and
// for the change is one round trip; it reports the change's own answer only. A
// change the server cannot refuse (cannotRefuse) goes out behind the caller like a
// write, and its only possible failure, the link's, is reported by the next write,
// flush, fsync or close: what an untar does to every file costs no wait, and its
// changes leave as one request (holdSetLocked).
func (f *sftpFile) SetAttr(ctx context.Context, set SetAttr) error {
	ctx, cancel := f.s.deadline(ctx)
	defer cancel()
	f.ra.reset()
	f.wb.mu.Lock()
	defer f.wb.mu.Unlock()
	if err := f.checkedLocked(ctx); err != nil {
		return f.s.fail(ctx, "open", f.path, err, nil)
	}
	f.settleLocked(ctx)
	a := toSFTPAttrs(set)
	if f.cannotRefuse(set) {
		// Held like a write, and like a write's its failure, if any, is reported by
		// the handle's next write, flush or close.
		f.holdSetLocked(ctx, a)
		return nil
	}
	// The change answers for itself only. A write of the handle's that failed before
	// it is not its failure: the caller may be a chmod by path borrowing another
	// descriptor's handle (fusefs), and that write's failure belongs to that
	// descriptor's close — as on a local file system, where an fchmod does not report
	// an earlier write-back error either.
	var own error
	err := f.enqueueLocked(pendingWrite{set: &a, res: &own})
	if err == nil {
		f.drainLocked(ctx)
		err = own
	}
	if set.Valid&SetOwner != 0 {
		f.created = false // the server's user may own it no more
	}
	return setattrErrno(f.s.fail(ctx, "fsetstat", f.path, err, nil))
}

// cannotRefuse tells a change the server cannot refuse for lack of permission: one
// of mode or times, or an owner and group left as they are (cp -p, tar as root), on a
// file this handle created, which the server's user therefore owns.
func (f *sftpFile) cannotRefuse(set SetAttr) bool {
	if !f.created || set.Valid&^(SetMode|SetTimes|SetOwner) != 0 {
		return false
	}
	return set.Valid&SetOwner == 0 || set.UID == f.opened.UID && set.GID == f.opened.GID
}

func (f *sftpFile) Sync(ctx context.Context) error {
	ctx, cancel := f.s.deadline(ctx)
	defer cancel()
	if err := f.ready(ctx); err != nil {
		return err
	}
	if !f.s.exts().fsync {
		// Every write has been acknowledged already; without fsync@openssh.com that
		// is as durable as the server lets us make it.
		return nil
	}
	err := f.withHandle(ctx, func(h handle) error { return h.c.Fsync(ctx, h.h) })
	return f.s.fail(ctx, "fsync", f.path, err, nil)
}

func (f *sftpFile) Close(ctx context.Context) error {
	ctx, cancel := f.s.deadline(ctx)
	defer cancel()
	f.ra.reset()
	if f.readOnly || f.checked(ctx) != nil {
		f.closeExtra()
		h := f.handle()
		h.c.CloseAsync(h.h)
		return nil
	}
	werr := f.Flush(ctx)
	extra := f.closeWritten(ctx) // in the same round trip as the file's own handle
	h := f.handle()
	err := h.c.CloseHandle(ctx, h.h)
	if connLost(err) {
		err = nil // the handle ended with its session, after every write was acknowledged
	}
	if xerr := extra(); err == nil {
		err = xerr
	}
	cerr := f.s.fail(ctx, "close", f.path, err, nil)
	if werr != nil {
		return werr
	}
	return cerr
}
