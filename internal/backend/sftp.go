package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sync"
	"syscall"
	"time"

	"github.com/muxfs/muxfs/internal/sftp"
)

// SFTP is a source reached over SFTP: one directory of one endpoint.
type SFTP struct {
	pool *Pool
	root string // absolute remote directory
	name string

	posixRename, hardlink, lsetstat, statvfs, fsync bool
}

// NewSFTP returns the source dir (empty: the login directory) on the pool's endpoint.
// It checks that the directory exists, so that a typo fails the mount, not the first
// ls.
func NewSFTP(ctx context.Context, pool *Pool, dir string) (*SFTP, error) {
	c, err := pool.Get(ctx)
	if err != nil {
		return nil, err
	}
	if dir == "" {
		dir = "."
	}
	root, err := c.Realpath(ctx, dir)
	if err != nil {
		return nil, fmt.Errorf("remote directory %s:%s does not exist or cannot be reached (%v) — check the path", pool.ep.String(), dir, err)
	}
	a, err := c.Stat(ctx, root)
	if err != nil {
		return nil, fmt.Errorf("remote directory %s:%s does not exist (%v) — check the path", pool.ep.String(), dir, err)
	}
	if a.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return nil, fmt.Errorf("%s:%s is not a directory — give a directory as the source", pool.ep.String(), dir)
	}
	pool.Acquire()
	return &SFTP{
		pool:        pool,
		root:        root,
		name:        pool.ep.String() + ":" + root,
		posixRename: c.HasExtension("posix-rename@openssh.com"),
		hardlink:    c.HasExtension("hardlink@openssh.com"),
		lsetstat:    c.HasExtension("lsetstat@openssh.com"),
		statvfs:     c.HasExtension("statvfs@openssh.com"),
		fsync:       c.HasExtension("fsync@openssh.com"),
	}, nil
}

func (s *SFTP) String() string { return s.name }

func (s *SFTP) log(format string, args ...any) {
	s.pool.log.Warn(fmt.Sprintf(format, args...), "source", s.name)
}

func (s *SFTP) abs(p string) string {
	if p == "" {
		return s.root
	}
	if s.root == "/" {
		return "/" + p
	}
	return s.root + "/" + p
}

func (s *SFTP) Close() error {
	s.pool.Release()
	return nil
}

// fail turns an SFTP error into a backend Error with the errno POSIX would give.
// OpenSSH's sftp-server folds most errnos into FAILURE (and ENOTDIR into NO_SUCH_FILE),
// so for FAILURE the operation-specific recover function looks at the server's state
// to say what really happened (EEXIST, ENOTEMPTY, EISDIR, ...).
func (s *SFTP) fail(ctx context.Context, op, p string, err error, recover func() syscall.Errno) error {
	if err == nil {
		return nil
	}
	errno := syscall.EIO
	var se *sftp.StatusError
	switch {
	case errors.As(err, &errno):
		// Already decided by a check of ours.
	case errors.As(err, &se):
		switch se.Code {
		case sftp.StatusNoSuchFile:
			// OpenSSH also reports ENOTDIR and ELOOP this way. Lookups (no recover
			// function) skip the check: a missing name is common, the kernel resolves
			// paths one directory at a time, and an extra round trip there is costly.
			errno = syscall.ENOENT
			if recover == nil {
				break
			}
			if s.parentIsFile(ctx, p) {
				errno = syscall.ENOTDIR
			} else if _, exists := s.lstatQuiet(p); exists {
				if e := recover(); e != syscall.EIO {
					errno = e
				}
			}
		case sftp.StatusPermissionDenied:
			errno = syscall.EACCES
		case sftp.StatusBadMessage:
			errno = syscall.EINVAL
		case sftp.StatusOpUnsupported:
			errno = syscall.EOPNOTSUPP
		case sftp.StatusFailure:
			if recover != nil {
				errno = recover()
			}
			if errno == syscall.EIO {
				errno = s.spaceOrReadOnly(ctx, p)
			}
		}
	case errors.Is(err, context.DeadlineExceeded):
		errno = syscall.ETIMEDOUT
	case errors.Is(err, context.Canceled):
		errno = syscall.EINTR
	}
	return &Error{Op: op, Source: s.name, Path: p, Errno: errno, Cause: err}
}

// bg is the context for the follow-up requests that recover an errno: short, and not
// cancelled with the original request.
func bg() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

func (s *SFTP) lstatQuiet(p string) (sftp.Attrs, bool) {
	ctx, cancel := bg()
	defer cancel()
	c, err := s.pool.Get(ctx)
	if err != nil {
		return sftp.Attrs{}, false
	}
	a, err := c.Lstat(ctx, s.abs(p))
	return a, err == nil
}

func (s *SFTP) parentIsFile(_ context.Context, p string) bool {
	if p == "" {
		return false
	}
	dir := path.Dir(p)
	if dir == "." {
		dir = ""
	}
	a, ok := s.lstatQuiet(dir)
	return ok && a.Mode&syscall.S_IFMT != syscall.S_IFDIR
}

// spaceOrReadOnly tells a full or read-only remote file system apart from other
// failures, which OpenSSH reports alike.
func (s *SFTP) spaceOrReadOnly(_ context.Context, p string) syscall.Errno {
	if !s.statvfs {
		return syscall.EIO
	}
	ctx, cancel := bg()
	defer cancel()
	c, err := s.pool.Get(ctx)
	if err != nil {
		return syscall.EIO
	}
	st, err := c.Statvfs(ctx, s.abs(path.Dir(p)))
	switch {
	case err != nil:
		return syscall.EIO
	case st.Flag&1 != 0: // ST_RDONLY
		return syscall.EROFS
	case st.Bavail == 0:
		return syscall.ENOSPC
	}
	return syscall.EIO
}

func (s *SFTP) existsErr(p string) syscall.Errno {
	if _, ok := s.lstatQuiet(p); ok {
		return syscall.EEXIST
	}
	return syscall.EIO
}

func (s *SFTP) client(ctx context.Context, op, p string) (*sftp.Client, error) {
	c, err := s.pool.Get(ctx)
	if err != nil {
		return nil, &Error{Op: op, Source: s.name, Path: p, Errno: syscall.EIO, Cause: err}
	}
	return c, nil
}

func attrFromSFTP(a sftp.Attrs) Attr {
	return Attr{
		Mode:  a.Mode,
		Size:  int64(a.Size),
		UID:   a.UID,
		GID:   a.GID,
		Atime: time.Unix(int64(a.Atime), 0),
		Mtime: time.Unix(int64(a.Mtime), 0),
	}
}

func (s *SFTP) Lstat(ctx context.Context, p string) (Attr, error) {
	c, err := s.client(ctx, "lstat", p)
	if err != nil {
		return Attr{}, err
	}
	a, err := c.Lstat(ctx, s.abs(p))
	if err != nil {
		return Attr{}, s.fail(ctx, "lstat", p, err, nil)
	}
	return attrFromSFTP(a), nil
}

func (s *SFTP) ReadDir(ctx context.Context, p string) ([]Entry, error) {
	c, err := s.client(ctx, "readdir", p)
	if err != nil {
		return nil, err
	}
	names, err := c.ReadDir(ctx, s.abs(p))
	if err != nil {
		return nil, s.fail(ctx, "readdir", p, err, func() syscall.Errno {
			if a, ok := s.lstatQuiet(p); ok && a.Mode&syscall.S_IFMT != syscall.S_IFDIR {
				return syscall.ENOTDIR
			}
			return syscall.EIO
		})
	}
	out := make([]Entry, 0, len(names))
	for _, n := range names {
		a := attrFromSFTP(n.Attrs)
		a.Nlink = n.Nlink
		out = append(out, Entry{Name: n.Name, Attr: a})
	}
	return out, nil
}

func (s *SFTP) Readlink(ctx context.Context, p string) (string, error) {
	c, err := s.client(ctx, "readlink", p)
	if err != nil {
		return "", err
	}
	t, err := c.Readlink(ctx, s.abs(p))
	if err != nil {
		return "", s.fail(ctx, "readlink", p, err, func() syscall.Errno { return syscall.EINVAL })
	}
	return t, nil
}

func (s *SFTP) Mkdir(ctx context.Context, p string, mode uint32) error {
	c, err := s.client(ctx, "mkdir", p)
	if err != nil {
		return err
	}
	err = c.Mkdir(ctx, s.abs(p), sftp.Attrs{Flags: sftp.AttrPermissions, Mode: mode & 07777})
	return s.fail(ctx, "mkdir", p, err, func() syscall.Errno { return s.existsErr(p) })
}

func (s *SFTP) Rmdir(ctx context.Context, p string) error {
	c, err := s.client(ctx, "rmdir", p)
	if err != nil {
		return err
	}
	err = c.Rmdir(ctx, s.abs(p))
	return s.fail(ctx, "rmdir", p, err, func() syscall.Errno {
		a, ok := s.lstatQuiet(p)
		switch {
		case !ok:
			return syscall.EIO
		case a.Mode&syscall.S_IFMT != syscall.S_IFDIR:
			return syscall.ENOTDIR
		}
		ctx, cancel := bg()
		defer cancel()
		if ents, err := c.ReadDir(ctx, s.abs(p)); err == nil && nonDotEntries(ents) {
			return syscall.ENOTEMPTY
		}
		return syscall.EBUSY
	})
}

func nonDotEntries(ents []sftp.NameEntry) bool {
	for _, e := range ents {
		if e.Name != "." && e.Name != ".." {
			return true
		}
	}
	return false
}

func (s *SFTP) Unlink(ctx context.Context, p string) error {
	c, err := s.client(ctx, "unlink", p)
	if err != nil {
		return err
	}
	err = c.Remove(ctx, s.abs(p))
	return s.fail(ctx, "unlink", p, err, func() syscall.Errno {
		if a, ok := s.lstatQuiet(p); ok && a.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			return syscall.EISDIR
		}
		return syscall.EIO
	})
}

func (s *SFTP) Rename(ctx context.Context, from, to string) error {
	c, err := s.client(ctx, "rename", from)
	if err != nil {
		return err
	}
	if s.posixRename {
		err = c.PosixRename(ctx, s.abs(from), s.abs(to))
	} else {
		err = s.renameReplacing(ctx, c, from, to)
	}
	return s.fail(ctx, "rename", from, err, func() syscall.Errno { return s.renameErrno(c, from, to) })
}

// renameReplacing gives rename(2) semantics on a server without posix-rename: plain
// SFTP rename refuses an existing target, so move the target aside first and put it
// back if the rename fails. Not atomic: a crash in between leaves the target under
// its temporary name, which is logged by name.
func (s *SFTP) renameReplacing(ctx context.Context, c *sftp.Client, from, to string) error {
	err := c.Rename(ctx, s.abs(from), s.abs(to))
	if err == nil || !sftp.IsStatus(err, sftp.StatusFailure) {
		return err
	}
	dst, ok := s.lstatQuiet(to)
	if !ok {
		return err
	}
	src, ok := s.lstatQuiet(from)
	if !ok || (src.Mode&syscall.S_IFMT == syscall.S_IFDIR) != (dst.Mode&syscall.S_IFMT == syscall.S_IFDIR) {
		return err
	}
	aside := fmt.Sprintf("%s.muxfs-rename-%d", to, time.Now().UnixNano())
	if err := c.Rename(ctx, s.abs(to), s.abs(aside)); err != nil {
		return err
	}
	if err := c.Rename(ctx, s.abs(from), s.abs(to)); err != nil {
		if rerr := c.Rename(ctx, s.abs(aside), s.abs(to)); rerr != nil {
			return fmt.Errorf("rename failed (%v) and the replaced file stays at %s (%v)", err, s.abs(aside), rerr)
		}
		return err
	}
	if src.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		err = c.Rmdir(ctx, s.abs(aside))
	} else {
		err = c.Remove(ctx, s.abs(aside))
	}
	if err != nil {
		// The rename itself succeeded; a non-empty replaced directory is the
		// caller's error, which rename(2) reports as ENOTEMPTY: undo.
		c.Rename(ctx, s.abs(to), s.abs(from))  //nolint:errcheck // best effort undo
		c.Rename(ctx, s.abs(aside), s.abs(to)) //nolint:errcheck // best effort undo
		return err
	}
	return nil
}

func (s *SFTP) renameErrno(c *sftp.Client, from, to string) syscall.Errno {
	src, okSrc := s.lstatQuiet(from)
	dst, okDst := s.lstatQuiet(to)
	if okSrc && okDst {
		srcDir := src.Mode&syscall.S_IFMT == syscall.S_IFDIR
		dstDir := dst.Mode&syscall.S_IFMT == syscall.S_IFDIR
		switch {
		case srcDir && !dstDir:
			return syscall.ENOTDIR
		case !srcDir && dstDir:
			return syscall.EISDIR
		case dstDir:
			ctx, cancel := bg()
			defer cancel()
			if ents, err := c.ReadDir(ctx, s.abs(to)); err == nil && nonDotEntries(ents) {
				return syscall.ENOTEMPTY
			}
		}
	}
	if okSrc && s.differentFS(c, from, to) {
		return syscall.EXDEV
	}
	return syscall.EIO
}

// differentFS reports whether two paths' parents are on different remote file systems
// (a rename or link between them fails with EXDEV, and mv then copies).
func (s *SFTP) differentFS(c *sftp.Client, a, b string) bool {
	if !s.statvfs {
		return false
	}
	ctx, cancel := bg()
	defer cancel()
	sa, err1 := c.Statvfs(ctx, s.abs(path.Dir(a)))
	sb, err2 := c.Statvfs(ctx, s.abs(path.Dir(b)))
	return err1 == nil && err2 == nil && sa.Fsid != sb.Fsid
}

func (s *SFTP) Symlink(ctx context.Context, target, p string) error {
	c, err := s.client(ctx, "symlink", p)
	if err != nil {
		return err
	}
	err = c.Symlink(ctx, target, s.abs(p))
	return s.fail(ctx, "symlink", p, err, func() syscall.Errno { return s.existsErr(p) })
}

func (s *SFTP) Link(ctx context.Context, from, to string) error {
	if !s.hardlink {
		return &Error{Op: "link", Source: s.name, Path: to, Errno: syscall.EPERM,
			Cause: errors.New("server does not offer hardlink@openssh.com")}
	}
	c, err := s.client(ctx, "link", to)
	if err != nil {
		return err
	}
	err = c.Hardlink(ctx, s.abs(from), s.abs(to))
	return s.fail(ctx, "link", to, err, func() syscall.Errno {
		if e := s.existsErr(to); e == syscall.EEXIST {
			return e
		}
		if a, ok := s.lstatQuiet(from); ok && a.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			return syscall.EPERM
		}
		if s.differentFS(c, from, to) {
			return syscall.EXDEV
		}
		return syscall.EIO
	})
}

func toSFTPAttrs(set SetAttr) sftp.Attrs {
	var a sftp.Attrs
	if set.Valid&SetMode != 0 {
		a.Flags |= sftp.AttrPermissions
		a.Mode = set.Mode & 07777
	}
	if set.Valid&SetOwner != 0 {
		a.Flags |= sftp.AttrUIDGID
		a.UID, a.GID = set.UID, set.GID
	}
	if set.Valid&SetSize != 0 {
		a.Flags |= sftp.AttrSize
		a.Size = uint64(set.Size)
	}
	if set.Valid&SetTimes != 0 {
		a.Flags |= sftp.AttrACModTime
		a.Atime, a.Mtime = uint32(set.Atime.Unix()), uint32(set.Mtime.Unix())
	}
	return a
}

// setattrErrno: chmod, chown and utimes by a non-owner fail with EPERM in POSIX, and
// OpenSSH folds EPERM into "permission denied".
func setattrErrno(err error) error {
	var be *Error
	if errors.As(err, &be) && be.Errno == syscall.EACCES {
		be.Errno = syscall.EPERM
	}
	return err
}

func (s *SFTP) SetAttr(ctx context.Context, p string, set SetAttr) error {
	c, err := s.client(ctx, "setattr", p)
	if err != nil {
		return err
	}
	a, err := c.Lstat(ctx, s.abs(p))
	if err != nil {
		return s.fail(ctx, "setattr", p, err, nil)
	}
	if a.Mode&syscall.S_IFMT == syscall.S_IFLNK {
		// A symlink's mode cannot change on Linux; its times and owner can only
		// through lsetstat, and setstat would change the target instead.
		set.Valid &^= SetMode
		if set.Valid == 0 {
			return nil
		}
		if !s.lsetstat {
			return &Error{Op: "setattr", Source: s.name, Path: p, Errno: syscall.EOPNOTSUPP,
				Cause: errors.New("server lacks lsetstat@openssh.com, needed to change a symlink itself")}
		}
		err = c.Lsetstat(ctx, s.abs(p), toSFTPAttrs(set))
		return setattrErrno(s.fail(ctx, "setattr", p, err, nil))
	}
	err = c.Setstat(ctx, s.abs(p), toSFTPAttrs(set))
	return setattrErrno(s.fail(ctx, "setattr", p, err, nil))
}

func openFlags(flags int) uint32 {
	var pf uint32
	switch flags & (os.O_RDONLY | os.O_WRONLY | os.O_RDWR) {
	case os.O_RDONLY:
		pf = sftp.FlagRead
	case os.O_WRONLY:
		pf = sftp.FlagWrite
	default:
		pf = sftp.FlagRead | sftp.FlagWrite
	}
	if flags&os.O_APPEND != 0 {
		pf |= sftp.FlagAppend
	}
	if flags&os.O_CREATE != 0 {
		pf |= sftp.FlagCreate
	}
	if flags&os.O_TRUNC != 0 {
		pf |= sftp.FlagTrunc
	}
	if flags&os.O_EXCL != 0 {
		pf |= sftp.FlagExcl
	}
	return pf
}

func (s *SFTP) Open(ctx context.Context, p string, flags int, mode uint32) (File, error) {
	c, err := s.client(ctx, "open", p)
	if err != nil {
		return nil, err
	}
	var a sftp.Attrs
	if flags&os.O_CREATE != 0 {
		a = sftp.Attrs{Flags: sftp.AttrPermissions, Mode: mode & 07777}
	}
	h, at, err := c.OpenAndLstat(ctx, s.abs(p), openFlags(flags), a)
	var check *sftp.PendingAttrs
	if err == nil {
		check, err = s.startCheck(c, h, at)
	}
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
	f := &sftpFile{s: s, c: c, h: h, path: p, readOnly: flags&(os.O_WRONLY|os.O_RDWR) == 0,
		opened: attrFromSFTP(at), lstat: at, check: check}
	f.ra.eofAt = -1
	return f, nil
}

// startCheck begins making sure the handle is the file at the path, not what a symlink
// swapped in just before the OPEN pointed to (SFTP v3 opens follow symlinks). at is the
// path's lstat taken just after the open: it must not be a symlink. The open file's own
// attributes (FSTAT) must then match it in type, mode and owner; that answer is awaited
// before the handle is first used, so the open itself costs one round trip.
func (s *SFTP) startCheck(c *sftp.Client, h string, at sftp.Attrs) (*sftp.PendingAttrs, error) {
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

// checked waits for the open's identity check; every use of the handle goes through it.
func (f *sftpFile) checked(ctx context.Context) error {
	f.checkOnce.Do(func() {
		fa, err := f.check.Wait(ctx)
		switch {
		case err != nil:
			f.checkErr = err
		case fa.Mode != f.lstat.Mode || fa.UID != f.lstat.UID || fa.GID != f.lstat.GID:
			// The handle is unusable; EIO is what a stale handle gives elsewhere.
			f.s.log("open of %s reached another file (a symlink was swapped in): refused", f.path)
			f.checkErr = syscall.EIO
		}
	})
	return f.checkErr
}

func (s *SFTP) Statfs(ctx context.Context, p string) (Statfs, error) {
	if !s.statvfs {
		// What sshfs reports without the extension: a large, empty file system, so that
		// programs checking free space before writing go ahead.
		return Statfs{Bsize: 4096, Blocks: 1 << 28, Bfree: 1 << 28, Bavail: 1 << 28, Files: 1 << 20, Ffree: 1 << 20, Namemax: 255}, nil
	}
	c, err := s.client(ctx, "statfs", p)
	if err != nil {
		return Statfs{}, err
	}
	st, err := c.Statvfs(ctx, s.abs(p))
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

// sftpFile is an open remote file, pinned to the session that opened it (handles are
// per session).
type sftpFile struct {
	s        *SFTP
	c        *sftp.Client
	h        string
	path     string
	readOnly bool
	opened   Attr // the file's attributes just after it was opened

	lstat     sftp.Attrs // the path's, just after the open
	check     *sftp.PendingAttrs
	checkOnce sync.Once
	checkErr  error

	wb writeBehind
	ra readAhead
}

// readDirect reads len(p) bytes at off as one pipelined burst of MaxRead-sized
// requests.
func (f *sftpFile) readDirect(ctx context.Context, p []byte, off int64) (int, error) {
	step := f.c.MaxRead
	var reqs []*sftp.PendingRead
	var startErr error
	for o := 0; o < len(p); o += step {
		r, err := f.c.StartRead(f.h, min(step, len(p)-o), off+int64(o))
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
			m, err := f.readFull(ctx, chunk[n:], off+int64(i*step+n))
			total += m
			if err != nil || m < len(chunk)-n {
				if err != io.EOF {
					firstErr = err
				}
				contiguous = false
			}
		}
	}
	if firstErr == nil {
		firstErr = startErr
	}
	if total > 0 {
		return total, nil
	}
	return 0, firstErr
}

func (f *sftpFile) readFull(ctx context.Context, p []byte, off int64) (int, error) {
	total := 0
	for total < len(p) {
		n, err := f.c.Read(ctx, f.h, p[total:], off+int64(total))
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
	if err := f.checked(ctx); err != nil {
		return 0, f.s.fail(ctx, "write", f.path, err, nil)
	}
	if err := f.wb.failed(); err != nil {
		return 0, f.s.fail(ctx, "write", f.path, f.wb.flush(ctx), nil)
	}
	f.ra.reset()
	step := f.c.MaxWrite
	for o := 0; o < len(p); o += step {
		chunk := p[o:min(len(p), o+step)]
		w, err := f.c.StartWrite(f.h, chunk, off+int64(o))
		if err == nil {
			err = f.wb.add(ctx, w, len(chunk))
		}
		if err != nil {
			f.wb.flush(ctx) //nolint:errcheck // err is the one to report
			return 0, f.s.fail(ctx, "write", f.path, err, nil)
		}
	}
	return len(p), nil
}

// Flush waits until the server has acknowledged every write, and reports the first
// that failed.
func (f *sftpFile) Flush(ctx context.Context) error {
	if f.readOnly {
		return nil // nothing written, nothing to wait for
	}
	return f.ready(ctx)
}

// ready makes the handle safe to use for anything: its identity is checked and every
// write is acknowledged.
func (f *sftpFile) ready(ctx context.Context) error {
	if err := f.checked(ctx); err != nil {
		return f.s.fail(ctx, "open", f.path, err, nil)
	}
	return f.s.fail(ctx, "write", f.path, f.wb.flush(ctx), nil)
}

func (f *sftpFile) OpenedAttr() Attr { return f.opened }

func (f *sftpFile) Stat(ctx context.Context) (Attr, error) {
	if err := f.ready(ctx); err != nil {
		return Attr{}, err
	}
	a, err := f.c.Fstat(ctx, f.h)
	if err != nil {
		return Attr{}, f.s.fail(ctx, "fstat", f.path, err, nil)
	}
	return attrFromSFTP(a), nil
}

func (f *sftpFile) SetAttr(ctx context.Context, set SetAttr) error {
	f.ra.reset()
	if err := f.ready(ctx); err != nil {
		return err
	}
	err := f.c.Fsetstat(ctx, f.h, toSFTPAttrs(set))
	return setattrErrno(f.s.fail(ctx, "fsetstat", f.path, err, nil))
}

func (f *sftpFile) Sync(ctx context.Context) error {
	if err := f.ready(ctx); err != nil {
		return err
	}
	if !f.s.fsync {
		// Every write has been acknowledged already; without fsync@openssh.com that
		// is as durable as the server lets us make it.
		return nil
	}
	return f.s.fail(ctx, "fsync", f.path, f.c.Fsync(ctx, f.h), nil)
}

func (f *sftpFile) Close(ctx context.Context) error {
	f.ra.reset()
	if f.checked(ctx) != nil {
		f.c.CloseAsync(f.h)
		return nil
	}
	if f.readOnly {
		f.c.CloseAsync(f.h)
		return nil
	}
	werr := f.Flush(ctx)
	cerr := f.s.fail(ctx, "close", f.path, f.c.CloseHandle(ctx, f.h), nil)
	if werr != nil {
		return werr
	}
	return cerr
}
