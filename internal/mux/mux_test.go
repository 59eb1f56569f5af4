package mux

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/muxfs/muxfs/internal/backend"
	"github.com/muxfs/muxfs/internal/config"
)

// layer makes a layer over n fresh local directories.
func layer(t *testing.T, n int, policy string) (*Layer, []string) {
	t.Helper()
	l := &Layer{Path: "/", Policy: policy}
	var dirs []string
	for i := 0; i < n; i++ {
		d := t.TempDir()
		b, err := backend.NewLocal(d)
		if err != nil {
			t.Fatal(err)
		}
		l.Branches = append(l.Branches, &Branch{ID: i, Backend: b})
		dirs = append(dirs, d)
	}
	return l, dirs
}

// fixedFree is a branch whose file system reports free bytes.
type fixedFree struct {
	backend.Backend
	free uint64
}

func (f fixedFree) Statfs(context.Context, string) (backend.Statfs, error) {
	return backend.Statfs{Bsize: 1, Bavail: f.free}, nil
}

func put(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestResolve(t *testing.T) {
	l, d := layer(t, 3, config.PolicyEPFF)
	put(t, d[1]+"/f")
	put(t, d[2]+"/f")
	put(t, d[0]+"/dir/a")
	put(t, d[2]+"/dir/b")
	put(t, d[1]+"/dir") // a file named like the others' directory
	ctx := context.Background()
	f, err := l.Resolve(ctx, "f")
	if err != nil || f.Index != 1 || f.Dirs != nil {
		t.Errorf("f: %+v %v", f, err)
	}
	f, err = l.Resolve(ctx, "dir")
	if err != nil || f.Index != 0 || len(f.Dirs) != 2 || f.Dirs[0] != 0 || f.Dirs[1] != 2 {
		t.Errorf("dir: %+v %v (want merged from 0 and 2)", f, err)
	}
	if _, err := l.Resolve(ctx, "none"); err != syscall.ENOENT {
		t.Errorf("missing: %v", err)
	}
}

func TestPlace(t *testing.T) {
	ctx := context.Background()
	t.Run("epff", func(t *testing.T) {
		l, _ := layer(t, 3, config.PolicyEPFF)
		l.Branches[0].ReadOnly = true
		if i, err := l.Place(ctx, "p", []int{0, 2}); err != nil || i != 2 {
			t.Errorf("got %d %v, want 2 (first writable with the parent)", i, err)
		}
		if _, err := l.Place(ctx, "p", []int{0}); err != syscall.EROFS {
			t.Errorf("parent only on a read-only branch: %v, want EROFS", err)
		}
		l.Branches[2].NoCreate = true
		if _, err := l.Place(ctx, "p", []int{0, 2}); err != syscall.EROFS {
			t.Errorf("parent on read-only and no-create branches: %v, want EROFS", err)
		}
	})
	t.Run("ff creates the parent path with its modes", func(t *testing.T) {
		l, d := layer(t, 2, config.PolicyFF)
		if err := os.MkdirAll(d[1]+"/a/b", 0o700); err != nil {
			t.Fatal(err)
		}
		os.Chmod(d[1]+"/a", 0o750) //nolint:errcheck
		i, err := l.Place(ctx, "a/b", []int{1})
		if err != nil || i != 0 {
			t.Fatalf("got %d %v", i, err)
		}
		for p, mode := range map[string]os.FileMode{"/a": 0o750, "/a/b": 0o700} {
			st, err := os.Stat(d[0] + p)
			if err != nil || st.Mode().Perm() != mode {
				t.Errorf("%s on branch 0: %v %v, want mode %v", p, err, st, mode)
			}
		}
	})
	t.Run("mfs and epmfs", func(t *testing.T) {
		l, _ := layer(t, 2, config.PolicyMFS)
		// Fixed free space: two directories of one file system report what it has
		// at each call, and other tests running meanwhile change it.
		free := func(a, b uint64) {
			for i, n := range []uint64{a, b} {
				br := l.Branches[i]
				if f, ok := br.Backend.(fixedFree); ok {
					br.Backend = f.Backend
				}
				br.Backend = fixedFree{br.Backend, n}
			}
		}
		free(100, 100)
		if i, err := l.Place(ctx, "", []int{0, 1}); err != nil || i != 0 {
			t.Errorf("mfs tie: %d %v, want the first", i, err)
		}
		free(100, 200)
		if i, err := l.Place(ctx, "", []int{0, 1}); err != nil || i != 1 {
			t.Errorf("mfs with more free on 1: %d %v", i, err)
		}
		l.Policy = config.PolicyEPMFS
		if i, err := l.Place(ctx, "", []int{1}); err != nil || i != 1 {
			t.Errorf("epmfs with the parent only on 1: %d %v", i, err)
		}
	})
}

func TestTable(t *testing.T) {
	l1, _ := layer(t, 1, config.PolicyEPFF)
	l2, _ := layer(t, 1, config.PolicyEPFF)
	l3, _ := layer(t, 1, config.PolicyEPFF)
	l1.Path, l2.Path, l3.Path = "/", "/a/b", "/FOO"
	tab, err := NewTable([]*Layer{l2, l3, l1})
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]struct {
		layer *Layer
		rel   string
	}{"/": {l1, ""}, "/x/y": {l1, "x/y"}, "/a": {l1, "a"}, "/a/b": {l2, ""}, "/a/b/c": {l2, "c"}, "/FOOBAR": {l1, "FOOBAR"}, "/FOO/z": {l3, "z"}} {
		l, rel := tab.Enclosing(p)
		if l != want.layer || rel != want.rel {
			t.Errorf("Enclosing(%s) = %s %q", p, l.Path, rel)
		}
	}
	if !tab.Junction("/a") || !tab.Junction("/a/b") || tab.Junction("/a/b/c") || tab.Junction("/x") {
		t.Error("junctions wrong")
	}
	if got := tab.JunctionChildren("/"); len(got) != 2 {
		t.Errorf("junction children of /: %v", got)
	}
	if _, err := NewTable([]*Layer{l1, {Path: "/", Branches: l1.Branches}}); err == nil {
		t.Error("duplicate path accepted")
	}
	if _, err := NewTable([]*Layer{{Path: "/x/", Branches: l1.Branches}}); err == nil {
		t.Error("unclean path accepted")
	}
}
