package diskcache

// spans is a set of byte ranges [Off, End) of a file, sorted and disjoint: the parts
// of a remote file held in its cache file.
type spans []span

type span struct {
	Off int64 `json:"o"`
	End int64 `json:"e"`
}

// add includes [off, end), merging with touching or overlapping spans.
func (s spans) add(off, end int64) spans {
	if end <= off {
		return s
	}
	var out spans
	i := 0
	for ; i < len(s) && s[i].End < off; i++ {
		out = append(out, s[i])
	}
	for ; i < len(s) && s[i].Off <= end; i++ {
		off, end = min(off, s[i].Off), max(end, s[i].End)
	}
	out = append(out, span{off, end})
	return append(out, s[i:]...)
}

// covers reports whether [off, end) is wholly present.
func (s spans) covers(off, end int64) bool {
	if end <= off {
		return true
	}
	for _, sp := range s {
		if sp.Off <= off && end <= sp.End {
			return true
		}
		if sp.Off > off {
			return false
		}
	}
	return false
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
