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
// "Read-ahead on a narrow link"). So a read-ahead measures the link and keeps at most paceGain times its
// bandwidth-delay product in flight.
//
// Only on a narrow link: one that delivered less than paceMaxRate at best, where the
// SSH window alone queues 50 ms or more. A fast link, however long, keeps its windows:
// there a window above the product still gains, since the two ends work on different
// chunks at once, and what it queues drains in milliseconds. The rate tells a narrow
// link from a fast one; a chunk's latency cannot, since on a busy machine it is mostly
// the two ends' work (at the bench's 2 ms, a 255 KiB chunk took 9 ms at best, at
// 100 Mbit/s 20 ms).
const (
	paceMaxRate = 40e6 // bytes per second
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
)

// pace measures the link under a file's read-ahead: the shortest time a chunk took from
// its request to its last byte (the link's delay plus one chunk's transfer, without
// queueing), and the rate at which its sessions received file data.
type pace struct {
	mu       sync.Mutex
	minLat   time.Duration
	n        int                    // readings taken
	readings [paceSamples]delivered // the last ones, a ring
	rates    [paceSamples]float64   // bytes per second over the ring, at each of the last readings
}

// delivered is a reading: by at, the sessions had received total bytes of file data.
type delivered struct {
	at    time.Time
	total int64
}

// chunk notes the latency of a chunk requested at sent whose answer arrived at at.
func (p *pace) chunk(sent, at time.Time) {
	lat := at.Sub(sent)
	p.mu.Lock()
	defer p.mu.Unlock()
	if lat > 0 && (p.minLat == 0 || lat < p.minLat) {
		p.minLat = lat
	}
}

// limit takes a reading — by now the read-ahead's sessions have received total bytes of
// file data — and returns the most the read-ahead should have in flight: paceGain
// times the best rate measured lately times the shortest latency, or 0 for no limit — on a fast
// link, or before a rate is known. The best rate, because a gap in the reader's
// requests (the application was busy) must not shrink the window of a link that is no
// slower. The total may jump when the sessions change (a striped file gains or loses
// a handle): a rate that jumps up only lifts the limit, one that falls is not kept.
func (p *pace) limit(now time.Time, total int64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	last := p.readings[(p.n+paceSamples-1)%paceSamples]
	if p.n == 0 || now.Sub(last.at) >= paceEvery {
		i := p.n % paceSamples
		p.readings[i] = delivered{at: now, total: total}
		p.n++
		// The ring's oldest reading is the one after the newest.
		first := p.readings[p.n%paceSamples]
		if p.n < paceSamples {
			first = p.readings[0]
		}
		p.rates[i] = 0
		if span := now.Sub(first.at); span > 0 && total > first.total {
			p.rates[i] = float64(total-first.total) / span.Seconds()
		}
	}
	best := 0.0
	for _, r := range p.rates[:min(p.n, paceSamples)] {
		best = max(best, r)
	}
	if best == 0 || best >= paceMaxRate || p.minLat == 0 {
		return 0
	}
	return int(paceGain * best * p.minLat.Seconds())
}
