package fusefs

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// serverFileMounted mounts a local directory (the server) with attributes cached by
// the kernel for no time, and puts in it a file named name holding content, an hour
// old. It returns the file's path on the server and the mount point.
func serverFileMounted(t *testing.T, name, content string) (p, mp string) {
	t.Helper()
	root, local := localDir(t)
	mp, _ = mountLoggedWith(t, local, Options{EntryTimeout: time.Minute})
	p = filepath.Join(root, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(p, old, old) //nolint:errcheck
	return p, mp
}

// TestChangeSeenByStatThenOpen: a file changed on the server (same size, new mtime)
// after the mount read it is read anew at the next open (close-to-open), also when a
// stat between has already shown the kernel its new attributes: the kernel does not
// drop a file's pages when its attributes change (muxfs controls them, explicitly),
// so the open must still find the change.
func TestChangeSeenByStatThenOpen(t *testing.T) {
	p, mp := serverFileMounted(t, "f", "old content")
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

// TestGrowthSeenThroughOpenDescriptor: a reader that follows a file through one
// descriptor (`tail -f`) while it grows on the server reads the new bytes once a
// stat shows the new size — not the zeros the kernel's last page held past the old
// end, which it keeps whatever size it is told unless muxfs drops it.
func TestGrowthSeenThroughOpenDescriptor(t *testing.T) {
	p, mp := serverFileMounted(t, "log", "line 0\n")
	f, err := os.Open(filepath.Join(mp, "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64)
	if n, err := f.Read(buf); err != nil || string(buf[:n]) != "line 0\n" {
		t.Fatalf("first read: %q, %v", buf[:n], err)
	}
	w, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.WriteString("line 1\n") //nolint:errcheck
	w.Close()
	if st, err := f.Stat(); err != nil || st.Size() != 14 {
		t.Fatalf("stat after the growth: %v, %v", st, err)
	}
	if n, err := f.Read(buf); err != nil || string(buf[:n]) != "line 1\n" {
		t.Errorf("read after the growth: %q, %v; want %q", buf[:n], err, "line 1\n")
	}
}
