package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/muxfs/muxfs/internal/sshd"
)

// muxfsFails runs muxfs (in the default background mode unless args say -f) and checks
// the contract for bad input: non-zero exit, one line on stderr naming the problem,
// and nothing left mounted.
func muxfsFails(t *testing.T, mp, want string, args ...string) {
	t.Helper()
	cmd := exec.Command(muxfsBin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill() //nolint:errcheck
		t.Fatalf("muxfs %v did not give up within 60 s", args)
	}
	if err == nil {
		unmountQuietly(mp)
		t.Fatalf("muxfs %v succeeded, want failure with %q", args, want)
	}
	msg := strings.TrimRight(stderr.String(), "\n")
	if strings.Count(msg, "\n") != 0 || !strings.HasPrefix(msg, "muxfs: ") {
		t.Errorf("muxfs %v: want one line \"muxfs: ...\" on stderr, got:\n%s", args, msg)
	}
	if !strings.Contains(msg, want) {
		t.Errorf("muxfs %v: error %q does not contain %q", args, msg, want)
	}
	if mp != "" && isMounted(mp) {
		unmountQuietly(mp)
		t.Errorf("muxfs %v failed but left %s mounted", args, mp)
	}
}

func TestBadInput(t *testing.T) {
	e := newEnv(t, 1)
	opts := e.sshOpts()
	writeFile(t, e.data[0]+"/afile", "x")
	freePort := func() int {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}()
	other, err := sshd.NewKeys(filepath.Join(e.tmp, "other"))
	if err != nil {
		t.Fatal(err)
	}
	wrongKey := strings.Join([]string{"IdentityFile=" + other.Identity, "IdentitiesOnly=yes",
		"UserKnownHostsFile=" + e.keys.KnownHosts, "StrictHostKeyChecking=yes", "PasswordAuthentication=no",
		"KbdInteractiveAuthentication=no"}, ",")
	unknownHostKey := strings.Join([]string{"IdentityFile=" + e.keys.Identity, "IdentitiesOnly=yes",
		"UserKnownHostsFile=" + other.KnownHosts, "GlobalKnownHostsFile=/dev/null", "StrictHostKeyChecking=yes"}, ",")

	nonEmpty := e.mountpoint()
	writeFile(t, nonEmpty+"/x", "x")
	busy := e.mount(e.source(0, ""))
	badTOML := filepath.Join(e.tmp, "bad.toml")
	writeFile(t, badTOML, "[options]\nmax_conns = 4\n[[mount]\npath = \"/\"\n")
	unknownKey := filepath.Join(e.tmp, "unknown.toml")
	writeFile(t, unknownKey, "[[mount]]\npath = \"/\"\npolcy = \"ff\"\nsources = [\"h:/x\"]\n")
	badPolicy := filepath.Join(e.tmp, "policy.toml")
	writeFile(t, badPolicy, "[[mount]]\npath = \"/\"\n\npolicy = \"fastest\"\nsources = [\"h:/x\"]\n")
	noMountpoint := filepath.Join(e.tmp, "nomp.toml")
	writeFile(t, noMountpoint, "[[mount]]\npath = \"/\"\nsources = [\"h:/x\"]\n")
	badSource := filepath.Join(e.tmp, "source.toml")
	writeFile(t, badSource, "[[mount]]\npath = \"/\"\nsources = [\n  \"ok:/x\",\n  \"-oProxyCommand=evil:/x\",\n]\n")

	cases := []struct {
		name string
		mp   string
		want string
		args []string
	}{
		{"no host", "", "has no host name", []string{"user@:/x", e.mountpoint()}},
		{"other URL scheme", "", "only sftp:// URLs", []string{"ftp://host/x", e.mountpoint()}},
		{"option injection", "", "cannot begin with '-'", []string{"--", "-oProxyCommand=touch${IFS}pwned:/x", e.mountpoint()}},
		{"dash path is local", "", "give an existing local directory", []string{"--", "-oProxyCommand=touch /tmp/pwned:/x", e.mountpoint()}},
		{"option injection in URL", "", "cannot begin with '-'", []string{"sftp://-oProxyCommand=x/dir", e.mountpoint()}},
		{"user injection", "", "cannot begin with '-'", []string{"--", "-lroot@host:/x", e.mountpoint()}},
		{"unknown host", "", "check the host name", []string{"-o", opts, "nosuchhost.invalid:/x", e.mountpoint()}},
		{"connection refused", "", "no SSH server listens there", []string{"-o", opts, fmt.Sprintf("sftp://127.0.0.1:%d/x", freePort), e.mountpoint()}},
		{"refused key", "", "authentication was refused", []string{"-o", wrongKey, e.source(0, ""), e.mountpoint()}},
		{"unknown host key", "", "accept its host key", []string{"-o", unknownHostKey, e.source(0, ""), e.mountpoint()}},
		{"missing remote dir", "", "does not exist", []string{"-o", opts, e.source(0, "no/such/dir"), e.mountpoint()}},
		{"remote file", "", "is not a directory", []string{"-o", opts, e.source(0, "afile"), e.mountpoint()}},
		{"missing local dir", "", "give an existing local directory", []string{"/no/such/dir", e.mountpoint()}},
		{"missing mount point", "", "does not exist", []string{e.source(0, ""), e.tmp + "/nope"}},
		{"mount point is a file", "", "is not a directory", []string{e.source(0, ""), e.data[0] + "/afile"}},
		{"non-empty mount point", nonEmpty, "is not empty", []string{"-o", opts, e.source(0, ""), nonEmpty}},
		{"already mounted", "", "already a mount point", []string{"-o", opts, e.source(0, ""), busy}},
		{"missing config", "", "no such file", []string{"--config", e.tmp + "/none.toml", e.mountpoint()}},
		{"config syntax", "", "bad.toml:3:", []string{"--config", badTOML, e.mountpoint()}},
		{"config unknown key", "", "unknown.toml:3: unknown setting", []string{"--config", unknownKey, e.mountpoint()}},
		{"config bad policy", "", "policy.toml:4: unknown policy", []string{"--config", badPolicy, e.mountpoint()}},
		{"config bad source", "", "source.toml:5:", []string{"--config", badSource, e.mountpoint()}},
		{"unknown option", "", "unknown option -o frobnicate", []string{"-o", "frobnicate", e.source(0, ""), e.mountpoint()}},
		{"bad max_conns", "", "max_conns", []string{"-o", "max_conns=0", e.source(0, ""), e.mountpoint()}},
		{"no mount point", "", "no mount point", []string{"--config", noMountpoint}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			muxfsFails(t, c.mp, c.want, c.args...)
		})
	}
	// The same contract in the foreground (-f): the error comes straight from muxfs.
	t.Run("foreground", func(t *testing.T) {
		muxfsFails(t, "", "check the host name", "-f", "-o", opts, "nosuchhost.invalid:/x", e.mountpoint())
	})
	if _, err := os.Stat("/tmp/pwned"); err == nil {
		t.Error("a source string reached ssh as an option")
	}
}

// TestHostileServer: a server that sends names with '/', '..' or '.' must not get them
// into the tree; the mount stays up and shows the valid names.
func TestHostileServer(t *testing.T) {
	e := newEnv(t, 0)
	// One session: every session muxfs opens starts its own fake server, each with
	// its own in-memory tree, so a file written on one would be missing on another.
	mp, log, stop := mountHelperServer(t, e, "hostile-sftp", "max_conns=1", "fake:/")
	writeFile(t, mp+"/real.txt", "real")
	got := strings.Join(names(t, mp), " ")
	if got != "real.txt" {
		t.Errorf("listing from a hostile server: got %q, want only real.txt", got)
	}
	if readString(t, mp+"/real.txt") != "real" {
		t.Error("valid file unreadable")
	}
	stop()
	if !strings.Contains(log.String(), "invalid file names") {
		t.Errorf("no warning logged for the invalid names:\n%s", log.String())
	}
}

// TestBrokenServer: a server whose replies do not parse, claim absurd lengths or
// sizes, or stop halfway gets an errno and a log line for that request; the mount
// stays up and serves everything else.
func TestBrokenServer(t *testing.T) {
	if _, err := os.Stat("/usr/lib/openssh/sftp-server"); err != nil {
		t.Skip("OpenSSH sftp-server not installed")
	}
	e := newEnv(t, 0)
	dir := filepath.Join(e.tmp, "served")
	writeFile(t, dir+"/normal.txt", "fine")
	writeFile(t, dir+"/evil-size", "x")
	mp, log, _ := mountHelperServer(t, e, "broken-sftp", "cache=no,timeout=2", "fake:"+dir)
	for _, c := range []struct {
		name string
		want []syscall.Errno
		log  string
	}{
		{"evil-garbage", []syscall.Errno{syscall.EIO}, "malformed"},
		{"evil-huge", []syscall.Errno{syscall.EIO}, "packet of 2147483647 bytes"},
		{"evil-size", []syscall.Errno{syscall.EIO}, "impossible file size"},
		{"evil-stall", []syscall.Errno{syscall.ETIMEDOUT, syscall.EIO}, "stopped answering"},
	} {
		start := time.Now()
		_, err := os.Lstat(filepath.Join(mp, c.name))
		took := time.Since(start)
		var errno syscall.Errno
		if !errors.As(err, &errno) || !slices.Contains(c.want, errno) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
		if took > 5*time.Second {
			t.Errorf("%s: took %v with -o timeout=2", c.name, took)
		}
		if got := readString(t, mp+"/normal.txt"); got != "fine" {
			t.Errorf("after %s the mount no longer serves other files: %q", c.name, got)
		}
	}
	// The stalled session is ended by the watchdog within the timeout.
	time.Sleep(2500 * time.Millisecond)
	for _, c := range []string{"malformed", "packet of 2147483647 bytes", "impossible file size", "stopped answering"} {
		if !strings.Contains(log.String(), c) {
			t.Errorf("nothing in the log says %q:\n%s", c, log.String())
		}
	}
}

// mountHelperServer mounts source with muxfs -f whose ssh command is this test binary
// running helper (a fake server, see helper_test.go), with more -o options opts. It
// returns the mount point, muxfs' log, and a function that unmounts and waits for
// muxfs to exit (also run at cleanup).
func mountHelperServer(t *testing.T, e *env, helper, opts, source string) (string, *sshd.LockedBuffer, func()) {
	t.Helper()
	mp := e.mountpoint()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	o := "ssh_command=" + self
	if opts != "" {
		o += "," + opts
	}
	cmd := exec.Command(muxfsBin, "-f", "-o", o, source, mp)
	cmd.Env = append(os.Environ(), "MUXFS_TEST_HELPER="+helper)
	log := &sshd.LockedBuffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			unmountQuietly(mp)
			cmd.Wait() //nolint:errcheck
		})
	}
	t.Cleanup(stop)
	deadline := time.Now().Add(20 * time.Second)
	for !ready(mp, log) {
		if time.Now().After(deadline) {
			t.Fatalf("mount did not come up:\n%s", log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return mp, log, stop
}
