package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
)

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

func readString(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// TestUnionMergeShadowDedup: three servers; names merge, each is listed once even when
// it sits on the second and third server (sshfsm lists those twice), and the first
// server holding a name wins.
func TestUnionMergeShadowDedup(t *testing.T) {
	e := newEnv(t, 3)
	writeFile(t, e.data[0]+"/a.txt", "a")
	writeFile(t, e.data[0]+"/shadow.txt", "from 0")
	writeFile(t, e.data[0]+"/common/x0", "x0")
	writeFile(t, e.data[0]+"/kind", "a file on 0")
	writeFile(t, e.data[1]+"/b.txt", "b")
	writeFile(t, e.data[1]+"/shadow.txt", "from 1")
	writeFile(t, e.data[1]+"/only12.txt", "from 1")
	writeFile(t, e.data[1]+"/common/x1", "x1 from 1")
	writeFile(t, e.data[1]+"/kind/inside", "a dir on 1")
	writeFile(t, e.data[2]+"/c.txt", "c")
	writeFile(t, e.data[2]+"/only12.txt", "from 2")
	writeFile(t, e.data[2]+"/common/x1", "x1 from 2")
	writeFile(t, e.data[2]+"/common/x2", "x2")
	mp := e.mount(e.source(0, ""), e.source(1, ""), e.source(2, ""))

	if got, want := strings.Join(names(t, mp), " "), "a.txt b.txt c.txt common kind only12.txt shadow.txt"; got != want {
		t.Errorf("root listing: got %q, want %q", got, want)
	}
	// ls in a separate process, counting lines: each name exactly once.
	out := run(t, "ls -1a "+mp+"/common")
	if got, want := strings.Fields(out), []string{".", "..", "x0", "x1", "x2"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("merged dir listing: got %q, want %q", got, want)
	}
	for p, want := range map[string]string{
		"shadow.txt": "from 0", "only12.txt": "from 1", "common/x1": "x1 from 1", "kind": "a file on 0",
	} {
		if got := readString(t, filepath.Join(mp, p)); got != want {
			t.Errorf("%s: got %q, want %q", p, got, want)
		}
	}
	// ls -l shows attributes from the listing; stat agrees with it.
	lsl := run(t, "ls -ln "+mp)
	if !strings.Contains(lsl, "shadow.txt") || strings.Count(lsl, "only12.txt") != 1 {
		t.Errorf("ls -l output:\n%s", lsl)
	}
	st, err := os.Stat(mp + "/shadow.txt")
	if err != nil || st.Size() != int64(len("from 0")) {
		t.Errorf("stat shadow.txt: %v size %d", err, st.Size())
	}
	// Inode numbers are stable while mounted and distinct between files.
	ino := func(p string) uint64 {
		var s syscall.Stat_t
		if err := syscall.Lstat(p, &s); err != nil {
			t.Fatal(err)
		}
		return s.Ino
	}
	first := ino(mp + "/a.txt")
	run(t, "ls -R "+mp+" >/dev/null")
	if ino(mp+"/a.txt") != first || first == ino(mp+"/b.txt") {
		t.Error("inode numbers are not stable and distinct")
	}
	// statfs of a union is the sum of its members (here three on one disk).
	var mst, lst syscall.Statfs_t
	if err := syscall.Statfs(mp, &mst); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Statfs(e.data[0], &lst); err != nil {
		t.Fatal(err)
	}
	if total, want := mst.Blocks*uint64(mst.Bsize), 3*lst.Blocks*uint64(lst.Bsize); total < want*99/100 || total > want*101/100 {
		t.Errorf("union capacity %d bytes, want about %d (3 members)", total, want)
	}
	// Removing a name removes every copy, so no shadowed copy reappears.
	if err := os.Remove(mp + "/only12.txt"); err != nil {
		t.Fatal(err)
	}
	if exists(mp+"/only12.txt") || exists(e.data[1]+"/only12.txt") || exists(e.data[2]+"/only12.txt") {
		t.Error("only12.txt still visible or present on a server after rm")
	}
	// A merged directory is empty only when empty everywhere.
	var errno syscall.Errno
	if err := os.Remove(mp + "/common"); !errors.As(err, &errno) || errno != syscall.ENOTEMPTY {
		t.Errorf("rmdir of non-empty merged dir: got %v, want ENOTEMPTY", err)
	}
	run(t, "rm "+mp+"/common/x0 "+mp+"/common/x1 "+mp+"/common/x2")
	if err := os.Remove(mp + "/common"); err != nil {
		t.Errorf("rmdir of emptied merged dir: %v", err)
	}
	for i := range e.data {
		if exists(e.data[i] + "/common") {
			t.Errorf("common still on server %d", i)
		}
	}
}

// TestPlacementPolicies: where new files and directories go.
func TestPlacementPolicies(t *testing.T) {
	e := newEnv(t, 2)
	writeFile(t, e.data[1]+"/onlyB/keep", "b")
	writeFile(t, e.data[0]+"/onA", "a")

	t.Run("epff", func(t *testing.T) {
		mp := e.mount(e.source(0, ""), e.source(1, ""))
		writeFile(t, mp+"/onlyB/new", "n")
		if !exists(e.data[1]+"/onlyB/new") || exists(e.data[0]+"/onlyB") {
			t.Error("epff: a file in onlyB/ must go to the server that has onlyB/")
		}
		writeFile(t, mp+"/top", "t")
		if !exists(e.data[0] + "/top") {
			t.Error("epff: a file at the root must go to the first server")
		}
		if err := os.Mkdir(mp+"/onlyB/sub", 0o750); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(e.data[1] + "/onlyB/sub")
		if err != nil || st.Mode().Perm() != 0o750 {
			t.Errorf("mkdir placed/mode wrong: %v %v", err, st)
		}
	})

	t.Run("ff", func(t *testing.T) {
		cfg := writeConfig(t, e, fmt.Sprintf(`
[[mount]]
path = "/"
policy = "ff"
sources = [%q, %q]
`, e.source(0, ""), e.source(1, "")))
		mp := e.mount("--config", cfg)
		writeFile(t, mp+"/onlyB/ff-new", "n")
		if !exists(e.data[0]+"/onlyB/ff-new") || !exists(e.data[0]+"/onlyB") {
			t.Error("ff: new file must go to the first server, its parent created there")
		}
		if got := names(t, mp+"/onlyB"); strings.Join(got, " ") != "ff-new keep new sub" {
			t.Errorf("merged onlyB after ff create: %v", got)
		}
	})

	t.Run("read_only and no_create", func(t *testing.T) {
		cfg := writeConfig(t, e, fmt.Sprintf(`
[[mount]]
path = "/"
sources = [{url = %q, read_only = true}, %q]
`, e.source(0, ""), e.source(1, "")))
		mp := e.mount("--config", cfg)
		writeFile(t, mp+"/ro-new", "n")
		if !exists(e.data[1]+"/ro-new") || exists(e.data[0]+"/ro-new") {
			t.Error("a read-only first source must not receive new files")
		}
		var errno syscall.Errno
		if err := os.WriteFile(mp+"/onA", []byte("x"), 0o644); !errors.As(err, &errno) || errno != syscall.EROFS {
			t.Errorf("writing a file of a read-only source: got %v, want EROFS", err)
		}
		if err := os.Remove(mp + "/onA"); !errors.As(err, &errno) || errno != syscall.EROFS {
			t.Errorf("removing a file of a read-only source: got %v, want EROFS", err)
		}
		if readString(t, mp+"/onA") != "a" {
			t.Error("read-only source must still be readable")
		}
	})

	t.Run("mfs", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to mount a small tmpfs")
		}
		small := t.TempDir()
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", small).CombinedOutput(); err != nil {
			t.Skipf("cannot mount tmpfs: %v %s", err, out)
		}
		t.Cleanup(func() { exec.Command("umount", small).Run() }) //nolint:errcheck // cleanup
		// Server 0 exports the small tmpfs, server 1 the big disk: mfs picks 1.
		os.Chmod(small, 0o755) //nolint:errcheck
		src0 := fmt.Sprintf("sftp://%s@127.0.0.1:%d%s", e.servers[0].User, e.servers[0].Port, small)
		cfg := writeConfig(t, e, fmt.Sprintf(`
[[mount]]
path = "/"
policy = "mfs"
sources = [%q, %q]
`, src0, e.source(1, "")))
		mp := e.mount("--config", cfg)
		writeFile(t, mp+"/mfs-new", "n")
		if !exists(e.data[1]+"/mfs-new") || exists(small+"/mfs-new") {
			t.Error("mfs: the new file must go to the source with the most free space")
		}
	})
}

// writeConfig writes a config file whose options make ssh use the test keys.
func writeConfig(t *testing.T, e *env, body string) string {
	t.Helper()
	var opts []string
	for _, o := range e.keys.SSHOptions() {
		opts = append(opts, fmt.Sprintf("%q", o))
	}
	text := fmt.Sprintf("[options]\nssh_options = [%s]\n%s", strings.Join(opts, ", "), body)
	f, err := os.CreateTemp(e.tmp, "muxfs-*.toml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return f.Name()
}

// TestGraftsAndEXDEV is the seed article's load-balancing example: FOO from one
// gateway and BAR from another, grafted under one root. Renames between them are
// EXDEV, so mv copies.
func TestGraftsAndEXDEV(t *testing.T) {
	e := newEnv(t, 2)
	writeFile(t, e.data[0]+"/PROJECT/FOO/foo.dat", "foo data")
	writeFile(t, e.data[1]+"/PROJECT/BAR/bar.dat", "bar data")
	writeFile(t, e.data[0]+"/home/notes.txt", "notes")
	writeFile(t, e.data[0]+"/home/proj/local.txt", "local")
	cfg := writeConfig(t, e, fmt.Sprintf(`
[[mount]]
path = "/FOO"
sources = [%q]

[[mount]]
path = "/BAR"
sources = [%q]

[[mount]]
path = "/home"
sources = [%q]

[[mount]]
path = "/home/proj/deep"
sources = [%q]
`, e.source(0, "PROJECT/FOO"), e.source(1, "PROJECT/BAR"), e.source(0, "home"), e.source(1, "PROJECT")))
	mp := e.mount("--config", cfg)

	if got := strings.Join(names(t, mp), " "); got != "BAR FOO home" {
		t.Errorf("root of grafts: got %q", got)
	}
	if readString(t, mp+"/FOO/foo.dat") != "foo data" || readString(t, mp+"/BAR/bar.dat") != "bar data" {
		t.Error("graft contents wrong")
	}
	// A graft below a real directory merges with it.
	if got := strings.Join(names(t, mp+"/home/proj"), " "); got != "deep local.txt" {
		t.Errorf("graft inside a source's directory: got %q", got)
	}
	if got := strings.Join(names(t, mp+"/home/proj/deep"), " "); got != "BAR" {
		t.Errorf("nested graft: got %q", got)
	}
	writeFile(t, mp+"/FOO/new.txt", "new")
	if readString(t, e.data[0]+"/PROJECT/FOO/new.txt") != "new" {
		t.Error("write in /FOO must land on gateway 1")
	}
	var errno syscall.Errno
	if err := os.Rename(mp+"/FOO/new.txt", mp+"/BAR/new.txt"); !errors.As(err, &errno) || errno != syscall.EXDEV {
		t.Fatalf("rename across sources: got %v, want EXDEV", err)
	}
	run(t, "mv "+mp+"/FOO/new.txt "+mp+"/BAR/moved.txt")
	if readString(t, e.data[1]+"/PROJECT/BAR/moved.txt") != "new" || exists(e.data[0]+"/PROJECT/FOO/new.txt") {
		t.Error("mv across sources must copy and remove")
	}
	if err := os.WriteFile(mp+"/rootfile", []byte("x"), 0o644); !errors.As(err, &errno) || errno != syscall.EROFS {
		t.Errorf("creating in a directory made only by the mount table: got %v, want EROFS", err)
	}
	if err := os.Remove(mp + "/FOO"); !errors.As(err, &errno) || errno != syscall.EBUSY {
		t.Errorf("removing a graft point: got %v, want EBUSY", err)
	}
	// statfs of the union root sums the sources; df works.
	run(t, "df "+mp+" "+mp+"/FOO")
}

// TestUnionRenameAllOrNothing: a rename in a union is made on the source's members,
// then the destination is removed from the others; what would make that removal fail
// is refused first, with a local rename's errno, and nothing moves. Before, a
// directory renamed over a merged directory that another member held non-empty was
// moved on the first member and the rename reported ENOTEMPTY.
func TestUnionRenameAllOrNothing(t *testing.T) {
	e := newEnv(t, 2)
	mkdirs(t, e.data[0]+"/d/a/a", e.data[0]+"/d/b", e.data[1]+"/d/b/c", e.data[1]+"/d/f/x", e.data[0]+"/d/g",
		e.data[0]+"/d/h/x", e.data[0]+"/d/m", e.data[1]+"/d/m", e.data[0]+"/d/p", e.data[1]+"/d/p", e.data[1]+"/d/q/x")
	writeFile(t, e.data[1]+"/d/b/a", "on the second member")
	writeFile(t, e.data[0]+"/d/file", "a file on the first member")
	writeFile(t, e.data[1]+"/d/g", "a file on the second member, a directory on the first")
	mp := e.mount(e.source(0, ""), e.source(1, ""))
	for _, c := range []struct {
		from, to string
		want     syscall.Errno
	}{
		{"d/a/a", "d/b", syscall.ENOTEMPTY}, // b: empty on the first member, not on the second
		{"d/file", "d/f", syscall.EISDIR},   // f: a directory on the second member only
		{"d/a/a", "d/g", syscall.ENOTDIR},   // g: a file on the second member
		{"d/p", "d/q", syscall.ENOTEMPTY},   // p on both members, q not empty on the second
	} {
		if err := syscall.Rename(filepath.Join(mp, c.from), filepath.Join(mp, c.to)); err != c.want {
			t.Errorf("rename %s %s: %v, want %v", c.from, c.to, err, c.want)
		}
	}
	for _, p := range []string{e.data[0] + "/d/a/a", e.data[0] + "/d/b", e.data[1] + "/d/b/a", e.data[0] + "/d/file", e.data[1] + "/d/f/x", e.data[0] + "/d/g", e.data[1] + "/d/g",
		e.data[0] + "/d/p", e.data[1] + "/d/p", e.data[1] + "/d/q/x"} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("after the refused renames: %v", err)
		}
	}
	// A merged directory empty on every member is replaced, as a local empty one
	// (rename(2) itself: os.Rename refuses any existing directory as a target).
	if err := syscall.Rename(filepath.Join(mp, "d/h"), filepath.Join(mp, "d/m")); err != nil {
		t.Fatalf("rename over a merged, empty directory: %v", err)
	}
	if _, err := os.Stat(e.data[0] + "/d/m/x"); err != nil {
		t.Errorf("the renamed directory: %v", err)
	}
	if _, err := os.Stat(e.data[1] + "/d/m"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the replaced directory's copy on the other member: %v, want it gone", err)
	}
}

// TestUnionRefresh: `muxfs refresh` in a union drops every member's cached names, and
// a directory the kernel still holds (a shell's working directory, here an open
// descriptor) merges a member that has since made the same directory. Before, the
// refresh did not reach the members' caches through the wrapper that leaves a member
// out while it is down, and a directory looked up again kept the members it had.
func TestUnionRefresh(t *testing.T) {
	e := newEnv(t, 2)
	writeFile(t, e.data[0]+"/d/a", "a")
	writeFile(t, e.data[0]+"/e/a", "a")
	mp := e.mount(e.source(0, ""), e.source(1, ""))
	for _, d := range []string{"d", "e"} {
		if got := strings.Join(names(t, mp+"/"+d), " "); got != "a" {
			t.Fatalf("%s: %q", d, got)
		}
	}
	held, err := os.Open(mp + "/e")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	writeFile(t, e.data[0]+"/d/new", "on the first member")
	writeFile(t, e.data[1]+"/e/b", "on the second member, in a directory it did not have")
	if out, err := exec.Command(muxfsBin, "refresh", mp).CombinedOutput(); err != nil {
		t.Fatalf("muxfs refresh: %v %s", err, out)
	}
	if got := strings.Join(names(t, mp+"/d"), " "); got != "a new" {
		t.Errorf("d after refresh: %q, want \"a new\"", got)
	}
	if got := strings.Join(names(t, mp+"/e"), " "); got != "a b" {
		t.Errorf("e after refresh: %q, want \"a b\"", got)
	}
}
