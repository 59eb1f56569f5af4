package linksim

import (
	"bytes"
	"io"
	"testing"
	"time"
)

// TestCopy: the data arrives whole, no sooner than its delay, and no faster than the
// rate lets it.
func TestCopy(t *testing.T) {
	want := bytes.Repeat([]byte("muxfs"), 200<<10) // 1 MB
	for _, c := range []struct {
		bps   float64
		delay time.Duration
		least time.Duration
	}{
		{0, 50 * time.Millisecond, 50 * time.Millisecond},
		{10e6, 0, 90 * time.Millisecond}, // 1 MB at 10 MB/s, less the first piece
	} {
		r, w := io.Pipe()
		go func() {
			w.Write(want) //nolint:errcheck // the reader takes it all
			w.Close()
		}()
		var got bytes.Buffer
		start := time.Now()
		Copy(&got, r, c.bps, c.delay)
		if took := time.Since(start); took < c.least {
			t.Errorf("rate %g, delay %v: took %v, want at least %v", c.bps, c.delay, took, c.least)
		}
		if !bytes.Equal(got.Bytes(), want) {
			t.Errorf("rate %g, delay %v: %d bytes arrived, not the %d sent", c.bps, c.delay, got.Len(), len(want))
		}
	}
}
