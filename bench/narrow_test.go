package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestProbeFiles: one regular file per directory (the first by name), none from a
// directory without files, so that each stat is a lookup no stat before it made.
func TestProbeFiles(t *testing.T) {
	root := t.TempDir()
	for _, f := range []string{"a/1", "a/2", "a/b/3", "c/d/4", "top"} {
		p := filepath.Join(root, f)
		os.MkdirAll(filepath.Dir(p), 0o755) //nolint:errcheck
		os.WriteFile(p, nil, 0o644)         //nolint:errcheck
	}
	os.Symlink("top", filepath.Join(root, "c", "link")) //nolint:errcheck
	got, err := probeFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a/1", "a/b/3", "c/d/4", "top"}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("probe files %q, want %q", got, want)
	}
}

// TestStatWhileStopsWithTheTransfer: statWhile takes one stat and returns once the
// transfer is over, not after all its files.
func TestStatWhileStopsWithTheTransfer(t *testing.T) {
	root := t.TempDir()
	var files []string
	for _, f := range []string{"1", "2", "3"} {
		os.WriteFile(filepath.Join(root, f), nil, 0o644) //nolint:errcheck
		files = append(files, f)
	}
	done := make(chan struct{})
	close(done)
	t0 := time.Now()
	if _, err := statWhile(root, files, done); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d >= narrowEvery {
		t.Errorf("statWhile took %v after the transfer ended", d)
	}
	if _, err := statWhile(root, []string{"missing"}, done); err == nil {
		t.Error("a stat that failed gave no error")
	}
}

// TestDuringTimesTheWholeTransfer: the stats may run out before the transfer ends; the
// transfer is still waited for and timed whole.
func TestDuringTimesTheWholeTransfer(t *testing.T) {
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, "1"), nil, 0o644) //nolint:errcheck
	took, stat, err := during("sleep 1", root, []string{"1"})
	if err != nil {
		t.Fatal(err)
	}
	if took < time.Second || stat <= 0 {
		t.Errorf("transfer timed %v, median stat %v: want the whole second and a stat", took, stat)
	}
}
