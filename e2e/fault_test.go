package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/muxfs/muxfs/internal/sshd"
)

// The fault tests mount with this request timeout; every operation must end within
// faultBound whatever happens to the link.
const (
	faultTimeout = 3 * time.Second
	faultBound   = 2*faultTimeout + time.Second
)

// freezer is a TCP proxy in front of an sshd that can stop forwarding (a frozen link:
// nothing is lost or refused, nothing arrives) and start again.
type freezer struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	frozen bool
	thawed *sync.Cond
}

func newFreezer(t *testing.T, target string) *freezer {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{l: l, target: target}
	f.thawed = sync.NewCond(&f.mu)
	t.Cleanup(func() { l.Close(); f.set(false) })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go f.serve(c)
		}
	}()
	return f
}

func (f *freezer) port() int { return f.l.Addr().(*net.TCPAddr).Port }

// mountFrozen mounts server i's data directory through a freezer of its own.
func (e *env) mountFrozen(i int, args ...string) (*freezer, string) {
	e.t.Helper()
	srv := e.servers[i]
	fz := newFreezer(e.t, "127.0.0.1:"+strconv.Itoa(srv.Port))
	// The proxy's port must be known to ssh under the server's host key.
	hostKey, err := os.ReadFile(filepath.Join(srv.Dir, "host_ed25519.pub"))
	if err != nil {
		e.t.Fatal(err)
	}
	kh, err := os.OpenFile(e.keys.KnownHosts, os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		e.t.Fatal(err)
	}
	fmt.Fprintf(kh, "[127.0.0.1]:%d %s", fz.port(), hostKey)
	kh.Close()
	src := fmt.Sprintf("sftp://%s@127.0.0.1:%d%s", srv.User, fz.port(), e.data[i])
	return fz, e.mount(append([]string{src}, args...)...)
}

func (f *freezer) set(frozen bool) {
	f.mu.Lock()
	f.frozen = frozen
	f.mu.Unlock()
	f.thawed.Broadcast()
}

func (f *freezer) wait() {
	f.mu.Lock()
	for f.frozen {
		f.thawed.Wait()
	}
	f.mu.Unlock()
}

func (f *freezer) serve(c net.Conn) {
	defer c.Close()
	f.wait()
	s, err := net.Dial("tcp", f.target)
	if err != nil {
		return
	}
	defer s.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			f.wait()
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		done <- struct{}{}
	}
	go pipe(s, c)
	go pipe(c, s)
	<-done
}

// opStats records how long each operation of a workload took and how many failed.
type opStats struct {
	mu      sync.Mutex
	ops     int
	errs    int
	lastErr error
	slowest time.Duration
	slowOp  string
}

func (s *opStats) do(what string, fn func() error) error {
	start := time.Now()
	err := fn()
	took := time.Since(start)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ops++
	if err != nil {
		s.errs++
		s.lastErr = err
	}
	if took > s.slowest {
		s.slowest, s.slowOp = took, what
	}
	return err
}

func (s *opStats) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("%d ops, %d failed (last: %v), slowest %v (%s)", s.ops, s.errs, s.lastErr, s.slowest.Round(time.Millisecond), s.slowOp)
}

// workload runs a sequential reader, a sequential writer and a metadata storm on the
// mount until stop is closed, and checks what it can as it goes.
type workload struct {
	t              *testing.T
	mp, serverDir  string
	bigSum         [32]byte
	read, wr, meta opStats
	good           map[string][32]byte // files whose every write and close succeeded
	badReads       int
	wg             sync.WaitGroup
	stop           chan struct{}
	// successes after the fault ended, per workload
	afterMu    sync.Mutex
	afterFault bool
	after      map[string]int
}

func startWorkload(t *testing.T, mp, serverDir string) *workload {
	big := randomData(24<<20, 1)
	if err := os.WriteFile(filepath.Join(serverDir, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	w := &workload{t: t, mp: mp, serverDir: serverDir, bigSum: sha256.Sum256(big),
		good: map[string][32]byte{}, stop: make(chan struct{}), after: map[string]int{}}
	os.Mkdir(filepath.Join(mp, "out"), 0o755)   //nolint:errcheck
	os.Mkdir(filepath.Join(mp, "storm"), 0o755) //nolint:errcheck
	w.wg.Add(3)
	go w.reader()
	go w.writer()
	go w.storm()
	return w
}

func (w *workload) stopped() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

func (w *workload) succeeded(name string) {
	w.afterMu.Lock()
	if w.afterFault {
		w.after[name]++
	}
	w.afterMu.Unlock()
}

func (w *workload) reader() {
	defer w.wg.Done()
	buf := make([]byte, 1<<20)
	for !w.stopped() {
		var f *os.File
		if w.read.do("open big", func() (err error) { f, err = os.Open(filepath.Join(w.mp, "big")); return }) != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		h := sha256.New()
		ok := true
		for ok && !w.stopped() {
			var n int
			eof := false
			err := w.read.do("read 1 MiB", func() (err error) {
				n, err = f.Read(buf)
				if err == io.EOF {
					eof, err = true, nil
				}
				return err
			})
			h.Write(buf[:n])
			if eof {
				break
			}
			ok = err == nil
		}
		f.Close()
		if ok && !w.stopped() {
			if !bytes.Equal(h.Sum(nil), w.bigSum[:]) {
				w.badReads++
			}
			w.succeeded("read")
		}
	}
}

func (w *workload) writer() {
	defer w.wg.Done()
	for i := 0; !w.stopped(); i++ {
		name := fmt.Sprintf("out/w%d", i)
		data := randomData(6<<20, int64(i)+100)
		var f *os.File
		if w.wr.do("create", func() (err error) { f, err = os.Create(filepath.Join(w.mp, name)); return }) != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		ok := true
		for off := 0; ok && off < len(data); off += 1 << 20 {
			ok = w.wr.do("write 1 MiB", func() error { _, err := f.Write(data[off : off+1<<20]); return err }) == nil
		}
		if w.wr.do("close", f.Close) != nil {
			ok = false
		}
		if ok {
			w.good[name] = sha256.Sum256(data)
			w.succeeded("write")
		}
	}
}

func (w *workload) storm() {
	defer w.wg.Done()
	for i := 0; !w.stopped(); i++ {
		d := filepath.Join(w.mp, "storm", fmt.Sprintf("d%d", i))
		ok := w.meta.do("mkdir", func() error { return os.Mkdir(d, 0o755) }) == nil
		ok = ok && w.meta.do("create", func() error { return os.WriteFile(d+"/f", []byte("x"), 0o644) }) == nil
		ok = ok && w.meta.do("rename", func() error { return os.Rename(d+"/f", d+"/g") }) == nil
		ok = ok && w.meta.do("stat", func() error { _, err := os.Stat(d + "/g"); return err }) == nil
		ok = ok && w.meta.do("readdir", func() error { _, err := os.ReadDir(d); return err }) == nil
		ok = ok && w.meta.do("unlink", func() error { return os.Remove(d + "/g") }) == nil
		ok = ok && w.meta.do("rmdir", func() error { return os.Remove(d) }) == nil
		if ok {
			w.succeeded("meta")
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// finish stops the workload and checks it: no operation took longer than faultBound,
// every file whose writer saw no error is byte-identical on the server, every full
// read returned the right bytes, and each workload succeeded again after the fault.
func (w *workload) finish(allowErrors bool) {
	t := w.t
	close(w.stop)
	w.wg.Wait()
	t.Logf("reader: %v", &w.read)
	t.Logf("writer: %v", &w.wr)
	t.Logf("metadata: %v", &w.meta)
	for _, s := range []*opStats{&w.read, &w.wr, &w.meta} {
		if s.slowest > faultBound {
			t.Errorf("an operation (%s) took %v: more than %v with -o timeout=%v", s.slowOp, s.slowest, faultBound, faultTimeout)
		}
		if !allowErrors && s.errs > 0 {
			t.Errorf("%d operations failed although the fault should be invisible: last %v", s.errs, s.lastErr)
		}
	}
	if w.badReads > 0 {
		t.Errorf("%d complete reads returned wrong data", w.badReads)
	}
	for name, sum := range w.good {
		data, err := os.ReadFile(filepath.Join(w.serverDir, name))
		if err != nil || sha256.Sum256(data) != sum {
			t.Errorf("%s: the writer saw success but the server's copy differs (%d bytes, %v)", name, len(data), err)
		}
	}
	for _, name := range []string{"read", "write", "meta"} {
		if w.after[name] == 0 {
			t.Errorf("the %s workload never succeeded after the fault ended", name)
		}
	}
	t.Logf("verified %d written files byte for byte", len(w.good))
}

// faultEnded marks the end of the fault and waits until the mount answers again,
// returning how long that took.
func (w *workload) faultEnded() time.Duration {
	w.afterMu.Lock()
	w.afterFault = true
	w.afterMu.Unlock()
	start := time.Now()
	for time.Since(start) < 30*time.Second {
		if _, err := os.ReadDir(filepath.Join(w.mp, "out")); err == nil {
			if _, err := os.Stat(filepath.Join(w.mp, "big")); err == nil {
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Let every workload run a full round on the recovered mount.
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		w.afterMu.Lock()
		done := w.after["read"] > 0 && w.after["write"] > 0 && w.after["meta"] > 0
		w.afterMu.Unlock()
		if done {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start)
}

func randomData(n int, seed int64) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

// connections lists what carries a mount's SSH connections: its ssh processes
// (-o transport=ssh), or else the servers' processes serving them (the in-process
// transport has no process of its own to kill).
func (e *env) connections(muxfsPID int) []int {
	var out []int
	for _, p := range sshd.Descendants(muxfsPID) {
		comm, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/comm")
		if strings.TrimSpace(string(comm)) == "ssh" {
			out = append(out, p)
		}
	}
	if len(out) > 0 {
		return out
	}
	for _, srv := range e.servers {
		out = append(out, srv.Sessions()...)
	}
	return out
}

// cutConnections kills them: every connection of the mount ends at once.
func (e *env) cutConnections(t *testing.T, muxfsPID int) {
	pids := e.connections(muxfsPID)
	if len(pids) == 0 {
		t.Fatal("the mount has no connection to cut")
	}
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGKILL) //nolint:errcheck
	}
}

// TestFaultKillSSH: cutting every connection of the mount (killing its ssh
// processes, or with the in-process transport the server's sessions) in the middle
// of a sequential read, a sequential write and a metadata storm is invisible to
// them: muxfs reconnects, reopens the files and sends the unacknowledged writes
// again. Both transports.
func TestFaultKillSSH(t *testing.T) {
	for _, transport := range []string{"native", "ssh"} {
		t.Run(transport, func(t *testing.T) {
			e := newEnv(t, 1)
			mp := e.mountpoint()
			cmd := e.mountAt(mp, e.source(0, ""), "-o", "timeout=3,transport="+transport)
			w := startWorkload(t, mp, e.data[0])
			for i := 0; i < 3; i++ {
				time.Sleep(time.Second)
				e.cutConnections(t, cmd.Process.Pid)
			}
			t.Logf("recovered after %v", w.faultEnded())
			w.finish(false)
			out := run(t, muxfsBin+" status --json "+mp)
			var st struct {
				Sources []struct {
					Retries, Reopened int64
					Members           []struct {
						Reconnects int64
						Transport  string
					}
				}
			}
			if err := json.Unmarshal([]byte(out), &st); err != nil || len(st.Sources) != 1 {
				t.Fatalf("status --json: %v\n%s", err, out)
			}
			s := st.Sources[0]
			t.Logf("status: %d requests retried, %d open files reopened, %d reconnects", s.Retries, s.Reopened, s.Members[0].Reconnects)
			if s.Members[0].Reconnects < 3 {
				t.Errorf("three kills, %d reconnects counted", s.Members[0].Reconnects)
			}
			if s.Members[0].Transport != transport {
				t.Errorf("sessions run %q, not %q", s.Members[0].Transport, transport)
			}
		})
	}
}

// TestFaultReopenReplacedOrGrown: after a lost connection muxfs opens a reader's file
// again by path. If the file was replaced on the server meanwhile (a new file renamed
// over it), the reader gets ESTALE, never the rest of another file's bytes; a log that
// only grew is followed on by `tail -f` across the cut.
func TestFaultReopenReplacedOrGrown(t *testing.T) {
	e := newEnv(t, 1)
	mp := e.mountpoint()
	// cache_timeout: tail polls its descriptor's size, which muxfs answers from
	// memory for that long.
	cmd := e.mountAt(mp, e.source(0, ""), "-o", "timeout=3,cache_timeout=1")
	const size = 32 << 20
	old := randomData(size, 1)
	replacing := randomData(size, 2)
	srv := filepath.Join(e.data[0], "data")
	if err := os.WriteFile(srv, old, 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(e.data[0], "log")
	appendLog := func(from, to int) {
		f, err := os.OpenFile(logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		for i := from; i < to; i++ {
			fmt.Fprintf(f, "line %d\n", i)
		}
		f.Close()
	}
	appendLog(0, 100)
	tail := exec.Command("tail", "-c", "+1", "-f", filepath.Join(mp, "log"))
	var out sshd.LockedBuffer
	tail.Stdout = &out
	if err := tail.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tail.Process.Kill(); tail.Wait() }) //nolint:errcheck
	f, err := os.Open(filepath.Join(mp, "data"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "tail shows the log", func() bool { return strings.Contains(out.String(), "line 99\n") })

	if err := os.WriteFile(srv+".new", replacing, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(srv+".new", srv); err != nil {
		t.Fatal(err)
	}
	appendLog(100, 200)
	e.cutConnections(t, cmd.Process.Pid)
	appendLog(200, 300)
	// The kernel's pages of the first MiB are the file as read; further on, the
	// read goes to muxfs, and to the reopened path.
	off := int64(size / 2)
	n, err := f.ReadAt(buf, off)
	switch {
	case errors.Is(err, syscall.ESTALE):
	case err == nil && bytes.Equal(buf[:n], replacing[off:off+int64(n)]):
		t.Errorf("the read after the reconnect returned the replacing file's bytes")
	default:
		t.Errorf("the read after the reconnect: %d bytes, %v; want ESTALE", n, err)
	}
	var want strings.Builder
	for i := 0; i < 300; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	waitUntil(t, "tail follows the log across the cut", func() bool { return out.String() == want.String() })
}

// waitUntil polls cond for up to 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
	}
}

// TestFaultStopSSHD: the server goes away (sshd and all its sessions killed) for
// longer than the timeout, then comes back: callers get errors within the bound, never
// a hang, and the mount recovers by itself.
func TestFaultStopSSHD(t *testing.T) {
	e := newEnv(t, 1)
	mp := e.mount(e.source(0, ""), "-o", "timeout=3")
	w := startWorkload(t, mp, e.data[0])
	time.Sleep(1500 * time.Millisecond)
	e.servers[0].Kill()
	time.Sleep(2*faultTimeout + time.Second)
	if err := e.servers[0].Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("recovered %v after the server came back", w.faultEnded())
	w.finish(true)
	out := run(t, muxfsBin+" status --json "+mp)
	if !strings.Contains(out, `"reconnects": 1`) && !strings.Contains(out, `"reconnects": 2`) {
		t.Errorf("status does not count the reconnect:\n%s", out)
	}
}

// TestFaultFrozenLink: the link stops carrying anything (no reset, no refusal) for
// longer than the timeout: callers get errors within the bound, and the mount
// recovers when the link does.
func TestFaultFrozenLink(t *testing.T) {
	e := newEnv(t, 1)
	fz, mp := e.mountFrozen(0, "-o", "timeout=3")
	w := startWorkload(t, mp, e.data[0])
	time.Sleep(1500 * time.Millisecond)
	fz.set(true)
	time.Sleep(2*faultTimeout + time.Second)
	fz.set(false)
	t.Logf("recovered %v after the link came back", w.faultEnded())
	w.finish(true)
}

// TestReplicaFailoverUnderLoad: two servers in front of the same storage form a
// replica set; one is killed under a running read/write/metadata load, which goes on
// without a single error, and the data is identical.
func TestReplicaFailoverUnderLoad(t *testing.T) {
	e := newEnv(t, 2)
	shared := e.data[0]
	conf := filepath.Join(e.tmp, "replicas.toml")
	writeFile(t, conf, fmt.Sprintf(`
[[mount]]
path = "/"
sources = [
  { url = "sftp://%s@127.0.0.1:%d%s", replicas = ["sftp://%s@127.0.0.1:%d%s"] },
]
`, e.servers[0].User, e.servers[0].Port, shared, e.servers[1].User, e.servers[1].Port, shared))
	mp := e.mount("--config", conf, "-o", "timeout=3")
	w := startWorkload(t, mp, shared)
	time.Sleep(1500 * time.Millisecond)
	e.servers[0].Kill()
	time.Sleep(3 * time.Second)
	t.Logf("load went on %v after the kill", w.faultEnded())
	w.finish(false)
	out := run(t, muxfsBin+" status "+mp)
	t.Logf("status:\n%s", out)
	if !strings.Contains(out, "degraded") {
		t.Errorf("status does not show the replica set degraded:\n%s", out)
	}
	if err := e.servers[0].Restart(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for strings.Contains(out, "degraded") && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		out = run(t, muxfsBin+" status "+mp)
	}
	if strings.Contains(out, "degraded") {
		t.Errorf("the restarted member was not probed back in:\n%s", out)
	}
}

// TestRandomIntegrityWithKills drives one file on the mount with random pwrite,
// truncate, read and fsync, compared with an in-memory model, while the mount's
// connections are cut every half second. No operation may fail and no byte differ.
func TestRandomIntegrityWithKills(t *testing.T) {
	e := newEnv(t, 1)
	mp := e.mountpoint()
	cmd := e.mountAt(mp, e.source(0, ""), "-o", "timeout=5")
	f, err := os.OpenFile(filepath.Join(mp, "model"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	kills := 0
	var killer sync.WaitGroup
	killer.Add(1)
	go func() {
		defer killer.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
			for _, p := range e.connections(cmd.Process.Pid) {
				syscall.Kill(p, syscall.SIGKILL) //nolint:errcheck
			}
			kills++
		}
	}()
	rng := rand.New(rand.NewSource(7))
	var model []byte
	const maxSize = 4 << 20
	var ops int
	// 12 s in the suite; MUXFS_INTEGRITY_SECONDS=N runs it longer.
	duration := 12 * time.Second
	if v, err := strconv.Atoi(os.Getenv("MUXFS_INTEGRITY_SECONDS")); err == nil && v > 0 {
		duration = time.Duration(v) * time.Second
	}
	end := time.Now().Add(duration)
	for ; time.Now().Before(end); ops++ {
		switch op := rng.Intn(10); {
		case op < 5:
			off := rng.Intn(maxSize)
			buf := randomData(1+rng.Intn(256<<10), rng.Int63())
			if _, err := f.WriteAt(buf, int64(off)); err != nil {
				t.Fatalf("op %d: pwrite: %v", ops, err)
			}
			if end := off + len(buf); end > len(model) {
				model = append(model, make([]byte, end-len(model))...)
			}
			copy(model[off:], buf)
		case op < 6:
			size := rng.Intn(maxSize)
			if err := f.Truncate(int64(size)); err != nil {
				t.Fatalf("op %d: truncate: %v", ops, err)
			}
			if size < len(model) {
				model = model[:size]
			} else {
				model = append(model, make([]byte, size-len(model))...)
			}
		case op < 9:
			off := rng.Intn(maxSize)
			buf := make([]byte, 1+rng.Intn(512<<10))
			n, err := f.ReadAt(buf, int64(off))
			if err != nil && err != io.EOF {
				t.Fatalf("op %d: pread: %v", ops, err)
			}
			var want []byte
			if off < len(model) {
				want = model[off:min(len(model), off+len(buf))]
			}
			if !bytes.Equal(buf[:n], want) {
				t.Fatalf("op %d: pread of %d bytes at %d: got %d bytes that differ from the model (%d expected)", ops, len(buf), off, n, len(want))
			}
		default:
			if err := f.Sync(); err != nil {
				t.Fatalf("op %d: fsync: %v", ops, err)
			}
		}
	}
	close(stop)
	killer.Wait()
	if err := f.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(e.data[0], "model"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, model) {
		t.Fatalf("the server's file (%d bytes) differs from the model (%d bytes)", len(got), len(model))
	}
	t.Logf("%d operations, %d connection kills, 0 mismatches", ops, kills)
}

// TestUnionMemberDown: a union goes on without a member whose server is down (its
// names disappear, new files go to a live member, the log and status say so) and
// takes it back when it returns; with on_down = "fail-closed" the union fails instead.
func TestUnionMemberDown(t *testing.T) {
	e := newEnv(t, 2)
	writeFile(t, e.data[0]+"/a.txt", "a")
	writeFile(t, e.data[0]+"/shared/x0", "0")
	writeFile(t, e.data[1]+"/b.txt", "b")
	writeFile(t, e.data[1]+"/shared/x1", "1")
	// offline=off: the persistent cache would otherwise keep serving the member's
	// cached names read-only (TestOffline).
	mp := e.mount(e.source(0, ""), e.source(1, ""), "-o", "timeout=3,offline=off")
	if got := strings.Join(names(t, mp), " "); got != "a.txt b.txt shared" {
		t.Fatalf("union before the fault: %q", got)
	}
	e.servers[1].Kill()
	// Until its first reconnect attempt fails (some 50 ms here), the member counts as
	// reconnecting and the memory cache may still answer for it.
	waitStatus(t, mp, `"state": "down"`)
	// The kernel's copy of the merged listing is dropped when the member leaves, right
	// after the status shows it (muxfs reacts to the change, not to the next listing).
	deadline := time.Now().Add(2 * time.Second)
	for i := 0; ; i++ {
		start := time.Now()
		got := strings.Join(names(t, mp), " ")
		if took := time.Since(start); took > faultBound || (i > 0 && took > time.Second) {
			t.Errorf("listing %d with member 2 down took %v", i+1, took)
		}
		if got == "a.txt shared" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("listing with member 2 down: %q, want a.txt shared", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := strings.Join(names(t, mp+"/shared"), " "); got != "x0" {
		t.Errorf("merged directory with member 2 down: %q", got)
	}
	writeFile(t, mp+"/shared/new", "n")
	if _, err := os.Stat(e.data[0] + "/shared/new"); err != nil {
		t.Errorf("a new file did not go to the live member: %v", err)
	}
	if readString(t, mp+"/a.txt") != "a" {
		t.Error("the live member's file is unreadable")
	}
	if err := e.servers[1].Restart(); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(15 * time.Second)
	got := ""
	for time.Now().Before(deadline) {
		if got = strings.Join(names(t, mp), " "); got == "a.txt b.txt shared" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got != "a.txt b.txt shared" {
		t.Errorf("member 2 did not come back into the union: %q", got)
	}

	// Without the memory cache, so that every lookup and listing asks the servers.
	t.Run("fail-closed", func(t *testing.T) {
		conf := filepath.Join(e.tmp, "closed.toml")
		writeFile(t, conf, fmt.Sprintf(`
[[mount]]
path = "/"
sources = ["%s", { url = "%s", on_down = "fail-closed" }]
`, e.source(0, ""), e.source(1, "")))
		mp := e.mount("--config", conf, "-o", "timeout=3,cache=no")
		if got := strings.Join(names(t, mp), " "); got != "a.txt b.txt shared" {
			t.Fatalf("union before the fault: %q", got)
		}
		e.servers[1].Kill()
		waitStatus(t, mp, `"state": "down"`)
		start := time.Now()
		_, err := os.ReadDir(mp + "/shared")
		if err == nil {
			t.Error("a fail-closed union listed a directory with a member down")
		}
		if took := time.Since(start); took > faultBound {
			t.Errorf("took %v", took)
		}
	})
}

// waitStatus polls `muxfs status --json` until it contains want.
func waitStatus(t *testing.T, mp, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	out := ""
	for time.Now().Before(deadline) {
		if out = run(t, muxfsBin+" status --json "+mp); strings.Contains(out, want) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("status never showed %s:\n%s", want, out)
}
