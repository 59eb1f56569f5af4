package fusefs

import (
	"context"
	"io"
	"os"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/muxfs/muxfs/internal/backend"
)

// openFlags keeps the open(2) flags a backend acts on; the kernel has dealt with the
// rest (O_CREAT and O_EXCL arrive through Create, O_NOFOLLOW through lookup).
func openFlags(flags uint32) int {
	return int(flags) & (os.O_RDONLY | os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC | os.O_EXCL)
}

func writes(flags int) bool {
	return flags&(os.O_WRONLY|os.O_RDWR) != 0 || flags&os.O_TRUNC != 0
}

var _ = (fs.NodeOpener)((*node)(nil))

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	ctx = uninterruptible(ctx)
	_, l, rel, errno := n.where()
	if errno != 0 {
		return nil, 0, errno
	}
	branch, _, _ := n.state()
	if branch < 0 || l == nil {
		return nil, 0, syscall.EISDIR
	}
	b := l.Branches[branch]
	fl := openFlags(flags)
	if writes(fl) && b.ReadOnly {
		return nil, 0, syscall.EROFS
	}
	f, err := b.Backend.Open(ctx, rel, fl, 0)
	if err != nil {
		return nil, 0, n.fsys.toErrno(err)
	}
	return &fileHandle{f: f, n: n}, 0, 0
}

// fileHandle is an open file. Every write is acknowledged by the server before it
// returns, so flush and close have nothing left to wait for.
type fileHandle struct {
	f backend.File
	n *node
}

var _ = (fs.FileReader)((*fileHandle)(nil))

func (h *fileHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	ctx = uninterruptible(ctx)
	n, err := h.f.ReadAt(ctx, dest, off)
	if err != nil && err != io.EOF && n == 0 {
		return nil, h.n.fsys.toErrno(err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

var _ = (fs.FileWriter)((*fileHandle)(nil))

func (h *fileHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	ctx = uninterruptible(ctx)
	n, err := h.f.WriteAt(ctx, data, off)
	if err != nil {
		return uint32(n), h.n.fsys.toErrno(err)
	}
	return uint32(n), 0
}

var _ = (fs.FileFlusher)((*fileHandle)(nil))

// Flush is close(2): every write was acknowledged when it returned, so there is nothing
// left to wait for and no late error to report.
func (h *fileHandle) Flush(ctx context.Context) syscall.Errno { return 0 }

var _ = (fs.FileFsyncer)((*fileHandle)(nil))

func (h *fileHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	ctx = uninterruptible(ctx)
	return h.n.fsys.toErrno(h.f.Sync(ctx))
}

var _ = (fs.FileReleaser)((*fileHandle)(nil))

func (h *fileHandle) Release(ctx context.Context) syscall.Errno {
	ctx = uninterruptible(ctx)
	return h.n.fsys.toErrno(h.f.Close(ctx))
}
