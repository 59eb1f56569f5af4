// Package backend defines what muxfs needs from a source (one remote or local
// directory) and provides the two implementations: SFTP over ssh, and a local directory.
//
// Paths given to a Backend are relative to its root ("" is the root, "a/b" below it) and
// have been checked by the caller: no empty, "." or ".." components. Errors wrap a
// syscall.Errno that says precisely what went wrong; ToErrno extracts it.
package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"
	"syscall"
	"time"

	"github.com/muxfs/muxfs/internal/sftp"
)

// Attr is what muxfs knows of a file: the parts of struct stat an SFTP v3 server sends.
type Attr struct {
	Mode  uint32 // st_mode: type bits and permissions
	Size  int64
	UID   uint32
	GID   uint32
	Atime time.Time
	Mtime time.Time
	Nlink uint32 // 0: unknown (SFTP v3 stat carries no link count)
}

// Child is the path of name in directory dir, both relative to a source's root ("" is
// the root itself).
func Child(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// IsDir reports whether the attributes describe a directory.
func (a Attr) IsDir() bool { return a.Mode&syscall.S_IFMT == syscall.S_IFDIR }

// Type returns the file type bits of the mode.
func (a Attr) Type() uint32 { return a.Mode & syscall.S_IFMT }

// Entry is one directory entry with its attributes (lstat semantics).
type Entry struct {
	Name string
	Attr Attr
}

// SetAttr says which attributes to change; only fields named in Valid are used.
type SetAttr struct {
	Valid uint32
	Mode  uint32 // permission bits only
	UID   uint32
	GID   uint32
	Size  int64
	Atime time.Time
	Mtime time.Time
}

// Bits of SetAttr.Valid.
const (
	SetMode = 1 << iota
	SetOwner
	SetSize
	SetTimes // Atime and Mtime both set (the caller fills an omitted one from lstat)
)

// Statfs is file system usage, in units of Bsize.
type Statfs struct {
	Bsize   uint64
	Blocks  uint64
	Bfree   uint64
	Bavail  uint64
	Files   uint64
	Ffree   uint64
	Namemax uint64
}

// Backend is one source: a directory tree reached over SFTP or locally.
type Backend interface {
	// String names the source for logs and errors, e.g. "user@host:/dir".
	String() string
	Lstat(ctx context.Context, path string) (Attr, error)
	ReadDir(ctx context.Context, path string) ([]Entry, error)
	Readlink(ctx context.Context, path string) (string, error)
	// Mkdir creates a directory and returns its attributes (one round trip where the
	// protocol pipelines; the caller needs them for the kernel's new entry).
	Mkdir(ctx context.Context, path string, mode uint32) (Attr, error)
	Rmdir(ctx context.Context, path string) error
	Unlink(ctx context.Context, path string) error
	// Rename replaces an existing destination, as rename(2) does.
	Rename(ctx context.Context, from, to string) error
	// Symlink makes a symlink and returns its attributes, as Mkdir does.
	Symlink(ctx context.Context, target, path string) (Attr, error)
	Link(ctx context.Context, from, to string) error
	// SetAttr never follows a final symlink where the server allows that; otherwise
	// changing a symlink's own times or owner fails with EOPNOTSUPP rather than
	// silently changing its target. It returns path's attributes after the change.
	SetAttr(ctx context.Context, path string, s SetAttr) (Attr, error)
	// Open opens with open(2) flags (O_RDONLY, O_CREAT, O_EXCL, ...); mode applies
	// when the file is created.
	Open(ctx context.Context, path string, flags int, mode uint32) (File, error)
	Statfs(ctx context.Context, path string) (Statfs, error)
	Close() error
}

// Wrapper is a Backend that adds behaviour to another (a union member's stand-in
// while its server is down, for instance) and forwards the rest to it.
type Wrapper interface {
	Unwrap() Backend
}

// As finds, in b or the backends b wraps, the first that implements T: what a source
// offers besides the Backend methods (dropping its cache for a path, say) must reach
// it through any wrapper, as errors.As reaches a wrapped error.
func As[T any](b Backend) (T, bool) {
	for {
		if t, ok := b.(T); ok {
			return t, true
		}
		w, ok := b.(Wrapper)
		if !ok {
			var zero T
			return zero, false
		}
		b = w.Unwrap()
	}
}

// File is an open file of a Backend.
//
// Writes may be sent behind the caller's back (write-behind): a write's failure is
// returned by a later WriteAt, Flush, Sync or Close, never lost. Stat, SetAttr, Sync
// and Close flush first, so they see and report every earlier write.
type File interface {
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
	WriteAt(ctx context.Context, p []byte, off int64) (int, error)
	// Flush returns once every write is acknowledged, with the first failure.
	Flush(ctx context.Context) error
	// Drain returns once every write made so far is acknowledged or refused, and
	// leaves a failure on record for this file's own next WriteAt, Flush, Sync or
	// Close: another handle of the same file, about to read or write where these
	// writes went, must come after them, and their failure is theirs to report.
	Drain(ctx context.Context)
	// Changed tells the file that another handle of the mount changed the file's
	// content or size: what it has read ahead may be stale.
	Changed()
	Stat(ctx context.Context) (Attr, error)
	// OpenedAttr is the file's attributes as they were just after opening.
	OpenedAttr() Attr
	SetAttr(ctx context.Context, s SetAttr) error
	Sync(ctx context.Context) error
	Close(ctx context.Context) error
}

// Error is a failed backend operation: what, where, the precise errno, and the cause.
type Error struct {
	Op     string
	Source string
	Path   string
	Errno  syscall.Errno
	Cause  error
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("%s %s:%s: %v", e.Op, e.Source, "/"+e.Path, e.Errno)
	if e.Cause != nil && e.Cause.Error() != e.Errno.Error() {
		msg += " (" + e.Cause.Error() + ")"
	}
	return msg
}

// Unwrap gives the errno first (ToErrno takes the first it finds), then the cause.
func (e *Error) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Errno}
	}
	return []error{e.Errno, e.Cause}
}

// IsUnavailable reports whether err means the source could not be reached or did not
// answer in time, rather than an answer about the file.
func IsUnavailable(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, sftp.ErrClosed) || errors.Is(err, context.DeadlineExceeded)
}

// ToErrno returns the errno for err: the one a backend chose, or one derived from
// context and io errors. Unknown errors are EIO: an I/O problem the caller cannot fix.
func ToErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var errno syscall.Errno
	switch {
	case errors.As(err, &errno):
		return errno
	case errors.Is(err, context.DeadlineExceeded):
		return syscall.ETIMEDOUT
	case errors.Is(err, context.Canceled):
		return syscall.EINTR
	case errors.Is(err, fs.ErrNotExist):
		return syscall.ENOENT
	case errors.Is(err, fs.ErrExist):
		return syscall.EEXIST
	case errors.Is(err, fs.ErrPermission):
		return syscall.EACCES
	case errors.Is(err, io.EOF):
		return 0
	}
	return syscall.EIO
}

type beingWrittenKey struct{}

// WithBeingWritten returns a context for an open of a file that the mount is writing
// through another handle: those writes are answered before the server has them, so
// attributes a source gave for the file meanwhile (a lookup's) may predate them, and
// an open that would trust such attributes (close-to-open off, -o nocto) must ask the
// server instead.
func WithBeingWritten(ctx context.Context) context.Context {
	return context.WithValue(ctx, beingWrittenKey{}, true)
}

// BeingWritten reports whether ctx is an open's of a file being written (WithBeingWritten).
func BeingWritten(ctx context.Context) bool {
	w, _ := ctx.Value(beingWrittenKey{}).(bool)
	return w
}

type listingProgressKey struct{}

// WithListingProgress returns a context under which a listing fetched from the server
// hands each part of itself to fn as it arrives, before ReadDir returns the whole: a
// reader of a big directory can start before its end (package fusefs). fn runs on the
// fetching goroutine, one part at a time. A listing answered from a cache, or fetched
// for another caller first, is not handed out in parts; a fetch that starts over (a
// lost connection) hands out its parts again, so fn must take each name once.
func WithListingProgress(ctx context.Context, fn func([]Entry)) context.Context {
	return context.WithValue(ctx, listingProgressKey{}, fn)
}

// ListingProgress is the function WithListingProgress put in ctx, or nil.
func ListingProgress(ctx context.Context) func([]Entry) {
	fn, _ := ctx.Value(listingProgressKey{}).(func([]Entry))
	return fn
}

// ListingExpiry collects when the directory listings answered for one request stop
// being trusted, for a cache above the sources (the kernel's, see package fusefs) that
// must not keep a listing longer than muxfs itself would, and whether any of them came
// from the persistent cache's store (fusefs does not restat those: atime.go). A
// context carries it through every wrapper of a source; the memory cache fills it in.
type ListingExpiry struct {
	mu     sync.Mutex
	at     time.Time
	stored bool
}

type listingExpiryKey struct{}

// WithListingExpiry returns a context under which listings report their expiry to e.
func WithListingExpiry(ctx context.Context, e *ListingExpiry) context.Context {
	return context.WithValue(ctx, listingExpiryKey{}, e)
}

// NoteListingExpiry records, in the ListingExpiry ctx carries if any, that a listing
// answered under ctx is trusted until t.
func NoteListingExpiry(ctx context.Context, t time.Time) {
	e, ok := ctx.Value(listingExpiryKey{}).(*ListingExpiry)
	if !ok {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.at.IsZero() || t.Before(e.at) {
		e.at = t
	}
}

// At is the earliest expiry noted; zero if no listing came from a cache.
func (e *ListingExpiry) At() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.at
}

// NoteListingStored records, in the ListingExpiry ctx carries if any, that a listing
// answered under ctx came from the persistent cache's store (a walk right after a
// remount), not from the server or from memory filled by it in this mount.
func NoteListingStored(ctx context.Context) {
	e, ok := ctx.Value(listingExpiryKey{}).(*ListingExpiry)
	if !ok {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stored = true
}

// Stored reports whether any listing came from the persistent cache's store.
func (e *ListingExpiry) Stored() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stored
}
