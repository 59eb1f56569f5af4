package fusefs

import (
	"bytes"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/muxfs/muxfs/internal/backend"
	"github.com/muxfs/muxfs/internal/mux"
)

// syncBuffer collects go-fuse's request log, written from its serving goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) count(op string, from int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.b.String()[from:], ": "+op+" ")
}

func (s *syncBuffer) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Len()
}

// TestSetattrKeepsAttributes: the attributes a SETATTR answers with are kept by the
// kernel like a GETATTR's, so the fstat that programs make after futimens or fchmod
// (tar: every file it extracts) costs no further request. go-fuse's bridge gives
// SETATTR answers no validity of their own.
func TestSetattrKeepsAttributes(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	root, mp := t.TempDir(), t.TempDir()
	local, err := backend.NewLocal(root)
	if err != nil {
		t.Fatal(err)
	}
	table, err := mux.NewTable([]*mux.Layer{{Path: "/", Branches: []*mux.Branch{{Backend: local}}}})
	if err != nil {
		t.Fatal(err)
	}
	var reqs syncBuffer
	log.SetOutput(&reqs) // go-fuse's request log (Debug) goes to the standard logger
	defer log.SetOutput(os.Stderr)
	server, err := New(table, slog.New(slog.DiscardHandler)).Mount(mp, Options{
		Debug: true, EntryTimeout: time.Minute, AttrTimeout: time.Minute,
	})
	if err != nil {
		t.Skipf("cannot mount here: %v", err)
	}
	defer server.Unmount() //nolint:errcheck

	f, err := os.Create(filepath.Join(mp, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("data")); err != nil {
		t.Fatal(err)
	}
	ts := []unix.Timespec{unix.NsecToTimespec(1e18), unix.NsecToTimespec(1e18)}
	for _, change := range []func() error{
		func() error { return unix.UtimesNanoAt(unix.AT_FDCWD, f.Name(), ts, 0) },
		func() error { return f.Chmod(0o640) },
	} {
		if err := change(); err != nil {
			t.Fatal(err)
		}
		from := reqs.len()
		st, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		if n := reqs.count("GETATTR", from); n != 0 {
			t.Errorf("fstat after a change sent %d GETATTR requests; want the change's answer kept", n)
		}
		if st.Size() != 4 {
			t.Errorf("size %d after the change, want 4", st.Size())
		}
	}
}
