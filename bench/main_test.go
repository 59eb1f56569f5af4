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
