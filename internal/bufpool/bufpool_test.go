package bufpool

import (
	"bytes"
	"testing"
	"unsafe"
)

// TestSizes: a buffer comes in the smallest pooled size that holds it, aligned for
// direct I/O, and comes back from its pool whole whatever length it was put with.
func TestSizes(t *testing.T) {
	for _, tc := range []struct{ n, want int }{
		{1, 4096}, {4096, 4096}, {4097, 8192}, {200 << 10, 256 << 10},
		{256 << 10, 256 << 10}, {Max - 1, Max}, {Max, Max},
	} {
		b := Get(tc.n)
		if len(*b) != tc.want || cap(*b) != tc.want {
			t.Errorf("buffer for %d bytes: len %d, cap %d; want %d", tc.n, len(*b), cap(*b), tc.want)
		}
		if a := uintptr(unsafe.Pointer(&(*b)[0])) % 4096; a != 0 {
			t.Errorf("buffer for %d bytes is %d bytes off a page", tc.n, a)
		}
		*b = (*b)[:1]
		Put(b)
		if again := Get(tc.n); len(*again) != tc.want {
			t.Errorf("pooled buffer for %d bytes came back with len %d", tc.n, len(*again))
		}
	}
}

// TestCopyAndAppend: a copy holds its bytes in a buffer of about their size, and
// appending keeps every byte while the buffer grows through the sizes.
func TestCopyAndAppend(t *testing.T) {
	p := bytes.Repeat([]byte("0123456789abcdef"), 256) // 4 KiB
	if b := Copy(p[:100], 200<<10); cap(b) != 256<<10 || !bytes.Equal(b, p[:100]) {
		t.Fatalf("copy of 100 bytes with room for 200 KiB: cap %d, equal %v", cap(b), bytes.Equal(b, p[:100]))
	}
	b := Copy(p[:100], 0)
	if cap(b) != 4096 || !bytes.Equal(b, p[:100]) {
		t.Fatalf("copy of 100 bytes: cap %d, equal %v", cap(b), bytes.Equal(b, p[:100]))
	}
	var want []byte
	want = append(want, p[:100]...)
	for range 70 {
		b = Append(b, p)
		want = append(want, p...)
		if !bytes.Equal(b, want) {
			t.Fatalf("after appending to %d bytes the contents differ", len(want))
		}
		if len(b) <= Max && cap(b) >= 2*len(b) {
			t.Fatalf("%d bytes held in a buffer of %d", len(b), cap(b))
		}
	}
	Release(b)
	roomy := Copy(p[:3000], 64<<10)
	if fit := Fit(roomy); cap(fit) != 4096 || !bytes.Equal(fit, p[:3000]) {
		t.Fatalf("3000 bytes in 64 KiB fitted into cap %d, equal %v", cap(fit), bytes.Equal(fit, p[:3000]))
	}
	if full := Copy(p, 0); cap(Fit(full)) != 4096 {
		t.Fatal("a full buffer was moved")
	}
	if big := Copy(make([]byte, Max+1), 0); len(big) != Max+1 {
		t.Fatalf("copy beyond Max: len %d", len(big))
	}
}
