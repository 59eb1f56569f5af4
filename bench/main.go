// Command bench measures muxfs against local disk, the raw ssh stream, sshfs (default and
// tuned) and rclone mount (vfs-cache-mode off and full), over one loopback sshd, at
// several added round-trip times, in one run, and writes docs/benchmarks.md with PNG
// charts. See bench/README.md.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

type bench struct {
	env       *env
	reps      int
	seqMiB    int
	treeTar   string
	treeFiles int
	luaTar    string
	// gitRepo is a bare repository of devTree on the local disk, cloned onto the
	// mount by the git workload.
	gitRepo string
	data    string // server-side data root
	results *store
	// maxSteal: a measurement during which the host took more than this percentage
	// of the machine is taken again, up to retakes times (steal.go).
	maxSteal float64
	retakes  int
	// stealClock, if set, stands in for /proc/stat (and no wait for a quiet host is
	// made): tests.
	stealClock func() (cpuTimes, bool)
	// The time spent waiting for the host and on attempts not kept, and on the
	// measurements kept (steady).
	stealSpent, measured time.Duration
}

func main() {
	var (
		sysList  = flag.String("systems", "local,sshfs,sshfs-tuned,rclone,rclone-full,mergerfs,mergerfs-tuned,muxfs,muxfs-nocto,muxfs-ssh", "systems to measure")
		wlList   = flag.String("workloads", "seq,rand,tree,union,bonnie,untar,build,narrow,bigdir,git,rsync", "workloads to run")
		rttList  = flag.String("rtt", "0,2,20", "added round-trip times in ms")
		reps     = flag.Int("reps", 3, "repetitions of each measurement (median reported)")
		seqMiB   = flag.Int("seq-mib", 128, "size of the sequential I/O file in MiB")
		out      = flag.String("out", "docs/benchmarks.md", "markdown report to write")
		charts   = flag.String("charts", "docs/bench", "directory for PNG charts")
		muxfsBin = flag.String("muxfs", "", "muxfs binary (default: build ./cmd/muxfs)")
		keep     = flag.Bool("keep", false, "keep the working directory")
		fromLog  = flag.String("from-log", "", "write the report from this run log instead of measuring")
		notes    = flag.String("notes", "", "markdown file appended to the report (the analysis)")
		fsGiB    = flag.Int("fs-gib", 32, "size of the ext4 image the bench's files live on (sparse); 0: the temporary directory's own file system")
		maxSteal = flag.Float64("max-steal", 5, "take a measurement again when the host took more than this percentage of the machine's CPU time during it (/proc/stat steal); 0: never")
		retakes  = flag.Int("retakes", 2, "at most this many retakes of one measurement for steal (the one with the least steal is kept)")
		serve    = flag.Bool("serve", false, "set up the server, delay proxies and data, print how to mount each system, and wait for Ctrl-C (a rig for profiling by hand)")
	)
	flag.Parse()
	log.SetFlags(log.Ltime)
	given := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if err := checkPartialOut(given); err != nil {
		log.Fatal(err)
	}
	// Paths are relative to the repository root, also when run from bench/.
	if _, err := os.Stat("cmd/muxfs"); err != nil {
		if err := os.Chdir(".."); err != nil {
			log.Fatal(err)
		}
	}

	var rtts []time.Duration
	for _, f := range strings.Split(*rttList, ",") {
		ms, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			log.Fatalf("bad -rtt %q", f)
		}
		rtts = append(rtts, time.Duration(ms)*time.Millisecond)
	}
	if *fromLog != "" {
		s, err := loadLog(*fromLog)
		if err != nil {
			log.Fatal(err)
		}
		cmdline := "bench/run.sh -from-log " + *fromLog
		if err := s.report(*out, *charts, *notes, cmdline, rtts, 0); err != nil {
			log.Fatal(err)
		}
		return
	}
	for _, tool := range []string{"fio", "sshfs", "rclone", "sshd", "make", "cc"} {
		if _, err := exec.LookPath(tool); err != nil && tool != "sshd" {
			log.Fatalf("%s is not installed: run bench/setup.sh", tool)
		}
	}
	root, err := os.MkdirTemp("", "muxfs-bench-")
	if err != nil {
		fatal(err)
	}
	defer td.run()
	td.onSignal(root, *serve)
	if !*keep {
		td.push(func() { os.RemoveAll(root) })
	}
	fs := ""
	if *fsGiB > 0 {
		undo, err := fsImage(root, *fsGiB)
		if err != nil {
			fatal(err)
		}
		fs = fsNote
		log.Printf("filesystem: %s", fs)
		if !*keep {
			td.push(undo)
		}
	}
	bin := *muxfsBin
	if bin == "" {
		bin = filepath.Join(root, "muxfs")
		if err := run("go", "build", "-o", bin, "./cmd/muxfs"); err != nil {
			fatal(err)
		}
	}
	e, err := newEnv(root, bin, rtts)
	if err != nil {
		fatal(err)
	}
	td.push(e.close)
	b := &bench{env: e, reps: *reps, seqMiB: *seqMiB, data: filepath.Join(root, "data"), results: newStore(),
		maxSteal: *maxSteal, retakes: *retakes}
	b.results.fs = fs
	b.results.machine = machine()
	b.results.maxSteal = *maxSteal
	log.Printf("machine: %s", b.results.machine)
	log.Printf("max steal: %g%%, %d retakes", *maxSteal, *retakes)
	if err := b.prepare(); err != nil {
		fatal(err)
	}

	if *serve {
		b.serve(rtts)
		return
	}

	selected := func(list string, name string) bool { return slices.Contains(strings.Split(list, ","), name) }
	started := time.Now()
	for _, rtt := range rtts {
		for _, w := range workloads {
			if !selected(*wlList, w.name) || !w.at(rtt) {
				continue
			}
			var measured []system
			for _, sys := range systems {
				if !selected(*sysList, sys.name) || (sys.only != nil && !slices.Contains(sys.only, w.name)) {
					continue
				}
				if w.skip != nil {
					if why := w.skip(sys.name, rtt); why != "" {
						b.results.fail(rtt, w.name, sys.name, errors.New(why))
						continue
					}
				}
				measured = append(measured, sys)
			}
			b.interleave(w, measured, rtt)
		}
	}
	log.Printf("all measurements took %v", time.Since(started).Round(time.Second))
	cmdline := strings.TrimSpace("bench/run.sh " + strings.Join(os.Args[1:], " "))
	if err := b.results.report(*out, *charts, *notes, cmdline, rtts, time.Since(started)); err != nil {
		fatal(err)
	}
	log.Printf("wrote %s and charts in %s", *out, *charts)
}

// checkPartialOut refuses a run of part of the bench (some systems, workloads or
// RTTs) that would write its report over the complete run's page and charts: a quick
// check of one workload run so replaced docs/benchmarks.md, the page the README's
// figures come from. given holds the flags set on the command line.
func checkPartialOut(given map[string]bool) error {
	if given["serve"] || given["from-log"] {
		return nil // -serve writes no report; a log's report is as complete as its run
	}
	partial := ""
	for _, f := range []string{"systems", "workloads", "rtt"} {
		if given[f] {
			partial = f
			break
		}
	}
	if partial == "" || given["out"] && given["charts"] {
		return nil
	}
	return fmt.Errorf("-%s runs part of the bench, whose report would replace the complete run's docs/benchmarks.md or docs/bench/: give both -out FILE.md and -charts DIR", partial)
}

// prepare makes the data every system reads: the tree, its tarball, Lua's source.
func (b *bench) prepare() error {
	shared := filepath.Join(b.data, "shared")
	if err := os.MkdirAll(shared, 0o755); err != nil {
		return err
	}
	goroot := strings.TrimSpace(mustOutput("go", "env", "GOROOT"))
	if _, _, err := sh(fmt.Sprintf("cp -a %s/src %s/tree", goroot, shared)); err != nil {
		return err
	}
	out := mustOutput("sh", "-c", "find "+shared+"/tree | wc -l")
	b.treeFiles, _ = strconv.Atoi(strings.TrimSpace(out))
	b.treeTar = filepath.Join(b.env.root, "tree.tar")
	if _, _, err := sh(fmt.Sprintf("tar -cf %s -C %s tree", b.treeTar, shared)); err != nil {
		return err
	}
	err := splitTree(filepath.Join(shared, "tree"), filepath.Join(shared, "union"))
	if err != nil {
		return err
	}
	if b.gitRepo, err = makeGitRepo(b.env.root, filepath.Join(shared, devTree)); err != nil {
		return err
	}
	lua, err := fetchLua(b.env.root)
	if err != nil {
		return err
	}
	b.luaTar = lua
	log.Printf("prepared: tree of %d entries, %s", b.treeFiles, filepath.Base(lua))
	return nil
}

// splitTree makes the union workload's data in dir: the tree as two members a and b
// (two servers' halves), each with every directory of the tree and every other file of
// it, and the whole tree again beside them (dir/tree, what the local system walks).
// Files are hard links to the tree's: the same bytes, no copy.
func splitTree(tree, dir string) error {
	i := 0
	return filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(filepath.Dir(tree), p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			for _, top := range []string{"a", "b", ""} {
				if err := os.MkdirAll(filepath.Join(dir, top, rel), 0o755); err != nil {
					return err
				}
			}
			return nil
		}
		member := []string{"a", "b"}[i%2]
		i++
		if err := os.Link(p, filepath.Join(dir, member, rel)); err != nil {
			return err
		}
		return os.Link(p, filepath.Join(dir, rel))
	})
}

// fetchLua downloads Lua 5.4's source from Debian (a private apt state: the machine's
// apt configuration is not touched).
func fetchLua(root string) (string, error) {
	dir := filepath.Join(root, "srcpkg")
	if err := os.MkdirAll(filepath.Join(dir, "lists", "partial"), 0o755); err != nil {
		return "", err
	}
	sources := "Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
	if err := os.WriteFile(filepath.Join(dir, "deb-src.sources"), []byte(sources), 0o644); err != nil {
		return "", err
	}
	apt := fmt.Sprintf("apt-get -q -o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts=%s -o Dir::State::Lists=%s/lists", dir, dir)
	if _, _, err := sh(fmt.Sprintf("cd %s && %s update && %s source --download-only lua5.4", dir, apt, apt)); err != nil {
		return "", err
	}
	m, _ := filepath.Glob(filepath.Join(dir, "lua5.4_*.orig.tar.gz"))
	if len(m) == 0 {
		return "", fmt.Errorf("lua5.4 source not downloaded")
	}
	return m[0], nil
}

func mustOutput(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		fatalf("%s %v: %v", name, args, err)
	}
	return string(out)
}

// ensureFile makes a file of n MiB of random data on the server side, unless there is one.
func (b *bench) ensureFile(s *session, name string, n int) error {
	p := filepath.Join(s.dir, name)
	if st, err := os.Stat(p); err == nil && st.Size() == int64(n)<<20 {
		return nil
	}
	_, _, err := sh(fmt.Sprintf("dd if=/dev/urandom of=%s bs=1M count=%d status=none", p, n))
	return err
}

// interleave runs workload w on every system at rtt, b.reps times, in turn (inTurn),
// and for seq the raw SSH streams after each repetition's systems. This machine's
// speed drifts by more than the margins of the targets over the minutes one system's
// repetitions take (docs/bench-notes.md): taken in turn, a slow spell falls on all
// the systems compared, not on one system's median.
func (b *bench) interleave(w workload, systems []system, rtt time.Duration) {
	streams := w.name == "seq"
	inTurn(systems, b.reps, func(sys system, rep int) bool {
		return b.measure(w, sys, rtt, rep)
	}, func(rep int) {
		if streams {
			streams = b.rawStream(rtt, rep)
		}
	})
}

// inTurn calls run for every system in each of reps repetitions, in an order turned
// by one from one repetition to the next, and after at the end of each repetition. A
// system for which run returns false (it failed) is not run again.
func inTurn(systems []system, reps int, run func(sys system, rep int) bool, after func(rep int)) {
	failed := map[string]bool{}
	for rep := 0; rep < reps; rep++ {
		for _, sys := range rotate(systems, rep) {
			if !failed[sys.name] && !run(sys, rep) {
				failed[sys.name] = true
			}
		}
		after(rep)
	}
}

// measure runs workload w once on system sys at rtt, on a fresh mount, as repetition
// rep; it says whether it succeeded.
func (b *bench) measure(w workload, sys system, rtt time.Duration, rep int) bool {
	dir := filepath.Join(b.data, sys.name)
	switch w.name {
	case "tree", "warm", "narrow", "bigdir":
		dir = filepath.Join(b.data, "shared")
	case "union":
		dir = filepath.Join(b.data, "shared", "union")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fatal(err)
	}
	name := fmt.Sprintf("%v %s %s rep %d", rtt, w.name, sys.name, rep+1)
	res, steal, err := b.steady(name, func() (res []result, err error) {
		s, err := b.env.open(sys, rtt, dir, w.name == "union")
		if err != nil {
			return nil, err
		}
		defer func() {
			s.close()
			if err == nil {
				res = append(res, s.memory()...)
			}
		}()
		s.round = rep
		return w.run(b, s, rtt)
	})
	for _, r := range res {
		b.results.add(rtt, w.name, sys.name, r)
	}
	if err != nil {
		b.results.fail(rtt, w.name, sys.name, err)
		log.Printf("%v %s %s: %v", rtt, w.name, sys.name, err)
		return false
	}
	b.results.kept(steal)
	log.Printf("%s: %s%s", name, summary(res), stealSuffix(steal))
	return true
}

func summary(res []result) string {
	var parts []string
	for _, r := range res {
		parts = append(parts, fmt.Sprintf("%s=%.3g%s", r.metric, r.value, r.unit))
	}
	return strings.Join(parts, " ")
}

// rawStream measures `ssh host cat FILE` through the same link, once, as repetition
// rep: the limit of one SSH stream, with ssh's default cipher and with the one muxfs
// prefers; and the other direction, `ssh host 'cat > FILE; sync FILE'` (fio's write
// ends with an fsync): the server writing a new file from one stream, the limit of a
// sequential write through one session. It says whether it succeeded.
func (b *bench) rawStream(rtt time.Duration, rep int) bool {
	file := filepath.Join(b.data, "shared", "stream.dat")
	if _, _, err := sh(fmt.Sprintf("test -s %s || dd if=/dev/urandom of=%s bs=1M count=%d status=none", file, file, b.seqMiB)); err != nil {
		fatal(err)
	}
	written := filepath.Join(b.data, "shared", "stream-written.dat")
	defer os.Remove(written) //nolint:errcheck // the bench's own scratch file
	for _, v := range []struct{ name, cipher string }{{"ssh-stream", ""}, {"ssh-stream-gcm", "-c aes128-gcm@openssh.com"}} {
		opts := "-o " + strings.Join(b.env.sshOpts(), " -o ")
		ssh := fmt.Sprintf("ssh %s %s -p %d %s@127.0.0.1", opts, v.cipher, b.env.proxies[rtt], b.env.server.User)
		name := fmt.Sprintf("%v seq %s rep %d", rtt, v.name, rep+1)
		res, steal, err := b.steady(name, func() ([]result, error) {
			// The connection's setup is not part of the stream: time it alone and
			// take it off.
			setup, _, err := sh(ssh + " true")
			if err != nil {
				return nil, err
			}
			dropCaches()
			d, _, err := sh(fmt.Sprintf("%s cat %s > /dev/null", ssh, file))
			if err != nil {
				return nil, err
			}
			res := []result{{"read", "MB/s", float64(b.seqMiB<<20) / mb / (d - setup).Seconds(), true}}
			os.Remove(written) //nolint:errcheck // each repetition writes a new file, as fio's write does
			d, _, err = sh(fmt.Sprintf("%s 'cat > %s && sync %s' < %s", ssh, written, written, file))
			if err != nil {
				return nil, err
			}
			res = append(res, result{"write", "MB/s", float64(b.seqMiB<<20) / mb / (d - setup).Seconds(), true})
			return res, nil
		})
		if err == nil {
			for _, r := range res {
				b.results.add(rtt, "seq", v.name, r)
			}
			b.results.kept(steal)
			log.Printf("%s: %s%s", name, summary(res), stealSuffix(steal))
		}
		if err != nil {
			b.results.fail(rtt, "seq", v.name, err)
			return false
		}
	}
	return true
}

// serve prints the rig's addresses and each system's mount command, and waits for
// Ctrl-C or SIGTERM: the same server, proxies, data and mount options as a run, for
// profiling one workload by hand (-o debug, MUXFS_CPUPROFILE, perf).
func (b *bench) serve(rtts []time.Duration) {
	e := b.env
	fmt.Printf("data on the server: %s (tree: %s/shared/tree, Lua source: %s)\n", b.data, b.data, b.luaTar)
	for _, rtt := range rtts {
		port := e.proxies[rtt]
		fmt.Printf("\n%v added RTT: port %d\n", rtt, port)
		fmt.Printf("  %s --cache-dir %s -o %s sftp://%s@127.0.0.1:%d%s MOUNTPOINT\n",
			e.muxfs, e.muxfsCache(), strings.Join(e.sshOpts(), ","), e.server.User, port, b.data)
		fmt.Printf("  sshfs -o %s %s@127.0.0.1:%s MOUNTPOINT\n", sshfsOpts(e, port, ""), e.server.User, b.data)
		union := filepath.Join(b.data, "shared", "union")
		fmt.Printf("  union: muxfs as above with the sources %s/a and %s/b; mergerfs over sshfs mounts of both: mergerfs MP-A:MP-B MOUNTPOINT\n", union, union)
	}
	fmt.Println("\nCtrl-C ends the rig (and unmounts what is still mounted in it).")
	select {} // until the teardown's signal handler ends the process
}
