package e2e

import (
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/posixtest"
)

// notOverSFTP are posixtest cases that test what SFTP cannot carry; each says why.
var notOverSFTP = map[string]string{
	// SFTP v3 has no seek-hole/seek-data; the kernel's default lseek answers these
	// with the generic behaviour, which posixtest checks against a local FS.
	"LseekHoleSeeksToEOF": "SFTP has no SEEK_HOLE",
	"LseekEnxioCheck":     "SFTP has no SEEK_DATA",
	// SFTP has no fallocate.
	"Fallocate":         "SFTP has no fallocate",
	"FallocateKeepSize": "SFTP has no fallocate",
	// Expects the file system to implement POSIX locks with per-descriptor owners;
	// SFTP has no locking, so muxfs leaves locks to the kernel (local to this machine,
	// as sshfs does).
	"FcntlFlockLocksFile": "SFTP has no locks; the kernel keeps them locally",
}

func runPosix(t *testing.T, mnt func(t *testing.T) string) {
	names := make([]string, 0, len(posixtest.All))
	for name := range posixtest.All {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fn := posixtest.All[name]
		t.Run(name, func(t *testing.T) {
			if why, skip := notOverSFTP[name]; skip {
				t.Skip(why)
			}
			fn(t, mnt(t))
		})
	}
}

// TestPosixSingle runs go-fuse's POSIX suite on a mount of one SFTP source: each case
// gets a fresh directory on the server, seen through one shared mount.
func TestPosixSingle(t *testing.T) {
	e := newEnv(t, 1)
	mp := e.mount(e.source(0, ""))
	// SFTP gives link counts only in listings, where the root never is: it shows 1
	// ("unknown" to find and fts), not 0, which says deleted.
	var st syscall.Stat_t
	if err := syscall.Stat(mp, &st); err != nil || st.Nlink != 1 {
		t.Errorf("the mount's root: link count %d (%v), want 1", st.Nlink, err)
	}
	n := 0
	runPosix(t, func(t *testing.T) string {
		n++
		dir := filepath.Join("case", string(rune('a'+n/26)), string(rune('a'+n%26)))
		if err := os.MkdirAll(filepath.Join(mp, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		return filepath.Join(mp, dir)
	})
}

// TestPosixUnion runs the suite on a two-host union: the case directory exists on both
// servers, so every operation goes through the merge and placement logic.
func TestPosixUnion(t *testing.T) {
	e := newEnv(t, 2)
	mp := e.mount(e.source(0, ""), e.source(1, ""))
	n := 0
	runPosix(t, func(t *testing.T) string {
		n++
		dir := filepath.Join("case", string(rune('a'+n/26)), string(rune('a'+n%26)))
		for _, d := range e.data {
			if err := os.MkdirAll(filepath.Join(d, dir), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return filepath.Join(mp, dir)
	})
}
