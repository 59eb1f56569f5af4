package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSSHConfigAndPort: a Host alias from an ssh_config file (-F) and a port given with
// -p reach the server, as with sshfs.
func TestSSHConfigAndPort(t *testing.T) {
	e := newEnv(t, 1)
	writeFile(t, e.data[0]+"/hello", "hi")
	srv := e.servers[0]
	conf := filepath.Join(e.tmp, "ssh_config")
	writeFile(t, conf, fmt.Sprintf("Host lab-alias\n  HostName 127.0.0.1\n  Port %d\n  User %s\n", srv.Port, srv.User))
	mp := e.mount("-F", conf, "lab-alias:"+e.data[0])
	if readString(t, mp+"/hello") != "hi" {
		t.Error("mount through an ssh_config alias")
	}
	mp = e.mount("-p", fmt.Sprint(srv.Port), fmt.Sprintf("%s@127.0.0.1:%s", srv.User, e.data[0]))
	if readString(t, mp+"/hello") != "hi" {
		t.Error("mount with -p")
	}
	// ssh_command replaces ssh: here a wrapper script that records it ran.
	marker := filepath.Join(e.tmp, "wrapper-ran")
	wrapper := filepath.Join(e.tmp, "myssh")
	writeFile(t, wrapper, "#!/bin/sh\ntouch "+marker+"\nexec ssh \"$@\"\n")
	os.Chmod(wrapper, 0o755) //nolint:errcheck
	mp = e.mount("-o", "ssh_command="+wrapper, e.source(0, ""))
	if readString(t, mp+"/hello") != "hi" || !exists(marker) {
		t.Error("ssh_command not used")
	}
}

// TestMountOptions: -o ro, and -o allow_other,default_permissions, under which other
// local users get the kernel's permission checks from the files' modes.
func TestMountOptions(t *testing.T) {
	e := newEnv(t, 1)
	writeFile(t, e.data[0]+"/public", "public")
	writeFile(t, e.data[0]+"/secret", "secret")
	os.Chmod(e.data[0]+"/secret", 0o600) //nolint:errcheck

	t.Run("ro", func(t *testing.T) {
		mp := e.mount("-o", "ro", e.source(0, ""))
		var errno syscall.Errno
		if err := os.WriteFile(mp+"/new", []byte("x"), 0o644); !errors.As(err, &errno) || errno != syscall.EROFS {
			t.Errorf("write on a read-only mount: %v", err)
		}
		if readString(t, mp+"/public") != "public" {
			t.Error("read on a read-only mount")
		}
		if !strings.Contains(run(t, "grep "+mp+" /proc/mounts"), " ro,") {
			t.Error("mount not flagged ro")
		}
	})

	t.Run("allow_other,default_permissions", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to act as another user")
		}
		mp := e.mount("-o", "allow_other,default_permissions", e.source(0, ""))
		os.Chmod(filepath.Dir(e.tmp), 0o755) //nolint:errcheck // the test's own temp dir is 0700
		asNobody := func(script string) (string, error) {
			cmd := exec.Command("/bin/sh", "-c", script)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			out, err := cmd.CombinedOutput()
			return string(out), err
		}
		if out, err := asNobody("cat " + mp + "/public"); err != nil || out != "public" {
			t.Errorf("another user reading a 0644 file: %v %q", err, out)
		}
		if out, err := asNobody("cat " + mp + "/secret"); err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("another user reading a 0600 file: %v %q", err, out)
		}
		if out, err := asNobody("echo x >> " + mp + "/public"); err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("another user writing a 0644 file of root: %v %q", err, out)
		}
	})
}

// TestSetIDBitsLikeLocal: the set-user-ID and set-group-ID bits end as on a local file
// system — cleared by a change of owner and by another user's write or truncation
// (also by an open with O_TRUNC, which muxfs makes in one request),
// kept through root's and on a directory, and set by a mode given after the owner (as
// tar does) — now that muxfs clears them itself instead of the kernel asking for the
// mode before every chown (CAP_HANDLE_KILLPRIV).
func TestSetIDBitsLikeLocal(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to act as another user")
	}
	e := newEnv(t, 1)
	mp := e.mount("-o", "allow_other", e.source(0, ""))
	os.Chmod(filepath.Dir(e.tmp), 0o755) //nolint:errcheck // the test's own temp dir is 0700
	local := filepath.Join(e.tmp, "local")
	if err := os.Mkdir(local, 0o755); err != nil {
		t.Fatal(err)
	}
	asNobody := func(script string) error {
		cmd := exec.Command("/bin/sh", "-c", script)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v %s", script, err, out)
		}
		return nil
	}
	cases := []struct {
		name string
		dir  bool
		mode uint32
		act  func(p string) error
	}{
		{"chown", false, 0o6775, func(p string) error { return os.Chown(p, 0, 0) }},
		{"chown, group not executable", false, 0o2765, func(p string) error { return os.Chown(p, 0, 0) }},
		{"chown to -1 -1", false, 0o4755, func(p string) error { return os.Chown(p, -1, -1) }},
		{"chown of a directory", true, 0o6775, func(p string) error { return os.Chown(p, 65534, 65534) }},
		{"write by another user", false, 0o4777, func(p string) error { return asNobody("echo more >> " + p) }},
		{"truncation by another user", false, 0o6777, func(p string) error { return asNobody("truncate -s 1 " + p) }},
		{"write by root", false, 0o4777, func(p string) error {
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return err
			}
			f.WriteString("more") //nolint:errcheck // Close reports it
			return f.Close()
		}},
		{"truncation by root", false, 0o6777, func(p string) error { return os.Truncate(p, 1) }},
		{"open with O_TRUNC by another user", false, 0o6777, func(p string) error { return asNobody(": > " + p) }},
		{"overwrite (O_TRUNC) by root", false, 0o6777, func(p string) error { return os.WriteFile(p, []byte("new"), 0o644) }},
		{"tar: owner, then mode", false, 0o600, func(p string) error {
			f, err := os.OpenFile(p+"-new", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return err
			}
			f.WriteString("data")               //nolint:errcheck // Close reports it
			f.Chown(65534, 65534)               //nolint:errcheck // the mode shows it
			syscall.Fchmod(int(f.Fd()), 0o4755) //nolint:errcheck // the mode shows it
			if err := f.Close(); err != nil {
				return err
			}
			return os.Rename(p+"-new", p)
		}},
	}
	modeOf := func(p string) uint32 {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st.Mode & 0o7777
	}
	for i, c := range cases {
		name := fmt.Sprintf("f%d", i)
		for _, dir := range []string{local, mp} {
			p := filepath.Join(dir, name)
			var err error
			if c.dir {
				err = os.Mkdir(p, 0o755)
			} else {
				err = os.WriteFile(p, []byte("data"), 0o644)
			}
			if err == nil {
				err = syscall.Chmod(p, c.mode)
			}
			if err == nil {
				err = c.act(p)
			}
			if err != nil {
				t.Fatalf("%s in %s: %v", c.name, dir, err)
			}
		}
		want := modeOf(filepath.Join(local, name))
		if got := modeOf(filepath.Join(mp, name)); got != want {
			t.Errorf("%s: mode %04o through the mount, %04o on a local file system", c.name, got, want)
		}
		if got := modeOf(filepath.Join(e.data[0], name)); got != want {
			t.Errorf("%s: mode %04o on the server, %04o on a local file system", c.name, got, want)
		}
	}
}

// A change by path, from another process, to a file a descriptor is still writing
// goes through that descriptor's handle, behind its writes; it is on the server when
// chmod(2) returns all the same, since no close of the caller's will wait for it.
// (The opener's own changes do not wait: TestOwnChangesDoNotWaitForTheServer.)
func TestChmodBesideAnOpenWriterReachesTheServer(t *testing.T) {
	e := newEnv(t, 1)
	mp := e.mount(e.source(0, ""))
	p := filepath.Join(mp, "open")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("data"); err != nil {
		t.Fatal(err)
	}
	for i, mode := range []os.FileMode{0o600, 0o640, 0o604} {
		run(t, fmt.Sprintf("chmod %o %s", mode, p))
		st, err := os.Stat(filepath.Join(e.data[0], "open"))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != mode {
			t.Errorf("chmod %d: mode %04o on the server once chmod returned, want %04o", i, st.Mode().Perm(), mode)
		}
	}
}

// TestOwnChangesDoNotWaitForTheServer: the changes of attributes the thread that
// opened a file for writing makes before closing it (tar's fchmod, fchown and
// futimens, which the kernel sends without a handle, as it does a chmod by path)
// travel with the file's writes, and its close waits for them; a chmod by path from
// another process, or from the opener after its close, is on the server when it
// returns. With the link frozen, the first return and the others do not.
func TestOwnChangesDoNotWaitForTheServer(t *testing.T) {
	e := newEnv(t, 1)
	fz, mp := e.mountFrozen(0)
	t.Cleanup(func() { fz.set(false) })
	p := filepath.Join(mp, "f")

	// The opener's calls run on one locked thread: the kernel names the calling
	// thread, not the process.
	type call struct {
		fn   func() error
		done chan error
	}
	calls := make(chan call)
	defer close(calls)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		for c := range calls {
			c.done <- c.fn()
		}
	}()
	opener := func(fn func() error) chan error {
		done := make(chan error, 1)
		calls <- call{fn, done}
		return done
	}
	returns := func(what string, done chan error) {
		t.Helper()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(10 * time.Second):
			fz.set(false)
			t.Fatalf("%s waited for the frozen server", what)
		}
	}
	waits := func(what string, done chan error) {
		t.Helper()
		select {
		case err := <-done:
			t.Fatalf("%s returned (%v) while the link was frozen", what, err)
		case <-time.After(500 * time.Millisecond):
		}
		fz.set(false)
		if err := <-done; err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	serverMode := func() os.FileMode {
		t.Helper()
		st, err := os.Stat(filepath.Join(e.data[0], "f"))
		if err != nil {
			t.Fatal(err)
		}
		return st.Mode().Perm()
	}

	var f *os.File
	returns("create, write and fsync", opener(func() (err error) {
		if f, err = os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err != nil {
			return err
		}
		if _, err = f.WriteString("data"); err != nil {
			return err
		}
		return f.Sync()
	}))
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	fz.set(true)
	returns("the opener's fchmod and futimens", opener(func() error {
		if err := f.Chmod(0o640); err != nil {
			return err
		}
		tv := syscall.NsecToTimeval(mtime.UnixNano())
		return syscall.Futimes(int(f.Fd()), []syscall.Timeval{tv, tv})
	}))
	chmod := make(chan error, 1)
	go func() { chmod <- exec.Command("chmod", "604", p).Run() }()
	waits("a chmod by path from another process", chmod)
	if m := serverMode(); m != 0o604 {
		t.Errorf("mode %04o on the server once chmod returned, want 0604", m)
	}
	returns("the opener's close", opener(func() error { return f.Close() }))
	st, err := os.Stat(filepath.Join(e.data[0], "f"))
	if err != nil {
		t.Fatal(err)
	}
	if !st.ModTime().Equal(mtime) {
		t.Errorf("mtime %v on the server after close, want %v", st.ModTime(), mtime)
	}
	fz.set(true)
	waits("the opener's chmod by path after its close", opener(func() error { return os.Chmod(p, 0o600) }))
	if m := serverMode(); m != 0o600 {
		t.Errorf("mode %04o on the server once the opener's chmod returned, want 0600", m)
	}
}
