package fusefs

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

func TestInodeTable(t *testing.T) {
	tab := newInodeTable()
	a := tab.get(0, "dir/a")
	if a == rootIno || tab.get(0, "dir/a") != a {
		t.Fatal("numbers must be stable and never the root's")
	}
	if tab.get(1, "dir/a") == a {
		t.Error("the same path on two sources must get two numbers")
	}
	dir := tab.get(0, "dir")
	tab.move(0, "dir", "moved")
	if tab.get(0, "moved") != dir || tab.get(0, "moved/a") != a {
		t.Error("a rename must carry the directory's and its children's numbers")
	}
	if tab.get(0, "dir/a") == a {
		t.Error("the old path must not keep the number")
	}
	tab.forget(0, "moved/a")
	if tab.get(0, "moved/a") == a {
		t.Error("a forgotten (deleted) path must get a new number")
	}
	tab.alias(0, "moved/hardlink", dir)
	if tab.get(0, "moved/hardlink") != dir {
		t.Error("alias")
	}
}

// TestInodeHashUnchanged: a path's number is what earlier versions gave it (FNV-1a of
// the source as 8 little-endian bytes, then the path), or every tracked file of a git
// checkout on the mount would be read again after an upgrade.
func TestInodeHashUnchanged(t *testing.T) {
	for _, c := range []struct {
		source int
		rel    string
	}{{0, ""}, {0, "src/main.go"}, {3, "a"}, {-1, "junction/dir"}, {1 << 40, "ä/ö"}} {
		h := fnv.New64a()
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], uint64(c.source))
		h.Write(b[:])
		h.Write([]byte(c.rel))
		if want, got := h.Sum64()&^(1<<63), hashIno(c.source, c.rel); got != want {
			t.Errorf("source %d, %q: %d, want %d", c.source, c.rel, got, want)
		}
	}
}

// TestInodeGetIn: a listing's numbers, taken a directory at a time, are those get
// gives each path, in the root and below it, for new names, names seen before and a
// name whose hash was handed out already; and only changes that can move a number
// count as moves.
func TestInodeGetIn(t *testing.T) {
	byPath, byDir := newInodeTable(), newInodeTable()
	// A number already given to another file: the path must get one from the counter.
	taken := hashIno(0, "d/taken")
	byPath.used[taken], byDir.used[taken] = struct{}{}, struct{}{}
	want := map[string]uint64{}
	for _, p := range []string{"d/seen", "d/taken", "d/new", "top", "d"} {
		want[p] = byPath.get(0, p)
	}
	byDir.get(0, "d/seen")
	moves := byDir.movesNow()
	for _, c := range []struct {
		dir   string
		names []string
	}{{"d", []string{"seen", "taken", "new"}}, {"", []string{"top", "d"}}} {
		inos := make([]uint64, len(c.names))
		byDir.getIn(0, c.dir, c.names, inos)
		for k, name := range c.names {
			p := name
			if c.dir != "" {
				p = c.dir + "/" + name
			}
			if inos[k] != want[p] {
				t.Errorf("%q: %d by directory, %d by path", p, inos[k], want[p])
			}
			if byDir.get(0, p) != inos[k] {
				t.Errorf("%q: getIn's number is not the table's", p)
			}
		}
	}
	if want["d/taken"] == taken {
		t.Error("a hash handed out before was given again")
	}
	if byDir.moved(moves) {
		t.Error("taking numbers counted as a move")
	}
	for _, change := range []func(){
		func() { byDir.move(0, "d/new", "d/newer") },
		func() { byDir.forget(0, "top") },
		func() { byDir.alias(0, "d/link", want["d/seen"]) },
	} {
		change()
		if !byDir.moved(moves) {
			t.Error("a rename, delete or link was not counted as a move")
		}
		moves = byDir.movesNow()
	}
}

// TestInodeNumbersSurviveRemounts: a fresh table (the next mount) gives each path the
// number the last one gave it, as long as nothing took it first; a number is never
// given to two paths, also when a path comes back after a rename or a delete (the
// file that had its number may still be open).
func TestInodeNumbersSurviveRemounts(t *testing.T) {
	paths := []string{"", "src", "src/main.go", "src/go.mod", ".git", ".git/index"}
	first, next := newInodeTable(), newInodeTable()
	numbers := map[string]uint64{}
	for _, p := range paths {
		for source := range 2 {
			numbers[fmt.Sprint(source, p)] = first.get(source, p)
		}
	}
	// The next mount meets the paths in another order.
	for _, p := range slices.Backward(paths) {
		for source := range 2 {
			if n := next.get(source, p); n != numbers[fmt.Sprint(source, p)] {
				t.Errorf("source %d, %q: %d in one mount, %d in the next", source, p, numbers[fmt.Sprint(source, p)], n)
			}
		}
	}
	given := map[uint64]bool{}
	for _, n := range numbers {
		given[n] = true
	}
	// made is a new file at p: it must get a number never given in this mount.
	made := func(p string) {
		if n := first.get(0, p); given[n] {
			t.Errorf("new %q got %d, a number given before", p, n)
		} else {
			given[n] = true
		}
	}
	first.move(0, ".git/index", ".git/index.old")
	made(".git/index")
	first.forget(0, "src/main.go")
	made("src/main.go")
	first.move(0, "src", "src.old")
	made("src")
	made("src/go.mod")
}

// TestRootLinkCount: the root is never looked up, so its link count is not known
// from a listing; it must still show one, never 0 (a deleted file's count).
func TestRootLinkCount(t *testing.T) {
	root, local := localDir(t)
	for _, d := range []string{"a", "b", "c"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mp, _ := mountLogged(t, local)
	var st unix.Stat_t
	if err := unix.Stat(mp, &st); err != nil {
		t.Fatal(err)
	}
	if st.Nlink != 5 {
		t.Errorf("the root's link count is %d, want the source's 5", st.Nlink)
	}
}
