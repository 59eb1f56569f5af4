// Package sshd runs throwaway OpenSSH servers on loopback: for `muxfs demo`, the tests
// and the benchmarks. Each server has its own host key, authorized keys and config in
// a private directory; nothing is written to the machine's ~/.ssh.
package sshd

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Keys is a client key pair and the known_hosts file that trusts the servers started
// with it.
type Keys struct {
	Dir        string
	Identity   string // private key file
	KnownHosts string
}

// NewKeys makes a client key pair in dir (created 0700).
func NewKeys(dir string) (*Keys, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	k := &Keys{Dir: dir, Identity: filepath.Join(dir, "id_ed25519"), KnownHosts: filepath.Join(dir, "known_hosts")}
	if err := keygen(k.Identity); err != nil {
		return nil, err
	}
	if err := os.WriteFile(k.KnownHosts, nil, 0o600); err != nil {
		return nil, err
	}
	return k, nil
}

func keygen(file string) error {
	out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "muxfs-throwaway", "-f", file).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ssh-keygen: %v: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// TrustPort trusts the server known on port from also on port to (a proxy in front of
// it): ssh keys hosts by port.
func (k *Keys) TrustPort(from, to int) error {
	b, err := os.ReadFile(k.KnownHosts)
	if err != nil {
		return err
	}
	prefix := fmt.Sprintf("[127.0.0.1]:%d ", from)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, prefix) {
			f, err := os.OpenFile(k.KnownHosts, os.O_APPEND|os.O_WRONLY, 0o600)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = fmt.Fprintf(f, "[127.0.0.1]:%d %s\n", to, strings.TrimPrefix(line, prefix))
			return err
		}
	}
	return fmt.Errorf("no key of a server on port %d in %s", from, k.KnownHosts)
}

// SSHOptions are the ssh -o settings that make a client use these keys and trust only
// these servers.
func (k *Keys) SSHOptions() []string {
	return []string{
		"IdentityFile=" + k.Identity,
		"IdentitiesOnly=yes",
		"UserKnownHostsFile=" + k.KnownHosts,
		"GlobalKnownHostsFile=/dev/null",
		"StrictHostKeyChecking=yes",
		"PasswordAuthentication=no",
		"KbdInteractiveAuthentication=no",
	}
}

// Server is one running sshd.
type Server struct {
	Dir  string
	Port int
	User string
	cmd  *exec.Cmd
	done chan struct{}
	log  *LockedBuffer
}

// LockedBuffer collects a child process's output (sshd's, a test's muxfs) while it
// runs and others read it.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Start runs sshd on a free loopback port, accepting keys' identity for the current
// user. dir holds its files.
func Start(dir string, keys *Keys) (*Server, error) {
	u, err := user.Current()
	if err != nil {
		return nil, err
	}
	return StartFor(dir, keys, u.Username)
}

// StartFor is Start for logins as another user (sshd must run as root for that). The
// authorized keys are then made readable to that user, as sshd reads them as the user.
func StartFor(dir string, keys *Keys, login string) (*Server, error) {
	sshdPath, err := findSSHD()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	hostKey := filepath.Join(dir, "host_ed25519")
	if err := keygen(hostKey); err != nil {
		return nil, err
	}
	pub, err := os.ReadFile(keys.Identity + ".pub")
	if err != nil {
		return nil, err
	}
	authKeys := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(authKeys, pub, 0o644); err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		// sshd running as root insists on its privilege-separation directory.
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			return nil, err
		}
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		cfg := filepath.Join(dir, "sshd_config")
		conf := strings.Join([]string{
			"Port " + strconv.Itoa(port),
			"ListenAddress 127.0.0.1",
			"HostKey " + hostKey,
			"AuthorizedKeysFile " + authKeys,
			"StrictModes no",
			"PidFile none",
			"UsePAM no",
			"PasswordAuthentication no",
			"KbdInteractiveAuthentication no",
			"PubkeyAuthentication yes",
			"PermitRootLogin prohibit-password",
			"AllowUsers " + login,
			// In-process SFTP: needs no login shell, so service accounts work too.
			"Subsystem sftp internal-sftp",
			"MaxStartups 100:30:200",
			"MaxSessions 100",
			"LogLevel ERROR",
		}, "\n") + "\n"
		if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
			return nil, err
		}
		s := &Server{Dir: dir, Port: port, User: login, log: &LockedBuffer{}}
		if err := s.start(sshdPath); err != nil {
			return nil, err
		}
		if err := s.waitListening(); err != nil {
			s.Stop()
			lastErr = err
			continue // the port was taken in between: try another
		}
		line := fmt.Sprintf("[127.0.0.1]:%d %s", port, mustRead(hostKey+".pub"))
		f, err := os.OpenFile(keys.KnownHosts, os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			s.Stop()
			return nil, err
		}
		_, err = f.WriteString(line)
		f.Close()
		if err != nil {
			s.Stop()
			return nil, err
		}
		return s, nil
	}
	return nil, lastErr
}

func mustRead(file string) string {
	b, _ := os.ReadFile(file)
	return string(b)
}

func findSSHD() (string, error) {
	for _, p := range []string{"/usr/sbin/sshd", "/usr/local/sbin/sshd"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("sshd"); err == nil {
		return p, nil
	}
	return "", errors.New("sshd not found: install openssh-server (apt-get install openssh-server)")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) waitListening() error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("sshd exited: %s", strings.TrimSpace(s.log.String()))
		default:
		}
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(s.Port), time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("sshd did not start listening within 10 s")
}

// Stop ends the server and every session it runs.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM) //nolint:errcheck // may be gone
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck // last resort
		<-s.done
	}
}

// Kill ends the server at once, with every session it runs (sshd puts each
// connection in a session of its own, so the process group is not enough): as when
// the server machine goes away.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	// Stopped, the listener forks no new session while its sessions are found and
	// killed; one forked just before would otherwise escape, live on and keep
	// serving the client.
	pid := s.cmd.Process.Pid
	syscall.Kill(pid, syscall.SIGSTOP) //nolint:errcheck // may be gone
	for pass := 0; pass < 3; pass++ {
		for _, d := range s.Sessions() {
			syscall.Kill(d, syscall.SIGKILL) //nolint:errcheck // may be gone
		}
		time.Sleep(10 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck // may be gone
	<-s.done
}

// Sessions lists the processes serving the server's connections (each connection's
// sshd processes, and what they run): killing them cuts every connection at the
// server's end, whichever way the client reached it.
func (s *Server) Sessions() []int {
	if s.cmd == nil || s.cmd.Process == nil {
		return nil
	}
	return Descendants(s.cmd.Process.Pid)
}

// start runs sshd in the foreground, its output kept for the log.
func (s *Server) start(sshdPath string) error {
	s.done = make(chan struct{})
	s.cmd = exec.Command(sshdPath, "-D", "-e", "-f", filepath.Join(s.Dir, "sshd_config"))
	s.cmd.Stdout = s.log
	s.cmd.Stderr = s.log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	// A session process that outlived the listener holds its output pipe: Wait must
	// not wait for it.
	s.cmd.WaitDelay = 2 * time.Second
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("starting sshd: %w", err)
	}
	cmd, done := s.cmd, s.done
	go func() { cmd.Wait(); close(done) }() //nolint:errcheck // reported via done
	return nil
}

// Restart starts the server again on the same port, with the same keys, after Kill.
func (s *Server) Restart() error {
	sshdPath, err := findSSHD()
	if err != nil {
		return err
	}
	if err := s.start(sshdPath); err != nil {
		return err
	}
	return s.waitListening()
}

// Descendants lists the processes below pid, from /proc.
func Descendants(pid int) []int {
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// The parent pid is the second field after the command in parentheses.
		rest := string(stat[bytes.LastIndexByte(stat, ')')+1:])
		f := strings.Fields(rest)
		if len(f) < 2 {
			continue
		}
		if pp, err := strconv.Atoi(f[1]); err == nil {
			children[pp] = append(children[pp], p)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// Log is what sshd printed.
func (s *Server) Log() string { return s.log.String() }
