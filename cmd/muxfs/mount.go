package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/term"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/muxfs/muxfs/internal/backend"
	"github.com/muxfs/muxfs/internal/cache"
	"github.com/muxfs/muxfs/internal/config"
	"github.com/muxfs/muxfs/internal/control"
	"github.com/muxfs/muxfs/internal/diskcache"
	"github.com/muxfs/muxfs/internal/fusefs"
	"github.com/muxfs/muxfs/internal/mountinfo"
	"github.com/muxfs/muxfs/internal/mux"
	"github.com/muxfs/muxfs/internal/procs"
)

// readyFDEnv names the descriptor on which a background mount process reports to the
// command that started it: "ok", or "error: ..." on one line.
const readyFDEnv = "MUXFS_READY_FD"

// buildConfig merges the config file, -o options, flags and positional arguments.
func buildConfig(mf mountFlags, args []string) (*config.Config, error) {
	cfg := &config.Config{Options: config.Defaults()}
	file := mf.configFile
	for _, o := range mf.options {
		if p := config.ConfigPath(o); p != "" {
			file = p
		}
	}
	if file != "" {
		if err := cfg.LoadFile(file); err != nil {
			return nil, err
		}
	}
	for _, o := range mf.options {
		if err := cfg.ApplyOptions(o); err != nil {
			return nil, err
		}
	}
	if mf.port != 0 {
		cfg.Options.Port = mf.port
	}
	if mf.sshConfig != "" {
		cfg.Options.ConfigFile = mf.sshConfig
	}
	if mf.cacheDir != "" {
		cfg.Options.CacheDir = mf.cacheDir
	}
	if mf.debug {
		cfg.Options.Debug = true
	}
	if cfg.Options.Debug {
		cfg.Options.Foreground = true
		// go-fuse traces every request and its answer through the standard
		// logger, which stamps whole seconds: with microseconds the trace shows
		// which requests waited, and for how long.
		log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	}
	if mf.foreground {
		cfg.Options.Foreground = true
	}
	if len(args) > 0 {
		cfg.Mountpoint = args[len(args)-1]
		sources := args[:len(args)-1]
		// mount(8) passes the fstab "device" field as the first argument; with a
		// config file it may be a placeholder.
		if file != "" && len(sources) == 1 && (sources[0] == "none" || sources[0] == "muxfs") {
			sources = nil
		}
		if err := cfg.AddSourcesAtRoot(sources); err != nil {
			return nil, err
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

func runMount(mf mountFlags, args []string) error {
	cfg, err := buildConfig(mf, args)
	if err != nil {
		return err
	}
	mp, err := checkMountpoint(cfg.Mountpoint, cfg.Options.NonEmpty)
	if err != nil {
		return err
	}
	cfg.Mountpoint = mp
	if !cfg.Options.Foreground && os.Getenv(readyFDEnv) == "" {
		return startBackground()
	}
	return serve(cfg, nil)
}

// checkMountpoint returns the absolute mount point, or why it cannot be used.
func checkMountpoint(mp string, nonEmpty bool) (string, error) {
	abs, err := filepath.Abs(mp)
	if err != nil {
		return "", err
	}
	st, err := os.Stat(abs)
	switch {
	case errors.Is(err, syscall.ENOTCONN):
		return "", fmt.Errorf("mount point %s is a dead FUSE mount: run `muxfs umount %s` first", mp, mp)
	case errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("mount point %s does not exist: create it with `mkdir -p %s`", mp, mp)
	case err != nil:
		return "", fmt.Errorf("mount point %s: %v", mp, err)
	case !st.IsDir():
		return "", fmt.Errorf("mount point %s is not a directory", mp)
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	if mountinfo.IsMounted(abs) {
		return "", fmt.Errorf("%s is already a mount point: unmount it first (`muxfs umount %s`) or choose another directory", mp, mp)
	}
	if !nonEmpty {
		d, err := os.Open(abs)
		if err != nil {
			return "", fmt.Errorf("mount point %s: %v", mp, err)
		}
		names, _ := d.Readdirnames(1)
		d.Close()
		if len(names) > 0 {
			return "", fmt.Errorf("mount point %s is not empty: use an empty directory, or -o nonempty to mount over its contents", mp)
		}
	}
	return abs, nil
}

// startBackground re-runs muxfs as a detached child and waits until it reports the
// mount ready or failed, so that the command's exit status tells the truth.
func startBackground() error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Env = append(os.Environ(), readyFDEnv+"=3")
	cmd.ExtraFiles = []*os.File{w}
	// The terminal stays attached until the mount is ready, so that ssh can ask for
	// a passphrase or a host-key confirmation.
	cmd.Stdin = os.Stdin
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	w.Close()
	line, _ := bufio.NewReader(r).ReadString('\n')
	r.Close()
	line = strings.TrimSpace(line)
	switch {
	case line == "ok":
		cmd.Process.Release() //nolint:errcheck // it serves on alone
		return nil
	case strings.HasPrefix(line, "error: "):
		cmd.Wait() //nolint:errcheck // already reported
		return errors.New(strings.TrimPrefix(line, "error: "))
	}
	err = cmd.Wait()
	return fmt.Errorf("the mount process ended before the mount was ready (%v); run with -f to see why", err)
}

// reporter tells the starting command how the mount went, once.
type reporter struct{ w io.WriteCloser }

func newReporter() *reporter {
	fd, err := strconv.Atoi(os.Getenv(readyFDEnv))
	if err != nil {
		return &reporter{}
	}
	os.Unsetenv(readyFDEnv)
	return &reporter{w: os.NewFile(uintptr(fd), "ready")}
}

func (r *reporter) report(err error) {
	if r.w == nil {
		return
	}
	if err != nil {
		fmt.Fprintf(r.w, "error: %s\n", oneLine(err.Error()))
	} else {
		fmt.Fprintln(r.w, "ok")
	}
	r.w.Close()
	r.w = nil
}

func (r *reporter) background() bool { return r.w != nil }

// newLogger logs to stderr in the foreground; a background mount logs to a file in
// $XDG_STATE_HOME/muxfs (~/.local/state/muxfs), since it has no terminal.
func newLogger(debug, background bool) (*slog.Logger, string) {
	level := slog.LevelInfo
	if debug {
		level = slog.LevelDebug
	}
	var w io.Writer = os.Stderr
	file := ""
	if background {
		w = io.Discard
		dir := os.Getenv("XDG_STATE_HOME")
		if dir == "" {
			if home, err := os.UserHomeDir(); err == nil {
				dir = filepath.Join(home, ".local", "state")
			}
		}
		if dir != "" {
			dir = filepath.Join(dir, "muxfs")
			if os.MkdirAll(dir, 0o700) == nil {
				file = filepath.Join(dir, "muxfs.log")
				if f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
					w = f
				} else {
					file = ""
				}
			}
		}
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})), file
}

// mounted is a running mount and what must be closed after it.
type mounted struct {
	server   *fuse.Server
	backends []backend.Backend
	pools    []*backend.Pool
	started  time.Time
	status   []statusSource
	disk     *diskcache.Cache // nil: no persistent cache
	// background: the log goes to a file, and what the user must hear at mount is
	// written to the terminal too.
	background bool
}

// statusSource is what `muxfs status` reports on for one source.
type statusSource struct {
	at    string
	b     backend.Backend
	cache *cache.Source     // nil with the caches off
	disk  *diskcache.Source // nil without the persistent cache
}

func (m *mounted) close() {
	for _, b := range m.backends {
		b.Close()
	}
	for _, p := range m.pools {
		p.Release()
	}
	if m.disk != nil {
		m.disk.Close()
	}
}

// residentMemory is this process' resident memory now and at its peak (VmRSS and
// VmHWM of /proc/self/status, what the bench reads of every system), in bytes; 0
// where the kernel does not say.
func residentMemory() (now, peak int64) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, value, _ := strings.Cut(line, ":")
		kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			continue
		}
		switch name {
		case "VmRSS":
			now = kib << 10
		case "VmHWM":
			peak = kib << 10
		}
	}
	return now, peak
}

// mountStatus is the reply to `muxfs status`.
type mountStatus struct {
	Mountpoint string  `json:"mountpoint"`
	PID        int     `json:"pid"`
	Uptime     float64 `json:"uptime_s"`
	// RSS and PeakRSS are the mount's resident memory now and at most since it
	// started: users on login nodes with a memory limit ask what a mount takes
	// (docs/benchmarks-memory.md has it beside sshfs and rclone). Both count the
	// persistent cache's database pages mapped in, which the kernel can reclaim.
	RSS     int64                  `json:"rss_bytes"`
	PeakRSS int64                  `json:"peak_rss_bytes"`
	Sources []backend.SourceStatus `json:"sources"`
}

func (m *mounted) report(mp string) mountStatus {
	out := mountStatus{Mountpoint: mp, PID: os.Getpid(), Uptime: time.Since(m.started).Seconds()}
	out.RSS, out.PeakRSS = residentMemory()
	for _, ss := range m.status {
		st := backend.SourceStatus{Source: ss.b.String(), State: "up"}
		if r, ok := ss.b.(backend.Reporter); ok {
			st = r.Status()
		}
		st.At = ss.at
		if ss.cache != nil {
			st.CacheHits, st.CacheMisses = ss.cache.Stats()
		}
		if ss.disk != nil {
			ds := ss.disk.Store().Stats()
			st.DiskBytes, st.DiskHitBytes, st.DiskFetchedBytes = ds.Bytes, ds.HitBytes, ds.Fetched
			if ss.disk.Offline() {
				st.State = "offline"
			}
		}
		out.Sources = append(out.Sources, st)
	}
	return out
}

// newMeta makes the memory cache the options ask for: sshfs' per-kind timeouts and
// its bound on entries.
func newMeta(o *config.Options) *cache.Meta {
	meta := cache.NewMeta(o.ListingTimeout())
	_, _, meta.LinkTTL = o.MetaTimeouts()
	if o.CacheEntries > 0 {
		meta.MaxEntries = o.CacheEntries
	}
	return meta
}

// openBackends connects every source, behind the memory caches unless they are off; on
// failure everything opened is closed again.
func openBackends(ctx context.Context, cfg *config.Config, log *slog.Logger, background bool) (*mux.Table, *mounted, error) {
	m := &mounted{started: time.Now(), background: background}
	pools := map[string]*backend.Pool{}
	var meta *cache.Meta
	var prefetch *cache.Prefetcher
	if cfg.Options.Cache {
		meta = newMeta(&cfg.Options)
		if cfg.Options.DirCache {
			prefetch = cache.NewPrefetcher(16)
		}
	}
	if err := m.openDiskCache(cfg, log); err != nil {
		return nil, nil, err
	}
	var layers []*mux.Layer
	id := 0
	for _, mt := range cfg.Mounts {
		layer := &mux.Layer{Path: mt.Path, Policy: mt.Policy}
		for _, src := range mt.Sources {
			b, err := openSource(ctx, cfg, src, pools, m, log)
			if err != nil {
				m.close()
				return nil, nil, err
			}
			m.backends = append(m.backends, b)
			ss := statusSource{at: mt.Path, b: b}
			health, _ := b.(interface{ State() backend.State })
			var offline func() bool
			if m.disk != nil && health != nil {
				if store, err := m.disk.Store(b.String()); err != nil {
					log.Warn("going without the persistent cache for this source", "source", b.String(), "err", err)
				} else {
					if roots, ok := resolvedRoots(b); ok {
						if err := store.SetOrigin(givenAs(cfg, src), roots); err != nil {
							log.Warn("cannot record the source in its cache; it will not start offline", "source", b.String(), "err", err)
						}
					}
					ss.disk = diskcache.Wrap(b, store, cfg.Options.DiskCache == config.DiskFull, cfg.Options.Offline, health.State, log)
					b, offline = ss.disk, ss.disk.Offline
				}
			}
			if meta != nil {
				ss.cache = cache.Wrap(b, id, meta, prefetch)
				ss.cache.SetNoCTO(cfg.Options.NoCTO)
				if ss.disk != nil {
					ss.cache.SetPersist(ss.disk.Persister(), offline)
				}
				b = ss.cache
			}
			m.status = append(m.status, ss)
			if health != nil && len(mt.Sources) > 1 && !src.FailClosed {
				b = mux.NewDegraded(b, health.State, offline, log)
			}
			layer.Branches = append(layer.Branches, &mux.Branch{ID: id, Backend: b,
				ReadOnly: src.ReadOnly || cfg.Options.ReadOnly, NoCreate: src.NoCreate})
			id++
		}
		layers = append(layers, layer)
	}
	table, err := mux.NewTable(layers)
	if err != nil {
		m.close()
		return nil, nil, err
	}
	return table, m, nil
}

// openDiskCache opens the persistent cache unless it is off. A cache directory the
// user named must work; the default one may fail (a read-only home, say), and the
// mount then goes without, with a warning.
func (m *mounted) openDiskCache(cfg *config.Config, log *slog.Logger) error {
	o := cfg.Options
	if o.DiskCache == config.DiskOff {
		return nil
	}
	dir := o.CacheDir
	if dir == "" {
		def, err := diskcache.DefaultDir()
		if err != nil {
			log.Warn("no cache directory; going without the persistent cache", "err", err)
			return nil
		}
		dc, err := diskcache.Open(def, diskcache.Options{MaxSize: o.CacheMaxSize, MinFree: o.CacheMinFree, FetchWhole: o.FetchWhole}, log)
		if err != nil {
			log.Warn("going without the persistent cache", "err", err)
			return nil
		}
		m.disk = dc
		return nil
	}
	dc, err := diskcache.Open(dir, diskcache.Options{MaxSize: o.CacheMaxSize, MinFree: o.CacheMinFree, FetchWhole: o.FetchWhole}, log)
	if err != nil {
		return fmt.Errorf("%v — give a directory you can write with --cache-dir, or -o cache=off", err)
	}
	m.disk = dc
	return nil
}

func openSource(ctx context.Context, cfg *config.Config, src config.Source, pools map[string]*backend.Pool, m *mounted, log *slog.Logger) (backend.Backend, error) {
	if !src.IsRemote() {
		b, err := backend.NewLocal(src.Local)
		if err != nil {
			return nil, fmt.Errorf("source %s: %v — give an existing local directory", src.Raw, err)
		}
		return b, nil
	}
	var members []backend.Member
	var firstErr error
	for _, ms := range append([]config.Source{src}, src.Replicas...) {
		pool, err := openPool(ctx, cfg, src, ms, pools, m, log)
		if err != nil {
			// A replica set starts with the members it can reach; the others join
			// when their server answers. A source none of whose servers answers may
			// start from its cache (below).
			if firstErr == nil {
				firstErr = err
			}
			if len(src.Replicas) > 0 {
				log.Warn("replica unreachable at mount; it joins when it answers", "member", ms.Raw, "err", err)
			}
			ep := endpoint(cfg, src, ms)
			pool = backend.NewDownPool(ep, err, log)
			pools[ep.Key()] = pool
			m.pools = append(m.pools, pool)
			pool.Acquire()
		}
		members = append(members, backend.Member{Pool: pool, Dir: ms.Dir})
	}
	if allDown(members) {
		if firstErr == nil { // an endpoint found down by an earlier source
			firstErr = members[0].Pool.Err()
		}
		if firstErr != nil {
			return m.startOffline(cfg, src, members, firstErr, log)
		}
	}
	return backend.NewSFTP(ctx, members, cfg.Options.Timeout, log)
}

func allDown(members []backend.Member) bool {
	for _, mb := range members {
		if mb.Pool.State() == backend.StateUp {
			return false
		}
	}
	return true
}

// startOffline starts a source whose servers could not be reached from what an
// earlier mount left in the persistent cache: read-only, until a server answers (the
// pools keep trying). Only when the servers were unreachable — a refused key or host
// key is an error to fix, never papered over — and the cache knows the source;
// otherwise the mount fails with err.
func (m *mounted) startOffline(cfg *config.Config, src config.Source, members []backend.Member, err error, log *slog.Logger) (backend.Backend, error) {
	var ce *backend.ConnectError
	if !cfg.Options.Offline || m.disk == nil || !errors.As(err, &ce) || !ce.Unreachable() {
		return nil, err
	}
	_, roots, ok := m.disk.Known(givenAs(cfg, src))
	if !ok || len(roots) != len(members) {
		return nil, err
	}
	for i := range members {
		members[i].Root = roots[i]
	}
	log.Warn("server unreachable at mount: serving the cached copy read-only until it answers", "source", src.Raw, "err", err)
	if m.background {
		why := ce.SSHSays
		if why == "" {
			why = oneLine(err.Error())
		}
		fmt.Fprintf(os.Stderr, "muxfs: %s is unreachable (%s): mounted from the cache, read-only until it answers\n", src.Raw, why)
	}
	return backend.NewOfflineSFTP(members, cfg.Options.Timeout, log)
}

// resolvedRoots returns where the directories of a remote source resolved, if every
// member answered at mount.
func resolvedRoots(b backend.Backend) ([]string, bool) {
	if sb, ok := b.(*backend.SFTP); ok {
		return sb.Roots()
	}
	return nil, false
}

// givenAs names a remote source as the user gave it, independently of where its
// directories resolve on the servers: how a later mount finds its cache offline.
func givenAs(cfg *config.Config, src config.Source) string {
	var parts []string
	for _, ms := range append([]config.Source{src}, src.Replicas...) {
		parts = append(parts, endpoint(cfg, src, ms).String()+":"+ms.Dir)
	}
	return strings.Join(parts, " | ")
}

// endpoint is how to reach member ms of source src: the source's ssh settings (which
// its replicas share) over the global ones.
func endpoint(cfg *config.Config, src, ms config.Source) *backend.Endpoint {
	o := cfg.Options
	ep := &backend.Endpoint{
		Host: ms.Host, User: ms.User, Port: ms.Port,
		SSHCommand: o.SSHCommand, ConfigFile: o.ConfigFile, SFTPServer: o.SFTPServer,
		Transport: o.Transport, MaxConns: o.MaxConns, Timeout: o.Timeout,
	}
	if ep.Port == 0 {
		ep.Port = o.Port
	}
	if src.MaxConns > 0 {
		ep.MaxConns = src.MaxConns
	}
	if src.IdentityFile != "" {
		ep.SSHOptions = append(ep.SSHOptions, "IdentityFile="+src.IdentityFile)
	}
	ep.SSHOptions = append(ep.SSHOptions, src.SSHOptions...)
	ep.SSHOptions = append(ep.SSHOptions, o.SSHOptions...)
	return ep
}

// openPool returns the session pool for member ms, shared with every source on the same
// endpoint.
func openPool(ctx context.Context, cfg *config.Config, src, ms config.Source, pools map[string]*backend.Pool, m *mounted, log *slog.Logger) (*backend.Pool, error) {
	ep := endpoint(cfg, src, ms)
	if pool := pools[ep.Key()]; pool != nil {
		return pool, nil
	}
	pool, err := backend.Dial(ctx, ep, log)
	if err != nil {
		return nil, err
	}
	pool.Acquire()
	pools[ep.Key()] = pool
	m.pools = append(m.pools, pool)
	return pool, nil
}

// fsName is what df shows as the device: the first source, and how many more.
func fsName(cfg *config.Config) string {
	if cfg.Options.FsName != "" {
		return cfg.Options.FsName
	}
	n := 0
	first := ""
	for _, m := range cfg.Mounts {
		for _, s := range m.Sources {
			if first == "" {
				first = s.Raw
			}
			n++
		}
	}
	if n > 1 {
		return fmt.Sprintf("%s+%d", first, n-1)
	}
	return first
}

// serve mounts cfg and serves until unmounted or signalled. onReady, if set, runs once
// the mount is up (the demo uses it); a background child reports to its parent.
func serve(cfg *config.Config, onReady func(mp string) error) error {
	rep := newReporter()
	log, _ := newLogger(cfg.Options.Debug, rep.background())
	fail := func(err error) error {
		if rep.background() {
			rep.report(err)
			return exitError{1}
		}
		return err
	}
	if file := os.Getenv("MUXFS_CPUPROFILE"); file != "" {
		// For performance work (docs/benchmarks.md): a CPU profile of the whole mount.
		if f, err := os.Create(file); err == nil {
			if err := pprof.StartCPUProfile(f); err == nil {
				defer pprof.StopCPUProfile()
			}
		}
	}
	if file := os.Getenv("MUXFS_MEMPROFILE"); file != "" {
		// The same for memory: what the mount allocated, by call stack, written
		// at unmount (pprof's allocs profile; -sample_index=alloc_space).
		defer func() {
			if f, err := os.Create(file); err == nil {
				pprof.Lookup("allocs").WriteTo(f, 0) //nolint:errcheck // a profile for a human
				f.Close()
			}
		}()
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	notifySystemd(log, "STATUS=connecting to "+fsName(cfg))
	table, m, err := openBackends(ctx, cfg, log, rep.background())
	if err != nil {
		return fail(err)
	}
	defer m.close()
	fsys := fusefs.New(table, log)
	entry, attr, negative := cfg.Options.KernelTimeouts()
	server, err := fsys.Mount(cfg.Mountpoint, fusefs.Options{
		CacheDirs:          cfg.Options.Cache,
		DirTimeout:         cfg.Options.ListingTimeout(),
		FsName:             fsName(cfg),
		AllowOther:         cfg.Options.AllowOther,
		DefaultPermissions: cfg.Options.DefaultPermissions,
		ReadOnly:           cfg.Options.ReadOnly,
		Debug:              cfg.Options.Debug,
		EntryTimeout:       entry,
		AttrTimeout:        attr,
		NegativeTimeout:    negative,
	})
	if err != nil {
		return fail(mountError(cfg.Mountpoint, err))
	}
	m.server = server
	stopControl, err := control.Serve(cfg.Mountpoint, func(req control.Request) (any, error) {
		switch req.Op {
		case "refresh":
			log.Info("refresh", "path", req.Path)
			return nil, fsys.Refresh(req.Path)
		case "status":
			return m.report(cfg.Mountpoint), nil
		case "cache-status":
			var out []diskcache.Stats
			if m.disk != nil {
				for _, st := range m.disk.Stores() {
					out = append(out, st.Stats())
				}
			}
			return out, nil
		case "cache-clear":
			if m.disk == nil {
				return nil, nil
			}
			var cleared []string
			for _, st := range m.disk.Stores() {
				if req.Path == "" || req.Path == st.Name() {
					if err := st.Clear(); err != nil {
						return nil, err
					}
					cleared = append(cleared, st.Name())
				}
			}
			if req.Path == "" {
				fsys.Refresh("/") //nolint:errcheck // the memory caches follow
			}
			return cleared, nil
		}
		return nil, fmt.Errorf("unknown request %q", req.Op)
	})
	if err != nil {
		log.Warn("no control socket: muxfs refresh will not reach this mount", "err", err)
	} else {
		defer stopControl()
	}
	go procs.Adapt(ctx, log)
	log.Info("mounted", "mountpoint", cfg.Mountpoint, "sources", fsName(cfg))
	notifySystemd(log, daemon.SdNotifyReady+"\nSTATUS=serving "+fsName(cfg)+" at "+cfg.Mountpoint)
	if rep.background() {
		rep.report(nil)
		detach()
	}
	stop := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			log.Info("signal received, unmounting", "mountpoint", cfg.Mountpoint)
			unmount(server, cfg.Mountpoint, log)
		case <-stop:
		}
	}()
	var readyErr error
	if onReady != nil {
		readyErr = onReady(cfg.Mountpoint)
		if readyErr != nil || !term.IsTerminal(int(os.Stdin.Fd())) {
			unmount(server, cfg.Mountpoint, log)
		}
	}
	server.Wait()
	close(stop)
	notifySystemd(log, daemon.SdNotifyStopping+"\nSTATUS=unmounted")
	log.Info("unmounted", "mountpoint", cfg.Mountpoint)
	return readyErr
}

// unmount detaches the mount, lazily if files are still open there, so that a signal
// always ends the process.
func unmount(server *fuse.Server, mp string, log *slog.Logger) {
	if err := server.Unmount(); err != nil {
		log.Warn("unmount failed; detaching lazily", "mountpoint", mp, "err", err)
		if os.Geteuid() == 0 {
			if err := syscall.Unmount(mp, syscall.MNT_DETACH); err == nil {
				return
			}
		}
		if out, err := exec.Command("fusermount3", "-u", "-z", mp).CombinedOutput(); err != nil {
			log.Error("lazy unmount failed", "mountpoint", mp, "err", err, "output", strings.TrimSpace(string(out)))
		}
	}
}

// notifySystemd tells a systemd service of Type=notify how the mount is going
// (sd_notify(3)): READY=1 once the mount serves, so that units ordered after it find
// it mounted. Without $NOTIFY_SOCKET it does nothing.
func notifySystemd(log *slog.Logger, state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		log.Warn("cannot notify systemd", "err", err)
	}
}

// detach leaves the terminal after a background mount is ready.
func detach() {
	if devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0); err == nil {
		for _, fd := range []int{0, 1, 2} {
			syscall.Dup2(int(devnull.Fd()), fd) //nolint:errcheck // best effort
		}
		devnull.Close()
	}
	syscall.Setsid() //nolint:errcheck // fails only for a group leader, which we are not
	signal.Ignore(syscall.SIGHUP)
}

func mountError(mp string, err error) error {
	s := err.Error()
	switch {
	case strings.Contains(s, "fusermount") && strings.Contains(s, "not found"):
		return fmt.Errorf("cannot mount %s: fusermount3 is missing — install fuse3 (apt-get install fuse3)", mp)
	case strings.Contains(s, "allow_other") && strings.Contains(s, "user_allow_other"):
		return fmt.Errorf("cannot mount %s with -o allow_other: add user_allow_other to /etc/fuse.conf, or drop the option", mp)
	case strings.Contains(s, "/dev/fuse"):
		return fmt.Errorf("cannot mount %s: /dev/fuse is not available (%v) — load the fuse module or run where FUSE is allowed", mp, err)
	}
	return fmt.Errorf("cannot mount %s: %v", mp, err)
}
