package diskcache

import (
	"path/filepath"
	"testing"
)

// TestKnownOrigin: a cache records how its source was given and where it resolved, so
// that a mount that cannot reach the server finds it (cmd/muxfs startOffline).
func TestKnownOrigin(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(dir, Options{}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Store("u@h:22:/home/u/src")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok := c.Known("u@h:22:src"); ok {
		t.Error("known before its origin was recorded")
	}
	if err := st.SetOrigin("u@h:22:src", []string{"/home/u/src"}); err != nil {
		t.Fatal(err)
	}
	c.Close()

	c, err = Open(dir, Options{}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	name, roots, ok := c.Known("u@h:22:src")
	if !ok || name != "u@h:22:/home/u/src" || len(roots) != 1 || roots[0] != "/home/u/src" {
		t.Errorf("Known: %q %v %v", name, roots, ok)
	}
	if _, _, ok := c.Known("u@h:22:other"); ok {
		t.Error("an unknown source was found")
	}
	// Reopening the store keeps the origin; the stats still name the source.
	if _, err := c.Store("u@h:22:/home/u/src"); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := c.Known("u@h:22:src"); !ok {
		t.Error("reopening the store lost its origin")
	}
	if s, _ := ReadStats(filepath.Join(dir, SourceKey("u@h:22:/home/u/src"))); s.Source != "u@h:22:/home/u/src" {
		t.Errorf("stats name %q", s.Source)
	}
}
