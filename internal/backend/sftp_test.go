package backend

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/muxfs/muxfs/internal/sftp"
)

// newTestSFTP serves a temporary directory with OpenSSH's sftp-server started through
// ssh_command (no sshd).
func newTestSFTP(t *testing.T) (*SFTP, string) {
	t.Helper()
	dir := t.TempDir()
	pool := newTestPool(t, "")
	return newTestSource(t, 0, dir, pool), dir
}

// newCreated is newTestSFTP with name created in the directory (flags, plus
// O_CREATE|O_EXCL) and open.
func newCreated(t *testing.T, name string, flags int, mode uint32) (*SFTP, string, File) {
	t.Helper()
	s, dir := newTestSFTP(t)
	f, err := s.Open(context.Background(), name, flags|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		t.Fatal(err)
	}
	return s, dir, f
}

const sftpServer = "/usr/lib/openssh/sftp-server"

// newTestPool starts a pool whose sessions are OpenSSH's sftp-server, run by sh: the
// endpoint's ssh arguments land in sh's unused $0.. $n. While the file downFlag exists
// (if given), connecting fails, as with a server that is down.
func newTestPool(t *testing.T, downFlag string) *Pool {
	t.Helper()
	script := "exec " + sftpServer
	if downFlag != "" {
		script = "test -e " + downFlag + " && exit 1; " + script
	}
	return newTestPoolScript(t, script)
}

// newTestPoolScript starts a pool whose sessions are the sh script given, which must
// end up running sftp-server.
func newTestPoolScript(t *testing.T, script string) *Pool {
	t.Helper()
	if _, err := os.Stat(sftpServer); err != nil {
		t.Skip("OpenSSH sftp-server not installed")
	}
	ep := &Endpoint{Host: "test", SSHCommand: []string{"/bin/sh", "-c", script}, MaxConns: 2, Timeout: 2 * time.Second}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	pool, err := Dial(context.Background(), ep, log)
	if err != nil {
		t.Fatal(err)
	}
	pool.Acquire()
	t.Cleanup(pool.Release)
	return pool
}

// newTestSource is a source over the given pools (several: a replica set), all
// serving dir.
func newTestSource(t *testing.T, timeout time.Duration, dir string, pools ...*Pool) *SFTP {
	t.Helper()
	var members []Member
	for _, p := range pools {
		members = append(members, Member{Pool: p, Dir: dir})
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := NewSFTP(context.Background(), members, timeout, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func wantErrno(t *testing.T, what string, err error, want syscall.Errno) {
	t.Helper()
	if got := ToErrno(err); got != want {
		t.Errorf("%s: got %v (%v), want %v", what, got, err, want)
	}
}

// TestErrnoRecovery: OpenSSH's sftp-server folds errnos into FAILURE; the backend must
// still give each case the errno POSIX specifies.
func TestErrnoRecovery(t *testing.T) {
	s, dir := newTestSFTP(t)
	ctx := context.Background()
	os.MkdirAll(dir+"/full/sub", 0o755)                 //nolint:errcheck
	os.MkdirAll(dir+"/empty", 0o755)                    //nolint:errcheck
	os.WriteFile(dir+"/file", []byte("x"), 0o644)       //nolint:errcheck
	os.WriteFile(dir+"/full/inner", []byte("y"), 0o644) //nolint:errcheck
	os.Symlink("file", dir+"/link")                     //nolint:errcheck
	wantErrno(t, "mkdir onto a directory", errOf(s.Mkdir(ctx, "full", 0o755)), syscall.EEXIST)
	wantErrno(t, "mkdir onto a file", errOf(s.Mkdir(ctx, "file", 0o755)), syscall.EEXIST)
	wantErrno(t, "rmdir of a non-empty directory", s.Rmdir(ctx, "full"), syscall.ENOTEMPTY)
	wantErrno(t, "rmdir of a file", s.Rmdir(ctx, "file"), syscall.ENOTDIR)
	wantErrno(t, "unlink of a directory", s.Unlink(ctx, "empty"), syscall.EISDIR)
	wantErrno(t, "lstat of a missing name", func() error { _, err := s.Lstat(ctx, "none"); return err }(), syscall.ENOENT)
	wantErrno(t, "mkdir through a file", errOf(s.Mkdir(ctx, "file/x", 0o755)), syscall.ENOTDIR)
	wantErrno(t, "symlink onto an existing name", errOf(s.Symlink(ctx, "t", "file")), syscall.EEXIST)
	wantErrno(t, "link onto an existing name", s.Link(ctx, "file", "full"), syscall.EEXIST)
	wantErrno(t, "rename a directory onto a non-empty one", s.Rename(ctx, "empty", "full"), syscall.ENOTEMPTY)
	wantErrno(t, "rename a file onto a directory", s.Rename(ctx, "file", "empty"), syscall.EISDIR)
	wantErrno(t, "rename a directory onto a file", s.Rename(ctx, "empty", "file"), syscall.ENOTDIR)
	wantErrno(t, "readlink of a file", func() error { _, err := s.Readlink(ctx, "file"); return err }(), syscall.EINVAL)
	wantErrno(t, "O_EXCL on an existing file", func() error {
		_, err := s.Open(ctx, "file", os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		return err
	}(), syscall.EEXIST)
	wantErrno(t, "open a directory for writing", func() error {
		_, err := s.Open(ctx, "empty", os.O_WRONLY, 0)
		return err
	}(), syscall.EISDIR)
}

func TestSFTPBackendBasics(t *testing.T) {
	s, dir, f := newCreated(t, "new", os.O_RDWR, 0o751)
	ctx := context.Background()
	data := make([]byte, 3<<20+5)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if n, err := f.WriteAt(ctx, data, 0); err != nil || n != len(data) {
		t.Fatalf("write: %d %v", n, err)
	}
	got := make([]byte, len(data)+100)
	if n, err := f.ReadAt(ctx, got, 0); err != nil || n != len(data) || string(got[:n]) != string(data) {
		t.Fatalf("read: %d %v", n, err)
	}
	if err := f.SetAttr(ctx, SetAttr{Valid: SetSize, Size: 10}); err != nil {
		t.Fatal(err)
	}
	if a, err := f.Stat(ctx); err != nil || a.Size != 10 || a.Mode&0o777 != 0o751 {
		t.Fatalf("fstat: %+v %v", a, err)
	}
	if err := f.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(ctx); err != nil {
		t.Fatal(err)
	}
	os.Symlink("new", dir+"/sl") //nolint:errcheck
	when := time.Unix(1_200_000_000, 0)
	if _, err := s.SetAttr(ctx, "sl", SetAttr{Valid: SetTimes, Atime: when, Mtime: when}); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Lstat(dir + "/sl"); !fi.ModTime().Equal(when) {
		t.Error("utimens on a symlink must change the link itself")
	}
	if fi, _ := os.Stat(dir + "/new"); fi.ModTime().Equal(when) {
		t.Error("utimens on a symlink changed its target")
	}
	ents, err := s.ReadDir(ctx, "")
	if err != nil || len(ents) < 2 {
		t.Fatalf("readdir: %v %v", ents, err)
	}
	if st, err := s.Statfs(ctx, ""); err != nil || st.Blocks == 0 {
		t.Errorf("statfs: %+v %v", st, err)
	}
	if !errors.Is(s.Unlink(ctx, "sl"), nil) {
		t.Error("unlink symlink failed")
	}
}

// TestFallbacksWithoutExtensions: servers without the OpenSSH extensions still get
// rename(2) semantics, and clear errnos where nothing can stand in.
func TestFallbacksWithoutExtensions(t *testing.T) {
	s, dir := newTestSFTP(t)
	s.ext.Store(&extensions{}) // a server with none of them
	ctx := context.Background()
	os.WriteFile(dir+"/a", []byte("a"), 0o644)      //nolint:errcheck
	os.WriteFile(dir+"/b", []byte("b"), 0o644)      //nolint:errcheck
	os.MkdirAll(dir+"/d1", 0o755)                   //nolint:errcheck
	os.MkdirAll(dir+"/d2", 0o755)                   //nolint:errcheck
	os.MkdirAll(dir+"/full", 0o755)                 //nolint:errcheck
	os.WriteFile(dir+"/full/x", []byte("x"), 0o644) //nolint:errcheck
	if err := s.Rename(ctx, "a", "b"); err != nil {
		t.Fatalf("rename onto a file without posix-rename: %v", err)
	}
	if b, _ := os.ReadFile(dir + "/b"); string(b) != "a" || exists(dir+"/a") {
		t.Error("the target was not replaced")
	}
	if err := s.Rename(ctx, "d1", "d2"); err != nil {
		t.Fatalf("rename onto an empty directory: %v", err)
	}
	wantErrno(t, "rename onto a non-empty directory", s.Rename(ctx, "d2", "full"), syscall.ENOTEMPTY)
	if !exists(dir+"/d2") || !exists(dir+"/full/x") {
		t.Error("a refused rename must leave both sides as they were")
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.Contains(e.Name(), "muxfs-rename") {
			t.Errorf("temporary name left behind: %s", e.Name())
		}
	}
	wantErrno(t, "link without hardlink@openssh.com", s.Link(ctx, "b", "c"), syscall.EPERM)
	os.Symlink("b", dir+"/sl") //nolint:errcheck
	now := time.Now()
	_, err := s.SetAttr(ctx, "sl", SetAttr{Valid: SetTimes, Atime: now, Mtime: now})
	wantErrno(t, "utimens on a symlink without lsetstat", err, syscall.EOPNOTSUPP)
	if a, err := s.SetAttr(ctx, "b", SetAttr{Valid: SetMode, Mode: 0o604}); err != nil || a.Mode&0o7777 != 0o604 {
		t.Errorf("chmod without lsetstat: %+v %v", a, err)
	}
	if st, err := s.Statfs(ctx, ""); err != nil || st.Bavail == 0 {
		t.Errorf("statfs without statvfs@openssh.com: %+v %v", st, err)
	}
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

// TestQueuedSetAttr: on a file this open created, mode and times (and an unchanged
// owner) go out behind the caller, queued after the writes, and are all in place once
// Close returns; a change that may be refused is waited for and its error returned.
func TestQueuedSetAttr(t *testing.T) {
	s, dir, f := newCreated(t, "new", os.O_WRONLY, 0o600)
	ctx := context.Background()
	sf := f.(*sftpFile)
	if sf.check != nil {
		t.Error("an exclusive create waits for an identity check")
	}
	if _, err := f.WriteAt(ctx, []byte("hello"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	requests := func() int64 { return sf.handle().c.Stats().Requests }
	before := requests()
	mtime := time.Unix(1e9, 0)
	own := f.OpenedAttr()
	for _, set := range []SetAttr{
		{Valid: SetTimes, Atime: mtime, Mtime: mtime},
		{Valid: SetOwner, UID: own.UID, GID: own.GID},
		{Valid: SetMode, Mode: 0o640},
	} {
		if !sf.cannotRefuse(set) {
			t.Errorf("%+v is waited for on a file this open created", set)
		}
		if err := f.SetAttr(ctx, set); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := requests() - before; n != 1 {
		t.Errorf("times, owner and mode set one after another went out as %d requests, not one", n)
	}
	if sf.cannotRefuse(SetAttr{Valid: SetOwner, UID: own.UID + 1, GID: own.GID}) {
		t.Error("a change of owner is not waited for")
	}
	if err := f.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(dir + "/new")
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o640 || !st.ModTime().Equal(mtime) || st.Size() != 5 {
		t.Errorf("after close: mode %v mtime %v size %d", st.Mode().Perm(), st.ModTime(), st.Size())
	}

	// An existing file: nothing is taken for granted.
	g, err := s.Open(ctx, "new", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close(ctx) //nolint:errcheck
	if g.(*sftpFile).cannotRefuse(SetAttr{Valid: SetMode, Mode: 0o600}) {
		t.Error("a change on a file this open did not create is not waited for")
	}
	if err := g.SetAttr(ctx, SetAttr{Valid: SetSize, Size: 2}); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(dir + "/new"); st.Size() != 2 {
		t.Errorf("a waited-for truncate returned before it was done: size %d", st.Size())
	}
}

// TestHeldSetAttrOrder: a change held for those that may follow it still reaches the
// server before a later write (whose mtime must win over a held change of times), is
// never taken for a write to merge with, and goes out by itself within holdFor.
func TestHeldSetAttrOrder(t *testing.T) {
	_, dir, f := newCreated(t, "f", os.O_WRONLY, 0o600)
	ctx := context.Background()
	old := time.Unix(1e9, 0)
	if err := f.SetAttr(ctx, SetAttr{Valid: SetTimes, Atime: old, Mtime: old}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(ctx, []byte("data"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.SetAttr(ctx, SetAttr{Valid: SetMode, Mode: 0o604}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		st, err := os.Stat(dir + "/f")
		if err == nil && st.Mode().Perm() == 0o604 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a held change never reached the server by itself: %v %v", st.Mode(), err)
		}
		time.Sleep(time.Millisecond)
	}
	if err := f.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(dir + "/f")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dir + "/f"); string(b) != "data" {
		t.Errorf("content %q: the write after a held change was lost or misplaced", b)
	}
	if st.ModTime().Equal(old) {
		t.Error("a held change of times went out after the write that followed it")
	}
}

// TestSetAttrAnswersForItself: a change of attributes reports its own answer only. A
// write of the handle's refused before it stays on record for the handle's close —
// fusefs lends a writer's handle to a chmod by path, and the writer must hear of its
// lost data — whether the change is held (on a file this open created) or waited for.
// The server here refuses to write beyond 4 KiB (ulimit -f), a disk-quota stand-in.
func TestSetAttrAnswersForItself(t *testing.T) {
	dir := t.TempDir()
	pool := newTestPoolScript(t, "trap '' XFSZ; ulimit -f 8; exec "+sftpServer)
	s := newTestSource(t, 0, dir, pool)
	ctx := context.Background()
	for _, created := range []bool{true, false} {
		name := "existing"
		flags := os.O_WRONLY
		if created {
			name, flags = "created", flags|os.O_CREATE|os.O_EXCL
		} else if err := os.WriteFile(dir+"/"+name, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := s.Open(ctx, name, flags, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(ctx, make([]byte, 4096), 1<<20); err != nil {
			t.Fatalf("%s: a write behind failed at once: %v", name, err)
		}
		f.Drain(ctx) // the refusal is on record
		if err := f.SetAttr(ctx, SetAttr{Valid: SetMode, Mode: 0o640}); err != nil {
			t.Errorf("%s: chmod reported another request's failure: %v", name, err)
		}
		if !created {
			if err := f.SetAttr(ctx, SetAttr{Valid: SetSize, Size: 2 << 20}); err == nil {
				t.Errorf("%s: a truncation the server refused succeeded", name)
			}
		}
		if err := f.Close(ctx); err == nil {
			t.Errorf("%s: close did not report the refused write", name)
		}
		if st, err := os.Stat(dir + "/" + name); err != nil || st.Mode().Perm() != 0o640 {
			t.Errorf("%s: mode after close %v (%v), want 0640", name, st.Mode(), err)
		}
	}
}

// TestMergeable: changes merge unless the union could set the set-user-ID or
// set-group-ID bit and change the owner, whose order the server chooses.
func TestMergeable(t *testing.T) {
	times := sftp.Attrs{Flags: sftp.AttrACModTime, Atime: 1, Mtime: 2}
	owner := sftp.Attrs{Flags: sftp.AttrUIDGID, UID: 5, GID: 6}
	mode := sftp.Attrs{Flags: sftp.AttrPermissions, Mode: 0o644}
	suid := sftp.Attrs{Flags: sftp.AttrPermissions, Mode: 0o4755}
	sgid := sftp.Attrs{Flags: sftp.AttrPermissions, Mode: 0o2755}
	for _, c := range []struct {
		a, b sftp.Attrs
		want bool
	}{
		{times, owner, true}, {owner, mode, true}, {mode, owner, true}, {times, suid, true},
		{owner, suid, false}, {suid, owner, false}, {owner, sgid, false},
		{suid, mode, true}, // the mode set last has no such bit
	} {
		if got := mergeable(c.a, c.b); got != c.want {
			t.Errorf("mergeable(%+v, %+v) = %v", c.a, c.b, got)
		}
	}
	u := times
	mergeAttrs(&u, owner)
	mergeAttrs(&u, mode)
	if u.Flags != sftp.AttrACModTime|sftp.AttrUIDGID|sftp.AttrPermissions || u.Mtime != 2 || u.UID != 5 || u.Mode != 0o644 {
		t.Errorf("merged: %+v", u)
	}
}

// TestPathSetAttr: a change by path returns the attributes it left, changes a symlink
// itself (its mode, which Linux cannot change, is left), and fails clearly on a
// missing name.
func TestPathSetAttr(t *testing.T) {
	s, dir := newTestSFTP(t)
	ctx := context.Background()
	os.WriteFile(dir+"/f", []byte("x"), 0o600) //nolint:errcheck
	os.Symlink("f", dir+"/sl")                 //nolint:errcheck
	when := time.Unix(1_300_000_000, 0)
	a, err := s.SetAttr(ctx, "f", SetAttr{Valid: SetMode | SetTimes, Mode: 0o640, Atime: when, Mtime: when})
	if err != nil {
		t.Fatal(err)
	}
	if a.Mode&0o7777 != 0o640 || !a.Mtime.Equal(when) || a.Size != 1 {
		t.Errorf("returned attributes %+v", a)
	}
	if st, _ := os.Stat(dir + "/f"); st.Mode().Perm() != 0o640 {
		t.Errorf("mode on the server %v", st.Mode())
	}
	if s.noLchmod.Load() {
		t.Error("lsetstat taken for unable to change modes on a server that can")
	}
	later := when.Add(time.Hour)
	a, err = s.SetAttr(ctx, "sl", SetAttr{Valid: SetMode | SetTimes, Mode: 0o600, Atime: later, Mtime: later})
	if err != nil {
		t.Fatal(err)
	}
	if a.Mode&syscall.S_IFMT != syscall.S_IFLNK || !a.Mtime.Equal(later) {
		t.Errorf("returned attributes of the symlink %+v", a)
	}
	if st, _ := os.Stat(dir + "/f"); st.Mode().Perm() != 0o640 || !st.ModTime().Equal(when) {
		t.Errorf("a change of a symlink reached its target: %v %v", st.Mode(), st.ModTime())
	}
	_, err = s.SetAttr(ctx, "missing", SetAttr{Valid: SetMode, Mode: 0o600})
	wantErrno(t, "chmod of a missing name", err, syscall.ENOENT)
}

// TestLchmodUnsupported: a server whose C library cannot change a mode without
// following symlinks — here sftp-server without /proc, as in a chroot, where glibc's
// fchmodat(AT_SYMLINK_NOFOLLOW) fails with EOPNOTSUPP — still has its modes changed,
// the long way, and is remembered as such; other changes still go by lsetstat.
func TestLchmodUnsupported(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("hiding /proc from sftp-server takes a mount namespace, so root")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare not installed")
	}
	dir := t.TempDir()
	pool := newTestPoolScript(t, "exec unshare --mount sh -c 'mount -t tmpfs none /proc && exec "+sftpServer+"'")
	s := newTestSource(t, 0, dir, pool)
	ctx := context.Background()
	os.WriteFile(dir+"/f", []byte("x"), 0o600) //nolint:errcheck
	for _, mode := range []uint32{0o640, 0o604} {
		a, err := s.SetAttr(ctx, "f", SetAttr{Valid: SetMode, Mode: mode})
		if err != nil || a.Mode&0o7777 != mode {
			t.Fatalf("chmod %o: %+v %v", mode, a, err)
		}
		if st, _ := os.Stat(dir + "/f"); st.Mode().Perm() != os.FileMode(mode) {
			t.Errorf("mode on the server %v, want %o", st.Mode().Perm(), mode)
		}
		if !s.noLchmod.Load() {
			t.Error("a server that cannot chmod through lsetstat is not remembered")
		}
	}
	os.Symlink("f", dir+"/sl") //nolint:errcheck
	when := time.Unix(1_400_000_000, 0)
	if _, err := s.SetAttr(ctx, "sl", SetAttr{Valid: SetTimes, Atime: when, Mtime: when}); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Lstat(dir + "/sl"); !fi.ModTime().Equal(when) {
		t.Error("times of a symlink no longer go by lsetstat")
	}
}

// TestSmallWritesCoalesced: small sequential writes behind others go out together
// (writeBehind.held), and whatever comes next on the file — a read, a stat, a change,
// a write elsewhere, the close — sees them; a held write goes out on its own within
// holdFor.
func TestSmallWritesCoalesced(t *testing.T) {
	_, dir, f := newCreated(t, "log", os.O_RDWR, 0o600)
	ctx := context.Background()
	sf := f.(*sftpFile)
	sent := func() int64 { return sf.handle().c.Stats().BytesOut }
	before := sent()
	const n = 2000
	for i := range n {
		if _, err := f.WriteAt(ctx, []byte{byte('a' + i%26)}, int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	// One WRITE per byte would send about 40 bytes each.
	if out := sent() - before; out > n*10 {
		t.Errorf("%d one-byte writes sent %d bytes: not coalesced", n, out)
	}
	// A read on the file sees every byte written.
	buf := make([]byte, n)
	if m, err := f.ReadAt(ctx, buf, 0); err != nil || m != n || buf[n-1] != byte('a'+(n-1)%26) {
		t.Fatalf("read after small writes: %d %v %q", m, err, buf[n-10:m])
	}
	// So does a stat, and a change of size queued behind them.
	if _, err := f.WriteAt(ctx, []byte("z"), n); err != nil {
		t.Fatal(err)
	}
	if a, err := f.Stat(ctx); err != nil || a.Size != n+1 {
		t.Fatalf("stat after a held write: %+v %v", a, err)
	}
	if _, err := f.WriteAt(ctx, []byte("y"), n+1); err != nil {
		t.Fatal(err)
	}
	if err := f.SetAttr(ctx, SetAttr{Valid: SetSize, Size: n + 5}); err != nil {
		t.Fatal(err)
	}
	// A write elsewhere sends the held one first; left alone, a held write goes out
	// by itself.
	if _, err := f.WriteAt(ctx, []byte("1"), n+10); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(ctx, []byte("2"), 3); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		b, _ := os.ReadFile(dir + "/log")
		if len(b) == n+11 && b[3] == '2' {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("held writes never reached the server: %d bytes, [3]=%q", len(b), b[3])
		}
		time.Sleep(time.Millisecond)
	}
	if err := f.Close(ctx); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(dir + "/log")
	if len(b) != n+11 || b[n] != 'z' || b[n+1] != 'y' || b[n+10] != '1' || b[3] != '2' || b[n+2] != 0 {
		t.Errorf("file after close: %d bytes, tail %q", len(b), b[n-2:])
	}
}

// TestExtensionsLearntLater: a source started with no server reachable knows no
// extension; it learns them from its first live session.
func TestExtensionsLearntLater(t *testing.T) {
	s, _ := newTestSFTP(t)
	s.ext.Store(nil) // as NewOfflineSFTP leaves it
	if e := s.exts(); !e.posixRename || !e.statvfs {
		t.Fatalf("extensions of OpenSSH's sftp-server not learnt from a live session: %+v", e)
	}
	if s.ext.Load() == nil {
		t.Error("learnt extensions were not kept")
	}
}

// TestCreateTriesExclusive: a create not asked to be exclusive is made exclusive when
// the name is missing (no identity check to wait for before the first write), and is
// made as asked when the name exists (truncated, checked).
func TestCreateTriesExclusive(t *testing.T) {
	s, dir := newTestSFTP(t)
	ctx := context.Background()
	f, err := s.Open(ctx, "new.o", os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if sf := f.(*sftpFile); sf.check != nil || !sf.created {
		t.Error("a create of a missing name waits for an identity check")
	}
	f.WriteAt(ctx, []byte("new"), 0) //nolint:errcheck
	if err := f.Close(ctx); err != nil {
		t.Fatal(err)
	}

	os.WriteFile(dir+"/old", []byte("old content"), 0o600) //nolint:errcheck
	f, err = s.Open(ctx, "old", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatalf("create over an existing file: %v", err)
	}
	if sf := f.(*sftpFile); sf.created {
		t.Error("an existing file counts as created by this open")
	}
	f.WriteAt(ctx, []byte("x"), 0) //nolint:errcheck
	if err := f.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dir + "/old"); string(b) != "x" {
		t.Errorf("existing file not truncated: %q", b)
	}
	if st, _ := os.Stat(dir + "/old"); st.Mode().Perm() != 0o600 {
		t.Errorf("existing file's mode changed to %v", st.Mode().Perm())
	}
	os.Symlink("old", dir+"/link") //nolint:errcheck
	if _, err := s.Open(ctx, "link", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644); err == nil {
		t.Error("a create through a symlink was not refused")
	}
}

// errOf is the error of a call that also returns attributes.
func errOf(_ Attr, err error) error { return err }
