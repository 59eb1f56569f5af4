package fusefs

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/muxfs/muxfs/internal/backend"
)

// statCounting counts the Stat calls of the files it opens: the round trip that
// close(2) of a handle open for writing waits for.
type statCounting struct {
	backend.Backend
	stats atomic.Int64
}

func (b *statCounting) Open(ctx context.Context, p string, flags int, mode uint32) (backend.File, error) {
	f, err := b.Backend.Open(ctx, p, flags, mode)
	if err != nil {
		return nil, err
	}
	return &statCountingFile{File: f, b: b}, nil
}

type statCountingFile struct {
	backend.File
	b *statCounting
}

func (f *statCountingFile) Stat(ctx context.Context) (backend.Attr, error) {
	f.b.stats.Add(1)
	return f.File.Stat(ctx)
}

// TestCloseWaitsOnlyAfterChanges: close(2) asks the server for the file (after every
// write is acknowledged) only when something went out through the handle; a file
// created or opened for writing and closed untouched keeps the attributes of its open
// (bonnie++'s creates, lock files), with the changes made through other ways since.
func TestCloseWaitsOnlyAfterChanges(t *testing.T) {
	root, local := localDir(t)
	b := &statCounting{Backend: local}
	mp, _ := mountLogged(t, b)

	closeStats := func(name string, use func(f *os.File) error, flags int) int64 {
		t.Helper()
		f, err := os.OpenFile(filepath.Join(mp, name), flags, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if err := use(f); err != nil {
			t.Fatal(err)
		}
		before := b.stats.Load()
		if err := f.Close(); err != nil {
			t.Fatalf("close %s: %v", name, err)
		}
		return b.stats.Load() - before
	}
	nothing := func(*os.File) error { return nil }
	create := os.O_WRONLY | os.O_CREATE | os.O_EXCL

	if n := closeStats("empty", nothing, create); n != 0 {
		t.Errorf("close of a created, untouched file asked the server %d times, want 0", n)
	}
	if n := closeStats("empty", nothing, os.O_RDWR); n != 0 {
		t.Errorf("close of a file opened for writing, untouched, asked the server %d times, want 0", n)
	}
	if n := closeStats("written", func(f *os.File) error { _, err := f.Write([]byte("data")); return err }, create); n != 1 {
		t.Errorf("close after a write asked the server %d times, want 1", n)
	}
	if n := closeStats("chmodded", func(f *os.File) error { return f.Chmod(0o640) }, create); n != 1 {
		t.Errorf("close after an fchmod asked the server %d times, want 1", n)
	}

	for name, want := range map[string]struct {
		size int64
		mode os.FileMode
	}{"empty": {0, 0o600}, "written": {4, 0o600}, "chmodded": {0, 0o640}} {
		for _, dir := range []string{mp, root} {
			st, err := os.Stat(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if st.Size() != want.size || st.Mode().Perm() != want.mode {
				t.Errorf("%s in %s: size %d mode %v, want %d %v", name, dir, st.Size(), st.Mode().Perm(), want.size, want.mode)
			}
		}
	}
}
