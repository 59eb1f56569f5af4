package diskcache

import (
	"slices"
	"sort"
)

// spans is a set of byte ranges [Off, End) of a file, sorted and disjoint: the parts
// of a remote file held in its cache file.
type spans []span

type span struct {
	Off int64 `json:"o"`
	End int64 `json:"e"`
}

// add includes [off, end), merging with touching or overlapping spans, and returns
// the set and how many bytes it gained. Binary search and an in-place replace: random
// reads and writes build thousands of spans, and the gain comes from the spans
// replaced, not from a sum over all of them (which a random writer paid twice per
// write).
func (s spans) add(off, end int64) (spans, int64) {
	if end <= off {
		return s, 0
	}
	// s[i:j] are the spans that touch or overlap [off, end).
	i := sort.Search(len(s), func(k int) bool { return s[k].End >= off })
	j := sort.Search(len(s), func(k int) bool { return s[k].Off > end })
	if i < j {
		off, end = min(off, s[i].Off), max(end, s[j-1].End)
	}
	gained := end - off
	for _, sp := range s[i:j] {
		gained -= sp.End - sp.Off
	}
	return slices.Replace(s, i, j, span{off, end}), gained
}

// covers reports whether [off, end) is wholly present.
func (s spans) covers(off, end int64) bool {
	if end <= off {
		return true
	}
	// The last span starting at or before off is the only one that can hold it.
	i := sort.Search(len(s), func(k int) bool { return s[k].Off > off }) - 1
	return i >= 0 && end <= s[i].End
}

// clip drops everything at or beyond size (a truncate).
func (s spans) clip(size int64) spans {
	var out spans
	for _, sp := range s {
		if sp.Off >= size {
			break
		}
		out = append(out, span{sp.Off, min(sp.End, size)})
	}
	return out
}

// bytes is the number of bytes present.
func (s spans) bytes() int64 {
	var n int64
	for _, sp := range s {
		n += sp.End - sp.Off
	}
	return n
}
