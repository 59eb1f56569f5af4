package fusefs

import (
	"fmt"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// fakeDirs stands in for go-fuse's bridge: directories of n entries each, handles
// with a position, counts of opens and releases.
type fakeDirs struct {
	fuse.RawFileSystem
	size    int
	next    uint64
	pos     map[uint64]uint64 // open handle -> next offset
	opens   int
	reloads int // reads at offset 0 (a listing taken afresh)
}

func (f *fakeDirs) OpenDir(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	f.next++
	f.opens++
	f.pos[f.next] = 0
	out.Fh = f.next
	return fuse.OK
}

func (f *fakeDirs) ReadDirPlus(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	if _, ok := f.pos[in.Fh]; !ok {
		panic(fmt.Sprintf("unknown handle %d", in.Fh))
	}
	if in.Offset == 0 {
		f.reloads++
	}
	off := in.Offset
	for off < uint64(f.size) {
		if out.AddDirLookupEntry(fuse.DirEntry{Name: fmt.Sprintf("e%d", off), Off: off + 1}) == nil {
			break
		}
		off++
	}
	f.pos[in.Fh] = off
	return fuse.OK
}

func (f *fakeDirs) ReleaseDir(in *fuse.ReleaseIn) {
	if _, ok := f.pos[in.Fh]; !ok {
		panic(fmt.Sprintf("release of unknown handle %d", in.Fh))
	}
	delete(f.pos, in.Fh)
}

// readAll reads directory id to its end as the kernel does without OPENDIR (Fh 0),
// in requests of size bytes, and returns the number of entries and requests.
func readAll(d *dirless, id uint64, size uint32) (entries, requests int) {
	off := uint64(0)
	for {
		out := fuse.NewDirEntryList(make([]byte, size), off)
		if st := d.ReadDirPlus(nil, &fuse.ReadIn{InHeader: fuse.InHeader{NodeId: id}, Offset: off, Size: size}, out); st != fuse.OK {
			panic(st)
		}
		requests++
		if out.Offset == off {
			return entries, requests
		}
		entries += int(out.Offset - off)
		off = out.Offset
	}
}

func TestDirless(t *testing.T) {
	f := &fakeDirs{size: 100, pos: map[uint64]uint64{}}
	fsys := &FS{}
	supported := true
	d := newDirless(f, fsys, func() bool { return supported })

	if st := d.OpenDir(nil, &fuse.OpenIn{}, &fuse.OpenOut{}); st != fuse.ENOSYS || !fsys.noOpendir.Load() {
		t.Fatalf("OPENDIR on a kernel with NO_OPENDIR: %v (noOpendir %v), want ENOSYS", st, fsys.noOpendir.Load())
	}

	// A listing larger than one request is read through one handle, closed at its end.
	n, reqs := readAll(d, 7, 1024)
	if n != 100 || reqs < 3 {
		t.Fatalf("read %d entries in %d requests, want 100 in several", n, reqs)
	}
	if f.opens != 1 || len(f.pos) != 0 || len(d.cursors) != 0 {
		t.Fatalf("opens %d, handles left open %d, cursors %d: want one handle, closed at the end", f.opens, len(f.pos), len(d.cursors))
	}

	// A reader that stops early leaves its handle; the next listing from offset 0
	// takes a fresh one and closes the old.
	out := fuse.NewDirEntryList(make([]byte, 1024), 0)
	d.ReadDirPlus(nil, &fuse.ReadIn{InHeader: fuse.InHeader{NodeId: 7}, Size: 1024}, out)
	if len(f.pos) != 1 {
		t.Fatalf("abandoned listing: %d handles open, want 1", len(f.pos))
	}
	reloads := f.reloads
	if n, _ := readAll(d, 7, 1024); n != 100 || f.reloads != reloads+1 || len(f.pos) != 0 {
		t.Fatalf("listing again: %d entries, %d reloads (want 1), %d handles open (want 0)", n, f.reloads-reloads, len(f.pos))
	}

	// Abandoned listings of many directories: at most maxCursors handles stay open.
	for id := uint64(100); id < 100+2*maxCursors; id++ {
		out := fuse.NewDirEntryList(make([]byte, 1024), 0)
		d.ReadDirPlus(nil, &fuse.ReadIn{InHeader: fuse.InHeader{NodeId: id}, Size: 1024}, out)
	}
	if len(f.pos) != maxCursors || len(d.cursors) != maxCursors {
		t.Fatalf("%d handles open, %d cursors: want %d", len(f.pos), len(d.cursors), maxCursors)
	}

	// A handle from a real OPENDIR (Fh != 0) is used as it is.
	var open fuse.OpenOut
	f.OpenDir(nil, &fuse.OpenIn{}, &open)
	opens := f.opens
	out = fuse.NewDirEntryList(make([]byte, 1024), 0)
	d.ReadDirPlus(nil, &fuse.ReadIn{InHeader: fuse.InHeader{NodeId: 9}, Fh: open.Fh, Size: 1024}, out)
	if f.opens != opens || f.pos[open.Fh] == 0 {
		t.Fatal("a READDIRPLUS with a handle must go to that handle")
	}

	// An older kernel gets the bridge's OPENDIR: ENOSYS would reach applications.
	supported = false
	fsys.noOpendir.Store(false)
	if st := d.OpenDir(nil, &fuse.OpenIn{}, &fuse.OpenOut{}); st != fuse.OK || fsys.noOpendir.Load() {
		t.Fatalf("OPENDIR on a kernel without NO_OPENDIR: %v, want the bridge's answer", st)
	}
}
