package backend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/muxfs/muxfs/internal/sftp"
)

// SFTP is a source reached over SFTP: one directory of one endpoint, or a replica set —
// the same storage behind several endpoints (members). Requests that only read go to
// the least busy member that is up; changes go to one member at a time (the writer),
// so that they stay ordered; when a member fails, its requests move to another.
type SFTP struct {
	members []*member
	name    string
	timeout time.Duration
	log     *slog.Logger

	// ext is what the server offers beyond SFTP v3; learnt from the first session
	// (see exts).
	ext atomic.Pointer[extensions]
	// noLchmod: lsetstat cannot change this server's modes (see SetAttr).
	noLchmod atomic.Bool

	writer   atomic.Int32  // index of the member that takes changes
	rr       atomic.Uint32 // rotates the first choice among equally busy members
	errs     atomic.Int64  // requests that failed for another reason than a missing name
	retries  atomic.Int64  // requests sent again after a lost connection
	reopened atomic.Int64  // open files moved to a new session
	striped  atomic.Int64  // extra handles opened to read or write a file over several sessions
}

// member is one way to the source's storage: a server's pool and the directory there.
type member struct {
	pool *Pool
	root string // absolute remote directory, or a path relative to the login directory
	name string
	// resolved: the server answered at mount and root is its answer.
	resolved bool
}

func (m *member) abs(p string) string {
	switch {
	case p == "":
		return m.root
	case m.root == "/":
		return "/" + p
	}
	return m.root + "/" + p
}

// Member is one endpoint of a source and its directory there ("" is the login
// directory).
type Member struct {
	Pool *Pool
	Dir  string
	// Root is the directory as resolved by an earlier mount (absolute), used while the
	// member is down: a source started offline keeps the name its cache is kept under.
	Root string
}

// extensions are the OpenSSH extensions muxfs uses where the server has them.
type extensions struct {
	posixRename, hardlink, lsetstat, statvfs, fsync bool
}

func extensionsOf(c *sftp.Client) *extensions {
	return &extensions{
		posixRename: c.HasExtension("posix-rename@openssh.com"),
		hardlink:    c.HasExtension("hardlink@openssh.com"),
		lsetstat:    c.HasExtension("lsetstat@openssh.com"),
		statvfs:     c.HasExtension("statvfs@openssh.com"),
		fsync:       c.HasExtension("fsync@openssh.com"),
	}
}

// exts returns the server's extensions. A source started offline learns them from
// its first session; until then (nothing can change on the server meanwhile) none is
// assumed.
func (s *SFTP) exts() extensions {
	if e := s.ext.Load(); e != nil {
		return *e
	}
	for _, m := range s.members {
		if c := m.pool.live(); c != nil {
			e := extensionsOf(c)
			s.ext.CompareAndSwap(nil, e)
			return *e
		}
	}
	return extensions{}
}

// NewSFTP returns a source made of one or more members (several: a replica set).
// Each reachable member's directory is checked, so that a typo fails the mount, not
// the first ls; at least one member must be reachable. timeout bounds every request,
// its reconnects and retries included (0: no bound).
func NewSFTP(ctx context.Context, members []Member, timeout time.Duration, log *slog.Logger) (*SFTP, error) {
	return newSFTP(ctx, members, timeout, log, false)
}

// NewOfflineSFTP returns a source none of whose members could be reached at mount,
// served from the persistent cache until one answers (each member's Root says where
// its directory was); its pools keep trying in the background.
func NewOfflineSFTP(members []Member, timeout time.Duration, log *slog.Logger) (*SFTP, error) {
	return newSFTP(context.Background(), members, timeout, log, true)
}

func newSFTP(ctx context.Context, members []Member, timeout time.Duration, log *slog.Logger, offline bool) (*SFTP, error) {
	s := &SFTP{timeout: timeout, log: log}
	var caps *sftp.Client
	for _, mb := range members {
		m, c, err := newMember(ctx, mb)
		if err != nil {
			return nil, err
		}
		if caps == nil && c != nil {
			caps = c
		}
		s.members = append(s.members, m)
	}
	if caps == nil && !offline {
		return nil, fmt.Errorf("no member of %s is reachable — check the servers", members[0].Pool.ep.String())
	}
	for _, m := range s.members {
		m.pool.Acquire()
	}
	s.name = s.members[0].name
	if len(s.members) > 1 {
		s.name += fmt.Sprintf(" (+%d replicas)", len(s.members)-1)
	}
	if caps != nil {
		s.ext.Store(extensionsOf(caps))
	}
	return s, nil
}

// Roots returns each member's directory as its server resolved it, and whether every
// member was reached at mount (a member down since then has its directory as given).
func (s *SFTP) Roots() ([]string, bool) {
	roots := make([]string, len(s.members))
	all := true
	for i, m := range s.members {
		roots[i] = m.root
		all = all && m.resolved
	}
	return roots, all
}

// newMember checks a member's directory. A member whose server is down (a replica
// set may start with one) keeps the directory as given; the server resolves a
// relative one against the login directory once it is back.
func newMember(ctx context.Context, mb Member) (*member, *sftp.Client, error) {
	ep := mb.Pool.ep.String()
	dir := mb.Dir
	if dir == "" {
		dir = "."
	}
	m := &member{pool: mb.Pool, root: path.Clean(dir), name: ep + ":" + dir}
	if mb.Pool.State() != StateUp {
		if mb.Root != "" {
			m.root, m.name = mb.Root, ep+":"+mb.Root
		}
		return m, nil, nil
	}
	c, err := mb.Pool.Get(ctx)
	if err != nil {
		return nil, nil, err
	}
	// Both at once: one round trip less at every mount (0.2 s at 200 ms). A STAT of
	// the path as given follows its symbolic links to the directory its REALPATH
	// names.
	var a sftp.Attrs
	var statErr error
	stated := make(chan struct{})
	go func() {
		defer close(stated)
		a, statErr = c.Stat(ctx, dir)
	}()
	root, err := c.Realpath(ctx, dir)
	<-stated
	if err != nil {
		return nil, nil, fmt.Errorf("remote directory %s:%s does not exist or cannot be reached (%v) — check the path", ep, dir, err)
	}
	if err := statErr; err != nil {
		return nil, nil, fmt.Errorf("remote directory %s:%s does not exist (%v) — check the path", ep, dir, err)
	}
	if a.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return nil, nil, fmt.Errorf("%s:%s is not a directory — give a directory as the source", ep, dir)
	}
	m.root, m.name, m.resolved = root, ep+":"+root, true
	return m, c, nil
}

func (s *SFTP) String() string { return s.name }

func (s *SFTP) warn(format string, args ...any) {
	s.log.Warn(fmt.Sprintf(format, args...), "source", s.name)
}

func (s *SFTP) Close() error {
	for _, m := range s.members {
		m.pool.Release()
	}
	return nil
}

// deadline bounds a request, with its reconnects and retries, by the source's
// timeout: a caller gets an error then, never an endless wait.
func (s *SFTP) deadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.timeout)
}

// maxAttempts bounds how often one request is sent again after lost connections, so
// that a request that itself kills the server's process is not repeated forever.
const maxAttempts = 3

// connLost reports whether err means the session ended under the request: the
// request may be sent again on another session.
func connLost(err error) bool { return errors.Is(err, sftp.ErrClosed) }

// pick chooses the member for a request. Changes (write) go to the writer while it is
// up, else to the first member that is; reads to the least busy member that is up.
// With none up, the writer: its pool waits for the reconnect. avoid (if not nil) just
// lost a session under a request: its other sessions are likely going the same way, so
// another member is preferred.
func (s *SFTP) pick(write bool, avoid *member) *member {
	if len(s.members) == 1 {
		return s.members[0]
	}
	usable := func(m *member) bool { return m != avoid && m.pool.State() == StateUp }
	w := int(s.writer.Load())
	if write {
		if usable(s.members[w]) {
			return s.members[w]
		}
		for i, m := range s.members {
			if usable(m) {
				if s.writer.CompareAndSwap(int32(w), int32(i)) {
					s.warn("changes now go through %s (%s is not answering)", m.name, s.members[w].name)
				}
				return m
			}
		}
		return s.members[w]
	}
	var best *member
	var load int64
	start := int(s.rr.Add(1))
	for k := range s.members {
		m := s.members[(start+k)%len(s.members)]
		if !usable(m) {
			continue
		}
		if l := m.pool.InFlight(); best == nil || l < load {
			best, load = m, l
		}
	}
	if best == nil {
		return s.members[w]
	}
	return best
}

// do runs fn on a live session of a member chosen by pick, within the source's
// deadline. When the session dies under fn (a lost connection), fn runs again on a
// live one — another member's if this member is down — so requests survive
// reconnects and failover. retried tells fn that an earlier attempt may have been
// carried out: requests that are not idempotent then treat "already done" as done,
// as NFS clients do.
func (s *SFTP) do(ctx context.Context, write bool, fn func(ctx context.Context, m *member, c *sftp.Client, retried bool) error) error {
	ctx, cancel := s.deadline(ctx)
	defer cancel()
	var err error
	var failed *member
	for attempt := 0; attempt < maxAttempts; attempt++ {
		m := s.pick(write, failed)
		if attempt > 0 {
			s.retries.Add(1)
			if m == failed {
				// No other member: give the pool a moment to see which of its
				// sessions died with the connection.
				time.Sleep(time.Duration(attempt) * 20 * time.Millisecond)
			}
		}
		var c *sftp.Client
		c, err = m.pool.Get(ctx)
		if err != nil {
			return err
		}
		err = fn(ctx, m, c, attempt > 0)
		if !connLost(err) || ctx.Err() != nil {
			return err
		}
		failed = m
	}
	return err
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
	if errno != syscall.ENOENT {
		s.errs.Add(1)
	}
	return &Error{Op: op, Source: s.name, Path: p, Errno: errno, Cause: err}
}

// bg is the context for the follow-up requests that recover an errno: short, and not
// cancelled with the original request.
func bg() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

// lstatQuiet asks the writer member, which has seen the change just attempted.
func (s *SFTP) lstatQuiet(p string) (sftp.Attrs, bool) {
	ctx, cancel := bg()
	defer cancel()
	var a sftp.Attrs
	err := s.do(ctx, true, func(ctx context.Context, m *member, c *sftp.Client, _ bool) error {
		var err error
		a, err = c.Lstat(ctx, m.abs(p))
		return err
	})
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
	if !s.exts().statvfs {
		return syscall.EIO
	}
	ctx, cancel := bg()
	defer cancel()
	var st sftp.StatVFS
	err := s.do(ctx, true, func(ctx context.Context, m *member, c *sftp.Client, _ bool) error {
		var err error
		st, err = c.Statvfs(ctx, m.abs(path.Dir(p)))
		return err
	})
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
	var a sftp.Attrs
	err := s.do(ctx, false, func(ctx context.Context, m *member, c *sftp.Client, _ bool) error {
		var err error
		a, err = c.Lstat(ctx, m.abs(p))
		return err
	})
	if err != nil {
		return Attr{}, s.fail(ctx, "lstat", p, err, nil)
	}
	return attrFromSFTP(a), nil
}

func (s *SFTP) ReadDir(ctx context.Context, p string) ([]Entry, error) {
	// The parts are joined once at the end: a big listing grown by append left twice
	// its size behind as garbage, at the moment its reader makes an inode per entry.
	var parts [][]Entry
	progress := ListingProgress(ctx)
	err := s.do(ctx, false, func(ctx context.Context, m *member, c *sftp.Client, _ bool) error {
		parts = nil // a retry lists again from the start
		return c.ReadDirFunc(ctx, m.abs(p), func(names []sftp.NameEntry) {
			part := s.entries(p, names)
			parts = append(parts, part)
			if progress != nil {
				progress(part)
			}
		})
	})
	if err != nil {
		return nil, s.fail(ctx, "readdir", p, err, func() syscall.Errno {
			if a, ok := s.lstatQuiet(p); ok && a.Mode&syscall.S_IFMT != syscall.S_IFDIR {
				return syscall.ENOTDIR
			}
			return syscall.EIO
		})
	}
	if len(parts) == 1 {
		return parts[0], nil
	}
	n := 0
	for _, part := range parts {
		n += len(part)
	}
	out := make([]Entry, 0, n)
	for _, part := range parts {
		out = append(out, part...)
	}
	return out, nil
}

// entries turns part of p's listing into entries, leaving out (with a warning) the
// ones whose attributes cannot be used.
func (s *SFTP) entries(p string, names []sftp.NameEntry) []Entry {
	out := make([]Entry, 0, len(names))
	for _, n := range names {
		if err := n.Attrs.Check(); err != nil {
			s.warn("listing of /%s: %v for %q; the entry is not shown", p, err, n.Name)
			continue
		}
		a := attrFromSFTP(n.Attrs)
		a.Nlink = n.Nlink
		out = append(out, Entry{Name: n.Name, Attr: a})
	}
	return out
}

func (s *SFTP) Readlink(ctx context.Context, p string) (string, error) {
	var t string
	err := s.do(ctx, false, func(ctx context.Context, m *member, c *sftp.Client, _ bool) error {
		var err error
		t, err = c.Readlink(ctx, m.abs(p))
		return err
	})
	if err != nil {
		return "", s.fail(ctx, "readlink", p, err, func() syscall.Errno { return syscall.EINVAL })
	}
	return t, nil
}

// change runs a request that is not idempotent on the writer member. done says, after
// a retry failed, whether the server's state shows that the lost first attempt was
// carried out; the change then counts as made.
func (s *SFTP) change(ctx context.Context, fn func(ctx context.Context, m *member, c *sftp.Client) error, done func() bool) error {
	return s.do(ctx, true, func(ctx context.Context, m *member, c *sftp.Client, retried bool) error {
		err := fn(ctx, m, c)
		if err != nil && retried && !connLost(err) && done() {
			return nil
		}
		return err
	})
}

func (s *SFTP) isType(p string, typ uint32) bool {
	a, ok := s.lstatQuiet(p)
	return ok && a.Mode&syscall.S_IFMT == typ
}

func (s *SFTP) missing(p string) bool {
	_, ok := s.lstatQuiet(p)
	return !ok
}

func (s *SFTP) Mkdir(ctx context.Context, p string, mode uint32) (Attr, error) {
	return s.makeEntry(ctx, "mkdir", p, func(ctx context.Context, c *sftp.Client, abs string) (sftp.Attrs, error) {
		return c.MkdirAndLstat(ctx, abs, sftp.Attrs{Flags: sftp.AttrPermissions, Mode: mode & 07777})
	}, func() bool { return s.isType(p, syscall.S_IFDIR) })
}

// makeEntry runs req, which makes p and returns its attributes (a MKDIR or a SYMLINK
// with an LSTAT behind it), as a change (see change: done tells whether a lost
// attempt made it). One made by an attempt whose answer was lost is asked for with an
// LSTAT.
func (s *SFTP) makeEntry(ctx context.Context, op, p string, req func(ctx context.Context, c *sftp.Client, abs string) (sftp.Attrs, error), done func() bool) (Attr, error) {
	var at sftp.Attrs
	made := false
	err := s.change(ctx, func(ctx context.Context, m *member, c *sftp.Client) error {
		var err error
		at, err = req(ctx, c, m.abs(p))
		made = err == nil
		return err
	}, done)
	if err == nil && !made {
		return s.Lstat(ctx, p)
	}
	return attrFromSFTP(at), s.fail(ctx, op, p, err, func() syscall.Errno { return s.existsErr(p) })
}

func (s *SFTP) Rmdir(ctx context.Context, p string) error {
	err := s.change(ctx, func(ctx context.Context, m *member, c *sftp.Client) error {
		return c.Rmdir(ctx, m.abs(p))
	}, func() bool { return s.missing(p) })
	return s.fail(ctx, "rmdir", p, err, func() syscall.Errno {
		a, ok := s.lstatQuiet(p)
		switch {
		case !ok:
			return syscall.EIO
		case a.Mode&syscall.S_IFMT != syscall.S_IFDIR:
			return syscall.ENOTDIR
		}
		if s.nonEmpty(p) {
			return syscall.ENOTEMPTY
		}
		return syscall.EBUSY
	})
}

// nonEmpty reports whether directory p holds anything.
func (s *SFTP) nonEmpty(p string) bool {
	ctx, cancel := bg()
	defer cancel()
	var ents []sftp.NameEntry
	err := s.do(ctx, true, func(ctx context.Context, m *member, c *sftp.Client, _ bool) error {
		var err error
		ents, err = c.ReadDir(ctx, m.abs(p))
		return err
	})
	return err == nil && nonDotEntries(ents)
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
	err := s.change(ctx, func(ctx context.Context, m *member, c *sftp.Client) error {
		return c.Remove(ctx, m.abs(p))
	}, func() bool { return s.missing(p) })
	return s.fail(ctx, "unlink", p, err, func() syscall.Errno {
		if s.isType(p, syscall.S_IFDIR) {
			return syscall.EISDIR
		}
		return syscall.EIO
	})
}

func (s *SFTP) Rename(ctx context.Context, from, to string) error {
	err := s.change(ctx, func(ctx context.Context, m *member, c *sftp.Client) error {
		if s.exts().posixRename {
			return c.PosixRename(ctx, m.abs(from), m.abs(to))
		}
		return s.renameReplacing(ctx, m, c, from, to)
	}, func() bool { return s.missing(from) && !s.missing(to) })
	return s.fail(ctx, "rename", from, err, func() syscall.Errno { return s.renameErrno(from, to) })
}

// renameReplacing gives rename(2) semantics on a server without posix-rename: plain
// SFTP rename refuses an existing target, so move the target aside first and put it
// back if the rename fails. Not atomic: a crash in between leaves the target under
// its temporary name, which is logged by name.
func (s *SFTP) renameReplacing(ctx context.Context, m *member, c *sftp.Client, from, to string) error {
	err := c.Rename(ctx, m.abs(from), m.abs(to))
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
	if err := c.Rename(ctx, m.abs(to), m.abs(aside)); err != nil {
		return err
	}
	if err := c.Rename(ctx, m.abs(from), m.abs(to)); err != nil {
		if rerr := c.Rename(ctx, m.abs(aside), m.abs(to)); rerr != nil {
			return fmt.Errorf("rename failed (%v) and the replaced file stays at %s (%v)", err, m.abs(aside), rerr)
		}
		return err
	}
	if src.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		err = c.Rmdir(ctx, m.abs(aside))
	} else {
		err = c.Remove(ctx, m.abs(aside))
	}
	if err != nil {
		// The rename itself succeeded; a non-empty replaced directory is the
		// caller's error, which rename(2) reports as ENOTEMPTY: undo.
		c.Rename(ctx, m.abs(to), m.abs(from))  //nolint:errcheck // best effort undo
		c.Rename(ctx, m.abs(aside), m.abs(to)) //nolint:errcheck // best effort undo
		return err
	}
	return nil
}

func (s *SFTP) renameErrno(from, to string) syscall.Errno {
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
		case dstDir && s.nonEmpty(to):
			return syscall.ENOTEMPTY
		}
	}
	if okSrc && s.differentFS(from, to) {
		return syscall.EXDEV
	}
	return syscall.EIO
}

// differentFS reports whether two paths' parents are on different remote file systems
// (a rename or link between them fails with EXDEV, and mv then copies).
func (s *SFTP) differentFS(a, b string) bool {
	if !s.exts().statvfs {
		return false
	}
	ctx, cancel := bg()
	defer cancel()
	var sa, sb sftp.StatVFS
	err := s.do(ctx, true, func(ctx context.Context, m *member, c *sftp.Client, _ bool) error {
		var err error
		if sa, err = c.Statvfs(ctx, m.abs(path.Dir(a))); err != nil {
			return err
		}
		sb, err = c.Statvfs(ctx, m.abs(path.Dir(b)))
		return err
	})
	return err == nil && sa.Fsid != sb.Fsid
}

func (s *SFTP) Symlink(ctx context.Context, target, p string) (Attr, error) {
	return s.makeEntry(ctx, "symlink", p, func(ctx context.Context, c *sftp.Client, abs string) (sftp.Attrs, error) {
		return c.SymlinkAndLstat(ctx, target, abs)
	}, func() bool {
		ctx, cancel := bg()
		defer cancel()
		t, err := s.Readlink(ctx, p)
		return err == nil && t == target
	})
}

func (s *SFTP) Link(ctx context.Context, from, to string) error {
	if !s.exts().hardlink {
		return &Error{Op: "link", Source: s.name, Path: to, Errno: syscall.EPERM,
			Cause: errors.New("server does not offer hardlink@openssh.com")}
	}
	err := s.change(ctx, func(ctx context.Context, m *member, c *sftp.Client) error {
		return c.Hardlink(ctx, m.abs(from), m.abs(to))
	}, func() bool { return !s.missing(to) })
	return s.fail(ctx, "link", to, err, func() syscall.Errno {
		if e := s.existsErr(to); e == syscall.EEXIST {
			return e
		}
		if s.isType(from, syscall.S_IFDIR) {
			return syscall.EPERM
		}
		if s.differentFS(from, to) {
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

// SetAttr changes path's attributes and returns them as the change left them (an
// LSTAT pipelined behind the change: one round trip). Where the server has
// lsetstat@openssh.com the change is made with it, which never follows a symlink,
// without looking at the path first. Should that fail — a mode asked of a symlink,
// which Linux cannot change, or a server whose C library cannot change a mode without
// following (glibc before 2.32) — the path is looked at (lstat) and the change made as
// it calls for, as it is where the server lacks the extension.
func (s *SFTP) SetAttr(ctx context.Context, p string, set SetAttr) (Attr, error) {
	var at sftp.Attrs
	err := s.do(ctx, true, func(ctx context.Context, m *member, c *sftp.Client, _ bool) error {
		name := m.abs(p)
		lset := s.exts().lsetstat
		tried := lset && (set.Valid&SetMode == 0 || !s.noLchmod.Load())
		if tried {
			var err error
			if at, err = c.SetstatAndLstat(ctx, name, toSFTPAttrs(set), true); err == nil || connLost(err) {
				return err
			}
		}
		cur, err := c.Lstat(ctx, name)
		if err != nil {
			return err
		}
		if cur.Mode&syscall.S_IFMT != syscall.S_IFLNK {
			at, err = c.SetstatAndLstat(ctx, name, toSFTPAttrs(set), false)
			if err == nil && tried && set.Valid&SetMode != 0 {
				// lsetstat failed where setstat succeeded: the server cannot change a
				// mode without following symlinks. Modes go the long way from now on.
				s.noLchmod.Store(true)
			}
			return err
		}
		// A symlink's mode cannot change on Linux; its times and owner can only
		// through lsetstat, and setstat would change the target instead.
		set := set
		set.Valid &^= SetMode
		if set.Valid == 0 {
			at = cur
			return nil
		}
		if !lset {
			return fmt.Errorf("server lacks lsetstat@openssh.com, needed to change a symlink itself: %w", syscall.EOPNOTSUPP)
		}
		at, err = c.SetstatAndLstat(ctx, name, toSFTPAttrs(set), true)
		return err
	})
	if err != nil {
		return Attr{}, setattrErrno(s.fail(ctx, "setattr", p, err, nil))
	}
	return attrFromSFTP(at), nil
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
