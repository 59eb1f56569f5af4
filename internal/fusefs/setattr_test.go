package fusefs

import (
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/muxfs/muxfs/internal/backend"
	"github.com/muxfs/muxfs/internal/mux"
)

// requestsSince counts the requests of kind op that go-fuse logged to f after
// offset from.
func requestsSince(t *testing.T, f *os.File, op string, from int64) int {
	t.Helper()
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b[from:]), ": "+op+" ")
}

// localDir is a local directory served as a source, for tests to fill from outside
// the mount.
func localDir(t *testing.T) (string, *backend.Local) {
	t.Helper()
	root := t.TempDir()
	local, err := backend.NewLocal(root)
	if err != nil {
		t.Fatal(err)
	}
	return root, local
}

// awaitRequests waits until go-fuse has logged at least n requests op since offset
// from (requests the kernel sends in the background: RELEASE, muxfs' own stats).
func awaitRequests(t *testing.T, f *os.File, op string, from int64, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); requestsSince(t, f, op, from) < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d %s requests within 5 s; requests:\n%s", n, op, logSince(t, f, from))
		}
	}
}

// mountLogged mounts b in this process with go-fuse's request log (Debug) going to
// the returned file, and minute-long kernel caches. It is unmounted, and the standard
// logger given back, when the test ends.
func mountLogged(t *testing.T, b backend.Backend) (mp string, reqs *os.File) {
	t.Helper()
	return mountLoggedWith(t, b, Options{EntryTimeout: time.Minute, AttrTimeout: time.Minute})
}

// mountLoggedWith is mountLogged with the options o (Debug set).
func mountLoggedWith(t *testing.T, b backend.Backend, o Options) (mp string, reqs *os.File) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	mp = t.TempDir()
	table, err := mux.NewTable([]*mux.Layer{{Path: "/", Branches: []*mux.Branch{{Backend: b}}}})
	if err != nil {
		t.Fatal(err)
	}
	// go-fuse's request log goes to the standard logger; a file takes its
	// concurrent writes as they come.
	reqs, err = os.Create(filepath.Join(t.TempDir(), "requests.log"))
	if err != nil {
		t.Fatal(err)
	}
	log.SetOutput(reqs)
	o.Debug = true
	server, err := New(table, slog.New(slog.DiscardHandler)).Mount(mp, o)
	if err != nil {
		log.SetOutput(os.Stderr)
		reqs.Close()
		t.Skipf("cannot mount here: %v", err)
	}
	t.Cleanup(func() {
		server.Unmount() //nolint:errcheck
		log.SetOutput(os.Stderr)
		reqs.Close()
	})
	return mp, reqs
}

// fsize is f's size as fstat(2) gives it (a request log's: where new requests start).
func fsize(t *testing.T, f *os.File) int64 {
	t.Helper()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// mountWithWrittenFile mounts a local directory with the request log on, and creates a
// file of 4 bytes in it, left open for the test.
func mountWithWrittenFile(t *testing.T) (f, reqs *os.File) {
	t.Helper()
	_, local := localDir(t)
	mp, reqs := mountLogged(t, local)
	f, err := os.Create(filepath.Join(mp, "f"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() }) // before the unmount, registered earlier
	if _, err := f.Write([]byte("data")); err != nil {
		t.Fatal(err)
	}
	return f, reqs
}

// TestSetattrKeepsAttributes: the attributes a SETATTR answers with are kept by the
// kernel like a GETATTR's, so the fstat that programs make after futimens or fchmod
// (tar: every file it extracts) costs no further request. go-fuse's bridge gives
// SETATTR answers no validity of their own.
func TestSetattrKeepsAttributes(t *testing.T) {
	f, reqs := mountWithWrittenFile(t)
	ts := []unix.Timespec{unix.NsecToTimespec(1e18), unix.NsecToTimespec(1e18)}
	for _, change := range []func() error{
		func() error { return unix.UtimesNanoAt(unix.AT_FDCWD, f.Name(), ts, 0) },
		func() error { return f.Chmod(0o640) },
	} {
		if err := change(); err != nil {
			t.Fatal(err)
		}
		from := fsize(t, reqs)
		st, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		if n := requestsSince(t, reqs, "GETATTR", from); n != 0 {
			t.Errorf("fstat after a change sent %d GETATTR requests; want the change's answer kept", n)
		}
		if st.Size() != 4 {
			t.Errorf("size %d after the change, want 4", st.Size())
		}
	}
}

// TestChownAsksNoMode: a change of owner costs one request, the SETATTR. Without
// CAP_HANDLE_KILLPRIV the kernel first sends a GETATTR, to work out which set-ID bits
// the change clears (tar, cp -a and rsync change the owner of every file they write);
// muxfs clears them itself (TestSetIDBitsLikeLocal in e2e checks which).
func TestChownAsksNoMode(t *testing.T) {
	f, reqs := mountWithWrittenFile(t)
	from := fsize(t, reqs)
	if err := f.Chown(os.Getuid(), os.Getgid()); err != nil {
		t.Fatal(err)
	}
	if n := requestsSince(t, reqs, "GETATTR", from); n != 0 {
		t.Errorf("fchown sent %d GETATTR requests before its SETATTR; want none:\n%s", n, logSince(t, reqs, from))
	}
	if n := requestsSince(t, reqs, "SETATTR", from); n != 1 {
		t.Errorf("fchown sent %d SETATTR requests; want 1", n)
	}
}

// TestTruncatingOpenIsOneRequest: an open with O_TRUNC truncates in its OPEN (the
// kernel sends no SETATTR of the size after it, which through SFTP was a round trip of
// its own), and every view of the file shrinks with it — also that of a handle open
// for writing before, whose size the file's stat would otherwise report.
func TestTruncatingOpenIsOneRequest(t *testing.T) {
	f, reqs := mountWithWrittenFile(t)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	from := fsize(t, reqs)
	g, err := os.OpenFile(f.Name(), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if n := requestsSince(t, reqs, "SETATTR", from); n != 0 {
		t.Errorf("open with O_TRUNC sent %d SETATTR requests; want the OPEN alone:\n%s", n, logSince(t, reqs, from))
	}
	if n := requestsSince(t, reqs, "OPEN", from); n != 1 {
		t.Errorf("open with O_TRUNC sent %d OPEN requests; want 1", n)
	}
	for what, stat := range map[string]func() (os.FileInfo, error){
		"the truncating handle": g.Stat, "the earlier writer": f.Stat, "the path": func() (os.FileInfo, error) { return os.Stat(f.Name()) },
	} {
		st, err := stat()
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() != 0 {
			t.Errorf("size %d through %s after an open with O_TRUNC, want 0", st.Size(), what)
		}
	}
}
