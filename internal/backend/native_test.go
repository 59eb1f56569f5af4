package backend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"

	"github.com/muxfs/muxfs/internal/sshd"
)

// nativeEnv is a real sshd on loopback and the keys that reach it.
type nativeEnv struct {
	keys *sshd.Keys
	srv  *sshd.Server
	dir  string // the server's data
	log  *bytes.Buffer
}

func newNativeEnv(t *testing.T) *nativeEnv {
	t.Helper()
	tmp := t.TempDir()
	keys, err := sshd.NewKeys(filepath.Join(tmp, "keys"))
	if err != nil {
		t.Skip(err)
	}
	srv, err := sshd.Start(filepath.Join(tmp, "srv"), keys)
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(srv.Stop)
	dir := filepath.Join(tmp, "data")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return &nativeEnv{keys: keys, srv: srv, dir: dir, log: &bytes.Buffer{}}
}

// endpoint reaches the server with the test keys, and opts after them.
func (e *nativeEnv) endpoint(transport string, opts ...string) *Endpoint {
	return &Endpoint{Host: "127.0.0.1", Port: e.srv.Port, User: e.srv.User, Transport: transport,
		SSHOptions: append(e.keys.SSHOptions(), opts...), MaxConns: 2, Timeout: 3 * time.Second}
}

// freeze stops the processes serving the server's connections as they are now (a
// server that stops answering; new connections are still served), until the test
// ends.
func (e *nativeEnv) freeze(t *testing.T) {
	stopped := e.srv.Sessions()
	for _, p := range stopped {
		syscall.Kill(p, syscall.SIGSTOP) //nolint:errcheck // may be gone
	}
	t.Cleanup(func() {
		for _, p := range stopped {
			syscall.Kill(p, syscall.SIGCONT) //nolint:errcheck // may be gone
		}
	})
}

func (e *nativeEnv) dial(t *testing.T, ep *Endpoint) (*Pool, error) {
	t.Helper()
	pool, err := Dial(context.Background(), ep, slog.New(slog.NewTextHandler(e.log, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err == nil {
		pool.Acquire()
		t.Cleanup(pool.Release)
	}
	return pool, err
}

// TestNativeSession: with ssh's configuration allowing it, sessions run in-process
// (no ssh process), move files both ways, and come back by themselves after the
// server cut every connection.
func TestNativeSession(t *testing.T) {
	e := newNativeEnv(t)
	pool, err := e.dial(t, e.endpoint(""))
	if err != nil {
		t.Fatalf("dial: %v\n%s", err, e.log)
	}
	if st := pool.Stats(); st.Transport != TransportNative {
		t.Fatalf("transport %q, want native; log:\n%s", st.Transport, e.log)
	}
	s := newTestSource(t, 5*time.Second, e.dir, pool)
	ctx := context.Background()
	want := randomBytes(3<<20, 3)
	for round := 0; round < 2; round++ {
		name := fmt.Sprintf("f%d", round)
		f, err := s.Open(ctx, name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(ctx, want, 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(filepath.Join(e.dir, name)); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("round %d: the server's file differs (%v)", round, err)
		}
		if round == 0 {
			for _, p := range e.srv.Sessions() {
				syscall.Kill(p, syscall.SIGKILL) //nolint:errcheck // may be gone
			}
		}
	}
	st := pool.Stats()
	if st.Reconnects < 1 || st.Transport != TransportNative {
		t.Errorf("after the cut: %d reconnects, transport %q; want ≥ 1, native", st.Reconnects, st.Transport)
	}
}

// TestNativeStall: an in-process session whose server stops answering is ended by
// the stall watchdog like one through ssh, and the next request runs on a new one.
func TestNativeStall(t *testing.T) {
	e := newNativeEnv(t)
	ep := e.endpoint(TransportNative)
	ep.Timeout = 2 * time.Second
	pool, err := e.dial(t, ep)
	if err != nil {
		t.Fatal(err)
	}
	s := newTestSource(t, time.Second, e.dir, pool)
	ctx := context.Background()
	if _, err := s.Lstat(ctx, ""); err != nil {
		t.Fatal(err)
	}
	e.freeze(t)
	if _, err := s.Lstat(ctx, ""); err == nil {
		t.Fatal("lstat on a stopped server succeeded")
	}
	time.Sleep(2500 * time.Millisecond) // the watchdog's 2 s, and some
	if _, err := s.Lstat(ctx, ""); err != nil {
		t.Fatalf("lstat after the stall, with the stalled sessions still stopped: %v", err)
	}
	if st := pool.Stats(); st.Reconnects < 1 {
		t.Errorf("%d reconnects, want ≥ 1", st.Reconnects)
	}
}

// TestNativeKeepAlive: an idle in-process session whose server stops answering is
// found dead by ssh's ServerAliveInterval/CountMax (no request is waiting, so the
// stall watchdog cannot see it), and the pool connects again.
func TestNativeKeepAlive(t *testing.T) {
	e := newNativeEnv(t)
	ep := e.endpoint(TransportNative)
	ep.SSHOptions = append([]string{"ServerAliveInterval=1", "ServerAliveCountMax=1"}, ep.SSHOptions...)
	pool, err := e.dial(t, ep)
	if err != nil {
		t.Fatal(err)
	}
	e.freeze(t)
	deadline := time.Now().Add(8 * time.Second)
	for pool.Stats().Reconnects < 1 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if st := pool.Stats(); st.Reconnects < 1 || st.State != StateUp {
		t.Errorf("8 s after the server stopped answering: %d reconnects, state %v; want a new session", st.Reconnects, st.State)
	}
}

// TestNativeHandsOver: what only ssh can do goes to ssh — a host key not in
// known_hosts, a changed host key, a key the server refuses, a ProxyCommand — and
// -o transport=native says so instead.
func TestNativeHandsOver(t *testing.T) {
	e := newNativeEnv(t)
	other, err := sshd.NewKeys(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	// A known_hosts with a different key under the server's name.
	changed := filepath.Join(t.TempDir(), "changed_hosts")
	otherKey, err := os.ReadFile(other.Identity + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(changed, fmt.Appendf(nil, "[127.0.0.1]:%d %s", e.srv.Port, otherKey), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, sshSays string
		opts          []string
		planned       bool // the configuration alone allows in-process
	}{
		{"unknown host", "host key verification failed", []string{"UserKnownHostsFile=/dev/null"}, false},
		{"changed host key", "host key", []string{"UserKnownHostsFile=" + changed}, true},
		{"refused key", "permission denied", []string{"IdentityFile=" + other.Identity}, true},
		{"proxy command", "connection closed", []string{"ProxyCommand=/bin/false"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ep := e.endpoint("")
			ep.SSHOptions = caseOptions(ep.SSHOptions, c.opts)
			p, why := planNative(ep)
			if (p != nil) != c.planned {
				t.Fatalf("planned %v (%s), want %v", p != nil, why, c.planned)
			}
			_, err := e.dial(t, ep)
			var ce *ConnectError
			if !errors.As(err, &ce) || !strings.Contains(strings.ToLower(ce.SSHSays), c.sshSays) {
				t.Fatalf("want ssh's own %q, got %v\nlog:\n%s", c.sshSays, err, e.log)
			}
			native := e.endpoint(TransportNative)
			native.SSHOptions = caseOptions(native.SSHOptions, c.opts)
			_, err = e.dial(t, native)
			if err == nil || !strings.Contains(err.Error(), "transport=native") {
				t.Fatalf("transport=native: want its own error, got %v", err)
			}
		})
	}
}

// caseOptions puts a case's options in front of the test keys' (ssh keeps the first
// value it reads); an identity file replaces theirs, since ssh offers every one given.
func caseOptions(keys, opts []string) []string {
	out := append([]string(nil), opts...)
	for _, o := range keys {
		if !strings.HasPrefix(o, "IdentityFile=") || !slices.ContainsFunc(opts, func(c string) bool { return strings.HasPrefix(c, "IdentityFile=") }) {
			out = append(out, o)
		}
	}
	return out
}

// TestNativeUnreachable: a port nobody listens on is reported in ssh's words, so the
// hint and the offline start read it as they read ssh.
func TestNativeUnreachable(t *testing.T) {
	e := newNativeEnv(t)
	ep := e.endpoint(TransportNative)
	ep.Port = 1 // nothing listens on loopback port 1
	h, _ := os.ReadFile(filepath.Join(e.srv.Dir, "host_ed25519.pub"))
	kh := filepath.Join(t.TempDir(), "kh")
	if err := os.WriteFile(kh, append([]byte("[127.0.0.1]:1 "), h...), 0o600); err != nil {
		t.Fatal(err)
	}
	ep.SSHOptions = append([]string{"UserKnownHostsFile=" + kh}, ep.SSHOptions...)
	_, err := e.dial(t, ep)
	var ce *ConnectError
	if !errors.As(err, &ce) || !ce.Unreachable() || !strings.Contains(err.Error(), "no SSH server listens there") {
		t.Fatalf("want an unreachable server with its hint, got %v", err)
	}
}

// TestNativeAgent: a key file that needs a passphrase is used through the agent that
// holds it, in-process; without the agent, ssh (which could ask for the passphrase)
// takes over, and -o transport=native says why it cannot.
func TestNativeAgent(t *testing.T) {
	e := newNativeEnv(t)
	plain, err := os.ReadFile(e.keys.Identity)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ssh.ParseRawPrivateKey(plain)
	if err != nil {
		t.Fatal(err)
	}
	locked := filepath.Join(t.TempDir(), "id_locked")
	if err := os.WriteFile(locked, plain, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ssh-keygen", "-q", "-p", "-P", "", "-N", "secret", "-f", locked).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen -p: %v: %s", err, out)
	}
	opts := []string{"IdentityFile=" + locked}

	t.Setenv("SSH_AUTH_SOCK", "")
	ep := e.endpoint(TransportNative)
	ep.SSHOptions = caseOptions(ep.SSHOptions, opts)
	if _, err := e.dial(t, ep); err == nil || !strings.Contains(err.Error(), "passphrase") {
		t.Fatalf("no agent, transport=native: want the passphrase named, got %v", err)
	}

	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	keyring := agent.NewKeyring()
	if err := keyring.Add(agent.AddedKey{PrivateKey: key}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { agent.ServeAgent(keyring, c); c.Close() }() //nolint:errcheck // ends with the connection
		}
	}()
	t.Setenv("SSH_AUTH_SOCK", sock)
	pool, err := e.dial(t, ep)
	if err != nil {
		t.Fatalf("with the key in the agent: %v\n%s", err, e.log)
	}
	if st := pool.Stats(); st.Transport != TransportNative {
		t.Errorf("transport %q, want native", st.Transport)
	}
}
