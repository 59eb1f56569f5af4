package backend

import (
	"sync"
	"time"
)

// Pacing a read-ahead to a narrow link. Every byte a stream has in flight beyond what
// the link needs waits in the link's queue, and every other request of the mount waits
// behind it there, whichever session it takes: at 100 Mbit/s with a queue of 1 s, a
// read-ahead of 8 MiB (2 MiB of it in the network: the SSH window) made a listing of
// a directory take 0.26 s at the median and 1.5 s at worst while a big file was read,
// against 0.1 s with 512 KiB in flight, for the same throughput (docs/design.md,
// "Read-ahead on a narrow link"). So a read-ahead, and a write-behind, measure the link
// and keep at most paceGain times its bandwidth-delay product in flight.
//
// Only on a narrow link: one that delivered less than paceMaxRate at best, where the
// SSH window alone queues 50 ms or more. A fast link, however long, keeps its windows:
// there a window above the product still gains, since the two ends work on different
// chunks at once, and what it queues drains in milliseconds. The rate tells a narrow
// link from a fast one; a chunk's latency cannot, since on a busy machine it is mostly
// the two ends' work (at the bench's 2 ms, a 255 KiB chunk took 9 ms at best, at
// 100 Mbit/s 20 ms). A server slower than that (its disk, its CPU) counts as narrow
// too, and loses little: one sftp-server handles a session's requests one at a
// time, and the limit never leaves fewer than two in flight; on a long link its
// writes still stripe (paceWindowBound).

// A narrow link and a long one that is bound by its windows both deliver under
// paceMaxRate; the product of the rate and the shortest latency tells them apart. A
// link bound by OpenSSH's 2 MiB channel window carries about one window per round trip,
// so its product is about a window (2 MB at 200 ms: 10 MB/s times 0.2 s), where the
// narrow workload's link (100 Mbit/s, 20 ms) shows about 0.5 MB. From paceWindowBound
// on, a write stripes (noteWriteLocked) as on a fast link. A link that is narrow as
// well as long (100 Mbit/s at 200 ms shows 2.6 MB) stripes too, and loses little: the
// limit bounds what the file has in flight over all its handles together, so the
// link's queue holds at most half the product, as under a paced read-ahead, and more
// windows gain where the product exceeds one window.
const paceWindowBound = 1 << 20 // half a window: between the two kinds, with room each way

// paceMaxRate is in bytes per second; a variable for tests (those of striping, whose
// pipes to a local sftp-server run at narrow rates under the race detector).
var paceMaxRate = 40e6

const (
	// paceSamples rates are kept, each over the last paceSamples readings of the bytes
	// delivered, taken at least paceEvery apart: a rate spans 80 ms or more, several
	// round trips of a long link whose windows arrive in bursts.
	paceSamples = 8
	paceEvery   = 10 * time.Millisecond
	// paceGain: the product itself would keep the link busy only if the reader asked
	// for the next chunk the moment one arrived; half as much again covers its gaps.
	// At 100 Mbit/s and 20 ms (the bench's narrow workload, three repetitions each) a
	// stat during a read took 68–75 ms with 1×, 72–75 with 1.5× and 105–120 with 2×
	// (sshfs 67–83), the read 11.7–11.9, 11.8–11.9 and 12.0–12.1 MB/s.
	paceGain = 1.5
	// paceMin is the least window a limit leaves: two chunks.
	paceMin = 512 << 10
)

// pace measures the link under a file's read-ahead or write-behind: the shortest time a
// chunk took from its request to its answer (the link's delay plus one chunk's
// transfer, without queueing), and the rate at which the link delivered.
type pace struct {
	mu       sync.Mutex
	minLat   time.Duration
	n        int                    // readings taken
	readings [paceSamples]delivered // the last ones, a ring
	rates    [paceSamples]float64   // bytes per second over the ring, at each of the last readings
}

// delivered is a reading: by at, the link had delivered total bytes.
type delivered struct {
	at    time.Time
	total int64
}

// chunk notes the latency of a chunk (a READ, or a WRITE) sent at sent whose answer
// arrived at at.
func (p *pace) chunk(sent, at time.Time) {
	if sent.IsZero() || at.IsZero() {
		return
	}
	lat := at.Sub(sent)
	p.mu.Lock()
	defer p.mu.Unlock()
	if lat > 0 && (p.minLat == 0 || lat < p.minLat) {
		p.minLat = lat
	}
}

// reading notes that by at the link had delivered total bytes: for a read-ahead, the
// file data its sessions had received; for a write-behind, the bytes the server had
// acknowledged. The total may jump when the sessions change (a striped file gains or
// loses a handle): a rate that jumps up only lifts the limit, one that falls is not
// kept. A reading less than paceEvery after the last is not taken.
func (p *pace) reading(at time.Time, total int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	last := p.readings[(p.n+paceSamples-1)%paceSamples]
	if p.n > 0 && at.Sub(last.at) < paceEvery {
		return
	}
	i := p.n % paceSamples
	p.readings[i] = delivered{at: at, total: total}
	p.n++
	// The ring's oldest reading is the one after the newest.
	first := p.readings[p.n%paceSamples]
	if p.n < paceSamples {
		first = p.readings[0]
	}
	p.rates[i] = 0
	if span := at.Sub(first.at); span > 0 && total > first.total {
		p.rates[i] = float64(total-first.total) / span.Seconds()
	}
}

// limit is the most a stream should have in flight: paceGain times the best rate
// measured lately times the shortest latency, or 0 for no limit — on a fast link, or
// before a rate is known. The best rate, because a gap in the application's requests
// must not shrink the window of a link that is no slower.
func (p *pace) limit() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	best := p.bestLocked()
	if best == 0 || best >= paceMaxRate || p.minLat == 0 {
		return 0
	}
	return int(paceGain * best * p.minLat.Seconds())
}

// windowBound tells whether the link may be bound by its SSH windows rather than by
// its bandwidth: its best rate times its shortest latency is paceWindowBound or more.
func (p *pace) windowBound() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bestLocked()*p.minLat.Seconds() >= paceWindowBound
}

// bestLocked is the best rate measured lately, in bytes per second. The caller holds p.mu.
func (p *pace) bestLocked() float64 {
	best := 0.0
	for _, r := range p.rates[:min(p.n, paceSamples)] {
		best = max(best, r)
	}
	return best
}
