package backend

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Local is a source that is a directory on this machine: for mixing local data into a
// mount, and for tests that need no server.
type Local struct {
	root string
}

// NewLocal returns a backend for the directory root, which must exist.
func NewLocal(root string) (*Local, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	st, err := os.Stat(abs)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, &Error{Op: "open source", Source: abs, Errno: syscall.ENOTDIR}
	}
	return &Local{root: abs}, nil
}

func (l *Local) String() string { return l.root }

func (l *Local) abs(p string) string {
	if p == "" {
		return l.root
	}
	return l.root + "/" + p
}

func (l *Local) wrap(op, p string, err error) error {
	if err == nil {
		return nil
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		errno = ToErrno(err)
	}
	return &Error{Op: op, Source: l.root, Path: p, Errno: errno}
}

func attrFromStat(st *unix.Stat_t) Attr {
	return Attr{
		Mode:  st.Mode,
		Size:  st.Size,
		UID:   st.Uid,
		GID:   st.Gid,
		Atime: time.Unix(st.Atim.Sec, st.Atim.Nsec),
		Mtime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
		Nlink: uint32(st.Nlink),
	}
}

func (l *Local) Lstat(_ context.Context, p string) (Attr, error) {
	var st unix.Stat_t
	if err := unix.Lstat(l.abs(p), &st); err != nil {
		return Attr{}, l.wrap("lstat", p, err)
	}
	return attrFromStat(&st), nil
}

func (l *Local) ReadDir(_ context.Context, p string) ([]Entry, error) {
	dir := l.abs(p)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, l.wrap("readdir", p, err)
	}
	out := make([]Entry, 0, len(ents))
	for _, e := range ents {
		var st unix.Stat_t
		if err := unix.Lstat(dir+"/"+e.Name(), &st); err != nil {
			continue // removed while listing
		}
		out = append(out, Entry{Name: e.Name(), Attr: attrFromStat(&st)})
	}
	return out, nil
}

func (l *Local) Readlink(_ context.Context, p string) (string, error) {
	s, err := os.Readlink(l.abs(p))
	return s, l.wrap("readlink", p, err)
}

func (l *Local) Mkdir(ctx context.Context, p string, mode uint32) (Attr, error) {
	if err := l.wrap("mkdir", p, unix.Mkdir(l.abs(p), mode&07777)); err != nil {
		return Attr{}, err
	}
	return l.Lstat(ctx, p)
}

func (l *Local) Rmdir(_ context.Context, p string) error {
	return l.wrap("rmdir", p, unix.Rmdir(l.abs(p)))
}

func (l *Local) Unlink(_ context.Context, p string) error {
	return l.wrap("unlink", p, unix.Unlink(l.abs(p)))
}

func (l *Local) Rename(_ context.Context, from, to string) error {
	return l.wrap("rename", from, unix.Rename(l.abs(from), l.abs(to)))
}

func (l *Local) Symlink(ctx context.Context, target, p string) (Attr, error) {
	if err := l.wrap("symlink", p, unix.Symlink(target, l.abs(p))); err != nil {
		return Attr{}, err
	}
	return l.Lstat(ctx, p)
}

func (l *Local) Link(_ context.Context, from, to string) error {
	return l.wrap("link", to, unix.Link(l.abs(from), l.abs(to)))
}

func (l *Local) SetAttr(ctx context.Context, p string, s SetAttr) (Attr, error) {
	if err := l.setAttr(p, s); err != nil {
		return Attr{}, err
	}
	return l.Lstat(ctx, p)
}

func (l *Local) setAttr(p string, s SetAttr) error {
	name := l.abs(p)
	if s.Valid&SetMode != 0 {
		// fchmodat cannot change a symlink's mode on Linux; symlink modes are
		// meaningless anyway, so a chmod reaching a symlink here is a no-op.
		var st unix.Stat_t
		if err := unix.Lstat(name, &st); err != nil {
			return l.wrap("chmod", p, err)
		}
		if st.Mode&syscall.S_IFMT != syscall.S_IFLNK {
			if err := unix.Chmod(name, s.Mode&07777); err != nil {
				return l.wrap("chmod", p, err)
			}
		}
	}
	if s.Valid&SetOwner != 0 {
		if err := unix.Lchown(name, int(s.UID), int(s.GID)); err != nil {
			return l.wrap("chown", p, err)
		}
	}
	if s.Valid&SetSize != 0 {
		if err := unix.Truncate(name, s.Size); err != nil {
			return l.wrap("truncate", p, err)
		}
	}
	if s.Valid&SetTimes != 0 {
		ts := []unix.Timespec{unix.NsecToTimespec(s.Atime.UnixNano()), unix.NsecToTimespec(s.Mtime.UnixNano())}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return l.wrap("utimens", p, err)
		}
	}
	return nil
}

func (l *Local) Open(_ context.Context, p string, flags int, mode uint32) (File, error) {
	f, err := os.OpenFile(l.abs(p), flags|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, os.FileMode(mode&0777))
	if err != nil {
		return nil, l.wrap("open", p, err)
	}
	if mode&07000 != 0 && flags&os.O_CREATE != 0 {
		// os.OpenFile drops setuid/setgid/sticky bits; apply them as asked.
		if err := unix.Fchmod(int(f.Fd()), mode&07777); err != nil {
			f.Close()
			return nil, l.wrap("open", p, err)
		}
	}
	lf := &localFile{f: f, l: l, path: p, appendOnly: flags&os.O_APPEND != 0}
	if lf.opened, err = lf.Stat(context.Background()); err != nil {
		f.Close()
		return nil, err
	}
	return lf, nil
}

func (l *Local) Statfs(_ context.Context, p string) (Statfs, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(l.abs(p), &st); err != nil {
		return Statfs{}, l.wrap("statfs", p, err)
	}
	return Statfs{
		Bsize: uint64(st.Bsize), Blocks: st.Blocks, Bfree: st.Bfree, Bavail: st.Bavail,
		Files: st.Files, Ffree: st.Ffree, Namemax: uint64(st.Namelen),
	}, nil
}

func (l *Local) Close() error { return nil }

type localFile struct {
	f          *os.File
	l          *Local
	path       string
	appendOnly bool
	opened     Attr
}

func (f *localFile) Flush(context.Context) error { return nil }

func (f *localFile) Drain(context.Context) {}

func (f *localFile) Changed() {}

func (f *localFile) OpenedAttr() Attr { return f.opened }

func (f *localFile) ReadAt(_ context.Context, p []byte, off int64) (int, error) {
	n, err := f.f.ReadAt(p, off)
	if err != nil && n == 0 {
		return 0, err
	}
	return n, nil
}

func (f *localFile) WriteAt(_ context.Context, p []byte, off int64) (int, error) {
	if f.appendOnly {
		// os.File refuses WriteAt on an O_APPEND file; the kernel appends anyway.
		n, err := f.f.Write(p)
		return n, f.l.wrap("write", f.path, err)
	}
	n, err := f.f.WriteAt(p, off)
	return n, f.l.wrap("write", f.path, err)
}

func (f *localFile) Stat(_ context.Context) (Attr, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.f.Fd()), &st); err != nil {
		return Attr{}, f.l.wrap("fstat", f.path, err)
	}
	return attrFromStat(&st), nil
}

func (f *localFile) SetAttr(ctx context.Context, s SetAttr) error {
	if s.Valid == SetSize {
		return f.l.wrap("ftruncate", f.path, f.f.Truncate(s.Size))
	}
	return f.l.setAttr(f.path, s)
}

func (f *localFile) Sync(_ context.Context) error {
	return f.l.wrap("fsync", f.path, f.f.Sync())
}

func (f *localFile) Close(_ context.Context) error {
	return f.l.wrap("close", f.path, f.f.Close())
}
