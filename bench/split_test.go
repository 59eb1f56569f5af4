package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSplitTree: each file of the tree is in exactly one member, every directory in
// both, and the whole tree beside them; a symlink is linked as itself.
func TestSplitTree(t *testing.T) {
	root := t.TempDir()
	tree := filepath.Join(root, "tree")
	files := []string{"f1", "f2", "d/f3", "d/e/f4", "d/e/f5"}
	for _, f := range files {
		p := filepath.Join(tree, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(tree, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f1", filepath.Join(tree, "d", "l")); err != nil {
		t.Fatal(err)
	}
	files = append(files, "d/l")
	union := filepath.Join(root, "union")
	if err := splitTree(tree, union); err != nil {
		t.Fatal(err)
	}
	exists := func(p string) bool { _, err := os.Lstat(p); return err == nil }
	in := map[string]int{}
	for _, f := range files {
		for _, m := range []string{"a", "b"} {
			if exists(filepath.Join(union, m, "tree", f)) {
				in[m]++
				if exists(filepath.Join(union, otherMember(m), "tree", f)) {
					t.Errorf("%s in both members", f)
				}
			}
		}
		if !exists(filepath.Join(union, "tree", f)) {
			t.Errorf("%s missing from the whole tree", f)
		}
	}
	if in["a"]+in["b"] != len(files) || in["a"] == 0 || in["b"] == 0 {
		t.Errorf("files per member: %v, want all %d split between both", in, len(files))
	}
	for _, d := range []string{"tree", "tree/d", "tree/d/e", "tree/empty"} {
		for _, m := range []string{"a", "b", ""} {
			if st, err := os.Stat(filepath.Join(union, m, d)); err != nil || !st.IsDir() {
				t.Errorf("directory %s missing from member %q", d, m)
			}
		}
	}
	if target, err := os.Readlink(filepath.Join(union, "tree", "d", "l")); err != nil || target != "f1" {
		t.Errorf("symlink: %q %v", target, err)
	}
}

func otherMember(m string) string {
	if m == "a" {
		return "b"
	}
	return "a"
}
