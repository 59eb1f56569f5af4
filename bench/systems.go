package main

import (
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/muxfs/muxfs/internal/mountinfo"
)

// system is one way of reaching the server's files.
type system struct {
	name  string
	local bool // the directory itself: the limit
	// muxfs: muxfs, mounted with opts (its -o options beyond the bench's own).
	muxfs bool
	opts  []string
	// only, if set, names the workloads the system is measured in (no row elsewhere).
	only []string
	// mount mounts remote dir at mp, reaching the server on port (muxfs systems are
	// mounted by session.mount). For the union workload dir holds the members a and
	// b, merged at mp.
	mount func(e *env, port int, dir, mp string) error
	// parts are mount points the system makes besides mp (mergerfs' members), unmounted
	// after it.
	parts func(mp string) []string
	// diskCache, if set, is where the system mounted at mp keeps file data on local
	// disk across mounts; a cold mount starts with it empty, as muxfs' does.
	diskCache func(e *env, mp string) string
}

func sshfsOpts(e *env, port int, extra string) string {
	o := fmt.Sprintf("port=%d,%s", port, strings.Join(e.sshOpts(), ","))
	if extra != "" {
		o += "," + extra
	}
	return o
}

// sshfsTuned are the sshfs options of the speed issue's sshfs-tuned.
const sshfsTuned = "max_conns=4,kernel_cache,Ciphers=aes128-gcm@openssh.com"

var systems = []system{
	{name: "local", local: true},
	{name: "sshfs", mount: func(e *env, port int, dir, mp string) error {
		return e.mount("sshfs", "-o", sshfsOpts(e, port, ""), fmt.Sprintf("%s@127.0.0.1:%s", e.server.User, dir), mp)
	}},
	{name: "sshfs-tuned", mount: func(e *env, port int, dir, mp string) error {
		return e.mount("sshfs", "-o", sshfsOpts(e, port, sshfsTuned), fmt.Sprintf("%s@127.0.0.1:%s", e.server.User, dir), mp)
	}},
	{name: "rclone", mount: func(e *env, port int, dir, mp string) error { return rcloneMount(e, port, dir, mp, "off") }},
	{name: "rclone-full", mount: func(e *env, port int, dir, mp string) error { return rcloneMount(e, port, dir, mp, "full") },
		diskCache: rcloneCache},
	// What users union several servers with today: mergerfs (its defaults) over one
	// sshfs mount (its defaults) per server; tuned, mergerfs with its caches on (the
	// page cache, and attributes, names, missing names and listings for 30 s) over
	// sshfs-tuned.
	{name: "mergerfs", only: []string{"union"}, parts: mergerfsParts,
		mount: func(e *env, port int, dir, mp string) error { return mergerfsMount(e, port, dir, mp, "", "") }},
	{name: "mergerfs-tuned", only: []string{"union"}, parts: mergerfsParts,
		mount: func(e *env, port int, dir, mp string) error {
			return mergerfsMount(e, port, dir, mp, sshfsTuned,
				"cache.files=partial,dropcacheonclose=true,cache.attr=30,cache.entry=30,cache.negative_entry=30,cache.readdir=true,cache.statfs=30")
		}},
	{name: "muxfs", muxfs: true},
	// Close-to-open off (opt-in): what muxfs does for a walk of opens without a
	// round trip at each.
	{name: "muxfs-nocto", muxfs: true, opts: []string{"nocto"}, only: []string{"tree", "union", "build", "warm"}},
	// Always through the ssh program (muxfs' only transport before 2026-11-25): what
	// the in-process transport gains, where a round trip or CPU per byte counts.
	{name: "muxfs-ssh", muxfs: true, opts: []string{"transport=ssh"}, only: []string{"seq", "rand", "tree", "untar"}},
	// A wider pool (not a default: the speed issue asks for 4 sessions, as sshfs'
	// max_conns): over a long round trip a striped transfer carries one SSH window
	// per session, so what more sessions give there.
	{name: "muxfs-8conns", muxfs: true, opts: []string{"max_conns=8"}, only: []string{"seq"}},
}

// muxfsMount mounts muxfs with its defaults and its persistent cache in the bench's
// directory, the union of dirs in their order; extra are more -o options.
func muxfsMount(e *env, port int, dirs []string, mp string, extra ...string) error {
	args := []string{"--cache-dir", e.muxfsCache(), "-o", strings.Join(append(e.sshOpts(), extra...), ",")}
	for _, dir := range dirs {
		args = append(args, fmt.Sprintf("sftp://%s@127.0.0.1:%d%s", e.server.User, port, dir))
	}
	return e.mount(e.muxfs, append(args, mp)...)
}

// unionMembers are the directories of the union workload's two members on the
// server, below its directory dir (see bench.splitTree).
func unionMembers(dir string) []string {
	return []string{filepath.Join(dir, "a"), filepath.Join(dir, "b")}
}

// mergerfsParts are the sshfs mounts that mergerfs at mp merges, one per member.
func mergerfsParts(mp string) []string { return []string{mp + "-a", mp + "-b"} }

// mergerfsMount mounts mergerfs at mp, with the options opts, over one sshfs mount of
// each member of dir, with the sshfs options sshfsExtra. A failure leaves nothing
// mounted: a failed open has no session to unmount it.
func mergerfsMount(e *env, port int, dir, mp, sshfsExtra, opts string) (err error) {
	parts := mergerfsParts(mp)
	defer func() {
		if err != nil {
			for _, p := range parts {
				unmount(p)
			}
		}
	}()
	for i, member := range unionMembers(dir) {
		if err := os.MkdirAll(parts[i], 0o755); err != nil {
			return err
		}
		if err := e.mount("sshfs", "-o", sshfsOpts(e, port, sshfsExtra), fmt.Sprintf("%s@127.0.0.1:%s", e.server.User, member), parts[i]); err != nil {
			return err
		}
	}
	args := []string{strings.Join(parts, ":"), mp}
	if opts != "" {
		args = append([]string{"-o", opts}, args...)
	}
	return e.mount("mergerfs", args...)
}

// muxfsCaches holds muxfs' persistent cache directories.
func (e *env) muxfsCaches() string { return filepath.Join(e.root, "muxfs-cache") }

// muxfsCache is the persistent cache directory muxfs mounts with now.
func (e *env) muxfsCache() string { return filepath.Join(e.muxfsCaches(), strconv.Itoa(e.cacheGen)) }

func rcloneMount(e *env, port int, dir, mp, mode string) error {
	remote := fmt.Sprintf(":sftp,host=127.0.0.1,port=%d,user=%s,key_file=%s,known_hosts_file=%s:%s",
		port, e.server.User, e.keys.Identity, e.keys.KnownHosts, dir)
	args := []string{"mount", remote, mp, "--daemon", "--vfs-cache-mode", mode}
	if mode != "off" {
		args = append(args, "--cache-dir", rcloneCache(e, mp))
	}
	if err := e.mount("rclone", args...); err != nil {
		return err
	}
	return waitMounted(mp)
}

// rcloneCache is the VFS cache directory of the rclone mount at mp.
func rcloneCache(e *env, mp string) string {
	return filepath.Join(e.root, "rclone-cache", filepath.Base(mp))
}

func run(name string, args ...string) error { return runCmd(exec.Command(name, args...)) }

// runCmd runs cmd; its error says what failed and ends with what the command printed.
func runCmd(cmd *exec.Cmd) error {
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", cmd.Args[0], err, tail(string(out)))
	}
	return nil
}

// mount runs a command that mounts a file system, in a process group of its own, and
// notes the group: what the command starts before it goes to the background — sshfs'
// first ssh, which then outlives its parent and belongs to no process of the mount —
// stays in it, so that the memory reading finds it.
func (e *env) mount(name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err := runCmd(cmd)
	if cmd.Process != nil {
		e.mountGroups = append(e.mountGroups, cmd.Process.Pid)
	}
	return err
}

func isMounted(mp string) bool { return mountinfo.IsMounted(mp) }

func waitMounted(mp string) error {
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if isMounted(mp) {
			return nil
		}
	}
	return fmt.Errorf("%s did not mount", mp)
}

func unmount(mp string) {
	if !isMounted(mp) {
		return
	}
	if exec.Command("fusermount3", "-u", mp).Run() != nil {
		time.Sleep(500 * time.Millisecond)
		if exec.Command("fusermount3", "-u", mp).Run() != nil {
			exec.Command("fusermount3", "-u", "-z", mp).Run() //nolint:errcheck
		}
	}
	for deadline := time.Now().Add(10 * time.Second); isMounted(mp) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	awaitExit(mp, time.Minute)
}

// awaitExit waits until no process has mp as the last word of its command line (a
// file system's process mounted there), and kills any still there after limit.
//
// The file system's process outlives the unmount for a moment (rclone's daemon writes
// its cache's state as it ends): what follows — emptying that cache, a new mount on
// the same point, the next system's measurement — must not race it, and one still
// busy after the limit is killed, so that its work cannot fall into another system's
// figures.
func awaitExit(mp string, limit time.Duration) {
	daemon := regexp.QuoteMeta(mp) + "( |$)"
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if exec.Command("pgrep", "-f", daemon).Run() != nil {
			return
		}
	}
	log.Printf("%s: its file system's process still runs %v after the unmount: killed", mp, limit)
	exec.Command("pkill", "-KILL", "-f", daemon).Run() //nolint:errcheck // gone already is fine
}

// session is one system mounted over one link: the directory to work in, and how to
// make it cold again (a fresh mount with dropped caches).
type session struct {
	e    *env
	sys  system
	port int
	dir  string // on the server
	mp   string // where the workload runs
	// union: the system is mounted as the union of dir's members a and b (the union
	// workload), not as dir.
	union bool
	// round is the repetition this session runs, for workloads that change the
	// order of their readings from one to the next.
	round int
	// peak is the most memory the system took in any of the session's mounts, read
	// as each ends (peakMemory).
	peak uint64
}

func (e *env) open(sys system, rtt time.Duration, dir string, union bool) (*session, error) {
	s := &session{e: e, sys: sys, port: e.proxies[rtt], dir: dir, mp: dir, union: union}
	if sys.local {
		return s, nil
	}
	s.mp = filepath.Join(e.root, "mnt", sys.name)
	if err := os.MkdirAll(s.mp, 0o755); err != nil {
		return nil, err
	}
	return s, s.remount()
}

// remount makes the session cold: a fresh mount, dropped caches, and (for muxfs) an
// empty persistent cache.
func (s *session) remount() error {
	if s.sys.local {
		dropCaches()
		return nil
	}
	s.unmount()
	if s.sys.muxfs {
		// Cold means nothing cached: a new, empty directory. Deleting the last one
		// here would put the file system's work of freeing it (hundreds of MiB at
		// times) next to the timed commands; session.close deletes them.
		s.e.cacheGen++
	}
	if s.sys.diskCache != nil {
		// rclone's VFS cache outlives its mount: a cold read after a remount came
		// from the local disk (the seq workload's read of the file just written).
		if err := os.RemoveAll(s.sys.diskCache(s.e, s.mp)); err != nil {
			return err
		}
	}
	dropCaches()
	if err := s.mount(); err != nil {
		return err
	}
	return waitMounted(s.mp)
}

// mount mounts the session's system; extra are more muxfs -o options.
func (s *session) mount(extra ...string) error {
	if s.sys.muxfs {
		dirs := []string{s.dir}
		if s.union {
			dirs = unionMembers(s.dir)
		}
		return muxfsMount(s.e, s.port, dirs, s.mp, append(slices.Clone(s.sys.opts), extra...)...)
	}
	return s.sys.mount(s.e, s.port, s.dir, s.mp)
}

// unmount unmounts the session's system and the mounts it is made of, noting the
// memory it took.
func (s *session) unmount() {
	mps := []string{s.mp}
	if s.sys.parts != nil {
		mps = append(mps, s.sys.parts(s.mp)...)
	}
	s.peak = max(s.peak, peakMemory(mps, s.e.mountGroups))
	s.e.mountGroups = nil
	unmount(s.mp)
	if s.sys.parts != nil {
		for _, p := range s.sys.parts(s.mp) {
			unmount(p)
		}
	}
}

// remountKeeping is a fresh mount with dropped page caches that keeps muxfs'
// persistent cache (what a user sees after a remount or a reboot); extra are more
// muxfs -o options.
func (s *session) remountKeeping(extra ...string) error {
	if s.sys.local {
		dropCaches()
		return nil
	}
	s.unmount()
	dropCaches()
	if err := s.mount(extra...); err != nil {
		return err
	}
	return waitMounted(s.mp)
}

func (s *session) close() {
	if !s.sys.local {
		s.unmount()
	}
	if s.sys.muxfs {
		os.RemoveAll(s.e.muxfsCaches()) //nolint:errcheck // the next session mounts a new one
	}
}

// memory is the session's reading of the memory its system took, once closed; none
// for local, which has no process of its own.
func (s *session) memory() []result {
	if s.peak == 0 {
		return nil
	}
	return []result{{metric: memoryMetric, unit: "MB", value: float64(s.peak) / 1e6}}
}
