package fusefs

import (
	"os"
	"path/filepath"
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
