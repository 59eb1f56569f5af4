package diskcache

import (
	"reflect"
	"testing"
	"time"

	"github.com/muxfs/muxfs/internal/backend"
)

func TestListingEncoding(t *testing.T) {
	at := time.Unix(1700000000, 123456789)
	list := []backend.Entry{
		{Name: "a.go", Attr: backend.Attr{Mode: 0o100644, Size: 1234, UID: 1000, GID: 1000,
			Atime: time.Unix(1600000000, 0), Mtime: time.Unix(1650000000, 0), Nlink: 1}},
		{Name: "dir with spaces", Attr: backend.Attr{Mode: 0o40755, Size: 4096,
			Atime: time.Unix(0, 0), Mtime: time.Unix(-5, 0)}},
		{Name: "big", Attr: backend.Attr{Mode: 0o100600, Size: 1<<63 - 1, UID: 1<<32 - 1,
			Atime: time.Unix(1, 0), Mtime: time.Unix(2, 0)}},
	}
	v := encodeListing(list, at)
	got, gotAt, err := decodeListing(v)
	if err != nil || !gotAt.Equal(at) || !reflect.DeepEqual(got, list) {
		t.Fatalf("round trip: %v %v\n%+v\nwant\n%+v", err, gotAt, got, list)
	}
	// Every truncation and a trailing byte are refused, never half-read.
	for i := range v {
		if _, _, err := decodeListing(v[:i]); err == nil {
			t.Fatalf("truncated at %d of %d: accepted", i, len(v))
		}
	}
	if _, _, err := decodeListing(append(v, 0)); err == nil {
		t.Fatal("trailing byte accepted")
	}
	// The JSON of earlier versions reads as absent.
	if _, _, err := decodeListing([]byte(`{"t":1,"e":[]}`)); err == nil {
		t.Fatal("old JSON value accepted")
	}
	a := list[0].Attr
	if got, err := decodeAttr(encodeAttr(a)); err != nil || !reflect.DeepEqual(got, a) {
		t.Fatalf("attr round trip: %v %+v", err, got)
	}
}

func FuzzDecodeListing(f *testing.F) {
	f.Add(encodeListing([]backend.Entry{{Name: "x", Attr: backend.Attr{Mode: 0o100644, Size: 3}}}, time.Unix(5, 0)))
	f.Add([]byte{itemFormat, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, v []byte) {
		list, at, err := decodeListing(v)
		if err != nil {
			return
		}
		// Whatever decodes must encode back to the same bytes' meaning.
		again, at2, err := decodeListing(encodeListing(list, at))
		if err != nil || !at.Equal(at2) || len(again) != len(list) {
			t.Fatalf("re-encode: %v", err)
		}
		decodeAttr(v) //nolint:errcheck // must only not panic
	})
}

func TestRecordEncoding(t *testing.T) {
	r := record{Size: 1 << 40, Mtime: 1700000000123456789, Used: 1700000000,
		Spans: spans{{Off: 0, End: 4096}, {Off: 1 << 20, End: 1<<20 + 255<<10}}}
	v := encodeRecord(r)
	got, err := decodeRecord(v)
	if err != nil || !reflect.DeepEqual(got, r) {
		t.Fatalf("round trip: %v %+v", err, got)
	}
	for i := range v {
		if _, err := decodeRecord(v[:i]); err == nil {
			t.Fatalf("truncated at %d of %d: accepted", i, len(v))
		}
	}
	if _, err := decodeRecord(append(v, 0)); err == nil {
		t.Fatal("trailing byte accepted")
	}
	// A record whose bytes the database holds says so in an optional last field.
	in := r
	in.Inline = true
	if got, err := decodeRecord(encodeRecord(in)); err != nil || !reflect.DeepEqual(got, in) {
		t.Fatalf("inline round trip: %v %+v", err, got)
	}
	if _, err := decodeRecord(append(encodeRecord(in), 1)); err == nil {
		t.Fatal("byte after the inline field accepted")
	}
	// Records of earlier versions (JSON) are still read: an upgrade keeps the cache.
	old, err := decodeRecord([]byte(`{"s":10,"m":5,"r":[{"o":0,"e":10}],"u":7}`))
	if err != nil || !reflect.DeepEqual(old, record{Size: 10, Mtime: 5, Used: 7, Spans: spans{{0, 10}}}) {
		t.Fatalf("old JSON record: %v %+v", err, old)
	}
	if _, err := decodeRecord([]byte(`{"s":`)); err == nil {
		t.Fatal("torn JSON record accepted")
	}
	empty, err := decodeRecord(encodeRecord(record{Size: 0, Mtime: 1}))
	if err != nil || empty.Spans != nil {
		t.Fatalf("record without spans: %v %+v", err, empty)
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(encodeRecord(record{Size: 3, Mtime: 1, Spans: spans{{0, 3}}}))
	f.Add([]byte(`{"s":1,"r":[{"o":0,"e":1}]}`))
	f.Fuzz(func(t *testing.T, v []byte) {
		r, err := decodeRecord(v)
		if err != nil {
			return
		}
		again, err := decodeRecord(encodeRecord(r))
		if err != nil || !reflect.DeepEqual(again, r) {
			t.Fatalf("re-encode: %v %+v, want %+v", err, again, r)
		}
	})
}
