package backend

import (
	"context"
	"os"
	"sync"
	"time"

	"github.com/muxfs/muxfs/internal/sftp"
)

// Striping. OpenSSH gives a session channel a window of 2 MiB: over a long round trip
// one session carries at most 2 MiB per RTT, whatever the link (95 MB/s at 21 ms), and
// an open file is pinned to one session. A big sequential read over such a link also
// reads through handles of the same file opened on the pool's other sessions, its
// read-ahead chunks dealt round-robin, so that n sessions carry n windows. Below
// stripeMinRTT one window moves more than one ssh process can decrypt, and more
// sessions only add work; small files and random reads never stripe.
var stripeMinRTT = 5 * time.Millisecond // a variable for tests

// A file is striped from its third sequential read (the window doubles at each: 512 KiB,
// 1 MiB, 2 MiB), if it is big enough for the sessions' handshakes to pay.
const (
	stripeMinSize = 32 << 20
	stripeAfter   = 2 << 20
)

// stripe holds the extra handles of a file read through several sessions.
type stripe struct {
	mu sync.Mutex
	// decided: whether the link is slow enough (slow) was asked of the pool once,
	// not at every read.
	decided, slow bool
	extra         []handle
	opening       map[*sftp.Client]bool // sessions an extra handle is being opened on (nil key: choosing one)
	closed        bool
}

// readHandles returns the handles a read-ahead deals its chunks over: h, and the live
// extra handles once the stream is at full window on a file worth it over a slow link;
// more are opened in the background, up to one per session of the pool.
func (f *sftpFile) readHandles(h handle, window int) []handle {
	hs := []handle{h}
	if !f.readOnly || window < stripeAfter || f.opened.Size < stripeMinSize {
		return hs
	}
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	if !f.st.decided {
		rtt := h.m.pool.MinRTT()
		f.st.decided, f.st.slow = true, rtt > 0 && rtt >= stripeMinRTT
	}
	if !f.st.slow {
		return hs
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
	hs = append(hs, live...)
	if f.st.opening == nil {
		f.st.opening = map[*sftp.Client]bool{}
	}
	if !f.st.closed && !f.st.opening[nil] && len(hs)+len(f.st.opening) < h.m.pool.ep.MaxConns {
		f.st.opening[nil] = true
		go f.openExtra(h, hs)
	}
	return hs
}

// openExtra opens the file on a session of h's pool that hs does not use. The new
// handle is kept only if it shows the file as opened (type, owner, size, mtime): an
// open by path may reach another file if the path changed since.
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
	delete(f.st.opening, nil) // the next read may choose another
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
	xh, err := c.Open(ctx, h.m.abs(f.path), openFlags(os.O_RDONLY), sftp.Attrs{})
	if err != nil {
		return
	}
	fa, err := c.Fstat(ctx, xh)
	same := err == nil && fa.Mode == f.lstat.Mode && fa.UID == f.lstat.UID && fa.GID == f.lstat.GID &&
		attrFromSFTP(fa).Size == f.opened.Size && attrFromSFTP(fa).Mtime.Equal(f.opened.Mtime)
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	if !same || f.st.closed {
		c.CloseAsync(xh)
		return
	}
	f.st.extra = append(f.st.extra, handle{m: h.m, c: c, h: xh})
	f.s.striped.Add(1)
}

// closeExtra closes the extra handles; none is opened after.
func (f *sftpFile) closeExtra() {
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	f.st.closed = true
	for _, x := range f.st.extra {
		x.c.CloseAsync(x.h)
	}
	f.st.extra = nil
}
