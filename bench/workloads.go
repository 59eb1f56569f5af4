package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// result is one measurement.
type result struct {
	metric string
	unit   string
	value  float64
	higher bool // higher is better (throughput), else lower (time)
}

// workload measures one thing on a session. full is false at added RTT, where only the
// part that tells something new about latency runs (see README).
type workload struct {
	name string
	desc string
	// at says whether the workload runs at this added RTT.
	at  func(rtt time.Duration) bool
	run func(b *bench, s *session, rtt time.Duration) ([]result, error)
	// skip, if set, names systems not measured at rtt, with the reason.
	skip func(sys string, rtt time.Duration) string
}

var workloads = []workload{
	{name: "seq", desc: "IOzone-style sequential I/O with fio, 64 KiB records: write and rewrite (fsync at the end), then read a file of the same size (written on the server: what a system's close left unsent does not count) from a fresh mount with dropped caches and reread at once (as IOzone's reread: the file's pages are not dropped, fio `--invalidate=0`)",
		at: func(time.Duration) bool { return true }, run: seqWorkload},
	{name: "rand", desc: "random 4 KiB I/O with fio on a 64 MiB file, 5 s each, one request at a time (psync): read IOPS, then write IOPS with an fsync at the end",
		at: func(rtt time.Duration) bool { return rtt == 0 }, run: randWorkload},
	{name: "tree", desc: "a source tree of 12,802 entries (Go 1.26's src: 11,478 files): find, ls -lR, du -s, grep -r; cold = fresh mount and dropped caches, hot = again at once (hot runs and du at 0 ms only)",
		at: func(rtt time.Duration) bool { return rtt <= 2*time.Millisecond }, run: treeWorkload,
		skip: func(sys string, rtt time.Duration) string {
			if rtt > 0 && strings.HasPrefix(sys, "rclone") {
				return "not run at added RTT: a cold grep -r through rclone takes minutes per repetition, beyond this run's time budget"
			}
			return ""
		}},
	{name: "union", desc: "the source tree split between two servers (every directory on both, every other file on each) and merged at the mount point, each name listed once: find, ls -lR, du -s, grep -r as in tree, cold and hot; mergerfs over one sshfs mount per member (both with their defaults; tuned: mergerfs' caches on, over sshfs-tuned), against muxfs given both members as sources; local walks the whole tree in one directory",
		at: func(rtt time.Duration) bool { return rtt <= 2*time.Millisecond }, run: treeWorkload,
		skip: func(sys string, rtt time.Duration) string {
			if sys != "local" && !strings.HasPrefix(sys, "mergerfs") && !strings.HasPrefix(sys, "muxfs") {
				return "not run: the union workload compares muxfs' union with mergerfs over sshfs"
			}
			return ""
		}},
	{name: "bonnie", desc: "bonnie++ 2.00 (the tool of the SDS seed), one run per repetition: 1 MiB written and read per character (one system call per byte), a 512 MiB file written in blocks, rewritten, read per character and in blocks, random seeks; then 2,048 empty files created, stat'ed and deleted in sequential and in random order. A figure bonnie++ prints as +++++ (done in under half a second: too fast to time) is left out",
		at: func(rtt time.Duration) bool { return rtt == 0 }, run: bonnieWorkload},
	{name: "untar", desc: "untar the same tree onto the mount, then rm -rf it",
		at: func(rtt time.Duration) bool { return rtt == 0 }, run: untarWorkload},
	{name: "build", desc: "build Lua 5.4 (a real C project, Debian's source) with make -j2, sources and objects on the mount; cold = fresh mount and dropped caches; then noop = make again with nothing to do, edit = make after a touch of one source (src/lstring.c: compiled again, liblua.a updated, lua and luac linked again), the edit-compile loop; hot = make clean and build again",
		at: func(rtt time.Duration) bool { return rtt <= 2*time.Millisecond }, run: buildWorkload},
	{name: "cache", desc: "the FS-Cache seed's table: a 256 MiB file read with fio (1 MiB records) from a fresh mount with dropped page caches — with muxfs' persistent cache off (`-o cache=memory`), with it on and empty (cold), after a remount with it full (hot: FUSE passthrough), and again at once (page cache); with the hot read, taken in turn, the same bytes read directly from the local disk without muxfs (its cache data file) and the server's file read directly; local is the file read with dropped caches, then again. Each figure is the median of 6 rounds per repetition, the readings compared with each other taken in turn, in an order that changes every round (bench/README.md)",
		at: func(rtt time.Duration) bool { return rtt <= 2*time.Millisecond }, run: cacheWorkload, skip: onlyLocalAndMuxfs("muxfs")},
	{name: "warm", desc: "the source tree and the Lua build right after a remount with a warm persistent cache and dropped page caches (each command first run once to fill the cache); local runs each with dropped caches. muxfs' builds are timed in turn with a local build of a copy of the same sources (each first in every other repetition), the base of the build's target",
		at: func(rtt time.Duration) bool { return rtt <= 2*time.Millisecond }, run: warmWorkload, skip: onlyLocalAndMuxfs("muxfs", "muxfs-nocto")},
	{name: "bigdir", desc: "a directory of 100,000 empty files (a job's outputs): `ls -f` (the names, unsorted) and `ls -l` (every entry's attributes), each cold (fresh mount, dropped caches)",
		at: func(time.Duration) bool { return true }, run: bigdirWorkload},
	{name: "git", desc: "a git repository of " + devDesc + " on the mount: `git clone` of it from the local disk (file://, as from a server), `git status` cold (fresh mount, dropped caches) and hot, and `git commit -a` of a one-line change; a status that finds changes fails the cell",
		at: func(rtt time.Duration) bool { return rtt <= 2*time.Millisecond }, run: gitWorkload},
	{name: "rsync", desc: "`rsync -a` of " + devDesc + " from the local disk onto the mount, then again from a fresh mount with dropped caches (nothing to send: rsync compares every file's size and mtime, and each directory's times); the items the second run sends again are counted — any is a change the mount lost",
		at: func(rtt time.Duration) bool { return rtt <= 2*time.Millisecond }, run: rsyncWorkload},
	{name: "narrow", desc: fmt.Sprintf("a link of %s: the SSH server's port on the loopback shaped both ways (tc htb, a byte queue of 100 ms), with or without added delay. A stat of a file in a directory not yet looked up (median of one every 200 ms): on an idle mount, while a %d MiB file is read (cat) and while one is written (dd, conv=fsync); and the transfers' rates. Cold each time (fresh mount, dropped caches)", narrowRate, narrowMiB),
		at: func(rtt time.Duration) bool { return rtt == 0 || rtt == 20*time.Millisecond }, run: narrowWorkload,
		skip: func(sys string, _ time.Duration) string {
			if sys == "local" {
				return "no link to narrow"
			}
			return ""
		}},
}

// onlyLocalAndMuxfs skips every system but local and the muxfs variants named: the
// workload measures muxfs' persistent cache against the local disk.
func onlyLocalAndMuxfs(variants ...string) func(string, time.Duration) string {
	return func(sys string, _ time.Duration) string {
		if sys != "local" && !slices.Contains(variants, sys) {
			return "measures muxfs' persistent cache against the local disk only"
		}
		return ""
	}
}

// cacheWorkload is the FS-Cache seed's table for one big file.
//
// This machine's disk reads the same file at 600 MB/s once and at 1,500 the next time,
// and which reads come out slow depends on the order of the reads before them
// (bench/README.md): more than the differences measured here. So the readings compared
// with each other are taken in turn, in an order that changes every round, and each
// figure is the median of its cacheRounds rounds: cache off with cold cache; the hot
// read with the same bytes read from the local disk without muxfs (the cache data file
// the hot read hands to the kernel) and with the server's file read directly.
func cacheWorkload(b *bench, s *session, rtt time.Duration) ([]result, error) {
	const mib = 256
	if err := b.ensureFile(s, "cache.dat", mib); err != nil {
		return nil, err
	}
	type reading struct {
		metric string
		file   string
		prep   func() error
	}
	reads := map[string][]float64{}
	var metrics []string
	take := func(rs ...*reading) error {
		for _, r := range rs {
			if _, ok := reads[r.metric]; !ok {
				metrics = append(metrics, r.metric)
			}
			if err := r.prep(); err != nil {
				return err
			}
			v, err := fioRead(r.file, mib)
			if err != nil {
				return err
			}
			reads[r.metric] = append(reads[r.metric], v)
		}
		return nil
	}
	file := filepath.Join(s.mp, "cache.dat")
	drop := func() error { dropCaches(); return nil }
	off := &reading{"cache off", file, func() error { return s.remountKeeping("cache=memory") }}
	cold := &reading{"cold cache", file, s.remount}
	hot := &reading{"hot cache after remount", file, func() error { return s.remountKeeping() }}
	page := &reading{"page cache", file, func() error { return nil }}
	for r := range cacheRounds {
		if err := take(rotate([]*reading{off, cold}, r)...); err != nil {
			return nil, err
		}
	}
	together := []*reading{hot}
	if s.sys.muxfs {
		data, err := largestFile(s.e.muxfsCache())
		if err != nil {
			return nil, err
		}
		together = append(together,
			&reading{"cache data file read directly", data, drop},
			&reading{"server's file read directly", filepath.Join(s.dir, "cache.dat"), drop})
	}
	for r := range cacheRounds {
		rs := rotate(together, r)
		if r == 0 {
			rs = append([]*reading{hot, page}, rs[1:]...)
		}
		if err := take(rs...); err != nil {
			return nil, err
		}
	}
	var res []result
	for _, m := range metrics {
		res = append(res, result{m, "MB/s", median(reads[m]), true})
	}
	return res, nil
}

// cacheRounds is how many times each reading of the cache workload is taken per
// repetition: a multiple of 2 and 3, so that in a rotation of two or three readings
// each takes every place as often.
const cacheRounds = 6

// rotate returns rs rotated left by n.
func rotate[T any](rs []T, n int) []T {
	if len(rs) == 0 {
		return nil
	}
	n %= len(rs)
	return append(slices.Clone(rs[n:]), rs[:n]...)
}

// fioRead reads the first mib MiB of file with fio in 1 MiB records, in MB/s.
func fioRead(file string, mib int) (float64, error) {
	o, err := fio("--name=read", "--filename="+file, "--rw=read", "--bs=1m", fmt.Sprintf("--size=%dm", mib))
	if err != nil {
		return 0, err
	}
	return o.Jobs[0].Read.BwBytes / mb, nil
}

// largestFile is the biggest regular file under dir.
func largestFile(dir string) (string, error) {
	var best string
	var size int64
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if err == nil && info.Size() > size {
			best, size = p, info.Size()
		}
		return err
	})
	if err == nil && best == "" {
		err = fmt.Errorf("no file in %s", dir)
	}
	return best, err
}

// warmWorkload times the tree commands and the build right after a remount that keeps
// the persistent cache.
func warmWorkload(b *bench, s *session, rtt time.Duration) ([]result, error) {
	tree := filepath.Join(s.mp, "tree")
	if err := b.unpackLua(filepath.Join(s.dir, "lua"), false); err != nil {
		return nil, err
	}
	lua := filepath.Join(s.mp, "lua")
	cmds := []struct{ name, script string }{
		{"find", "find " + tree + " | wc -l"},
		{"ls -lR", "ls -lR " + tree + " > /dev/null"},
		{"grep -r", "grep -r --count zzqqxxnotfound " + tree + " > /dev/null; test $? -le 1"},
		{"build", "make -C " + lua + " -j2 posix > /dev/null"},
	}
	if err := s.remountKeeping(); err != nil {
		return nil, err
	}
	// Fill the cache: each command once (every repetition mounts with a new, empty
	// cache).
	for _, c := range cmds {
		if _, _, err := sh(c.script); err != nil {
			return nil, err
		}
		if c.name == "build" {
			sh("make -C " + lua + " clean > /dev/null") //nolint:errcheck
		}
	}
	var res []result
	for _, c := range cmds {
		// The build's target has a margin narrower than this machine's drift over the
		// minutes between the local system's run and this one: muxfs' builds are
		// timed in turn with a local build of a copy of the same sources, each first
		// in every other repetition (bench/README.md).
		withLocal := c.name == "build" && s.sys.muxfs
		timeLocal := func() error {
			r, err := localBuild(b, s)
			if err == nil {
				res = append(res, r)
			}
			return err
		}
		if withLocal && s.round%2 == 0 {
			if err := timeLocal(); err != nil {
				return res, err
			}
		}
		if err := s.remountKeeping(); err != nil {
			return res, err
		}
		d, _, err := sh(c.script)
		if err != nil {
			return res, err
		}
		res = append(res, result{c.name + " after remount", "s", d.Seconds(), false})
		if c.name == "build" {
			sh("make -C " + lua + " clean > /dev/null") //nolint:errcheck
		}
		if withLocal && s.round%2 == 1 {
			if err := timeLocal(); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// localBuild times the Lua build, with dropped caches, in a local copy of its sources.
func localBuild(b *bench, s *session) (result, error) {
	src := filepath.Join(s.e.root, "lua-local")
	if err := b.unpackLua(src, false); err != nil {
		return result{}, err
	}
	dropCaches()
	d, _, err := sh("make -C " + src + " -j2 posix > /dev/null")
	sh("make -C " + src + " clean > /dev/null") //nolint:errcheck
	return result{"local build, same rounds", "s", d.Seconds(), false}, err
}

// unpackLua unpacks Lua's source tarball into dir, untimed: afresh, or only if dir
// does not exist yet.
func (b *bench) unpackLua(dir string, afresh bool) error {
	if afresh {
		os.RemoveAll(dir) //nolint:errcheck
	} else if _, err := os.Stat(dir); err == nil {
		return nil
	}
	_, _, err := sh(fmt.Sprintf("mkdir -p %s && tar -xzf %s -C %s --strip-components=1", dir, b.luaTar, dir))
	return err
}

type fioOut struct {
	Jobs []struct {
		Read struct {
			BwBytes float64 `json:"bw_bytes"`
			Iops    float64 `json:"iops"`
		} `json:"read"`
		Write struct {
			BwBytes float64 `json:"bw_bytes"`
			Iops    float64 `json:"iops"`
		} `json:"write"`
	} `json:"jobs"`
}

func fio(args ...string) (fioOut, error) {
	var o fioOut
	out, err := exec.Command("fio", append([]string{"--output-format=json", "--ioengine=psync"}, args...)...).Output()
	if err != nil {
		return o, fmt.Errorf("fio %v: %v", args, err)
	}
	// fio may print warnings before the JSON.
	if i := strings.Index(string(out), "{"); i > 0 {
		out = out[i:]
	}
	if err := json.Unmarshal(out, &o); err != nil || len(o.Jobs) == 0 {
		return o, fmt.Errorf("fio output: %v", err)
	}
	return o, nil
}

const mb = 1e6

func seqWorkload(b *bench, s *session, rtt time.Duration) ([]result, error) {
	file := filepath.Join(s.mp, "seq.dat")
	size := fmt.Sprintf("%dm", b.seqMiB)
	var res []result
	if err := s.remount(); err != nil {
		return nil, err
	}
	for _, name := range []string{"write", "rewrite"} {
		o, err := fio("--name="+name, "--filename="+file, "--rw=write", "--bs=64k", "--size="+size, "--end_fsync=1")
		if err != nil {
			return res, err
		}
		res = append(res, result{name, "MB/s", o.Jobs[0].Write.BwBytes / mb, true})
	}
	// The reads are of a file the server wrote itself, not of the one just written:
	// rclone-full's close and fsync return before its upload (5 s later), and its
	// unmount does not wait for it, so the file written may not be on the server.
	read := filepath.Join(s.mp, "seq-read.dat")
	if err := b.ensureFile(s, "seq-read.dat", b.seqMiB); err != nil {
		return res, err
	}
	if err := s.remount(); err != nil {
		return res, err
	}
	// IOzone's reread reads the file just read, from whatever cache the system kept
	// of it; fio drops a file's pages before each job unless told not to.
	for _, job := range []struct{ name, invalidate string }{{"read", "1"}, {"reread", "0"}} {
		o, err := fio("--name="+job.name, "--filename="+read, "--rw=read", "--bs=64k", "--size="+size, "--invalidate="+job.invalidate)
		if err != nil {
			return res, err
		}
		res = append(res, result{job.name, "MB/s", o.Jobs[0].Read.BwBytes / mb, true})
	}
	return res, nil
}

func randWorkload(b *bench, s *session, rtt time.Duration) ([]result, error) {
	file := filepath.Join(s.mp, "rand.dat")
	if err := b.ensureFile(s, "rand.dat", 64); err != nil {
		return nil, err
	}
	if err := s.remount(); err != nil {
		return nil, err
	}
	var res []result
	o, err := fio("--name=randread", "--filename="+file, "--rw=randread", "--bs=4k", "--size=64m", "--runtime=5", "--time_based")
	if err != nil {
		return res, err
	}
	res = append(res, result{"randread", "IOPS", o.Jobs[0].Read.Iops, true})
	o, err = fio("--name=randwrite", "--filename="+file, "--rw=randwrite", "--bs=4k", "--size=64m", "--runtime=5", "--time_based", "--end_fsync=1")
	if err != nil {
		return res, err
	}
	res = append(res, result{"randwrite", "IOPS", o.Jobs[0].Write.Iops, true})
	return res, nil
}

// treeWorkload runs on the shared read-only copy of the tree, or on the union of its
// two halves (the union workload).
func treeWorkload(b *bench, s *session, rtt time.Duration) ([]result, error) {
	tree := filepath.Join(s.mp, "tree")
	cmds := []struct{ name, script string }{
		{"find", "find " + tree + " | wc -l"},
		{"ls -lR", "ls -lR " + tree + " > /dev/null"},
		{"du -s", "du -s " + tree},
		{"grep -r", "grep -r --count zzqqxxnotfound " + tree + " > /dev/null; test $? -le 1"},
	}
	// With added RTT only the cold walks tell something new (the targets); hot runs
	// are the kernel's and muxfs' caches, measured at 0 ms.
	temps := []string{"cold", "hot"}
	if rtt > 0 {
		temps = temps[:1]
	}
	var res []result
	for _, c := range cmds {
		if rtt > 0 && c.name == "du -s" {
			continue
		}
		if err := s.remount(); err != nil {
			return res, err
		}
		for _, temp := range temps {
			d, _, err := sh(c.script)
			if err != nil {
				return res, err
			}
			res = append(res, result{c.name + " " + temp, "s", d.Seconds(), false})
		}
	}
	return res, nil
}

// bigdirFiles is the size of the bigdir workload's directory (its description says it
// too): OpenSSH's server sends 100 entries per READDIR answer, so listing it takes
// 1,000 answers.
const bigdirFiles = 100_000

// bigdirWorkload lists one big directory, cold, by name and with attributes.
func bigdirWorkload(b *bench, s *session, rtt time.Duration) ([]result, error) {
	if err := ensureBigdir(filepath.Join(s.dir, "bigdir")); err != nil {
		return nil, err
	}
	dir := filepath.Join(s.mp, "bigdir")
	cmds := []struct{ name, script string }{
		{"ls -f", "ls -f " + dir + " | wc -l"},
		{"ls -l", "ls -l " + dir + " | wc -l"},
	}
	// ls -f prints . and .. too; ls -l a "total" line.
	var res []result
	for _, c := range cmds {
		if err := s.remount(); err != nil {
			return res, err
		}
		d, out, err := sh(c.script)
		if err != nil {
			return res, err
		}
		if n, _ := strconv.Atoi(strings.TrimSpace(out)); n < bigdirFiles || n > bigdirFiles+2 {
			return res, fmt.Errorf("%s listed %s lines for %d files", c.name, strings.TrimSpace(out), bigdirFiles)
		}
		res = append(res, result{c.name + " cold", "s", d.Seconds(), false})
	}
	return res, nil
}

// ensureBigdir makes dir hold exactly bigdirFiles empty files, server side and
// untimed; a directory left complete by an earlier run is kept.
func ensureBigdir(dir string) error {
	if ents, err := os.ReadDir(dir); err == nil && len(ents) == bigdirFiles {
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i := range bigdirFiles {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("out-%06d.dat", i)), nil, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// devTree is the part of the source tree the git and rsync workloads work on; devDesc
// says what it is.
const (
	devTree = "tree/cmd/go"
	devDesc = "Go 1.26's cmd/go (1,502 files in 81 directories, 9 MB)"
)

// makeGitRepo makes a bare repository at root/devtree.git holding src in one commit,
// and has every git the bench runs use a configuration of its own (a committer, no
// automatic gc, and any owner: the mounts show the server's).
func makeGitRepo(root, src string) (string, error) {
	cfg := filepath.Join(root, "gitconfig")
	if err := os.WriteFile(cfg, []byte("[user]\n\tname = bench\n\temail = bench@localhost\n[safe]\n\tdirectory = *\n[init]\n\tdefaultBranch = main\n[gc]\n\tauto = 0\n"), 0o644); err != nil {
		return "", err
	}
	os.Setenv("GIT_CONFIG_GLOBAL", cfg)   //nolint:errcheck // a valid name
	os.Setenv("GIT_CONFIG_NOSYSTEM", "1") //nolint:errcheck // a valid name
	repo := filepath.Join(root, "devtree.git")
	git := fmt.Sprintf("git --git-dir=%s --work-tree=%s", repo, src)
	_, out, err := sh(fmt.Sprintf("git init -q --bare %s && %s add -A && %s commit -q -m import", repo, git, git))
	if err != nil {
		return "", fmt.Errorf("making the git workload's repository: %v: %s", err, out)
	}
	return repo, nil
}

// gitWorkload clones devTree's repository onto the mount and works in it as a
// developer does: status after a remount, status again, a commit.
func gitWorkload(b *bench, s *session, rtt time.Duration) ([]result, error) {
	os.RemoveAll(filepath.Join(s.dir, "git")) //nolint:errcheck // leftovers of a failed run, server side
	if err := s.remount(); err != nil {
		return nil, err
	}
	repo := filepath.Join(s.mp, "git")
	status := "git -C " + repo + " status --porcelain"
	steps := []struct {
		name, script string
		cold         bool
		clean        bool // the script prints what git status finds changed
	}{
		{"clone", "git clone -q file://" + b.gitRepo + " " + repo, false, false},
		{"status cold", status, true, true},
		{"status hot", status, false, true},
		{"commit", "echo '// edited' >> " + repo + "/main.go && git -C " + repo + " commit -q -a -m edit && " + status, false, true},
	}
	var res []result
	for _, st := range steps {
		if st.cold {
			if err := s.remount(); err != nil {
				return res, err
			}
		}
		d, out, err := sh(st.script)
		if err != nil {
			return res, fmt.Errorf("%s: %v: %s", st.name, err, out)
		}
		if st.clean && strings.TrimSpace(out) != "" {
			return res, fmt.Errorf("%s: git status found changes: %.200s", st.name, out)
		}
		res = append(res, result{st.name, "s", d.Seconds(), false})
	}
	return res, nil
}

// rsyncWorkload copies devTree onto the mount with rsync -a, then runs the same
// rsync on a fresh mount, which should find nothing to send.
func rsyncWorkload(b *bench, s *session, rtt time.Duration) ([]result, error) {
	os.RemoveAll(filepath.Join(s.dir, "rsync")) //nolint:errcheck // leftovers of a failed run, server side
	if err := s.remount(); err != nil {
		return nil, err
	}
	script := fmt.Sprintf("rsync -ai %s/ %s/", filepath.Join(b.data, "shared", devTree), filepath.Join(s.mp, "rsync"))
	d, out, err := sh(script)
	if err != nil {
		return nil, fmt.Errorf("rsync -a: %v: %.300s", err, out)
	}
	res := []result{{"rsync -a", "s", d.Seconds(), false}}
	if err := s.remount(); err != nil {
		return res, err
	}
	if d, out, err = sh(script); err != nil {
		return res, fmt.Errorf("rsync -a again: %v: %.300s", err, out)
	}
	sent := 0
	if out = strings.TrimSpace(out); out != "" {
		sent = strings.Count(out, "\n") + 1
	}
	return append(res, result{"rsync -a again cold", "s", d.Seconds(), false},
		result{"items sent again", "items", float64(sent), false}), nil
}

func untarWorkload(b *bench, s *session, rtt time.Duration) ([]result, error) {
	dst := filepath.Join(s.mp, "untar")
	if err := s.remount(); err != nil {
		return nil, err
	}
	os.RemoveAll(filepath.Join(s.dir, "untar")) //nolint:errcheck // leftovers of a failed run, server side
	d, _, err := sh(fmt.Sprintf("mkdir -p %s && tar -xf %s -C %s", dst, b.treeTar, dst))
	if err != nil {
		return nil, err
	}
	res := []result{{"untar", "files/s", float64(b.treeFiles) / d.Seconds(), true}}
	d, _, err = sh("rm -rf " + dst)
	if err != nil {
		return res, err
	}
	return append(res, result{"rm -rf", "s", d.Seconds(), false}), nil
}

func buildWorkload(b *bench, s *session, rtt time.Duration) ([]result, error) {
	// Unpacked on the server side (untimed), built through the mount.
	if err := b.unpackLua(filepath.Join(s.dir, "lua"), true); err != nil {
		return nil, err
	}
	dir := filepath.Join(s.mp, "lua")
	if err := s.remount(); err != nil {
		return nil, err
	}
	var res []result
	for _, temp := range []string{"cold", "hot"} {
		d, _, err := sh("make -C " + dir + " -j2 posix")
		if err != nil {
			return res, err
		}
		res = append(res, result{"build " + temp, "s", d.Seconds(), false})
		if temp == "cold" {
			r, err := rebuilds(dir)
			res = append(res, r...)
			if err != nil {
				return res, err
			}
		}
		if _, _, err := sh("make -C " + dir + " clean"); err != nil {
			return res, err
		}
	}
	return res, nil
}

// editedSource is the source rebuilds touches: one file of the library, so make
// recompiles it, updates liblua.a and links lua and luac again. A small one (0.1 s
// of compiling here): the compiler's own CPU time for lvm.c varied by 0.6 s from one
// run to the next on this machine, more than the file systems differ.
const editedSource = "lstring.c"

// rebuilds times the edit-compile loop on the build just made: make with nothing to
// do (it stats every target and source), then make after a touch of one source.
func rebuilds(dir string) ([]result, error) {
	mk := "make -C " + dir + " -j2 posix"
	d, _, err := sh(mk + " > /dev/null")
	if err != nil {
		return nil, err
	}
	res := []result{{"build noop", "s", d.Seconds(), false}}
	// SFTP v3 times are whole seconds: a touch within the second the object was
	// written in would leave the source no newer than it, and make would do nothing.
	time.Sleep(time.Second)
	src := filepath.Join(dir, "src", editedSource)
	if _, _, err := sh("touch " + src); err != nil {
		return res, err
	}
	d, out, err := sh(mk)
	if err != nil {
		return res, err
	}
	if !strings.Contains(out, " "+editedSource) {
		return res, fmt.Errorf("make after a touch of %s did not compile it: %s", src, tail(out))
	}
	return append(res, result{"build edit", "s", d.Seconds(), false}), nil
}

// bonnieFields are the columns of bonnie++'s CSV line (format 1.98, bonnie++ 2.00)
// reported, with the unit of each.
var bonnieFields = []struct {
	col    int
	metric string
	unit   string // MB/s: bonnie++'s K/sec converted
}{
	{9, "write per char", "MB/s"}, {11, "write block", "MB/s"}, {13, "rewrite", "MB/s"},
	{15, "read per char", "MB/s"}, {17, "read block", "MB/s"}, {19, "random seeks", "IOPS"},
	{26, "seq create", "files/s"}, {28, "seq stat", "files/s"}, {30, "seq delete", "files/s"},
	{32, "random create", "files/s"}, {34, "random stat", "files/s"}, {36, "random delete", "files/s"},
}

func bonnieWorkload(b *bench, s *session, rtt time.Duration) ([]result, error) {
	dir := filepath.Join(s.mp, "bonnie")
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := s.remount(); err != nil {
		return nil, err
	}
	// -r 256 lets a 512 MiB file count as twice the RAM (bonnie++ wants the file to
	// outsize the page cache; each phase's figure is then still the file system's, as
	// the read phases start after the 512 MiB written have pushed most of it out).
	// -f1: the per-character phases move 1 MiB (default 20), one write(2) or
	// read(2) per byte: through FUSE each is a request, and 20 MiB at sshfs' 30 KB/s
	// would take over ten minutes. Its standard error is kept (sh puts it in the
	// error): a failed run says what bonnie++ could not do.
	_, out, err := sh("bonnie++ -q -u root -x 1 -d " + dir + " -s 512 -r 256 -f1 -n 2 -m " + s.sys.name)
	if err != nil {
		return nil, err
	}
	var cols []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Split(strings.TrimSpace(line), ","); len(f) > 36 {
			cols = f
		}
	}
	if cols == nil {
		return nil, fmt.Errorf("bonnie++ printed no CSV line: %s", tail(out))
	}
	var res []result
	for _, f := range bonnieFields {
		v, err := strconv.ParseFloat(cols[f.col], 64)
		if err != nil {
			continue // +++++: too fast to time
		}
		if f.unit == "MB/s" {
			v = v * 1024 / mb
		}
		res = append(res, result{f.metric, f.unit, v, true})
	}
	return res, nil
}
