// Package linksim passes a byte stream through a simulated network link, for tests:
// no faster than its rate, each piece arriving its delay after the link passed it.
// This kernel has no netem, and a test must not depend on one.
package linksim

import (
	"io"
	"time"
)

// Copy copies src to dst at bps bytes per second at most (0: no limit), each piece
// arriving delay after the link has passed it, until src ends or dst fails. Pieces
// are read while earlier ones are still delayed, as a link carries a round trip's
// worth of data at once.
func Copy(dst io.Writer, src io.Reader, bps float64, delay time.Duration) {
	type piece struct {
		data []byte
		at   time.Time
	}
	pieces := make(chan piece, 4096)
	go func() {
		defer close(pieces)
		var free time.Time // when the link has passed what it was given
		for {
			buf := make([]byte, 64<<10)
			n, err := src.Read(buf)
			if n > 0 {
				passed := time.Now()
				if bps > 0 {
					free = later(free, passed).Add(time.Duration(float64(n) / bps * float64(time.Second)))
					time.Sleep(time.Until(free))
					passed = free
				}
				pieces <- piece{buf[:n], passed.Add(delay)}
			}
			if err != nil {
				return
			}
		}
	}()
	for p := range pieces {
		time.Sleep(time.Until(p.at))
		if _, err := dst.Write(p.data); err != nil {
			return
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
