package main

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// The narrow workload: what the mount answers while a big file crosses a narrow link.
// The bench's proxies add delay without limiting bandwidth; here the SSH server's
// traffic on the loopback goes through a 100 Mbit/s class (tc htb, with a byte queue of
// 100 ms, as a router's), so every system's transfer fills the link as on a home
// connection to a remote server, and a listing or a stat waits behind it there.
const (
	narrowRate  = "100mbit"
	narrowQueue = 1250000 // bytes: 100 ms at 100 Mbit/s
	narrowMiB   = 48
	// A stat every narrowEvery while the transfer runs; at most narrowStats in all.
	narrowEvery = 200 * time.Millisecond
	narrowStats = 40
)

// shapeLink puts the SSH server's port (both ways) behind a narrow link, and returns
// how to take it off. It replaces the loopback's root queueing discipline: the bench
// runs alone on its machine.
func shapeLink(port int) (func(), error) {
	p := strconv.Itoa(port)
	unshape := func() { exec.Command("tc", "qdisc", "del", "dev", "lo", "root").Run() } //nolint:errcheck // none there
	unshape()
	for _, args := range [][]string{
		{"qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "10", "r2q", "1000"},
		{"class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit"},
		{"class", "add", "dev", "lo", "parent", "1:", "classid", "1:30", "htb", "rate", narrowRate, "ceil", narrowRate},
		{"qdisc", "add", "dev", "lo", "parent", "1:30", "handle", "30:", "bfifo", "limit", strconv.Itoa(narrowQueue)},
		{"filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "u32", "match", "ip", "sport", p, "0xffff", "flowid", "1:30"},
		{"filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "u32", "match", "ip", "dport", p, "0xffff", "flowid", "1:30"},
	} {
		if out, err := exec.Command("tc", args...).CombinedOutput(); err != nil {
			unshape()
			return nil, fmt.Errorf("shaping the loopback (tc %v; needs root and the htb, bfifo and u32 modules): %v: %s", args, err, out)
		}
	}
	td.push(unshape) // an interrupted run must not leave the loopback shaped
	return unshape, nil
}

// probeFiles are files of the tree, each in a directory of its own, in a fixed order:
// a stat of one looks up names no walk before it has (a cold lookup per directory).
func probeFiles(tree string) ([]string, error) {
	var files []string
	seen := map[string]bool{}
	err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dir := filepath.Dir(p)
		if d.Type().IsRegular() && !seen[dir] {
			seen[dir] = true
			rel, _ := filepath.Rel(tree, p)
			files = append(files, rel)
		}
		return nil
	})
	return files, err
}

// statWhile stats files under mp, one every narrowEvery, until done is closed (or
// narrowStats were taken, or the files ran out), and returns the median time a stat
// took.
func statWhile(mp string, files []string, done <-chan struct{}) (time.Duration, error) {
	var took []time.Duration
	for _, f := range files[:min(len(files), narrowStats)] {
		t0 := time.Now()
		if _, err := os.Lstat(filepath.Join(mp, f)); err != nil {
			return 0, err
		}
		took = append(took, time.Since(t0))
		select {
		case <-done:
		case <-time.After(narrowEvery):
			continue
		}
		break
	}
	if len(took) == 0 {
		return 0, fmt.Errorf("no file to stat")
	}
	slices.Sort(took)
	return took[len(took)/2], nil
}

// during runs script (the transfer) and stats files meanwhile; it returns the
// transfer's time and the median stat.
func during(script, mp string, files []string) (time.Duration, time.Duration, error) {
	done := make(chan struct{}) // closed when the transfer has ended, took and err set
	var took time.Duration
	var err error
	go func() {
		defer close(done)
		took, _, err = sh(script)
	}()
	time.Sleep(narrowEvery) // the transfer under way
	stat, serr := statWhile(mp, files, done)
	<-done // statWhile may stop first (its files ran out): the transfer is still timed
	if err != nil {
		return 0, 0, err
	}
	return took, stat, serr
}

func narrowWorkload(b *bench, s *session, rtt time.Duration) ([]result, error) {
	files, err := probeFiles(filepath.Join(s.dir, "tree"))
	if err != nil {
		return nil, err
	}
	// Each phase stats files of its own: none is in a cache from the phase before.
	third := len(files) / 3
	idleFiles, readFiles, writeFiles := files[:third], files[third:2*third], files[2*third:]
	if err := b.ensureFile(s, "narrow.dat", narrowMiB); err != nil {
		return nil, err
	}
	unshape, err := shapeLink(b.env.server.Port)
	if err != nil {
		return nil, err
	}
	defer unshape()
	if err := s.remount(); err != nil {
		return nil, err
	}
	tree := filepath.Join(s.mp, "tree")
	closed := make(chan struct{})
	close(closed)
	idle, err := statWhile(tree, idleFiles[:min(len(idleFiles), 10)], closed)
	if err != nil {
		return nil, err
	}
	res := []result{{"stat idle", "ms", ms(idle), false}}

	if err := s.remount(); err != nil {
		return res, err
	}
	took, stat, err := during("cat "+filepath.Join(s.mp, "narrow.dat")+" > /dev/null", tree, readFiles)
	if err != nil {
		return res, err
	}
	res = append(res, result{"read", "MB/s", narrowMiB << 20 / took.Seconds() / mb, true}, result{"stat while reading", "ms", ms(stat), false})

	if err := s.remount(); err != nil {
		return res, err
	}
	out := filepath.Join(s.mp, fmt.Sprintf("narrow-%s.out", s.sys.name))
	took, stat, err = during(fmt.Sprintf("dd if=/dev/zero of=%s bs=1M count=%d conv=fsync status=none", out, narrowMiB), tree, writeFiles)
	os.Remove(filepath.Join(s.dir, filepath.Base(out))) //nolint:errcheck // server side
	if err != nil {
		return res, err
	}
	return append(res, result{"write", "MB/s", narrowMiB << 20 / took.Seconds() / mb, true}, result{"stat while writing", "ms", ms(stat), false}), nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
