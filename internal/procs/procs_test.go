package procs

import (
	"context"
	"log/slog"
	"os"
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

// TestAdapt runs the controller on this process: quiet, it drops to one P; made
// busy, it gets every P back.
func TestAdapt(t *testing.T) {
	max := runtime.GOMAXPROCS(0)
	if max < 2 || os.Getenv("GOMAXPROCS") != "" {
		t.Skip("needs two CPUs and GOMAXPROCS unset")
	}
	defer runtime.SetDefaultGOMAXPROCS()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { Adapt(ctx, slog.New(slog.DiscardHandler)); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor := func(want int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for runtime.GOMAXPROCS(0) != want {
			if time.Now().After(deadline) {
				t.Fatalf("GOMAXPROCS %d after 5 s, want %d", runtime.GOMAXPROCS(0), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor(1)
	// Busy: a goroutine that keeps a CPU to itself.
	var stop atomic.Bool
	defer stop.Store(true)
	go func() {
		for !stop.Load() {
		}
	}()
	waitFor(max)
}
