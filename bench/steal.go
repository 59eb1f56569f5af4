package main

import (
	"errors"
	"fmt"
	"log"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The bench machine is a virtual machine, and its host takes CPU time from it in
// spells: /proc/stat's "steal", the time a virtual CPU wanted to run and the host ran
// something else. Untarring 5,338 files onto muxfs (the bench rig, 2026-11-26), the
// same binary ran at 522–624 files/s while the host took under 2% of the machine and
// at 168–337 files/s while it took 19–41% (bench/README.md, "Steal"). Such a
// measurement is of the host, not of the systems compared, and one of them in three
// repetitions moves a median past a target's margin. So every measurement records the
// steal during it, and one during which the host took more than maxSteal is taken
// again, the same rule for every system.

// cpuTimes are the machine's CPU counters from /proc/stat, in clock ticks.
type cpuTimes struct{ steal, total uint64 }

// readCPU reads the first line of /proc/stat: "cpu user nice system idle iowait irq
// softirq steal guest guest_nice". Guest time is already inside user and nice.
func readCPU() (cpuTimes, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, false
	}
	return parseCPU(strings.SplitN(string(b), "\n", 2)[0])
}

func parseCPU(line string) (cpuTimes, bool) {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return cpuTimes{}, false
	}
	var t cpuTimes
	for i, s := range f[1:9] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return cpuTimes{}, false
		}
		t.total += v
		if i == 7 {
			t.steal = v
		}
	}
	return t, true
}

// stealShare is the share of the machine's time, in percent, that the host took
// between a and b.
func stealShare(a, b cpuTimes) float64 {
	if b.total <= a.total || b.steal < a.steal {
		return 0
	}
	return 100 * float64(b.steal-a.steal) / float64(b.total-a.total)
}

// steady runs one measurement, f, once the host is quiet (waitQuiet), and takes it
// again (up to b.retakes times) while the host took more than b.maxSteal percent of
// the machine during it. It returns the results of the attempt with the least steal,
// and that steal (-1 if unknown); a failed attempt is returned at once, as it is.
//
// Waiting and retaking stop for the rest of the run once they have taken longer than
// the measurements kept plus stealGrace: a host that stays busy makes the run at most
// about twice as long, and its measurements are then kept as they come (their steal
// still logged).
func (b *bench) steady(name string, f func() ([]result, error)) ([]result, float64, error) {
	var best []result
	bestShare := math.Inf(1)
	var bestTook time.Duration
	clock, quiet := readCPU, b.waitQuiet
	if b.stealClock != nil { // tests
		clock, quiet = b.stealClock, func() {}
	}
	start := time.Now()
	overBudget := func(extra time.Duration) bool {
		if !b.results.stealGaveUp && b.maxSteal > 0 && b.stealSpent+extra > b.measured+stealGrace {
			b.results.stealGaveUp = true
			log.Printf("waiting for the host and retaking have taken %v against %v of measurements kept: %s",
				(b.stealSpent + extra).Round(time.Second), b.measured.Round(time.Second), gaveUpText)
		}
		return b.results.stealGaveUp
	}
	defer func() {
		b.stealSpent += time.Since(start) - bestTook
		b.measured += bestTook
		overBudget(0)
	}()
	for attempt := 0; ; attempt++ {
		if b.maxSteal > 0 && !b.results.stealGaveUp {
			quiet()
		}
		t0 := time.Now()
		before, ok1 := clock()
		res, err := f()
		after, ok2 := clock()
		took := time.Since(t0)
		if err != nil {
			bestTook = took
			return res, 0, err
		}
		if !ok1 || !ok2 {
			bestTook = took
			return res, -1, nil // no /proc/stat: nothing to judge by
		}
		share := stealShare(before, after)
		kept := share < bestShare
		if kept {
			best, bestShare, bestTook = res, share, took
		}
		if b.maxSteal <= 0 || share <= b.maxSteal || attempt >= b.retakes || overBudget(time.Since(start)-bestTook) {
			if !kept {
				log.Printf("%s not kept, steal %.1f%%: %s", name, share, summary(res))
			}
			return best, bestShare, nil
		}
		b.results.retaken++
		log.Printf("%s retaken, steal %.1f%%: %s", name, share, summary(res))
	}
}

// gaveUpText ends the log line of a run that stopped waiting and retaking.
const gaveUpText = "from now on measurements are kept as they come"

// stealGrace: how much longer than the measurements kept waiting for the host and
// retaking may take in a run before they stop (steady).
const stealGrace = 5 * time.Minute

// waitQuiet waits, at most quietMax, until a one-second probe sees the host take at
// most half of maxSteal. The probe wakes one thread from another as fast as it can:
// the steal shows in wake-ups (a virtual CPU that halted waits for the host to run it
// again), which is what file systems do most. A probe that kept every CPU busy saw
// 0–0.5% during a spell in which this one saw 14–30% and an untar 22–31%.
func (b *bench) waitQuiet() {
	start := time.Now()
	for {
		s, err := probeSteal(time.Second)
		if err != nil || s <= b.maxSteal/2 {
			break
		}
		if time.Since(start) >= quietMax {
			log.Printf("the host still takes %.1f%% of the machine after %v: measuring anyway", s, quietMax)
			return
		}
		time.Sleep(4 * time.Second)
	}
	if waited := time.Since(start); waited > 2*time.Second {
		log.Printf("waited %v for the host's steal to pass", waited.Round(time.Second))
	}
}

const quietMax = 3 * time.Minute

// probeSteal passes a byte back and forth between two threads through pipes for d
// and returns the steal during it.
func probeSteal(d time.Duration) (float64, error) {
	var ping, pong [2]int
	if err := syscall.Pipe(ping[:]); err != nil {
		return 0, err
	}
	if err := syscall.Pipe(pong[:]); err != nil {
		syscall.Close(ping[0])
		syscall.Close(ping[1])
		return 0, err
	}
	defer func() {
		for _, fd := range []int{ping[0], pong[0], pong[1]} {
			syscall.Close(fd)
		}
	}()
	echoed := make(chan struct{})
	go func() {
		// Threads of their own, so that every pass is a wake-up of another thread
		// and not a hand-over inside the Go scheduler.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		buf := make([]byte, 1)
		for {
			if n, err := syscall.Read(ping[0], buf); n != 1 || err != nil {
				close(echoed) // the end: ping's writing end was closed
				return
			}
			if _, err := syscall.Write(pong[1], buf); err != nil {
				close(echoed)
				return
			}
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, ok1 := readCPU()
	buf := []byte{1}
	for end := time.Now().Add(d); time.Now().Before(end); {
		if _, err := syscall.Write(ping[1], buf); err != nil {
			break
		}
		if _, err := syscall.Read(pong[0], buf); err != nil {
			break
		}
	}
	after, ok2 := readCPU()
	syscall.Close(ping[1])
	<-echoed
	if !ok1 || !ok2 {
		return 0, errors.New("no /proc/stat")
	}
	return stealShare(before, after), nil
}

// stealSuffix is what a measurement's log line adds about the steal during it.
func stealSuffix(steal float64) string {
	if steal < 0 {
		return ""
	}
	return fmt.Sprintf(" (steal %.1f%%)", steal)
}

// stealNote is the report's sentence on the host's steal during the run.
func (s *store) stealNote() string {
	if len(s.steal) == 0 {
		return ""
	}
	note := fmt.Sprintf("Steal (the CPU time the host of this virtual machine took from it, /proc/stat) during the measurements kept: median %.1f%%, at most %.1f%%", median(s.steal), slices.Max(s.steal))
	if s.retaken > 0 {
		what := fmt.Sprintf("%d measurements were", s.retaken)
		if s.retaken == 1 {
			what = "1 measurement was"
		}
		note += fmt.Sprintf("; %s taken again because the host took more than %s of the machine", what, s.maxStealText())
	}
	if s.stealGaveUp {
		note += "; the host stayed busy, and waiting for it and retaking stopped partway through the run, after which measurements were kept as they came"
	}
	return note + " (see bench/README.md, \"Steal\").\n\n"
}

func (s *store) maxStealText() string {
	if s.maxSteal > 0 {
		return strconv.FormatFloat(s.maxSteal, 'g', -1, 64) + "%"
	}
	return "the limit (-max-steal)"
}
