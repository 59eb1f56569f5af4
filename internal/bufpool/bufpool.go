// Package bufpool recycles byte buffers in power-of-two sizes from 4 KiB to 1 MiB, so
// that a copy of n bytes holds less than 2n bytes of memory (4 KiB at least) however
// many are held at once — not the largest size any caller might need. A random writer's 4 KiB
// writes each took a 256 KiB copy while they waited for the server's acknowledgement
// and a 1 MiB one while they waited for the persistent cache's writer: up to 1,024 of
// the first per file (256 MiB of memory for 4 MiB of data, the write-behind window
// bounding only the bytes) and 32 of the second.
package bufpool

import (
	"math/bits"
	"sync"
)

const (
	// minBits is the smallest size's: the page size, so that every buffer is aligned
	// for direct I/O (Go allocates objects of 4 KiB and more at page offsets).
	minBits = 12
	maxBits = 20
	// Max is the largest pooled size: a FUSE WRITE carries at most 1 MiB.
	Max = 1 << maxBits
)

var pools [maxBits + 1]sync.Pool

// Get returns a buffer of the smallest pooled size that holds n bytes; its length is
// that whole size. n must be at most Max.
func Get(n int) *[]byte {
	c := max(bits.Len(uint(n-1)), minBits)
	if b, ok := pools[c].Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 1<<c)
	return &b
}

// Put hands b back for reuse, whatever its length, if its capacity is a pooled size
// (a buffer from Get); the garbage collector takes any other. Nothing may use b after.
func Put(b *[]byte) {
	if n := cap(*b); n >= 1<<minBits && n <= Max && n&(n-1) == 0 {
		*b = (*b)[:n]
		pools[bits.Len(uint(n-1))].Put(b)
	}
}

// Copy returns a copy of p (length len(p)) in a pooled buffer with room for at least
// size bytes, or in a buffer of its own if that is more than Max. Release gives it
// back.
func Copy(p []byte, size int) []byte {
	if size = max(size, len(p)); size > Max {
		return append(make([]byte, 0, size), p...)
	}
	return append((*Get(size))[:0], p...)
}

// Append appends p to b, a buffer from Copy, Append or Fit, moving the bytes to a larger
// pooled buffer (and b back to its pool) when p does not fit in b's capacity.
func Append(b, p []byte) []byte {
	if n := len(b) + len(p); n > cap(b) && n <= Max {
		grown := append((*Get(n))[:0], b...)
		Release(b)
		b = grown
	}
	return append(b, p...)
}

// Fit returns b, or — if b fills less than half of a buffer larger than the
// smallest size, room kept for bytes that did not come — a copy in a buffer of its
// own size, b going back to its pool.
func Fit(b []byte) []byte {
	if c := cap(b); c > 1<<minBits && c >= 2*len(b) {
		small := Copy(b, 0)
		Release(b)
		return small
	}
	return b
}

// Release hands b, from Copy, Append or Fit, back for reuse; nothing may use it after.
func Release(b []byte) { Put(&b) }
