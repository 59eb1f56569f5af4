package procs

import (
	"context"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

func TestStep(t *testing.T) {
	const d = interval
	share := func(f float64) time.Duration { return time.Duration(f * float64(d)) }
	c := &controller{max: 4, cur: 4}
	// Quiet: one P only after quietFor intervals in a row.
	for i := 1; i < quietFor; i++ {
		if n := c.step(share(0.05), d); n != 4 {
			t.Fatalf("quiet interval %d: %d Ps, want 4 until %d quiet intervals", i, n, quietFor)
		}
	}
	if n := c.step(share(0.05), d); n != 1 {
		t.Fatalf("after %d quiet intervals: %d Ps, want 1", quietFor, n)
	}
	// Between the thresholds: no change either way.
	if n := c.step(share(0.3), d); n != 1 {
		t.Fatalf("moderate load at 1 P: %d Ps, want 1", n)
	}
	// Busy: every P at once.
	if n := c.step(share(0.8), d); n != 4 {
		t.Fatalf("busy: %d Ps, want 4", n)
	}
	// A moderate interval resets the count of quiet ones.
	for i := 1; i < quietFor; i++ {
		c.step(share(0.05), d)
	}
	c.step(share(0.3), d)
	if n := c.step(share(0.05), d); n != 4 {
		t.Fatalf("quiet count not reset by a moderate interval: %d Ps", n)
	}
	// An interval longer than planned (a late tick) is judged by its share.
	c = &controller{max: 2, cur: 1}
	if n := c.step(share(0.8), 4*d); n != 1 {
		t.Fatalf("0.8 interval's CPU over four intervals is 0.2 of a CPU: %d Ps, want 1", n)
	}
}

// TestAdapt drives the loop that applies the controller's verdicts with a made-up
// CPU clock: quiet, the process drops to one P; busy, it gets every P back.
func TestAdapt(t *testing.T) {
	all := runtime.GOMAXPROCS(0)
	if all < 2 {
		t.Skip("needs two CPUs")
	}
	defer runtime.SetDefaultGOMAXPROCS()
	var used atomic.Int64 // the made-up CPU time, in ns
	ticks := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		adapt(ctx, slog.New(slog.DiscardHandler), func() (time.Duration, bool) {
			return time.Duration(used.Load()), true
		}, ticks)
		close(done)
	}()
	defer func() { cancel(); <-done }()
	now := time.Now()
	// tick ends an interval of the given CPU share; the loop has applied its
	// verdict once it takes the next tick.
	tick := func(share float64) {
		now = now.Add(interval)
		used.Add(int64(share * float64(interval)))
		ticks <- now
	}
	for range quietFor {
		tick(0.01)
	}
	tick(0.01)
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Fatalf("quiet: GOMAXPROCS %d, want 1", n)
	}
	tick(0.9)
	tick(0.9)
	if n := runtime.GOMAXPROCS(0); n != all {
		t.Fatalf("busy: GOMAXPROCS %d, want %d", n, all)
	}
}

// TestMovedGivesEveryCPUAtOnce: on one P, burstBytes of data moved within an interval
// give the mount every P before the interval ends; less does not, and the count starts
// over at each tick.
func TestMovedGivesEveryCPUAtOnce(t *testing.T) {
	all := runtime.GOMAXPROCS(0)
	if all < 2 {
		t.Skip("needs two CPUs")
	}
	defer runtime.SetDefaultGOMAXPROCS()
	ticks := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		adapt(ctx, slog.New(slog.DiscardHandler), func() (time.Duration, bool) { return 0, true }, ticks)
		close(done)
	}()
	defer func() { cancel(); <-done }()
	now := time.Now()
	tick := func() {
		now = now.Add(interval)
		ticks <- now
	}
	for range quietFor + 1 {
		tick()
	}
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Fatalf("quiet: GOMAXPROCS %d, want 1", n)
	}
	// Half a burst, a tick, half a burst: never a burst within one interval. The
	// loop has dealt with a tick (and any nudge before it) once it takes the next.
	Moved(burstBytes / 2)
	tick()
	tick()
	Moved(burstBytes / 2)
	tick()
	tick()
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Fatalf("half a burst in each of two intervals: GOMAXPROCS %d, want 1", n)
	}
	Moved(burstBytes)
	deadline := time.Now().Add(5 * time.Second)
	for runtime.GOMAXPROCS(0) != all {
		if time.Now().After(deadline) {
			t.Fatalf("a burst on one P: GOMAXPROCS %d, want %d without a tick", runtime.GOMAXPROCS(0), all)
		}
		time.Sleep(time.Millisecond)
	}
}
