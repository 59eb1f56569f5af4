// Package fusefs serves a mux.Table as a FUSE file system (go-fuse v2, fs package).
package fusefs

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/muxfs/muxfs/internal/backend"
	"github.com/muxfs/muxfs/internal/mux"
)

// Options are the FUSE-side settings of a mount.
type Options struct {
	// CacheDirs lets the kernel keep directory listings (with the memory caches on),
	// each for DirTimeout after it read it.
	CacheDirs          bool
	DirTimeout         time.Duration
	FsName             string
	AllowOther         bool
	DefaultPermissions bool
	ReadOnly           bool
	Debug              bool
	EntryTimeout       time.Duration
	AttrTimeout        time.Duration
	NegativeTimeout    time.Duration
}

// FS is one mounted file system.
type FS struct {
	table     *mux.Table
	inodes    *inodeTable
	log       *slog.Logger
	mountTime time.Time
	uid, gid  uint32
	root      *node
	cacheDirs bool
	// attrTimeout is how long the kernel keeps attributes muxfs answered with.
	attrTimeout time.Duration

	// noOpendir: the kernel opens directories itself (see dirless) and keeps the
	// listings in held until expireListings drops them.
	noOpendir atomic.Bool
	heldMu    sync.Mutex
	held      map[*node]time.Time

	// restat: directories are statted through the mountpoint (absolute) after the
	// kernel read their listing (atime.go), when the kernel keeps attributes and
	// marks access times stale (not on a read-only mount).
	restat     bool
	mountpoint string
	listedDirs listedDirs
}

// New prepares the file system for table.
func New(table *mux.Table, log *slog.Logger) *FS {
	f := &FS{
		table:     table,
		inodes:    newInodeTable(),
		log:       log,
		mountTime: time.Now(),
		uid:       uint32(os.Getuid()),
		gid:       uint32(os.Getgid()),
	}
	f.root = &node{fsys: f, branch: -1}
	if l, rel := table.Enclosing("/"); l != nil && rel == "" {
		// The root's members are every branch of the root layer until the first
		// lookup refreshes them.
		f.root.branch = 0
		for i := range l.Branches {
			f.root.dirs = append(f.root.dirs, i)
		}
	}
	return f
}

// Mount mounts the file system at mountpoint and returns the running server.
func (f *FS) Mount(mountpoint string, o Options) (*fuse.Server, error) {
	f.cacheDirs = o.CacheDirs
	f.attrTimeout = o.AttrTimeout
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return nil, err
	}
	f.mountpoint = abs
	f.restat = o.AttrTimeout > 0 && !o.ReadOnly
	var fuseOpts []string
	if o.DefaultPermissions {
		fuseOpts = append(fuseOpts, "default_permissions")
	}
	if o.ReadOnly {
		fuseOpts = append(fuseOpts, "ro")
	}
	entry, attr, negative := o.EntryTimeout, o.AttrTimeout, o.NegativeTimeout
	opts := &fs.Options{
		MountOptions: fuse.MountOptions{
			AllowOther: o.AllowOther,
			FsName:     o.FsName,
			Name:       "muxfs",
			Options:    fuseOpts,
			// 1 MiB requests: fewer round trips through the kernel for big I/O. The
			// read-ahead asked for is capped by the kernel's offer at mount (128 KiB,
			// the new mount's default); muxfs' own read-ahead does the rest (design.md).
			MaxWrite:     1 << 20,
			MaxReadAhead: 1 << 20,
			// With splice on, go-fuse 2.12 logs a line for every 1 MiB read.
			DisableSplice: true,
			// Enough queued requests for a parallel build or a pipelined read.
			MaxBackground: 64,
			// mount(2) directly when root; otherwise go-fuse falls back to fusermount3,
			// which is how unprivileged users mount.
			DirectMount: true,
			// The page cache is dropped by muxfs when an open finds the file changed
			// on the server (close-to-open), not by the kernel whenever attributes
			// differ: a file being written reports sizes and times of its own.
			ExplicitDataCacheControl: true,
			// SFTP v3 has no extended attributes: say so once (ENOSYS makes the kernel
			// answer EOPNOTSUPP without asking again).
			DisableXAttrs: true,
			Debug:         o.Debug,
			// muxfs clears set-user-ID and set-group-ID bits itself (dropsPrivs):
			// the kernel then sends no GETATTR before a change of owner. And an
			// open with O_TRUNC truncates in its OPEN, where the kernel would
			// follow it with a SETATTR of the size: one round trip to the server
			// instead of two for `> file`, cp over a file, a compiler's output.
			ExtraCapabilities: fuse.CAP_HANDLE_KILLPRIV | fuse.CAP_ATOMIC_O_TRUNC,
		},
		// Explicit timeouts: a nil field in a non-nil fs.Options means zero.
		EntryTimeout:    &entry,
		AttrTimeout:     &attr,
		NegativeTimeout: &negative,
		RootStableAttr:  &fs.StableAttr{Ino: rootIno},
		UID:             f.uid,
		GID:             f.gid,
	}
	var raw fuse.RawFileSystem = fs.NewNodeFS(f.root, opts)
	// The kernel keeps listings without OPENDIR only when muxfs may keep them for a
	// while: expiry is checked a tenth of the timeout apart, at most every second.
	var server *fuse.Server // set before Serve, so before any OPENDIR
	dirs := o.CacheDirs && o.DirTimeout >= time.Second
	if dirs {
		raw = newDirless(raw, f, func() bool {
			return server.KernelSettings().Flags64()&fuse.CAP_NO_OPENDIR_SUPPORT != 0
		})
	}
	server, err = fuse.NewServer(raw, mountpoint, &opts.MountOptions)
	if err != nil {
		return nil, err
	}
	if dirs {
		go f.expireListings(server, min(o.DirTimeout/10, time.Second))
	}
	go server.Serve()
	if err := server.WaitMount(); err != nil {
		// Serve ends with the failed mount, and expireListings with it.
		return nil, err
	}
	return server, nil
}

// uninterruptible drops the kernel's interrupt from a request's context. The kernel
// interrupts a FUSE request whenever its caller gets any signal (Go's preemption
// SIGURG, make's SIGCHLD); answering EINTR then breaks every program that does not
// retry. Like sshfs without -o intr, requests run to completion.
func uninterruptible(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// vpath is the node's path in the mounted tree: "/" or "/a/b". ok is false for a node
// that is no longer linked into the tree (unlinked or replaced while the kernel still
// holds it): it has no path, and must not be taken for the root.
func (n *node) vpath() (vp string, ok bool) {
	var segments []string
	for p := &n.Inode; !p.IsRoot(); {
		name, parent := p.Parent()
		if parent == nil {
			return "", false
		}
		segments = append(segments, name)
		p = parent
	}
	slices.Reverse(segments)
	return "/" + strings.Join(segments, "/"), true
}

func join(dir, name string) string {
	if dir == "/" {
		return "/" + name
	}
	return dir + "/" + name
}

// checkName refuses names no POSIX file system accepts, before anything is sent.
func checkName(name string) syscall.Errno {
	if len(name) > 255 {
		return syscall.ENAMETOOLONG
	}
	return 0
}

// validRemoteName reports whether a name sent by a server is one we can show: a
// server (broken or hostile) could send "../x" or "a/b", which would escape or
// corrupt the tree.
func validRemoteName(name string) bool {
	return name != "" && name != "." && name != ".." && len(name) <= 255 &&
		!strings.ContainsAny(name, "/\x00")
}

// fillAttr converts backend attributes to FUSE attributes.
func fillAttr(out *fuse.Attr, a backend.Attr, ino uint64, nlink uint32) {
	out.Ino = ino
	out.Mode = a.Mode
	out.Size = uint64(max(a.Size, 0))
	out.Blocks = (out.Size + 511) / 512
	out.Blksize = 128 << 10
	out.Nlink = nlink
	out.Uid = a.UID
	out.Gid = a.GID
	mtime := a.Mtime
	out.SetTimes(&a.Atime, &mtime, &mtime)
}

// syntheticAttr is what a directory made only by the mount table looks like.
func (f *FS) syntheticAttr() backend.Attr {
	return backend.Attr{
		Mode:  syscall.S_IFDIR | 0o755,
		UID:   f.uid,
		GID:   f.gid,
		Atime: f.mountTime,
		Mtime: f.mountTime,
		Nlink: 2,
	}
}

// toErrno is the FUSE boundary: errors become errnos here and nowhere else. Unexpected
// I/O failures are logged, since the application only sees EIO.
func (f *FS) toErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	errno := backend.ToErrno(err)
	if errno == syscall.EIO || errno == syscall.ETIMEDOUT {
		f.log.Warn("I/O error", "err", err)
	} else {
		f.log.Debug("operation failed", "errno", errno, "err", err)
	}
	return errno
}
