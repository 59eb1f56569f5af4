package main

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/procfs"
)

// TestPeakMemoryOfMountAndChildren: the memory of a mounted system is the peak of its
// daemon (the process given the mount point) and of every process below it (sshfs'
// ssh), and nothing of any other process.
func TestPeakMemoryOfMountAndChildren(t *testing.T) {
	mp := filepath.Join(t.TempDir(), "mnt")
	daemon := exec.Command("sh", "-c", "sleep 60 & wait", "sh", mp)
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		exec.Command("pkill", "-P", strconv.Itoa(daemon.Process.Pid)).Run() //nolint:errcheck // gone already is fine
		daemon.Process.Kill()                                               //nolint:errcheck
		daemon.Wait()                                                       //nolint:errcheck
	})
	child := waitChild(t, daemon.Process.Pid)
	want := hwm(t, daemon.Process.Pid) + hwm(t, child)
	if got := peakMemory([]string{mp}, nil); got != want {
		t.Errorf("peakMemory = %d, want %d: the daemon's %d and its child's %d", got, want, hwm(t, daemon.Process.Pid), hwm(t, child))
	}
	if got := peakMemory([]string{mp + "-a", mp + "-b"}, nil); got != 0 {
		t.Errorf("peakMemory of mount points no process serves = %d, want 0", got)
	}
	if got := peakMemory([]string{mp, mp + "-a"}, nil); got != want {
		t.Errorf("peakMemory with a part no process serves = %d, want %d", got, want)
	}

	// What a mount command starts before it goes to the background outlives it, with
	// no parent of the mount's: sshfs' first ssh.
	launcher := exec.Command("sh", "-c", "sleep 60 & exit")
	launcher.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := launcher.Run(); err != nil {
		t.Fatal(err)
	}
	group := launcher.Process.Pid
	out, err := exec.Command("pgrep", "-g", strconv.Itoa(group)).Output()
	orphan, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || orphan == 0 {
		t.Fatalf("no process left in the launcher's group %d: %v", group, err)
	}
	t.Cleanup(func() { syscall.Kill(orphan, syscall.SIGKILL) }) //nolint:errcheck // gone already is fine
	if got, want := peakMemory([]string{mp}, []int{group}), want+hwm(t, orphan); got != want {
		t.Errorf("peakMemory with the launcher's group = %d, want %d", got, want)
	}
}

// waitChild is the PID of the first child of the process pid, once it has one.
func waitChild(t *testing.T, pid int) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		out, _ := exec.Command("pgrep", "-P", strconv.Itoa(pid)).Output()
		if f := strings.Fields(string(out)); len(f) > 0 {
			child, err := strconv.Atoi(f[0])
			if err != nil {
				t.Fatal(err)
			}
			return child
		}
	}
	t.Fatalf("process %d started no child", pid)
	return 0
}

func hwm(t *testing.T, pid int) uint64 {
	t.Helper()
	p, err := procfs.NewProc(pid)
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.NewStatus()
	if err != nil {
		t.Fatal(err)
	}
	if st.VmHWM == 0 {
		t.Fatalf("process %d: no VmHWM", pid)
	}
	return st.VmHWM
}
