package diskcache

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"time"

	"github.com/muxfs/muxfs/internal/backend"
)

// Listings and attributes are stored in a compact binary form: a walk right after a
// remount decodes one listing per directory, and JSON's decoding was a fifth of the
// mount's CPU time in `find` over a stored tree (docs/design.md, "Persistent cache").
// Values start with a format byte; anything else (the JSON of older versions, a torn
// value) reads as absent, and is fetched and stored again.
const itemFormat = 1

var errCorrupt = errors.New("corrupt cache value")

func appendItem(b []byte, name string, a backend.Attr) []byte {
	b = binary.AppendUvarint(b, uint64(len(name)))
	b = append(b, name...)
	b = binary.AppendUvarint(b, uint64(a.Mode))
	b = binary.AppendVarint(b, a.Size)
	b = binary.AppendUvarint(b, uint64(a.UID))
	b = binary.AppendUvarint(b, uint64(a.GID))
	b = binary.AppendVarint(b, a.Atime.Unix())
	b = binary.AppendVarint(b, a.Mtime.Unix())
	return binary.AppendUvarint(b, uint64(a.Nlink))
}

// decoder reads the fields appendItem wrote; the first malformed field sets err and
// every later read returns zero.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

// varint reads what binary.AppendVarint wrote: a zig-zag encoded uvarint.
func (d *decoder) varint() int64 {
	u := d.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

func (d *decoder) u32() uint32 {
	v := d.uvarint()
	if v > 1<<32-1 {
		d.fail()
	}
	return uint32(v)
}

func (d *decoder) fail() {
	d.err, d.b = errCorrupt, nil
}

func (d *decoder) item() (string, backend.Attr) {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail()
		return "", backend.Attr{}
	}
	name := string(d.b[:n])
	d.b = d.b[n:]
	var a backend.Attr
	a.Mode = d.u32()
	a.Size = d.varint()
	a.UID = d.u32()
	a.GID = d.u32()
	a.Atime = time.Unix(d.varint(), 0)
	a.Mtime = time.Unix(d.varint(), 0)
	a.Nlink = d.u32()
	return name, a
}

// newDecoder checks the format byte of a stored value.
func newDecoder(v []byte) *decoder {
	if len(v) == 0 || v[0] != itemFormat {
		return &decoder{err: errCorrupt}
	}
	return &decoder{b: v[1:]}
}

func encodeListing(list []backend.Entry, at time.Time) []byte {
	b := make([]byte, 0, 16+len(list)*40)
	b = append(b, itemFormat)
	b = binary.AppendVarint(b, at.UnixNano())
	b = binary.AppendUvarint(b, uint64(len(list)))
	for _, e := range list {
		b = appendItem(b, e.Name, e.Attr)
	}
	return b
}

func decodeListing(v []byte) ([]backend.Entry, time.Time, error) {
	d := newDecoder(v)
	at := d.varint()
	n := d.uvarint()
	if n > uint64(len(d.b)) { // every entry takes at least one byte
		d.fail()
	}
	if d.err != nil {
		return nil, time.Time{}, d.err
	}
	out := make([]backend.Entry, n)
	for i := range out {
		out[i].Name, out[i].Attr = d.item()
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, time.Time{}, errCorrupt
	}
	return out, time.Unix(0, at), nil
}

func encodeAttr(a backend.Attr) []byte {
	return appendItem([]byte{itemFormat}, "", a)
}

func decodeAttr(v []byte) (backend.Attr, error) {
	d := newDecoder(v)
	_, a := d.item()
	if d.err != nil || len(d.b) != 0 {
		return backend.Attr{}, errCorrupt
	}
	return a, nil
}

// File records are stored in the same compact form: every open of a cached file reads
// its record, and JSON's decoding was 8% of the mount's CPU time in a `grep -r` of a
// cached tree. Records written as JSON by earlier versions are still read, so an
// upgrade keeps the cache.
func encodeRecord(r record) []byte {
	b := make([]byte, 0, 24+len(r.Spans)*8)
	b = append(b, itemFormat)
	b = binary.AppendVarint(b, r.Size)
	b = binary.AppendVarint(b, r.Mtime)
	b = binary.AppendVarint(b, r.Used)
	b = binary.AppendUvarint(b, uint64(len(r.Spans)))
	for _, s := range r.Spans {
		b = binary.AppendVarint(b, s.Off)
		b = binary.AppendVarint(b, s.End-s.Off)
	}
	if r.Inline {
		b = append(b, 1) // optional last field: records before it end with the spans
	}
	return b
}

func decodeRecord(v []byte) (record, error) {
	var r record
	if len(v) > 0 && v[0] == '{' {
		if err := json.Unmarshal(v, &r); err != nil {
			return record{}, errCorrupt
		}
		if len(r.Spans) == 0 {
			r.Spans = nil // as the binary form reads: nothing cached
		}
		return r, nil
	}
	d := newDecoder(v)
	r.Size = d.varint()
	r.Mtime = d.varint()
	r.Used = d.varint()
	n := d.uvarint()
	if n > uint64(len(d.b)) { // every span takes at least two bytes
		d.fail()
	}
	if d.err != nil {
		return record{}, d.err
	}
	if n > 0 {
		r.Spans = make(spans, n)
	}
	for i := range r.Spans {
		off := d.varint()
		r.Spans[i] = span{Off: off, End: off + d.varint()}
	}
	if d.err == nil && len(d.b) == 1 && d.b[0] == 1 {
		r.Inline, d.b = true, nil
	}
	if d.err != nil || len(d.b) != 0 {
		return record{}, errCorrupt
	}
	return r, nil
}
