package main

import (
	"fmt"
	"slices"
	"testing"
)

func TestInTurn(t *testing.T) {
	systems := []system{{name: "a"}, {name: "b"}, {name: "c"}}
	var got []string
	inTurn(systems, 3, func(sys system, rep int) bool {
		got = append(got, fmt.Sprintf("%s%d", sys.name, rep))
		return !(sys.name == "b" && rep == 0) // b fails in its first repetition
	}, func(rep int) { got = append(got, fmt.Sprintf("|%d", rep)) })
	want := []string{"a0", "b0", "c0", "|0", "c1", "a1", "|1", "c2", "a2", "|2"}
	if !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v (every system once per repetition, turned by one, a failed one not again)", got, want)
	}
}

// TestCheckPartialOut: a run of part of the bench must name where its report goes;
// the complete run, a rig and a report from a log need not.
func TestCheckPartialOut(t *testing.T) {
	set := func(names ...string) map[string]bool {
		m := map[string]bool{}
		for _, n := range names {
			m[n] = true
		}
		return m
	}
	for _, c := range []struct {
		given []string
		ok    bool
	}{
		{nil, true},
		{[]string{"reps", "max-steal"}, true},
		{[]string{"workloads"}, false},
		{[]string{"systems", "out"}, false},
		{[]string{"rtt", "charts"}, false},
		{[]string{"workloads", "systems", "rtt", "out", "charts"}, true},
		{[]string{"serve", "rtt"}, true},
		{[]string{"from-log", "rtt"}, true},
	} {
		if err := checkPartialOut(set(c.given...)); (err == nil) != c.ok {
			t.Errorf("flags %v: %v, want ok=%v", c.given, err, c.ok)
		}
	}
}
