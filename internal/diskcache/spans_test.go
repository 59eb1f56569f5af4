package diskcache

import (
	"math/rand"
	"testing"
)

// TestSpansAgainstBitmap checks add, covers and clip against a byte-per-byte model.
func TestSpansAgainstBitmap(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for round := 0; round < 200; round++ {
		const size = 200
		var s spans
		var model [size]bool
		for op := 0; op < 30; op++ {
			a, b := int64(rng.Intn(size)), int64(rng.Intn(size))
			if a > b {
				a, b = b, a
			}
			if rng.Intn(8) == 0 {
				s = s.clip(a)
				for i := a; i < size; i++ {
					model[i] = false
				}
				continue
			}
			var gained, fresh int64
			s, gained = s.add(a, b)
			for i := a; i < b; i++ {
				if !model[i] {
					fresh++
				}
				model[i] = true
			}
			if gained != fresh {
				t.Fatalf("add(%d,%d) gained %d bytes, model %d: %v", a, b, gained, fresh, s)
			}
			for i := 1; i < len(s); i++ {
				if s[i-1].End >= s[i].Off {
					t.Fatalf("spans not disjoint and sorted: %v", s)
				}
			}
			var n int64
			for _, v := range model {
				if v {
					n++
				}
			}
			if s.bytes() != n {
				t.Fatalf("bytes %d, model %d: %v", s.bytes(), n, s)
			}
			c, d := int64(rng.Intn(size)), int64(rng.Intn(size))
			if c > d {
				c, d = d, c
			}
			want := true
			for i := c; i < d; i++ {
				want = want && model[i]
			}
			if s.covers(c, d) != want {
				t.Fatalf("covers(%d,%d) = %v, model %v: %v", c, d, !want, want, s)
			}
		}
	}
}
