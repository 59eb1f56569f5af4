package fusefs

import "testing"

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
