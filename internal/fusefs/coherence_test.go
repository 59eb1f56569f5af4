package fusefs

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestChangeSeenByStatThenOpen: a file changed on the server (same size, new mtime)
// after the mount read it is read anew at the next open (close-to-open), also when a
// stat between has already shown the kernel its new attributes: the kernel does not
// drop a file's pages when its attributes change (muxfs controls them, explicitly),
// so the open must still find the change.
func TestChangeSeenByStatThenOpen(t *testing.T) {
	root, local := localDir(t)
	mp, _ := mountLoggedWith(t, local, Options{EntryTimeout: time.Minute})
	p := filepath.Join(root, "f")
	if err := os.WriteFile(p, []byte("old content"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(p, old, old) //nolint:errcheck
	if b, err := os.ReadFile(filepath.Join(mp, "f")); err != nil || string(b) != "old content" {
		t.Fatalf("first read: %q, %v", b, err)
	}
	if err := os.WriteFile(p, []byte("new content"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mp, "f")); err != nil { // GETATTR: the new mtime
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(mp, "f")); err != nil || string(b) != "new content" {
		t.Errorf("after the server's change and a stat, the mount read %q (%v), want %q", b, err, "new content")
	}
}
