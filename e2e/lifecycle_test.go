package e2e

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/muxfs/muxfs/internal/sshd"
)

// muxfsProcesses lists the pids of muxfs processes whose command line names mp.
func muxfsProcesses(mp string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) > 0 && filepath.Base(args[0]) == "muxfs" && strings.Contains(string(cmdline), mp) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func waitGone(t *testing.T, mp string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if !isMounted(mp) && len(muxfsProcesses(mp)) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("after unmount: mounted=%v, muxfs processes %v", isMounted(mp), muxfsProcesses(mp))
	for _, pid := range muxfsProcesses(mp) {
		syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck
	}
}

// TestBackgroundAndUmount: without -f, muxfs returns once the mount is ready and keeps
// serving; `muxfs umount` ends it and the process exits.
func TestBackgroundAndUmount(t *testing.T) {
	e := newEnv(t, 1)
	mp := e.mountpoint()
	t.Cleanup(func() { unmountQuietly(mp); waitGone(t, mp) })
	out, err := exec.Command(muxfsBin, "-o", e.sshOpts(), e.source(0, ""), mp).CombinedOutput()
	if err != nil {
		t.Fatalf("background mount: %v\n%s", err, out)
	}
	if len(out) != 0 {
		t.Errorf("a successful mount prints nothing, got %q", out)
	}
	if !isMounted(mp) {
		t.Fatal("muxfs returned before the mount was ready")
	}
	writeFile(t, mp+"/bg.txt", "background")
	if readString(t, e.data[0]+"/bg.txt") != "background" {
		t.Error("write through the background mount lost")
	}
	if out, err := exec.Command(muxfsBin, "umount", mp).CombinedOutput(); err != nil {
		t.Fatalf("muxfs umount: %v\n%s", err, out)
	}
	waitGone(t, mp)
	out, err = exec.Command(muxfsBin, "umount", mp).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "is not mounted") {
		t.Errorf("umount of an unmounted dir: %v %q", err, out)
	}
}

// TestSignalsUnmount: SIGTERM and SIGINT unmount cleanly and exit 0; so does
// fusermount3 -u from outside.
func TestSignalsUnmount(t *testing.T) {
	e := newEnv(t, 1)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, 0} {
		t.Run(fmt.Sprint(sig), func(t *testing.T) {
			mp := e.mountpoint()
			cmd := exec.Command(muxfsBin, "-f", "-o", e.sshOpts(), e.source(0, ""), mp)
			log := &sshd.LockedBuffer{}
			cmd.Stderr = log
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unmountQuietly(mp) })
			for deadline := time.Now().Add(20 * time.Second); !ready(mp, log); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					cmd.Process.Kill() //nolint:errcheck
					t.Fatalf("no mount:\n%s", log.String())
				}
			}
			if sig == 0 {
				if out, err := exec.Command("fusermount3", "-u", mp).CombinedOutput(); err != nil {
					t.Fatalf("fusermount3 -u: %v %s", err, out)
				}
			} else {
				cmd.Process.Signal(sig) //nolint:errcheck
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("exit after %v: %v\n%s", sig, err, log.String())
				}
			case <-time.After(10 * time.Second):
				cmd.Process.Kill() //nolint:errcheck
				t.Fatalf("muxfs still running 10 s after %v", sig)
			}
			if isMounted(mp) {
				t.Errorf("still mounted after %v", sig)
			}
		})
	}
}

// TestUnprivileged mounts as an ordinary user (nobody) through fusermount3, as users
// run muxfs, and checks that the mount is theirs alone.
func TestUnprivileged(t *testing.T) {
	requireTools(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root to act as another user; as an ordinary user every other test is this test")
	}
	if st, err := os.Stat("/dev/fuse"); err != nil || st.Mode().Perm()&0o006 != 0o006 {
		// Debian's udev rule makes /dev/fuse 0666; some containers leave it 0600,
		// and then no ordinary user can mount anything (sshfs neither).
		t.Fatalf("/dev/fuse is not usable by ordinary users (%v): run `chmod 0666 /dev/fuse` as .ci/run does", st.Mode())
	}
	const uid, gid = 65534, 65534 // nobody
	base, err := os.MkdirTemp("", "muxfs-unpriv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	os.Chmod(base, 0o755) //nolint:errcheck
	keys, err := sshd.NewKeys(filepath.Join(base, "client"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sshd.StartFor(filepath.Join(base, "sshd"), keys, "nobody")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	data, mp, home := filepath.Join(base, "data"), filepath.Join(base, "mnt"), filepath.Join(base, "home")
	for _, d := range []string{data, mp, home} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{keys.Dir, keys.Identity, keys.KnownHosts, data, mp, home} {
		if err := os.Chown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	asNobody := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(name, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
		cmd.Env = []string{"HOME=" + home, "PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}
		return cmd
	}
	src := fmt.Sprintf("sftp://nobody@127.0.0.1:%d%s", srv.Port, data)
	t.Cleanup(func() { unmountQuietly(mp); waitGone(t, mp) })
	out, err := asNobody(muxfsBin, "-o", strings.Join(keys.SSHOptions(), ","), src, mp).CombinedOutput()
	if err != nil {
		t.Fatalf("unprivileged mount: %v\n%s", err, out)
	}
	if !isMounted(mp) {
		t.Fatal("not mounted")
	}
	out, err = asNobody("/bin/sh", "-c", "echo mine > "+mp+"/u.txt && cat "+mp+"/u.txt && ls -ln "+mp).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "mine") {
		t.Fatalf("using the mount as its owner: %v\n%s", err, out)
	}
	// The user's own ssh configuration allows the in-process transport here.
	if out, err := asNobody(muxfsBin, "status", "--json", mp).CombinedOutput(); err != nil || !strings.Contains(string(out), `"transport": "native"`) {
		t.Errorf("status of the unprivileged mount, want the in-process transport: %v\n%s", err, out)
	}
	st, err := os.Stat(data + "/u.txt")
	if err != nil || st.Sys().(*syscall.Stat_t).Uid != uid {
		t.Errorf("file on the server: %v, owner %v", err, st.Sys())
	}
	// The persistent cache is the user's own, and a fully cached file still reads
	// right without FUSE passthrough (which needs CAP_SYS_ADMIN).
	if st, err := os.Stat(home + "/.cache/muxfs"); err != nil || st.Mode().Perm() != 0o700 || st.Sys().(*syscall.Stat_t).Uid != uid {
		t.Errorf("cache directory of an unprivileged mount: %v %v", err, st)
	}
	out, err = asNobody("/bin/sh", "-c", "cat "+mp+"/u.txt "+mp+"/u.txt").CombinedOutput()
	if err != nil || string(out) != "mine\nmine\n" {
		t.Errorf("reading a cached file unprivileged: %v %q", err, out)
	}
	// Without allow_other, nobody else, not even root, may enter the mount.
	if _, err := os.ReadDir(mp); !errors.Is(err, os.ErrPermission) {
		t.Errorf("root reading another user's mount: got %v, want permission denied", err)
	}
	if out, err := asNobody(muxfsBin, "umount", mp).CombinedOutput(); err != nil {
		t.Fatalf("unprivileged umount: %v\n%s", err, out)
	}
	waitGone(t, mp)
}

// TestFstab mounts through mount(8) from an fstab line of type fuse.muxfs, and unmounts
// with umount(8).
func TestFstab(t *testing.T) {
	requireTools(t)
	if os.Geteuid() != 0 {
		t.Skip("mount(8) with an fstab file needs root")
	}
	if _, err := os.Stat("/sbin/mount.fuse3"); err != nil {
		t.Skip("mount.fuse3 is not installed")
	}
	e := newEnv(t, 1)
	writeFile(t, e.data[0]+"/from-fstab.txt", "fstab")
	cfg := writeConfig(t, e, fmt.Sprintf("[[mount]]\npath = \"/\"\nsources = [%q]\n", e.source(0, "")))
	mp := e.mountpoint()
	fstab := filepath.Join(e.tmp, "fstab")
	// mount(8) runs helpers with a fixed PATH, so `fuse.muxfs` needs muxfs installed
	// there. Link the binary under test in if nothing is installed; otherwise name it
	// in the device field (the `fuse` type's PROGRAM#SOURCE form), so that this test
	// never runs some other muxfs.
	line := fmt.Sprintf("none %s fuse.muxfs config=%s,noauto,_netdev 0 0\n", mp, cfg)
	const installed = "/usr/local/bin/muxfs"
	if _, err := os.Lstat(installed); err == nil {
		line = fmt.Sprintf("%s#none %s fuse config=%s,noauto,_netdev 0 0\n", muxfsBin, mp, cfg)
	} else if err := os.Symlink(muxfsBin, installed); err == nil {
		t.Cleanup(func() { os.Remove(installed) })
	} else {
		t.Fatalf("cannot install muxfs for mount(8): %v", err)
	}
	writeFile(t, fstab, line)
	t.Cleanup(func() { unmountQuietly(mp); waitGone(t, mp) })
	cmd := exec.Command("mount", "-T", fstab, mp)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mount -T fstab: %v\n%s", err, out)
	}
	if readString(t, mp+"/from-fstab.txt") != "fstab" {
		t.Error("fstab mount does not show the source")
	}
	if out, err := exec.Command("umount", mp).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v\n%s", err, out)
	}
	waitGone(t, mp)
}

// TestDemo runs `muxfs demo` as the README does on a fresh machine (no terminal: it
// runs its tour and exits).
func TestDemo(t *testing.T) {
	requireTools(t)
	cmd := exec.Command(muxfsBin, "demo")
	cmd.Stdin = nil
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("muxfs demo: %v\n%s", err, out)
	}
	for _, want := range []string{"Makefile\nmain.c\nutil.c", "new.txt", "demo finished"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	if _, err := exec.LookPath("cc"); err == nil && !strings.Contains(string(out), "\n42\n") {
		t.Errorf("demo build step did not print 42:\n%s", out)
	}
}

// TestSystemdNotify: under a systemd service of Type=notify (NOTIFY_SOCKET set), a
// foreground muxfs says READY=1 once the mount serves — an unmount at that moment
// succeeds — and STOPPING=1 when it is unmounted.
func TestSystemdNotify(t *testing.T) {
	e := newEnv(t, 1)
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	mp := e.mountpoint()
	cmd := exec.Command(muxfsBin, "-f", "-o", e.sshOpts(), e.source(0, ""), mp)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
	log := &sshd.LockedBuffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		unmountQuietly(mp)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill() //nolint:errcheck
		}
	})
	// next returns the next notification that is not only a STATUS line.
	next := func() string {
		t.Helper()
		buf := make([]byte, 4096)
		for {
			conn.SetReadDeadline(time.Now().Add(20 * time.Second)) //nolint:errcheck
			n, err := conn.Read(buf)
			if err != nil {
				t.Fatalf("no notification from muxfs (%v); log:\n%s", err, log.String())
			}
			if msg := string(buf[:n]); !strings.HasPrefix(msg, "STATUS=") {
				return msg
			}
		}
	}
	if msg := next(); !strings.HasPrefix(msg, "READY=1\n") || !strings.Contains(msg, "STATUS=serving") {
		t.Fatalf("first notification %q, want READY=1 with a STATUS", msg)
	}
	if !isMounted(mp) {
		t.Fatal("READY=1 before the mount is there")
	}
	if out, err := exec.Command("fusermount3", "-u", mp).CombinedOutput(); err != nil {
		t.Fatalf("unmount right after READY=1: %v %s", err, out)
	}
	if msg := next(); !strings.HasPrefix(msg, "STOPPING=1\n") {
		t.Errorf("notification after the unmount %q, want STOPPING=1", msg)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit after unmount: %v\n%s", err, log.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("muxfs still running 10 s after the unmount")
	}
}
