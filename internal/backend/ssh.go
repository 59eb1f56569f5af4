package backend

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
	"golang.org/x/term"
	"time"

	"github.com/muxfs/muxfs/internal/sftp"
)

// Endpoint says how to reach one SSH server. Sources on the same endpoint share its
// session pool.
type Endpoint struct {
	Host       string
	User       string
	Port       int
	SSHCommand []string // the ssh program and its own leading arguments; default "ssh"
	SSHOptions []string // ssh -o values ("IdentityFile=~/.ssh/id", ...), in order
	ConfigFile string   // ssh -F
	SFTPServer string   // a remote command to run instead of the sftp subsystem
	MaxConns   int      // SFTP sessions in the pool
	// Timeout ends a session that leaves requests unanswered this long (the stall
	// watchdog), and bounds each request with its retries (see SFTP); 0: none.
	Timeout time.Duration
	// Transport is TransportAuto (""), TransportSSH or TransportNative (native.go).
	Transport string

	native *nativePlan // set by Dial when sessions may be opened in-process
}

// String is the endpoint as a user would type it.
func (e *Endpoint) String() string {
	s := e.Host
	if e.User != "" {
		s = e.User + "@" + s
	}
	if e.Port != 0 {
		s += ":" + strconv.Itoa(e.Port)
	}
	return s
}

// Key identifies endpoints that can share sessions: the whole ssh command line.
func (e *Endpoint) Key() string { return strings.Join(e.command(false), "\x00") }

// command is the ssh argv. batch turns off every prompt: for sessions opened after the
// first, which run detached from the terminal.
func (e *Endpoint) command(batch bool) []string {
	argv := append([]string(nil), e.SSHCommand...)
	if len(argv) == 0 {
		argv = []string{"ssh"}
	}
	argv = append(argv, e.options(batch)...)
	if e.SFTPServer != "" {
		return append(argv, "--", e.Host, e.SFTPServer)
	}
	return append(argv, "-s", "--", e.Host, "sftp")
}

// options are ssh's arguments before the host: also what `ssh -G` is asked with.
func (e *Endpoint) options(batch bool) []string {
	var argv []string
	if e.ConfigFile != "" {
		argv = append(argv, "-F", e.ConfigFile)
	}
	// No X11 or agent forwarding: a file transfer session needs neither, and agent
	// forwarding to a shared gateway would be a risk. No port forwardings either.
	argv = append(argv, "-x", "-a", "-oClearAllForwardings=yes")
	for _, o := range e.SSHOptions {
		argv = append(argv, "-o"+o)
	}
	// Defaults come after the user's options: ssh keeps the first value it reads.
	// Keep-alives make a dead link show up as a dead session within ~45 s.
	argv = append(argv, "-oServerAliveInterval=15", "-oServerAliveCountMax=3")
	if batch {
		argv = append(argv, "-oBatchMode=yes")
	}
	if e.Port != 0 {
		argv = append(argv, "-p", strconv.Itoa(e.Port))
	}
	if e.User != "" {
		argv = append(argv, "-l", e.User)
	}
	return argv
}

// ConnectError is a failure to open an SFTP session, with ssh's own explanation.
type ConnectError struct {
	Endpoint string
	SSHSays  string // ssh's last meaningful stderr line
	Cause    error
}

func (e *ConnectError) Error() string {
	msg := fmt.Sprintf("cannot connect to %s", e.Endpoint)
	if e.SSHSays != "" {
		msg += ": " + e.SSHSays
	} else if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	if hint := connectHint(e.SSHSays); hint != "" {
		msg += " — " + hint
	}
	return msg
}

func (e *ConnectError) Unwrap() error { return e.Cause }

// Unreachable reports whether the server could not be reached at all (no network, a
// name that does not resolve, nothing listening, no answer), as opposed to a server
// that answered and refused: a mount may then start from its cache (offline).
func (e *ConnectError) Unreachable() bool {
	s := strings.ToLower(e.SSHSays)
	for _, c := range []string{"could not resolve hostname", "connection refused", "timed out",
		"no route to host", "network is unreachable", "temporary failure in name resolution"} {
		if strings.Contains(s, c) {
			return true
		}
	}
	return e.SSHSays == "" && errors.Is(e.Cause, context.DeadlineExceeded)
}

// connectHint turns ssh's complaint into what to do about it.
func connectHint(says string) string {
	s := strings.ToLower(says)
	switch {
	case strings.Contains(s, "could not resolve hostname"):
		return "check the host name (or its Host entry in ~/.ssh/config)"
	case strings.Contains(s, "host key verification failed"), strings.Contains(s, "remote host identification has changed"):
		return "run `ssh` to that host once to check and accept its host key"
	case strings.Contains(s, "permission denied"), strings.Contains(s, "too many authentication failures"):
		return "authentication was refused: check the user, the key (-o IdentityFile=...) or your ssh-agent"
	case strings.Contains(s, "connection refused"):
		return "no SSH server listens there: check the host and port (-p)"
	case strings.Contains(s, "timed out"), strings.Contains(s, "no route to host"), strings.Contains(s, "network is unreachable"):
		return "the host is unreachable: check the network or the host name"
	case strings.Contains(s, "subsystem request failed"):
		return "the server has no sftp subsystem: ask its admin, or set -o sftp_server=PATH"
	}
	return ""
}

// session is one SFTP client and what carries it: an `ssh -s sftp` process, or an
// in-process SSH connection.
type session struct {
	client *sftp.Client
	cmd    *exec.Cmd // through the ssh program
	conn   net.Conn  // in-process
}

// startSession opens a session the endpoint's way: in-process when Dial found that
// possible (and no session has since been refused that way), else through ssh. like,
// if not nil, is a live session of the same pool: the new one is another session to a
// server known to serve SFTP, and takes like's packet limits (sftp.NewClientLike).
func startSession(ctx context.Context, ep *Endpoint, interactive bool, log *slog.Logger, like *session) (*session, error) {
	var limits *sftp.Limits
	if like != nil {
		l := like.client.Limits()
		limits = &l
	}
	p := ep.native
	if p == nil || p.broken.Load() {
		return startSSH(ctx, ep, interactive, log, limits)
	}
	s, err := startNative(ctx, ep, p, log, limits)
	switch {
	case err == nil || !errors.Is(err, errHandedOver):
		return s, err
	case ep.Transport == TransportNative:
		return nil, nativeOnly(ep, err)
	}
	p.broken.Store(true)
	log.Info("the ssh program takes over from the in-process transport", "endpoint", ep.String(), "why", err)
	return startSSH(ctx, ep, interactive, log, limits)
}

// startSSH spawns ssh and runs the SFTP handshake. interactive leaves ssh in our
// process group with the terminal, so that a first connection can ask for a passphrase
// or a host-key confirmation like ssh and sshfs do; later sessions run in their own
// session with BatchMode, so they never touch the terminal.
func startSSH(ctx context.Context, ep *Endpoint, interactive bool, log *slog.Logger, limits *sftp.Limits) (*session, error) {
	argv := ep.command(!interactive)
	cmd := exec.Command(findProgram(argv[0]), argv[1:]...)
	// Pdeathsig: if muxfs dies, its ssh processes go with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setsid: !interactive}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	// A pipe holds 64 KiB by default: less than one 255 KiB SFTP packet, so every
	// write would wait for ssh to drain it. 1 MiB lets a burst go through at once.
	// Through SyscallConn, not Fd: Fd would put the pipe in blocking mode, and a
	// reply read by a blocking read(2) reaches its waiting request ~20 µs later than
	// one the runtime's poller delivers (measured: LSTAT round trip 245–258 µs
	// blocking, 220–245 polled, on loopback).
	for _, p := range []any{stdin, stdout} {
		if f, ok := p.(interface {
			SyscallConn() (syscall.RawConn, error)
		}); ok {
			if rc, err := f.SyscallConn(); err == nil {
				rc.Control(func(fd uintptr) { //nolint:errcheck // a smaller pipe still works
					unix.FcntlInt(fd, unix.F_SETPIPE_SZ, 1<<20) //nolint:errcheck // as above
				})
			}
		}
	}
	if err := cmd.Start(); err != nil {
		return nil, &ConnectError{Endpoint: ep.String(), Cause: fmt.Errorf("starting %s: %w", argv[0], err)}
	}
	log.Debug("ssh started", "endpoint", ep.String(), "pid", cmd.Process.Pid, "argv", argv)
	stderrDone := make(chan struct{})
	var lastMu sync.Mutex
	var last string
	connected := false
	go func() {
		defer close(stderrDone)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line == "" {
				continue
			}
			lastMu.Lock()
			last = line
			up := connected
			lastMu.Unlock()
			// Before the handshake, what ssh says ends up in the connect error (or
			// is chatter such as "Permanently added ... to known hosts").
			if up {
				log.Warn("ssh: "+line, "endpoint", ep.String())
			} else {
				log.Debug("ssh: "+line, "endpoint", ep.String())
			}
		}
	}()
	exited := make(chan struct{})
	go func() {
		// Wait closes the stderr pipe: only after ssh's last words are read.
		<-stderrDone
		cmd.Wait() //nolint:errcheck // exit status is reported through stderr and EOF
		close(exited)
	}()
	closer := closerFunc(func() error {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(2 * time.Second):
			cmd.Process.Kill() //nolint:errcheck // already exiting or gone
		}
		return nil
	})
	hsCtx := ctx
	if !interactive {
		// Nobody can be typing a passphrase: a handshake this slow is a dead link.
		var cancel context.CancelFunc
		hsCtx, cancel = context.WithTimeout(ctx, max(30*time.Second, ep.Timeout))
		defer cancel()
	}
	client, err := sftp.NewClientLike(hsCtx, stdout, stdin, closer, limits)
	if err != nil {
		// Let ssh finish explaining before we quote it.
		select {
		case <-stderrDone:
		case <-time.After(2 * time.Second):
		}
		lastMu.Lock()
		says := last
		lastMu.Unlock()
		return nil, &ConnectError{Endpoint: ep.String(), SSHSays: says, Cause: err}
	}
	lastMu.Lock()
	connected = true
	lastMu.Unlock()
	return newSession(client, ep, log, cmd, nil), nil
}

// newSession sets a connected client going, either transport: the stall watchdog,
// and a warning when the session ends other than by Close.
func newSession(client *sftp.Client, ep *Endpoint, log *slog.Logger, cmd *exec.Cmd, conn net.Conn) *session {
	client.Watch(ep.Timeout)
	go func() {
		<-client.Done()
		if err := client.Err(); !errors.Is(err, sftp.ErrClientClosed) {
			log.Warn("SFTP session ended", "endpoint", ep.String(), "err", err)
		}
	}()
	return &session{client: client, cmd: cmd, conn: conn}
}

// findProgram resolves a program name, also where PATH is empty: mount(8) starts
// fstab mounts with a bare environment.
func findProgram(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if strings.Contains(name, "/") {
		return name
	}
	for _, dir := range []string{"/usr/bin", "/bin", "/usr/local/bin"} {
		if _, err := os.Stat(dir + "/" + name); err == nil {
			return dir + "/" + name
		}
	}
	return name
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// Pool is the set of SFTP sessions to one endpoint. Requests go to the session with the
// fewest requests in flight; more sessions are opened in the background, up to
// MaxConns, while all existing ones are busy. When every session has died, one
// background loop reconnects with backoff while callers wait (each up to its own
// deadline) for it; so a blip costs a pause, never a hang.
type Pool struct {
	ep  *Endpoint
	log *slog.Logger

	mu         sync.Mutex
	sessions   []*session
	opening    int // background opens of extra sessions under way
	closed     bool
	refs       int
	dialing    bool          // the reconnect loop is running
	lastErr    error         // why the last reconnect attempt failed; nil once up
	up         chan struct{} // closed (and replaced) each time a reconnect succeeds
	tried      chan struct{} // closed (and replaced) each time a reconnect attempt fails
	reconnects int64
	gone       sftp.Stats    // byte and request counts of sessions that have ended
	quit       chan struct{} // closed with the pool: stops the reconnect loop
}

// State is a pool's (or a source's) health.
type State int

const (
	StateUp         State = iota // a live session exists
	StateConnecting              // the sessions were lost; reconnecting, no failure yet
	StateDown                    // reconnecting failed at least once; still retrying
)

func (s State) String() string {
	return [...]string{"up", "connecting", "down"}[s]
}

// preferredCipher is put first in ssh's cipher list when the user has not chosen
// ciphers: AES-GCM runs on the CPU's AES instructions and moved 1.4× the bytes of
// ssh's default (chacha20-poly1305) through one stream on this project's test machine.
// The "^" form keeps the rest of the default list, so a server without it still works.
const preferredCipher = "aes128-gcm@openssh.com"

// userChoseCiphers reports whether ciphers are set in the -o options or in the ssh
// configuration (ssh -G shows the effective list; compared with the list ssh uses with
// no configuration at all).
func userChoseCiphers(ep *Endpoint) bool {
	for _, o := range ep.SSHOptions {
		if name, _, _ := strings.Cut(o, "="); strings.EqualFold(name, "ciphers") {
			return true
		}
	}
	if len(ep.SSHCommand) > 0 && filepath.Base(ep.SSHCommand[0]) != "ssh" {
		return true // another program: do not guess its options
	}
	effective := func(e *Endpoint) string {
		cfg, err := sshConfig(e)
		if err != nil || len(cfg["ciphers"]) == 0 {
			return ""
		}
		return cfg["ciphers"][0]
	}
	bare := *ep
	bare.ConfigFile = "/dev/null"
	mine := effective(ep)
	return mine == "" || mine != effective(&bare)
}

// Dial opens the first session (interactive if stdin is a terminal) and returns the
// pool. A failure here is the user's one-line error.
func Dial(ctx context.Context, ep *Endpoint, log *slog.Logger) (*Pool, error) {
	if !userChoseCiphers(ep) {
		ep.SSHOptions = append(ep.SSHOptions, "Ciphers=^"+preferredCipher)
	}
	if ep.Transport != TransportSSH {
		p, why := planNative(ep)
		switch {
		case p != nil:
			ep.native = p
		case ep.Transport == TransportNative:
			return nil, nativeOnly(ep, errors.New(why))
		default:
			log.Debug("sessions go through the ssh program", "endpoint", ep.String(), "why", why)
		}
	}
	s, err := startSession(ctx, ep, term.IsTerminal(int(os.Stdin.Fd())), log, nil)
	if err != nil {
		return nil, err
	}
	if ep.MaxConns < 1 {
		ep.MaxConns = 1
	}
	return &Pool{ep: ep, log: log, sessions: []*session{s},
		up: make(chan struct{}), tried: make(chan struct{}), quit: make(chan struct{})}, nil
}

// NewDownPool returns a pool for an endpoint that could not be reached (err): a
// replica set starts without that member, and the pool keeps trying to connect in the
// background.
func NewDownPool(ep *Endpoint, err error, log *slog.Logger) *Pool {
	if ep.MaxConns < 1 {
		ep.MaxConns = 1
	}
	p := &Pool{ep: ep, log: log, up: make(chan struct{}), tried: make(chan struct{}), quit: make(chan struct{}),
		dialing: true, lastErr: err}
	go p.reconnect()
	return p
}

// Acquire adds a user of the pool; Release closes it when the last user is gone.
func (p *Pool) Acquire() { p.mu.Lock(); p.refs++; p.mu.Unlock() }

// Release drops a user; the last one closes every session.
func (p *Pool) Release() {
	p.mu.Lock()
	p.refs--
	if p.refs > 0 {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.quit)
	sessions := p.sessions
	p.sessions = nil
	p.mu.Unlock()
	for _, s := range sessions {
		s.client.Close()
	}
}

// Err returns why the pool last failed to connect (nil: it never did).
func (p *Pool) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastErr
}

// live returns a live session without waiting, or nil.
func (p *Pool) live() *sftp.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pruneLocked()
}

// pruneLocked drops dead sessions and returns the least busy live one, or nil.
func (p *Pool) pruneLocked() *sftp.Client {
	var best *sftp.Client
	live := p.sessions[:0]
	for _, s := range p.sessions {
		if s.client.Err() != nil {
			cs := s.client.Stats()
			p.gone.BytesIn += cs.BytesIn
			p.gone.BytesOut += cs.BytesOut
			p.gone.Requests += cs.Requests
			continue
		}
		live = append(live, s)
		if best == nil || s.client.InFlight() < best.InFlight() {
			best = s.client
		}
	}
	for i := len(live); i < len(p.sessions); i++ {
		p.sessions[i] = nil
	}
	p.sessions = live
	return best
}

// ErrUnavailable marks errors of a source that cannot be reached at the moment (its
// connection is lost and not yet back, or it did not answer in time).
var ErrUnavailable = errors.New("source unavailable")

// Get returns a live session's client, the least busy one. With none alive it waits
// for the reconnect loop's next attempt (or until ctx ends): if that attempt fails, the
// caller hears at once that the server is unreachable rather than waiting out its
// deadline again and again while the server stays down.
func (p *Pool) Get(ctx context.Context) (*sftp.Client, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, errors.New("connection pool closed")
		}
		best := p.pruneLocked()
		if best != nil {
			if best.InFlight() > 0 && len(p.sessions) < p.ep.MaxConns && p.opening == 0 {
				p.opening++
				go p.openMore(p.sessions[0])
			}
			p.mu.Unlock()
			return best, nil
		}
		p.stateLocked() // starts the reconnect loop
		up, tried, lastErr := p.up, p.tried, p.lastErr
		p.mu.Unlock()
		select {
		case <-up:
		case <-tried:
			p.mu.Lock()
			lastErr = p.lastErr
			p.mu.Unlock()
			return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, p.ep.String(), lastErr)
		case <-ctx.Done():
			cause := ctx.Err()
			if lastErr != nil {
				cause = fmt.Errorf("%w; last attempt: %v", cause, lastErr)
			}
			return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, p.ep.String(), cause)
		}
	}
}

// Backoff of the reconnect loop: the first attempt is immediate, then the wait
// doubles up to maxBackoff, so a server back after a reboot is found within seconds
// without hammering one that stays down.
const (
	minBackoff = 250 * time.Millisecond
	maxBackoff = 5 * time.Second
)

func (p *Pool) reconnect() {
	wait := minBackoff
	for attempt := 1; ; attempt++ {
		s, err := startSession(context.Background(), p.ep, false, p.log, nil)
		p.mu.Lock()
		if p.closed {
			p.dialing = false
			p.mu.Unlock()
			if err == nil {
				s.client.Close()
			}
			return
		}
		if err == nil {
			p.sessions = append(p.sessions, s)
			p.dialing, p.lastErr = false, nil
			p.reconnects++
			close(p.up)
			p.up = make(chan struct{})
			p.mu.Unlock()
			announceHealth()
			p.log.Warn("reconnected", "endpoint", p.ep.String(), "attempts", attempt)
			return
		}
		first := p.lastErr == nil
		p.lastErr = err
		close(p.tried)
		p.tried = make(chan struct{})
		p.mu.Unlock()
		if first {
			announceHealth()
		}
		if first {
			p.log.Warn("server unreachable; retrying in the background", "endpoint", p.ep.String(), "err", err)
		} else {
			p.log.Debug("reconnect attempt failed", "endpoint", p.ep.String(), "attempt", attempt, "err", err)
		}
		select {
		case <-time.After(wait):
		case <-p.quit:
		}
		wait = min(wait*2, maxBackoff)
	}
}

// health is closed and replaced whenever a pool's State changes: views built from
// several sources (a union's merged listings, which the kernel may keep) change with
// their members' health.
var health struct {
	sync.Mutex
	changed chan struct{}
}

// HealthChanged returns a channel closed at the next change of any pool's State.
func HealthChanged() <-chan struct{} {
	health.Lock()
	defer health.Unlock()
	if health.changed == nil {
		health.changed = make(chan struct{})
	}
	return health.changed
}

func announceHealth() {
	health.Lock()
	defer health.Unlock()
	if health.changed != nil {
		close(health.changed)
		health.changed = nil
	}
}

// State reports the pool's health without waiting. A pool found without a live
// session starts reconnecting: a replica member that nobody asks while it is out must
// still be probed back in.
func (p *Pool) State() State {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stateLocked()
}

func (p *Pool) stateLocked() State {
	switch {
	case p.pruneLocked() != nil:
		return StateUp
	case !p.dialing && !p.closed:
		p.dialing = true
		p.log.Warn("connection lost; reconnecting", "endpoint", p.ep.String())
		go p.reconnect()
		announceHealth()
	}
	if p.lastErr != nil {
		return StateDown
	}
	return StateConnecting
}

// PoolStats are a pool's counters, summed over its sessions.
type PoolStats struct {
	State      State
	Sessions   int
	Reconnects int64
	LastError  string
	Transport  string // TransportNative or TransportSSH: how the live sessions run ("" with none; the latest one's)
	sftp.Stats
}

// Stats sums the live sessions' counters.
func (p *Pool) Stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := PoolStats{Reconnects: p.reconnects, State: p.stateLocked()}
	st.BytesIn, st.BytesOut, st.Requests = p.gone.BytesIn, p.gone.BytesOut, p.gone.Requests
	if p.lastErr != nil {
		st.LastError = p.lastErr.Error()
	}
	var rtts []time.Duration
	for _, s := range p.sessions {
		cs := s.client.Stats()
		st.Sessions++
		st.Transport = TransportSSH
		if s.conn != nil {
			st.Transport = TransportNative
		}
		st.InFlight += cs.InFlight
		st.BytesIn += cs.BytesIn
		st.BytesOut += cs.BytesOut
		st.Requests += cs.Requests
		if cs.RTT > 0 {
			rtts = append(rtts, cs.RTT)
		}
	}
	for _, r := range rtts {
		st.RTT += r / time.Duration(len(rtts))
	}
	return st
}

// InFlight is the number of requests outstanding over all sessions: the load measure
// by which replica members are chosen.
func (p *Pool) InFlight() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, s := range p.sessions {
		n += s.client.InFlight()
	}
	return n
}

// openMore adds a session to the pool; like, if not nil, is a live one of it.
func (p *Pool) openMore(like *session) {
	s, err := startSession(context.Background(), p.ep, false, p.log, like)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.opening--
	if err != nil {
		// Worth a warning only while the server is otherwise reachable (a key that
		// needs a passphrase, a session limit); a server going away is reported by
		// the reconnect loop.
		if p.pruneLocked() != nil {
			p.log.Warn("could not open another SFTP session; going on with fewer", "endpoint", p.ep.String(), "err", err)
		}
		return
	}
	if p.closed {
		s.client.Close()
		return
	}
	p.sessions = append(p.sessions, s)
}

// MinRTT is the shortest round trip seen on any of the pool's sessions (0: none yet).
func (p *Pool) MinRTT() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var best time.Duration
	for _, s := range p.sessions {
		if d := s.client.MinRTT(); d > 0 && (best == 0 || d < best) {
			best = d
		}
	}
	return best
}

// maxOpening bounds the handshakes under way at once: sshd's MaxStartups (10 by
// default) refuses connections beyond its limit of unauthenticated ones.
const maxOpening = 3

// spare returns the least busy live session that in does not hold, or nil; with none,
// the pool is filled up (several at once: a striped read waits for them) for next time.
func (p *Pool) spare(in func(*sftp.Client) bool) *sftp.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pruneLocked()
	var best *sftp.Client
	for _, s := range p.sessions {
		if !in(s.client) && (best == nil || s.client.InFlight() < best.InFlight()) {
			best = s.client
		}
	}
	if best == nil {
		p.fillLocked()
	}
	return best
}

// warm opens the sessions the pool lacks, without waiting for them: a file about to
// be striped over a slow link then finds them open, instead of waiting for their
// handshakes (about nine round trips each) once striping starts.
func (p *Pool) warm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pruneLocked()
	p.fillLocked()
}

// fillLocked starts opening the sessions the pool lacks, up to maxOpening at once.
func (p *Pool) fillLocked() {
	var like *session
	if len(p.sessions) > 0 {
		like = p.sessions[0]
	}
	for n := len(p.sessions) + p.opening; n < p.ep.MaxConns && p.opening < maxOpening && !p.closed; n++ {
		p.opening++
		go p.openMore(like)
	}
}
