// Package e2e tests muxfs as users meet it: the real binary, mounted in its own process,
// over real sshd servers on loopback, driven with ordinary tools and syscalls.
package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/muxfs/muxfs/internal/mountinfo"
	"github.com/muxfs/muxfs/internal/sshd"
)

var muxfsBin string

func TestMain(m *testing.M) {
	if helper := os.Getenv("MUXFS_TEST_HELPER"); helper != "" {
		os.Exit(runHelper(helper, os.Args[1:]))
	}
	dir, err := os.MkdirTemp("", "muxfs-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Chmod(dir, 0o755) //nolint:errcheck // the unprivileged test needs to run it
	// Every muxfs the tests start keeps its persistent cache here, never in the
	// machine's ~/.cache.
	os.Setenv("XDG_CACHE_HOME", filepath.Join(dir, "cache")) //nolint:errcheck
	muxfsBin = filepath.Join(dir, "muxfs")
	build := exec.Command("go", "build", "-o", muxfsBin, "../cmd/muxfs")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building muxfs:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is a set of throwaway SSH servers, each exporting its own data directory.
type env struct {
	t       *testing.T
	tmp     string
	keys    *sshd.Keys
	servers []*sshd.Server
	data    []string
}

func requireTools(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"sshd", "ssh", "fusermount3"} {
		if _, err := exec.LookPath(tool); err != nil {
			if _, err := os.Stat("/usr/sbin/" + tool); err != nil {
				t.Fatalf("%s is not installed: run .ci/run or apt-get install openssh-server fuse3", tool)
			}
		}
	}
}

// newEnv starts n servers. Everything is stopped and removed when the test ends.
func newEnv(t *testing.T, n int) *env {
	t.Helper()
	requireTools(t)
	tmp := t.TempDir()
	os.Chmod(tmp, 0o755) //nolint:errcheck // other users' tests traverse it
	keys, err := sshd.NewKeys(filepath.Join(tmp, "client"))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, tmp: tmp, keys: keys}
	for i := 0; i < n; i++ {
		data := filepath.Join(tmp, fmt.Sprintf("data%d", i))
		if err := os.MkdirAll(data, 0o755); err != nil {
			t.Fatal(err)
		}
		srv, err := sshd.Start(filepath.Join(tmp, fmt.Sprintf("sshd%d", i)), keys)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Stop)
		e.servers = append(e.servers, srv)
		e.data = append(e.data, data)
	}
	return e
}

// source is the sftp:// URL of server i's data directory (plus sub).
func (e *env) source(i int, sub string) string {
	s := e.servers[i]
	return fmt.Sprintf("sftp://%s@127.0.0.1:%d%s", s.User, s.Port, filepath.Join(e.data[i], sub))
}

// sshOpts is the -o list that makes muxfs use the throwaway keys.
func (e *env) sshOpts() string {
	return strings.Join(e.keys.SSHOptions(), ",")
}

// mountpoint makes an empty directory to mount on.
func (e *env) mountpoint() string {
	mp, err := os.MkdirTemp(e.tmp, "mnt-")
	if err != nil {
		e.t.Fatal(err)
	}
	return mp
}

// mount runs `muxfs -f ARGS... MOUNTPOINT` in its own process and waits until the
// mount is up. It is unmounted and the process ended when the test ends.
func (e *env) mount(args ...string) string {
	e.t.Helper()
	mp := e.mountpoint()
	e.mountAt(mp, args...)
	return mp
}

func (e *env) mountAt(mp string, args ...string) *exec.Cmd {
	e.t.Helper()
	full := append([]string{"-f", "-o", e.sshOpts()}, args...)
	full = append(full, mp)
	cmd := exec.Command(muxfsBin, full...)
	stderr := &sshd.LockedBuffer{}
	cmd.Stderr = stderr
	cmd.Stdout = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	e.t.Cleanup(func() {
		unmountQuietly(mp)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck // last resort
			<-exited
			e.t.Errorf("muxfs did not exit after unmount; log:\n%s", stderr.String())
		}
		if e.t.Failed() {
			e.t.Logf("muxfs log for %s:\n%s", mp, stderr.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if ready(mp, stderr) {
			return cmd
		}
		select {
		case err := <-exited:
			exited <- err
			e.t.Fatalf("muxfs exited before mounting (%v):\n%s", err, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	e.t.Fatalf("mount did not come up within 20 s:\n%s", stderr.String())
	return nil
}

// ready reports whether a foreground muxfs has finished mounting mp. The mount shows in
// mountinfo before muxfs is done with it: go-fuse then opens a file in it (its epoll
// workaround), and an unmount in that moment fails with EBUSY. muxfs logs "mounted"
// once that is over.
func ready(mp string, log *sshd.LockedBuffer) bool {
	return isMounted(mp) && strings.Contains(log.String(), "msg=mounted ")
}

func unmountQuietly(mp string) {
	if !isMounted(mp) {
		return
	}
	if exec.Command("fusermount3", "-u", mp).Run() != nil {
		exec.Command("fusermount3", "-u", "-z", mp).Run() //nolint:errcheck // best effort
	}
}

func isMounted(mp string) bool { return mountinfo.IsMounted(mp) }

// run runs a shell command (a separate process, as a user would) and returns its
// combined output; it fails the test on error.
func run(t *testing.T, script string) string {
	t.Helper()
	out, err := exec.Command("/bin/sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	return string(out)
}

// mkdirs makes each directory with its parents.
func mkdirs(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
