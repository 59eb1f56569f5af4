package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseCPU(t *testing.T) {
	c, ok := parseCPU("cpu  1822921 40915 2505282 5505114 363485 0 184151 703775 0 0")
	if !ok || c.steal != 703775 || c.total != 1822921+40915+2505282+5505114+363485+184151+703775 {
		t.Errorf("parsed %+v, %v", c, ok)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7 8", "cpu 1 2 3", "cpu 1 2 3 4 5 6 7 x"} {
		if _, ok := parseCPU(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
	if s := stealShare(cpuTimes{10, 1000}, cpuTimes{60, 2000}); s != 5 {
		t.Errorf("share %v, want 5", s)
	}
}

// fakeSteal is a clock whose measurements see the given steal shares in turn: each
// measurement reads it twice, and 1,000 ticks pass between the two readings.
func fakeSteal(shares ...float64) func() (cpuTimes, bool) {
	var now cpuTimes
	calls := 0
	return func() (cpuTimes, bool) {
		if calls%2 == 1 {
			now.total += 1000
			now.steal += uint64(shares[calls/2] * 10)
		}
		calls++
		return now, true
	}
}

// TestSteady: a measurement during which the host took more than the limit is taken
// again, at most retakes times, and the one with the least steal is kept.
func TestSteady(t *testing.T) {
	for _, c := range []struct {
		name     string
		shares   []float64
		runs     int
		kept     float64 // the value of the run kept (its index)
		steal    float64
		retakens int
	}{
		{"quiet", []float64{1}, 1, 0, 1, 0},
		{"second quiet", []float64{20, 3}, 2, 1, 3, 1},
		{"never quiet: the least steal", []float64{20, 8, 10}, 3, 1, 8, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := &bench{results: newStore(), maxSteal: 5, retakes: 2, stealClock: fakeSteal(c.shares...)}
			runs := 0
			res, steal, err := b.steady("0s untar muxfs rep 1", func() ([]result, error) {
				runs++
				return []result{{"untar", "files/s", float64(runs - 1), true}}, nil
			})
			if err != nil || runs != c.runs || len(res) != 1 || res[0].value != c.kept || steal != c.steal || b.results.retaken != c.retakens {
				t.Errorf("runs %d, kept %v, steal %v, retaken %d, err %v; want runs %d, kept %v, steal %v, retaken %d",
					runs, res, steal, b.results.retaken, err, c.runs, c.kept, c.steal, c.retakens)
			}
		})
	}
	b := &bench{results: newStore(), maxSteal: 0, retakes: 2, stealClock: fakeSteal(50)}
	if _, steal, _ := b.steady("x", func() ([]result, error) { return nil, nil }); steal != 50 || b.results.retaken != 0 {
		t.Errorf("-max-steal 0 retook a measurement (steal %v, retaken %d)", steal, b.results.retaken)
	}
}

// TestStealBudget: once waiting and retaking have taken longer than the measurements
// kept (and the grace), a busy host's measurements are kept as they come.
func TestStealBudget(t *testing.T) {
	b := &bench{results: newStore(), maxSteal: 5, retakes: 2, stealClock: fakeSteal(20, 20, 20, 20, 20)}
	run := func() ([]result, error) { time.Sleep(10 * time.Millisecond); return nil, nil }
	b.steady("first", run)
	if b.results.retaken != 2 || b.results.stealGaveUp {
		t.Fatalf("first measurement: retaken %d, gave up %v", b.results.retaken, b.results.stealGaveUp)
	}
	b.stealSpent += stealGrace // as if the waits for the host had taken that long
	if _, steal, _ := b.steady("second", run); steal != 20 || b.results.retaken != 2 || !b.results.stealGaveUp {
		t.Fatalf("second measurement: steal %v, retaken %d, gave up %v", steal, b.results.retaken, b.results.stealGaveUp)
	}
	b.steady("third", run)
	if b.results.retaken != 2 {
		t.Errorf("a measurement was retaken after giving up (retaken %d)", b.results.retaken)
	}
}

// TestStealFromLog: a page written from a run's log gives the steal of the
// measurements kept and how many were taken again, as the run's own page does.
func TestStealFromLog(t *testing.T) {
	s := loadLines(t, "07:00:00 max steal: 5%, 2 retakes\n"+
		"07:00:10 0s untar muxfs rep 1 retaken, steal 19.2%: untar=337files/s rm -rf=9.7s\n"+
		"07:00:40 0s untar muxfs rep 1: untar=574files/s rm -rf=8.06s (steal 0.2%)\n"+
		"07:00:50 0s untar muxfs rep 2 not kept, steal 9.0%: untar=300files/s rm -rf=9.1s\n"+
		"07:01:40 0s untar sshfs rep 1: untar=190files/s rm -rf=10.1s (steal 3.1%)\n"+
		"07:09:00 waiting for the host and retaking have taken 7m19s against 1m49s of measurements kept: "+gaveUpText+"\n")
	if v, ok := s.med(0, "untar", "untar", "muxfs"); !ok || v != 574 {
		t.Errorf("muxfs untar read back as %v (%v): an attempt not kept counted", v, ok)
	}
	if s.retaken != 1 || len(s.steal) != 2 || s.maxSteal != 5 || !s.stealGaveUp {
		t.Errorf("read back retaken %d, steal %v, limit %v, gave up %v", s.retaken, s.steal, s.maxSteal, s.stealGaveUp)
	}
	want := "median 1.7%, at most 3.1%; 1 measurement was taken again because the host took more than 5% of the machine; the host stayed busy, and waiting"
	if page := pageOf(t, s); !strings.Contains(page, want) {
		t.Errorf("the page has no %q:\n%s", want, page)
	}
}

// TestProbeSteal: the probe runs and ends, and its share is a share.
func TestProbeSteal(t *testing.T) {
	s, err := probeSteal(50 * time.Millisecond)
	if err != nil || s < 0 || s > 100 {
		t.Errorf("probe: %v, %v", s, err)
	}
}
