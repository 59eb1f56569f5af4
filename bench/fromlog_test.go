package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLogRoundTrip: a report rebuilt from a run's log has every figure the run logged,
// whatever its metric's name (spaces, an apostrophe, a comma), so that -from-log pages
// judge the targets with the same readings as the run's own.
func TestLogRoundTrip(t *testing.T) {
	res := []result{
		{"cache off", "MB/s", 1440, true},
		{"server's file read directly", "MB/s", 1180, true},
		{"local build, same rounds", "s", 3.77, false},
		{"ls -lR after remount", "s", 0.412, false},
		{"untar", "files/s", 565, true},
		{"randread", "IOPS", 10564, true},
		{memoryMetric, "MB", 61.2, false},
		{memoryMetric + " of a big mount", "MB", 1234, false},
		{"stat while reading", "ms", 54.6, false},
		{"items sent again", "items", 3, false},
		{"read", "MB/s", 12.3, true},
	}
	line := fmt.Sprintf("18:19:41 %v warm muxfs rep 1: %s\n", 2*time.Millisecond, summary(res))
	const machine = "2 cores, 24683656 kB RAM, Linux 6.18.44, OpenSSH_9.2p1"
	file := filepath.Join(t.TempDir(), "run.log")
	if err := os.WriteFile(file, []byte("18:19:30 machine: "+machine+"\n"+line), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := loadLog(file)
	if err != nil {
		t.Fatal(err)
	}
	if s.machine != machine {
		t.Errorf("the run's machine read back as %q", s.machine)
	}
	for _, r := range res {
		v, ok := s.med(2*time.Millisecond, "warm", r.metric, "muxfs")
		if !ok {
			t.Errorf("%q: not read back from %q", r.metric, line)
			continue
		}
		// The log keeps three significant digits.
		if want := r.value; v < want*0.995 || v > want*1.005 {
			t.Errorf("%q: read back %v, want %v", r.metric, v, want)
		}
		if s.higher["warm/"+r.metric] != r.higher {
			t.Errorf("%q: higher is better read back as %v", r.metric, !r.higher)
		}
	}
}

// TestTargetsOfPartialRuns: a page written from a run of one workload judges the
// speed issue's targets that workload measures (a run of rand alone had none).
func TestTargetsOfPartialRuns(t *testing.T) {
	s := loadLines(t, "05:35:35 0s rand sshfs-tuned rep 1: randread=1.72e+03IOPS randwrite=810IOPS\n"+
		"05:35:46 0s rand muxfs rep 1: randread=8.68e+03IOPS randwrite=4.35e+03IOPS\n")
	page := pageOf(t, s)
	for _, want := range []string{"| random read IOPS ≥ 2× sshfs-tuned | 5.05 | yes |", "| random write IOPS ≥ 3× sshfs-tuned | 5.37 | yes |"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page has no row %q", want)
		}
	}
}

// loadLines reads a run's log made of lines.
func loadLines(t *testing.T, lines string) *store {
	t.Helper()
	file := filepath.Join(t.TempDir(), "run.log")
	if err := os.WriteFile(file, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := loadLog(file)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// pageOf is the page written from s, as -from-log writes it.
func pageOf(t *testing.T, s *store) string {
	t.Helper()
	dir := t.TempDir()
	page := filepath.Join(dir, "page.md")
	if err := s.report(page, filepath.Join(dir, "charts"), "", "", []time.Duration{0}, 0); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
