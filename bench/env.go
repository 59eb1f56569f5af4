package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/muxfs/muxfs/internal/sshd"
)

// env is the bench's world: one throwaway sshd on loopback, reached directly (0 ms) or
// through a toxiproxy latency proxy per added round-trip time.
type env struct {
	root    string
	keys    *sshd.Keys
	server  *sshd.Server
	proxies map[time.Duration]int // added RTT -> local port to connect to
	muxfs   string
	// cacheGen numbers muxfs' persistent cache directories: each cold mount gets a
	// new, empty one (see session.remount).
	cacheGen int
	// mountGroups are the process groups of the mount commands run since the last
	// unmount (e.mount), for the memory reading (peakMemory).
	mountGroups []int
}

func newEnv(root, muxfsBin string, rtts []time.Duration) (*env, error) {
	keys, err := sshd.NewKeys(filepath.Join(root, "keys"))
	if err != nil {
		return nil, err
	}
	srv, err := sshd.Start(filepath.Join(root, "sshd"), keys)
	if err != nil {
		return nil, err
	}
	e := &env{root: root, keys: keys, server: srv, proxies: map[time.Duration]int{0: srv.Port}, muxfs: muxfsBin}
	api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	for _, rtt := range rtts {
		if rtt == 0 {
			continue
		}
		p := toxiproxy.NewProxy(api, fmt.Sprintf("rtt%d", rtt.Milliseconds()), "127.0.0.1:0", fmt.Sprintf("127.0.0.1:%d", srv.Port))
		if err := p.Start(); err != nil {
			return nil, fmt.Errorf("starting the delay proxy: %w", err)
		}
		// Half the round trip each way. The latency toxic timestamps data on arrival,
		// so it delays without limiting bandwidth.
		half := rtt.Milliseconds() / 2
		for _, stream := range []string{"upstream", "downstream"} {
			js := fmt.Sprintf(`{"type":"latency","stream":%q,"attributes":{"latency":%d}}`, stream, half)
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
				return nil, err
			}
		}
		_, port, _ := strings.Cut(p.Listen, ":")
		n, _ := strconv.Atoi(port)
		e.proxies[rtt] = n
		// The proxy's port has its own known_hosts line (ssh keys hosts by port).
		if err := keys.TrustPort(srv.Port, n); err != nil {
			return nil, err
		}
	}
	return e, nil
}

func (e *env) close() { e.server.Stop() }

// sshArgs are ssh options (as -o values) for the bench's keys.
func (e *env) sshOpts() []string { return e.keys.SSHOptions() }

// dropCaches empties the page, dentry and inode caches (root only) for cold runs.
func dropCaches() {
	exec.Command("sync").Run()                                     //nolint:errcheck
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o200) //nolint:errcheck // not root: cold means fresh mounts only
}

// commandLimit ends a command that takes longer: a hung mount (rclone's grep -r over
// the tree once sat at 0% CPU for 12 minutes) must cost one failed cell, not the run.
const commandLimit = 5 * time.Minute

// sh runs a shell command and returns its wall-clock time.
func sh(script string) (time.Duration, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), commandLimit)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", script)
	// At the limit, kill the whole pipeline, not only the shell.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Start()
	if err == nil {
		// Its own process group is out of reach of a terminal's Ctrl-C: the teardown
		// ends it, before unmounting what it works in.
		td.started(cmd.Process.Pid)
		err = cmd.Wait()
		td.ended(cmd.Process.Pid)
	}
	out := buf.Bytes()
	d := time.Since(start)
	if ctx.Err() != nil {
		return d, string(out), fmt.Errorf("%s: no result after %v", script, commandLimit)
	}
	if err != nil {
		return d, string(out), fmt.Errorf("%s: %v: %s", script, err, tail(string(out)))
	}
	return d, string(out), nil
}

func tail(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 300 {
		s = "..." + s[len(s)-300:]
	}
	return s
}
