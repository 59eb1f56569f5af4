// Package procs sets how many CPUs the mount's Go code may use at once (GOMAXPROCS)
// from how busy the mount is: one while it is quiet, all of them while it is busy.
//
// Why: go-fuse reads each request from /dev/fuse with a blocking read(2), and a
// goroutine blocked in a system call keeps its P (the runtime's right to run Go
// code). While one P sits in such a read and another is idle, the runtime's monitor
// thread (sysmon) does not take it back for 10 ms, and until then it wakes every
// 20–70 µs to look again; every FUSE request that ends a quiet spell starts this
// over. On a two-CPU virtual machine that monitor took half of muxfs' CPU time in a
// build through the mount (docs/design.md, "The Go runtime's monitor thread"). With a
// single P there is no idle P to wait for: the monitor takes the P back at its next
// look and then sleeps until a request wakes it, so it wakes less than half as often
// (about 4,800 times against 12,000 in a build) and muxfs' CPU time in the build fell
// by a third to a half. It still polls around each request's blocking reads, which
// only reading /dev/fuse through the runtime's poller (a fork of go-fuse) would end.
// A single P also caps what muxfs can do in parallel — decrypting several
// sessions' streams, answering many requests at once — so the controller gives the
// mount every CPU back as soon as it uses more than half of one, and at once when data
// starts to stream through it (Moved).
package procs

import (
	"context"
	"log/slog"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
)

// Thresholds, as the share of one CPU that the process used over an interval. The
// gap between them keeps a load near either from switching at every interval.
const (
	interval = 250 * time.Millisecond
	busyAt   = 0.5 // above: every CPU, at the next interval
	quietAt  = 0.2 // below for quietFor in a row: one CPU
	quietFor = 4   // intervals (one second)
)

// burstBytes of file data read or written through the mount within one interval give
// it every CPU at once (Moved), without waiting for the interval's end. A stream that
// starts on a quiet mount — a copy, a sequential read or write — ran its first quarter
// to half second on one P, until the next tick or the one after saw the CPU it used;
// a 128 MiB copy at 0 ms lasts less than a second here. A build does not move that
// much in an interval (docs/design.md, "The Go runtime's monitor thread").
const burstBytes = 4 << 20

// What Moved and the loop share: whether the mount runs on one P, the bytes moved
// since the last tick, and a nudge to the loop (it alone sets GOMAXPROCS).
var (
	single atomic.Bool
	moved  atomic.Int64
	burst  = make(chan struct{}, 1)
)

// Moved counts n bytes of file data read or written through the mount; on one P, a
// burst of them gives the mount every CPU at once.
func Moved(n int) {
	if !single.Load() {
		return
	}
	if moved.Add(int64(n)) >= burstBytes {
		select {
		case burst <- struct{}{}:
		default:
		}
	}
}

// controller decides; adapt feeds it the process' CPU time and applies its verdicts.
type controller struct {
	max   int // the runtime's default: what a busy mount gets
	cur   int
	quiet int // intervals in a row below quietAt
}

// busy gives every P back at once.
func (c *controller) busy() int {
	c.quiet = 0
	c.cur = c.max
	return c.cur
}

// step takes the CPU time the process used during the last interval of length d and
// returns the number of Ps to run with.
func (c *controller) step(used, d time.Duration) int {
	share := float64(used) / float64(d)
	switch {
	case share > busyAt:
		c.busy()
	case share < quietAt:
		c.quiet++
		if c.quiet >= quietFor {
			c.cur = 1
		}
	default:
		c.quiet = 0
	}
	return c.cur
}

// Adapt runs until ctx ends, setting GOMAXPROCS as the package comment explains. It
// does nothing when the user set GOMAXPROCS in the environment, or when there is one
// CPU anyway.
func Adapt(ctx context.Context, log *slog.Logger) {
	if os.Getenv("GOMAXPROCS") != "" || runtime.GOMAXPROCS(0) <= 1 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	adapt(ctx, log, cpuTime, t.C)
}

// adapt applies the controller's verdicts at every tick, from the CPU time cpu reports.
func adapt(ctx context.Context, log *slog.Logger, cpu func() (time.Duration, bool), ticks <-chan time.Time) {
	c := &controller{max: runtime.GOMAXPROCS(0)}
	c.cur = c.max
	last, ok := cpu()
	if !ok {
		return
	}
	before := time.Now()
	defer single.Store(false)
	apply := func(was, n int, why string) {
		if n == was {
			return
		}
		// A change stops the world for a moment; the hysteresis makes it rare.
		if n == 1 {
			runtime.GOMAXPROCS(1)
			// A nudge sent as the last switch up was made belongs to that burst.
			select {
			case <-burst:
			default:
			}
		} else {
			// The default again, and the runtime's own updates of it (a container's
			// CPU limit changing) with it.
			runtime.SetDefaultGOMAXPROCS()
			c.max = runtime.GOMAXPROCS(0)
			c.cur = c.max
		}
		single.Store(c.cur == 1)
		log.Debug("GOMAXPROCS", "from", was, "to", c.cur, "why", why)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-burst:
			if was := c.cur; was == 1 {
				apply(was, c.busy(), "data streaming")
			}
		case now := <-ticks:
			used, ok := cpu()
			if !ok {
				return
			}
			moved.Store(0)
			was := c.cur
			apply(was, c.step(used-last, now.Sub(before)), "CPU used")
			last, before = used, now
		}
	}
}

// cpuTime is the CPU time (user and system) the process has used so far.
func cpuTime() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
