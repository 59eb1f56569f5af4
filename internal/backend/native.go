package backend

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/muxfs/muxfs/internal/sftp"
)

// The in-process SSH transport (docs/design.md, "The in-process transport"). A
// session through the ssh program costs two more hops per request (muxfs → pipe →
// ssh → socket, and back), each a wake-up of another process: on this project's test
// machine an LSTAT round trip took 168 µs through ssh against 132 µs in-process, and
// what waits for one request after another (an untar, a cold find) ran a fifth to a
// quarter faster; big transfers gain little, being bound by the server. The ssh
// program stays in
// charge of everything it knows better: muxfs uses its own transport only when
// `ssh -G` shows a configuration it reproduces exactly (a direct TCP connection, a
// host key already in known_hosts, keys it can use without asking anyone), and hands
// over to ssh — prompts, ProxyJump, certificates and all — whenever it does not.

// Transport names, for -o transport= and `muxfs status`.
const (
	TransportAuto   = "auto"   // in-process when the configuration allows, else ssh
	TransportSSH    = "ssh"    // always the ssh program, as sshfs
	TransportNative = "native" // always in-process; an error where it cannot be
)

// nativePlan is what `ssh -G` says about an endpoint, in the form the in-process
// transport uses. It is made once, at Dial, and shared by the pool's sessions.
type nativePlan struct {
	network     string // tcp, tcp4 or tcp6 (AddressFamily)
	addr        string // host:port to dial (HostName, Port)
	user        string
	hostKeys    ssh.HostKeyCallback
	hostKeyName string   // the name looked up in known_hosts (HostKeyAlias or HostName), with port
	hostAlgos   []string // the algorithms of the host's known keys, so the server shows one of them
	files       []string // identity files (private keys) that exist
	onlyFiles   bool     // IdentitiesOnly
	agentSock   string   // "" : no agent
	ciphers     []string
	macs        []string
	kex         []string
	timeout     time.Duration // ConnectTimeout (0: the handshake's own bound)
	alive       time.Duration // ServerAliveInterval
	aliveCount  int
	// broken is set when a session could not be opened this way after the server
	// answered (a key it refused, a host key it did not show): every later session
	// of the pool goes through ssh, which explains or asks.
	broken atomic.Bool
}

// sshConfig runs `ssh -G` with the endpoint's arguments: the configuration ssh itself
// would use, after ~/.ssh/config, Match blocks and -o options.
func sshConfig(ep *Endpoint) (map[string][]string, error) {
	args := append([]string{"-G"}, ep.options(false)...)
	// A `Match exec` command could hang; ssh itself would then hang too, so the
	// mount goes on through ssh and its own behaviour.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, findProgram("ssh"), append(args, "--", ep.Host)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("ssh -G: %s", firstLine(ee.Stderr))
		}
		return nil, fmt.Errorf("ssh -G: %w", err)
	}
	cfg := map[string][]string{}
	for _, line := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok {
			k = strings.ToLower(k)
			cfg[k] = append(cfg[k], v)
		}
	}
	return cfg, nil
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}

// planNative decides whether the endpoint can use the in-process transport and
// prepares it; otherwise it says why not (for the log, or the error of
// transport=native).
func planNative(ep *Endpoint) (*nativePlan, string) {
	if len(ep.SSHCommand) > 0 {
		return nil, "-o ssh_command is set"
	}
	cfg, err := sshConfig(ep)
	if err != nil {
		return nil, err.Error()
	}
	one := func(k string) string {
		if v := cfg[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	// What only the ssh program does: a connection that is not a plain TCP socket,
	// a multiplexed one, compression, local commands, security keys, certificates,
	// host keys looked up by a command.
	for _, k := range []string{"proxycommand", "proxyjump", "controlpath", "localcommand",
		"knownhostscommand", "certificatefile", "bindaddress", "bindinterface", "securitykeyprovider"} {
		if v := one(k); v != "" && v != "none" && (k != "securitykeyprovider" || v != "internal") {
			return nil, k + " is set"
		}
	}
	if one("controlmaster") != "false" && one("controlmaster") != "" {
		return nil, "controlmaster is set"
	}
	if one("compression") == "yes" {
		return nil, "compression is on"
	}
	if one("pubkeyauthentication") == "false" || one("pubkeyauthentication") == "no" {
		return nil, "pubkeyauthentication is off"
	}
	port, err := strconv.Atoi(one("port"))
	if err != nil {
		return nil, "no port in ssh -G"
	}
	host := one("hostname")
	p := &nativePlan{network: "tcp", addr: net.JoinHostPort(host, strconv.Itoa(port)), user: one("user"),
		onlyFiles: one("identitiesonly") == "yes" || one("identitiesonly") == "true"}
	switch one("addressfamily") {
	case "inet":
		p.network = "tcp4"
	case "inet6":
		p.network = "tcp6"
	}
	if d, err := strconv.Atoi(one("connecttimeout")); err == nil {
		p.timeout = time.Duration(d) * time.Second
	}
	if d, err := strconv.Atoi(one("serveraliveinterval")); err == nil {
		p.alive = time.Duration(d) * time.Second
	}
	p.aliveCount, _ = strconv.Atoi(one("serveralivecountmax"))

	supported := ssh.SupportedAlgorithms()
	for _, a := range []struct {
		key  string
		from []string
		to   *[]string
	}{{"ciphers", supported.Ciphers, &p.ciphers}, {"macs", supported.MACs, &p.macs}, {"kexalgorithms", supported.KeyExchanges, &p.kex}} {
		*a.to = intersect(strings.Split(one(a.key), ","), a.from)
		if len(*a.to) == 0 {
			return nil, "no " + a.key + " in common with ssh's configuration"
		}
	}

	home, _ := os.UserHomeDir()
	expand := func(f string) (string, bool) {
		if strings.Contains(f, "%") {
			return "", false
		}
		if rest, ok := strings.CutPrefix(f, "~/"); ok {
			return filepath.Join(home, rest), true
		}
		return f, true
	}
	var khFiles []string
	for _, line := range append(cfg["userknownhostsfile"], cfg["globalknownhostsfile"]...) {
		for _, f := range strings.Fields(line) {
			f, ok := expand(f)
			if !ok {
				return nil, "known_hosts file with % tokens"
			}
			if _, err := os.Stat(f); err == nil {
				khFiles = append(khFiles, f)
			}
		}
	}
	if p.hostKeys, err = knownhosts.New(khFiles...); err != nil {
		return nil, err.Error()
	}
	name := host
	if alias := one("hostkeyalias"); alias != "" {
		name, port = alias, 22 // ssh looks an alias up as it is, without the port
	}
	p.hostKeyName = knownhosts.Normalize(net.JoinHostPort(name, strconv.Itoa(port)))
	known := p.knownKeys()
	if len(known) == 0 {
		return nil, "the host key of " + p.hostKeyName + " is not in known_hosts yet"
	}
	for _, k := range known {
		if k.Type() == ssh.KeyAlgoRSA {
			p.hostAlgos = append(p.hostAlgos, ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256)
		} else {
			p.hostAlgos = append(p.hostAlgos, k.Type())
		}
	}
	p.hostAlgos = intersect(intersect(p.hostAlgos, strings.Split(one("hostkeyalgorithms"), ",")), supported.HostKeys)
	if len(p.hostAlgos) == 0 {
		return nil, "no known host key of a type ssh's configuration allows and this transport verifies"
	}

	for _, f := range cfg["identityfile"] {
		f, ok := expand(f)
		if !ok {
			return nil, "identity file with % tokens"
		}
		if _, err := os.Stat(f); err != nil {
			continue // ssh skips its default names that do not exist, and so do we
		}
		if _, err := os.Stat(f + "-cert.pub"); err == nil {
			return nil, "a certificate beside " + f
		}
		p.files = append(p.files, f)
	}
	switch a := one("identityagent"); {
	case a == "none":
	case a == "" || a == "SSH_AUTH_SOCK":
		p.agentSock = os.Getenv("SSH_AUTH_SOCK")
	default:
		sock, ok := expandAgent(a, expand)
		if !ok {
			return nil, "identityagent with % tokens"
		}
		p.agentSock = sock
	}
	return p, ""
}

// expandAgent resolves IdentityAgent: an environment variable ($NAME or ${NAME}), or
// a path.
func expandAgent(a string, expand func(string) (string, bool)) (string, bool) {
	if v, ok := strings.CutPrefix(a, "$"); ok {
		return os.Getenv(strings.Trim(v, "{}")), true
	}
	return expand(a)
}

// intersect keeps the names of want that have has, in want's order: ssh's order of
// preference, limited to what x/crypto implements.
func intersect(want, have []string) []string {
	var out []string
	for _, w := range want {
		if slices.Contains(have, w) && !slices.Contains(out, w) {
			out = append(out, w)
		}
	}
	return out
}

// knownKeys lists the keys known_hosts holds for the host (asked with a key nobody
// has: the answer names the ones that would have matched).
func (p *nativePlan) knownKeys() []ssh.PublicKey {
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		return nil
	}
	probe, err := ssh.NewPublicKey(pub)
	if err != nil {
		return nil
	}
	var ke *knownhosts.KeyError
	if err := p.hostKeys(p.hostKeyName, &net.TCPAddr{IP: net.IPv4zero}, probe); !errors.As(err, &ke) {
		return nil
	}
	var keys []ssh.PublicKey
	for _, k := range ke.Want {
		keys = append(keys, k.Key)
	}
	return keys
}

// signers are the keys ssh would offer, in its order: the identity files (through
// the agent when it holds them), then the agent's other keys unless IdentitiesOnly. A
// key file that needs a passphrase the agent cannot stand in for makes the plan
// unusable: ssh would ask for it. The agent connection, if any, is returned for the
// caller to close after the handshake.
func (p *nativePlan) signers() (out []ssh.Signer, agentConn net.Conn, err error) {
	defer func() {
		if err != nil && agentConn != nil {
			agentConn.Close()
			agentConn = nil
		}
	}()
	var fromAgent []ssh.Signer
	if p.agentSock != "" {
		if c, err := net.Dial("unix", p.agentSock); err == nil {
			agentConn = c
			fromAgent, _ = agent.NewClient(c).Signers()
		}
	}
	agentKey := func(k ssh.PublicKey) int {
		return slices.IndexFunc(fromAgent, func(s ssh.Signer) bool { return bytes.Equal(s.PublicKey().Marshal(), k.Marshal()) })
	}
	used := make([]bool, len(fromAgent))
	for _, f := range p.files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		s, err := ssh.ParsePrivateKey(b)
		var pub ssh.PublicKey
		var pm *ssh.PassphraseMissingError
		switch {
		case err == nil:
			pub = s.PublicKey()
		case errors.As(err, &pm) && pm.PublicKey != nil:
			pub = pm.PublicKey
		default:
			return nil, agentConn, fmt.Errorf("%s: %v", f, err)
		}
		if i := agentKey(pub); i >= 0 {
			if !used[i] {
				out, used[i] = append(out, fromAgent[i]), true
			}
			continue
		}
		if s == nil {
			return nil, agentConn, fmt.Errorf("%s needs its passphrase (ssh can ask for it)", f)
		}
		out = append(out, s)
	}
	if !p.onlyFiles {
		for i, s := range fromAgent {
			if !used[i] {
				out = append(out, s)
			}
		}
	}
	if len(out) == 0 {
		return nil, agentConn, errors.New("no key to offer")
	}
	return out, agentConn, nil
}

// nativeOnly is the error of -o transport=native where only ssh could go on.
func nativeOnly(ep *Endpoint, cause error) error {
	return &ConnectError{Endpoint: ep.String(),
		Cause: fmt.Errorf("-o transport=native: %w — without that option the ssh program is used here", cause)}
}

// hostKeyError is the server's host key not matching known_hosts.
type hostKeyError struct{ err error }

func (e *hostKeyError) Error() string { return "host key: " + e.err.Error() }

// errHandedOver marks a failure after which ssh should try: the server answered but
// this transport could not finish what ssh might (errors.Is).
var errHandedOver = errors.New("in-process SSH cannot go on")

// startNative opens a session in-process. A failure to reach the server is
// reported in ssh's own words (so hints and offline detection read it alike);
// anything later wraps errHandedOver.
func startNative(ctx context.Context, ep *Endpoint, p *nativePlan, log *slog.Logger, limits *sftp.Limits) (*session, error) {
	timeout := 30 * time.Second
	if p.timeout > 0 {
		timeout = p.timeout
	}
	if ep.Timeout > timeout {
		timeout = ep.Timeout
	}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	signers, agentConn, err := p.signers()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errHandedOver, err)
	}
	if agentConn != nil {
		defer agentConn.Close()
	}
	conn, err := (&net.Dialer{}).DialContext(dctx, p.network, p.addr)
	if err != nil {
		return nil, &ConnectError{Endpoint: ep.String(), SSHSays: sshWords(p.addr, err), Cause: err}
	}
	cfg := &ssh.ClientConfig{
		Config:            ssh.Config{Ciphers: p.ciphers, MACs: p.macs, KeyExchanges: p.kex},
		User:              p.user,
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(signers...)},
		HostKeyAlgorithms: p.hostAlgos,
		HostKeyCallback: func(_ string, remote net.Addr, key ssh.PublicKey) error {
			if err := p.hostKeys(p.hostKeyName, remote, key); err != nil {
				return &hostKeyError{err}
			}
			return nil
		},
		ClientVersion: "SSH-2.0-muxfs",
	}
	conn = newBatchConn(conn)
	deadline, _ := dctx.Deadline()
	conn.SetDeadline(deadline) //nolint:errcheck // a TCP conn takes deadlines
	cc, chans, reqs, err := ssh.NewClientConn(conn, p.addr, cfg)
	if err != nil {
		conn.Close()
		var hk *hostKeyError
		var alg *ssh.AlgorithmNegotiationError
		if errors.As(err, &hk) || errors.As(err, &alg) || strings.Contains(err.Error(), "unable to authenticate") {
			return nil, fmt.Errorf("%w: %v", errHandedOver, err)
		}
		// The link, not the configuration: reported as ssh reports it, and the
		// next attempt is in-process again.
		return nil, &ConnectError{Endpoint: ep.String(), SSHSays: sshWords(p.addr, err), Cause: err}
	}
	conn.SetDeadline(time.Time{}) //nolint:errcheck // as above
	client := ssh.NewClient(cc, chans, reqs)
	sess, err := client.NewSession()
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("%w: %v", errHandedOver, err)
	}
	stdin, err1 := sess.StdinPipe()
	stdout, err2 := sess.StdoutPipe()
	sess.Stderr = io.Discard
	if err := errors.Join(err1, err2); err != nil {
		client.Close()
		return nil, err
	}
	if ep.SFTPServer != "" {
		err = sess.Start(ep.SFTPServer)
	} else {
		// Waiting for the answer costs nothing: sshd opens a session channel with
		// no window and grants one only once the subsystem runs, so the SFTP INIT
		// could not leave any sooner.
		err = sess.RequestSubsystem("sftp")
	}
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("%w: starting sftp: %v", errHandedOver, err)
	}
	closer := closerFunc(func() error { sess.Close(); return client.Close() })
	hsCtx, hsCancel := context.WithTimeout(ctx, timeout)
	defer hsCancel()
	sc, err := sftp.NewClientLike(hsCtx, stdout, stdin, closer, limits)
	if err != nil {
		return nil, &ConnectError{Endpoint: ep.String(), Cause: err}
	}
	if p.alive > 0 {
		go keepAlive(client, sc, p.alive, max(p.aliveCount, 1))
	}
	log.Debug("in-process ssh session", "endpoint", ep.String(), "addr", p.addr)
	return newSession(sc, ep, log, nil, conn), nil
}

// keepAlive is ssh's ServerAliveInterval: a link that stops answering is found dead
// after interval × count even when no request is waiting (the stall watchdog covers
// the case with requests).
func keepAlive(c *ssh.Client, sc *sftp.Client, interval time.Duration, count int) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var answered atomic.Bool
	answered.Store(true)
	missed := 0
	for {
		select {
		case <-sc.Done():
			return
		case <-tick.C:
		}
		if !answered.Load() {
			if missed++; missed >= count {
				c.Close()
				return
			}
			continue
		}
		missed = 0
		answered.Store(false)
		go func() {
			if _, _, err := c.SendRequest("keepalive@openssh.com", true, nil); err == nil {
				answered.Store(true)
			}
		}()
	}
}

// sshWords says a connection failure the way ssh does, so that connectHint and
// Unreachable read it as they read ssh's own line.
func sshWords(addr string, err error) string {
	host, port, _ := net.SplitHostPort(addr)
	var dns *net.DNSError
	if errors.As(err, &dns) {
		if dns.IsNotFound {
			return fmt.Sprintf("ssh: Could not resolve hostname %s: Name or service not known", host)
		}
		return fmt.Sprintf("ssh: Could not resolve hostname %s: Temporary failure in name resolution", host)
	}
	why := err.Error()
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		why = "Connection refused"
	case errors.Is(err, syscall.EHOSTUNREACH):
		why = "No route to host"
	case errors.Is(err, syscall.ENETUNREACH):
		why = "Network is unreachable"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		why = "Connection timed out"
	case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
		return fmt.Sprintf("ssh: Connection closed by %s port %s", host, port)
	}
	return fmt.Sprintf("ssh: connect to host %s port %s: %s", host, port, why)
}
