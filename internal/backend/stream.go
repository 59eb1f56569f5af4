package backend

import (
	"context"
	"io"
	"sync"

	"github.com/muxfs/muxfs/internal/sftp"
)

// Sizes of the windows that keep a stream's requests in flight. One SSH channel carries
// about 2 MiB at a time, so a few MiB per file keep the link busy without letting one
// file hog a session; the write window is bounded because an unbounded one overloads
// OpenSSH's sftp-server (design.md: 750 IOPS with sshfs' unbounded writes).
const (
	readAheadStart = 512 << 10
	readAheadMax   = 8 << 20
	writeWindow    = 8 << 20
)

// writeBehind sends a file's writes without waiting for each acknowledgement, up to
// writeWindow bytes in flight. The first failure is kept and returned by the next
// write, flush, fsync or close, so no error is ever lost; flush returns only once the
// server has acknowledged everything.
type writeBehind struct {
	mu      sync.Mutex
	pending []pendingWrite
	bytes   int
	err     error
}

type pendingWrite struct {
	w *sftp.PendingWrite
	n int
}

// add queues an acknowledged-later write and waits for the oldest ones while the window
// is full.
func (wb *writeBehind) add(ctx context.Context, w *sftp.PendingWrite, n int) error {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	wb.pending = append(wb.pending, pendingWrite{w, n})
	wb.bytes += n
	for wb.bytes > writeWindow {
		wb.waitOldest(ctx)
	}
	return wb.err
}

func (wb *writeBehind) waitOldest(ctx context.Context) {
	p := wb.pending[0]
	wb.pending = wb.pending[1:]
	wb.bytes -= p.n
	if err := p.w.Wait(ctx); err != nil && wb.err == nil {
		wb.err = err
	}
}

// failed returns the first write error so far, without waiting.
func (wb *writeBehind) failed() error {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	return wb.err
}

// flush waits for every write in flight and returns the first error, once: after it
// is reported, the file is usable again.
func (wb *writeBehind) flush(ctx context.Context) error {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	for len(wb.pending) > 0 {
		wb.waitOldest(ctx)
	}
	err := wb.err
	wb.err = nil
	return err
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
}

type raChunk struct {
	off  int64
	size int
	pr   *sftp.PendingRead
	once sync.Once
	data []byte
	err  error
}

// wait returns the chunk's data, collecting the answer once.
func (c *raChunk) wait(ctx context.Context) ([]byte, error) {
	c.once.Do(func() {
		buf := make([]byte, c.size)
		n, err := c.pr.Wait(ctx, buf)
		c.data, c.err = buf[:n], err
	})
	return c.data, c.err
}

// sequentialSlack is how far from the stream's position a read still counts as part of
// it.
const sequentialSlack = 1 << 20

func (ra *readAhead) dropLocked() {
	for _, c := range ra.chunks {
		go c.wait(context.Background()) //nolint:errcheck // abandoned read-ahead must still be collected
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
func (f *sftpFile) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	n, err := f.readAt(ctx, p, off)
	// The open's identity check is collected after the reads were sent (its answer
	// comes first), but before any data is returned.
	if cerr := f.checked(ctx); cerr != nil {
		return 0, f.s.fail(ctx, "read", f.path, cerr, nil)
	}
	return n, err
}

func (f *sftpFile) readAt(ctx context.Context, p []byte, off int64) (int, error) {
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
	var err error
	if n < len(p) && !atEOF {
		var m int
		m, err = f.readDirect(ctx, p[n:], off+int64(n))
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
		ra.chunks = ra.chunks[1:]
	}
	if near {
		ra.fillLocked(f)
	}
	if err != nil && n == 0 {
		return 0, f.s.fail(ctx, "read", f.path, err, nil)
	}
	return n, nil
}

// fillLocked grows the window and requests chunks up to next+window.
func (ra *readAhead) fillLocked(f *sftpFile) {
	if ra.window == 0 {
		ra.window = readAheadStart
	} else {
		ra.window = min(ra.window*2, readAheadMax)
	}
	from := ra.next
	if k := len(ra.chunks); k > 0 {
		from = max(from, ra.chunks[k-1].off+int64(ra.chunks[k-1].size))
		if ra.chunks[k-1].off+int64(ra.chunks[k-1].size) < ra.next {
			ra.dropLocked() // the stream overtook the chunks
			ra.window = readAheadStart
			from = ra.next
		}
	}
	step := f.c.MaxRead
	for ; from < ra.next+int64(ra.window); from += int64(step) {
		if ra.eofAt >= 0 && from >= ra.eofAt {
			return
		}
		pr, err := f.c.StartRead(f.h, step, from)
		if err != nil {
			return
		}
		ra.chunks = append(ra.chunks, &raChunk{off: from, size: step, pr: pr})
	}
}
