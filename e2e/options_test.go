package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
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
