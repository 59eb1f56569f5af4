package main

import (
	"fmt"
	"log"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/muxfs/muxfs/internal/mountinfo"
)

// teardown undoes what the bench set up — its file systems' mounts, the SSH server
// and proxies, the loop-mounted image, the run's directory — at the end of a run, on
// a fatal error and on Ctrl-C or SIGTERM alike. An interrupted run that left its image
// mounted would keep tens of GiB of the disk (the image only grows), and a system
// left mounted would keep its server alive.
type teardown struct {
	mu     sync.Mutex
	undo   []func()
	root   string
	done   bool
	groups map[int]bool // process groups of the workload commands running
}

var td teardown

// push adds a step, run before the steps pushed earlier.
func (t *teardown) push(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.undo = append(t.undo, f)
}

// started records a workload command's process group; one started after the
// teardown began is killed at once.
func (t *teardown) started(pgid int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		syscall.Kill(-pgid, syscall.SIGKILL) //nolint:errcheck // may be gone
		return
	}
	if t.groups == nil {
		t.groups = map[int]bool{}
	}
	t.groups[pgid] = true
}

// ended forgets a process group recorded by started. Once the teardown has begun the
// process is about to exit, and the workload whose command it killed waits here
// rather than go on to the next system (and log its failures).
func (t *teardown) ended(pgid int) {
	t.mu.Lock()
	if t.done {
		t.mu.Unlock()
		select {}
	}
	delete(t.groups, pgid)
	t.mu.Unlock()
}

// run kills the workload commands still running (a fio left writing keeps the image
// busy), unmounts every file system still mounted under the run's directory (deepest
// first), then runs the steps; only the first call does anything.
func (t *teardown) run() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return
	}
	t.done = true
	for pgid := range t.groups {
		syscall.Kill(-pgid, syscall.SIGKILL) //nolint:errcheck // may be gone
	}
	if t.root != "" {
		if m, err := mountinfo.Mounts(); err == nil {
			for _, mp := range fuseMountsUnder(m, t.root) {
				unmount(mp)
			}
		}
	}
	for _, f := range slices.Backward(t.undo) {
		f()
	}
}

// fuseMountsUnder returns the FUSE mount points of mounts (mount point -> type) below
// root, each before any it is mounted in: a mount is busy while another is mounted
// inside it.
func fuseMountsUnder(mounts map[string]string, root string) []string {
	var mps []string
	for mp, fstype := range mounts {
		if strings.HasPrefix(mp, root+"/") && strings.HasPrefix(fstype, "fuse") {
			mps = append(mps, mp)
		}
	}
	slices.SortFunc(mps, func(a, b string) int { return len(b) - len(a) })
	return mps
}

// onSignal makes Ctrl-C and SIGTERM end the bench through the teardown: with status 0
// for a rig (-serve, which is ended that way), 130 for a run cut short.
func (t *teardown) onSignal(root string, serve bool) {
	t.mu.Lock()
	t.root = root
	t.mu.Unlock()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		code := 130
		if serve {
			code = 0
		} else {
			log.Printf("%v: unmounting and removing what the bench set up in %s", s, root)
		}
		t.run()
		os.Exit(code)
	}()
}

// fatal logs the error, tears down and exits.
func fatal(v ...any) {
	log.Print(v...)
	td.run()
	os.Exit(1)
}

// fatalf is fatal with a format.
func fatalf(format string, v ...any) { fatal(fmt.Sprintf(format, v...)) }
