package sftp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const sftpServer = "/usr/lib/openssh/sftp-server"

// serve starts OpenSSH's sftp-server on pipes (no ssh needed) and returns a client.
func serve(t *testing.T) (*Client, string) {
	t.Helper()
	return serveThrough(t, func(w io.WriteCloser) io.Writer { return w })
}

// serveThrough is serve with the client writing to the server's input through wrap.
func serveThrough(t *testing.T, wrap func(io.WriteCloser) io.Writer) (*Client, string) {
	t.Helper()
	if _, err := os.Stat(sftpServer); err != nil {
		t.Skip("OpenSSH sftp-server not installed (apt-get install openssh-server)")
	}
	dir := t.TempDir()
	stdout, stdin, closer := startServer(t)
	c, err := NewClient(context.Background(), stdout, wrap(stdin), closer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, dir
}

// startServer starts OpenSSH's sftp-server on pipes: its output, its input, and a
// closer that ends it.
func startServer(t *testing.T) (io.Reader, io.WriteCloser, io.Closer) {
	t.Helper()
	cmd := exec.Command(sftpServer, "-e", "-l", "ERROR")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return stdout, stdin, closerFunc(func() error { stdin.Close(); return cmd.Wait() })
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

func TestHandshakeAndLimits(t *testing.T) {
	c, _ := serve(t)
	for _, ext := range []string{"posix-rename@openssh.com", "statvfs@openssh.com", "hardlink@openssh.com",
		"fsync@openssh.com", "lsetstat@openssh.com", "limits@openssh.com"} {
		if !c.HasExtension(ext) {
			t.Errorf("extension %s not announced", ext)
		}
	}
	if c.MaxRead < 64<<10 || c.MaxWrite < 64<<10 {
		t.Errorf("limits not applied: read %d write %d", c.MaxRead, c.MaxWrite)
	}
}

// TestNewClientLikeTakesLimits: another session to a server announcing
// limits@openssh.com takes the limits given instead of asking for them (no request
// sent), and the first asks.
func TestNewClientLikeTakesLimits(t *testing.T) {
	if _, err := os.Stat(sftpServer); err != nil {
		t.Skip("OpenSSH sftp-server not installed (apt-get install openssh-server)")
	}
	for _, like := range []*Limits{nil, {MaxRead: 100000, MaxWrite: 90000}} {
		stdout, stdin, closer := startServer(t)
		c, err := NewClientLike(context.Background(), stdout, stdin, closer, like)
		if err != nil {
			t.Fatal(err)
		}
		sent, got := c.Stats().Requests, c.Limits()
		c.Close()
		switch {
		case like == nil && (sent != 1 || got.MaxRead < 64<<10):
			t.Errorf("first session: %d requests sent, limits %+v; want the limits asked for", sent, got)
		case like != nil && (sent != 0 || got != *like):
			t.Errorf("another session: %d requests sent, limits %+v; want none sent and %+v", sent, got, *like)
		}
	}
}

func TestFileRoundTrip(t *testing.T) {
	c, dir := serve(t)
	ctx := context.Background()
	p := filepath.Join(dir, "f")
	h, err := c.Open(ctx, p, FlagWrite|FlagCreate|FlagExcl, Attrs{Flags: AttrPermissions, Mode: 0o640})
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("0123456789abcdef"), 100_000)
	// Pipeline every chunk, then collect.
	var pending []*PendingWrite
	for off := 0; off < len(data); off += c.MaxWrite {
		w, err := c.StartWrite(h, data[off:min(len(data), off+c.MaxWrite)], int64(off))
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, w)
	}
	for _, w := range pending {
		if err := w.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Fsync(ctx, h); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseHandle(ctx, h); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o640 || st.Size() != int64(len(data)) {
		t.Fatalf("created file: %v %v", err, st)
	}
	h, err = c.Open(ctx, p, FlagRead, Attrs{})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 0, len(data))
	buf := make([]byte, c.MaxRead)
	for off := int64(0); ; {
		n, err := c.Read(ctx, h, buf, off)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
		off += int64(n)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
	if _, err := c.Open(ctx, p, FlagWrite|FlagCreate|FlagExcl, Attrs{}); !IsStatus(err, StatusFailure) {
		t.Errorf("O_EXCL on existing file: %v", err)
	}
}

func TestNamespaceOps(t *testing.T) {
	c, dir := serve(t)
	ctx := context.Background()
	if _, err := c.MkdirAndLstat(ctx, dir+"/d", Attrs{Flags: AttrPermissions, Mode: 0o700}); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(dir + "/d"); st.Mode().Perm() != 0o700 {
		t.Errorf("mkdir mode: %v", st.Mode())
	}
	os.WriteFile(dir+"/d/a", []byte("a"), 0o644) //nolint:errcheck
	os.WriteFile(dir+"/d/b", []byte("b"), 0o644) //nolint:errcheck
	if a, err := c.SymlinkAndLstat(ctx, "a", dir+"/d/link"); err != nil || a.Mode&0o170000 != 0o120000 || a.Size != 1 {
		t.Fatalf("symlink and lstat: mode %o size %d, %v", a.Mode, a.Size, err)
	}
	if target, err := c.Readlink(ctx, dir+"/d/link"); err != nil || target != "a" {
		t.Errorf("readlink: %q %v (symlink argument order wrong?)", target, err)
	}
	if err := c.Hardlink(ctx, dir+"/d/a", dir+"/d/hard"); err != nil {
		t.Fatal(err)
	}
	ents, err := c.ReadDir(ctx, dir+"/d")
	if err != nil {
		t.Fatal(err)
	}
	nlink := map[string]uint32{}
	for _, e := range ents {
		nlink[e.Name] = e.Nlink
	}
	if nlink["a"] != 2 || nlink["hard"] != 2 || nlink["b"] != 1 {
		t.Errorf("link counts from long names: %v", nlink)
	}
	if err := c.Rename(ctx, dir+"/d/a", dir+"/d/b"); !IsStatus(err, StatusFailure) {
		t.Errorf("plain rename onto an existing file must fail, got %v", err)
	}
	if err := c.PosixRename(ctx, dir+"/d/a", dir+"/d/b"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dir + "/d/b"); string(b) != "a" {
		t.Error("posix-rename did not replace")
	}
	old := time.Unix(1_000_000_000, 0)
	la, err := c.SetstatAndLstat(ctx, dir+"/d/link", Attrs{Flags: AttrACModTime, Atime: uint32(old.Unix()), Mtime: uint32(old.Unix())}, true)
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Lstat(dir + "/d/link"); !fi.ModTime().Equal(old) || la.Mtime != uint32(old.Unix()) {
		t.Errorf("lsetstat changed %v, not the link (answered %d)", fi.ModTime(), la.Mtime)
	}
	if la, err := c.SetstatAndLstat(ctx, dir+"/d/b", Attrs{Flags: AttrPermissions, Mode: 0o604}, false); err != nil || la.Mode&0o777 != 0o604 {
		t.Errorf("setstat: %v, answered mode %o", err, la.Mode)
	}
	// The link's target ("a") was renamed away: setstat follows the link and finds
	// nothing there.
	if _, err := c.SetstatAndLstat(ctx, dir+"/d/link", Attrs{Flags: AttrPermissions, Mode: 0o600}, false); !IsStatus(err, StatusNoSuchFile) {
		t.Errorf("setstat through a dangling link: %v", err)
	}
	if err := c.Rmdir(ctx, dir+"/d"); !IsStatus(err, StatusFailure) {
		t.Errorf("rmdir of non-empty dir: %v", err)
	}
	if _, err := c.Lstat(ctx, dir+"/none"); !IsStatus(err, StatusNoSuchFile) {
		t.Errorf("lstat of missing: %v", err)
	}
	if st, err := c.Statvfs(ctx, dir); err != nil || st.Blocks == 0 {
		t.Errorf("statvfs: %+v %v", st, err)
	}
	if err := c.Remove(ctx, dir+"/d/link"); err != nil {
		t.Error(err)
	}
}

func TestConcurrentRequests(t *testing.T) {
	c, dir := serve(t)
	ctx := context.Background()
	before := c.Stats().Requests
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Lstat(ctx, dir); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if c.InFlight() != 0 {
		t.Errorf("in flight after all answered: %d", c.InFlight())
	}
	if n := c.Stats().Requests - before; n != 64 {
		t.Errorf("64 requests counted as %d", n)
	}
}

func TestContextAndClose(t *testing.T) {
	c, dir := serve(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Lstat(ctx, dir); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
	c.Close()
	if _, err := c.Lstat(context.Background(), dir); !errors.Is(err, ErrClosed) {
		t.Errorf("after close: %v", err)
	}
}

// fakeServer answers the handshake and then whatever reply() writes.
func fakeServer(t *testing.T, reply func(w io.Writer, id uint32)) *Client {
	t.Helper()
	cr, sw := io.Pipe()
	sr, cw := io.Pipe()
	go func() {
		hdr := make([]byte, 9)
		io.ReadFull(sr, hdr) //nolint:errcheck // init
		v := newPacket(fxpVersion, 3)
		sw.Write(v.finish()) //nolint:errcheck
		requestsFrom(sr, func(_ byte, id uint32) { reply(sw, id) })
	}()
	c, err := NewClient(context.Background(), cr, cw, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); sw.Close(); sr.Close() })
	return c
}

// requestsFrom reads the client's requests from r (after its INIT) and hands each
// one's type and id to each, until r ends.
func requestsFrom(r io.Reader, each func(typ byte, id uint32)) {
	for {
		var l [4]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(l[:]))
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		each(body[0], binary.BigEndian.Uint32(body[1:5]))
	}
}

func TestMalformedReplies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t.Run("huge packet", func(t *testing.T) {
		c := fakeServer(t, func(w io.Writer, id uint32) {
			w.Write([]byte{0xff, 0xff, 0xff, 0xff, fxpAttrs}) //nolint:errcheck
		})
		if _, err := c.Lstat(ctx, "/x"); !errors.Is(err, ErrClosed) {
			t.Errorf("got %v, want the connection closed", err)
		}
	})
	t.Run("truncated attrs", func(t *testing.T) {
		c := fakeServer(t, func(w io.Writer, id uint32) {
			b := newPacket(fxpAttrs, id)
			b.u32(AttrSize | AttrUIDGID) // announces fields it does not send
			w.Write(b.finish())          //nolint:errcheck
		})
		if _, err := c.Lstat(ctx, "/x"); !errors.Is(err, errShort) {
			t.Errorf("got %v, want a malformed-packet error", err)
		}
	})
	t.Run("lying name count", func(t *testing.T) {
		c := fakeServer(t, func(w io.Writer, id uint32) {
			b := newPacket(fxpName, id)
			b.u32(1 << 30)
			w.Write(b.finish()) //nolint:errcheck
		})
		if _, err := c.Readlink(ctx, "/x"); err == nil {
			t.Error("accepted a NAME reply claiming 2^30 entries")
		}
	})
	t.Run("oversized read data", func(t *testing.T) {
		c := fakeServer(t, func(w io.Writer, id uint32) {
			b := newPacket(fxpData, id)
			b.bytes(make([]byte, 100))
			w.Write(b.finish()) //nolint:errcheck
		})
		if _, err := c.Read(ctx, "h", make([]byte, 10), 0); err == nil {
			t.Error("accepted more data than asked for")
		}
	})
	t.Run("server exits", func(t *testing.T) {
		c := fakeServer(t, func(w io.Writer, id uint32) {
			w.(*io.PipeWriter).Close()
		})
		if _, err := c.Lstat(ctx, "/x"); !errors.Is(err, ErrClosed) {
			t.Errorf("got %v", err)
		}
	})
	t.Run("stall mid-reply", func(t *testing.T) {
		c := fakeServer(t, func(w io.Writer, id uint32) {
			b := newPacket(fxpAttrs, id)
			b.attrs(&Attrs{Flags: AttrSize, Size: 1})
			pkt := b.finish()
			w.Write(pkt[:len(pkt)/2]) //nolint:errcheck // and then nothing more
		})
		c.Watch(200 * time.Millisecond)
		start := time.Now()
		_, err := c.Lstat(ctx, "/x")
		if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "stopped answering") {
			t.Errorf("got %v, want the session ended as stalled", err)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("the stalled request took %v with a 200 ms watchdog", took)
		}
	})
	t.Run("slow but alive is not stalled", func(t *testing.T) {
		c := fakeServer(t, func(w io.Writer, id uint32) {
			time.Sleep(100 * time.Millisecond)
			b := newPacket(fxpAttrs, id)
			b.attrs(&Attrs{Flags: AttrSize, Size: 1})
			w.Write(b.finish()) //nolint:errcheck
		})
		c.Watch(300 * time.Millisecond)
		// Ten requests answered one after another take 1 s in all, but each packet
		// arrives within the watchdog's 300 ms.
		var wg sync.WaitGroup
		for i := 0; i < 10; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := c.Lstat(ctx, "/x"); err != nil {
					t.Errorf("slow server: %v", err)
				}
			}()
		}
		wg.Wait()
	})
	t.Run("absurd size", func(t *testing.T) {
		c := fakeServer(t, func(w io.Writer, id uint32) {
			b := newPacket(fxpAttrs, id)
			b.attrs(&Attrs{Flags: AttrSize, Size: 1 << 63})
			w.Write(b.finish()) //nolint:errcheck
		})
		if _, err := c.Lstat(ctx, "/x"); err == nil || !strings.Contains(err.Error(), "impossible file size") {
			t.Errorf("a size beyond int64 must be an error that says so: %v", err)
		}
	})
}

func FuzzParseNames(f *testing.F) {
	b := &buffer{}
	b.u32(1)
	b.str("name")
	b.str("-rw-r--r--    2 u g 1 Jan 1 00:00 name")
	b.attrs(&Attrs{Flags: AttrSize | AttrPermissions, Size: 5, Mode: syscall.S_IFREG | 0o644})
	f.Add(b.b)
	f.Add([]byte{0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		names, err := parseNames(data)
		if err == nil && len(names)*12 > len(data) {
			t.Errorf("%d names from %d bytes", len(names), len(data))
		}
	})
}

func FuzzAttrs(f *testing.F) {
	b := &buffer{}
	b.attrs(&Attrs{Flags: AttrSize | AttrUIDGID | AttrPermissions | AttrACModTime, Size: 1, Mode: 0o644})
	f.Add(b.b)
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &reader{b: data}
		a := r.attrs()
		if r.err == nil && a.Size > 1<<63-1 && a.Check() == nil {
			t.Error("size beyond int64 passes the check")
		}
	})
}

// FuzzServerStream feeds arbitrary bytes as a server's whole output, after a valid
// version packet, to a client making every kind of request: whatever comes, each
// request ends (with data or an error) and nothing panics.
func FuzzServerStream(f *testing.F) {
	attrs := newPacket(fxpAttrs, 1)
	attrs.attrs(&Attrs{Flags: AttrSize, Size: 3})
	f.Add(attrs.finish())
	f.Add([]byte{0, 0, 0, 5, fxpStatus, 0, 0, 0, 1})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0})
	f.Add([]byte{0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, stream []byte) {
		cr, sw := io.Pipe()
		sr, cw := io.Pipe()
		go func() {
			io.ReadFull(sr, make([]byte, 9)) //nolint:errcheck // init
			v := newPacket(fxpVersion, 3)
			sw.Write(v.finish())    //nolint:errcheck
			sw.Write(stream)        //nolint:errcheck
			sw.Close()              // and then the server is gone: pending requests end
			io.Copy(io.Discard, sr) //nolint:errcheck
		}()
		c, err := NewClient(context.Background(), cr, cw, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { c.Close(); sw.Close(); sr.Close() }()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		c.Lstat(ctx, "/x")                           //nolint:errcheck
		c.ReadDir(ctx, "/d")                         //nolint:errcheck
		c.Read(ctx, "h", make([]byte, 64), 0)        //nolint:errcheck
		c.Readlink(ctx, "/l")                        //nolint:errcheck
		c.Realpath(ctx, ".")                         //nolint:errcheck
		c.Statvfs(ctx, "/")                          //nolint:errcheck
		c.OpenAndLstat(ctx, "/f", FlagRead, Attrs{}) //nolint:errcheck
	})
}

// FuzzHandshake feeds arbitrary bytes as the server's answer to INIT.
func FuzzHandshake(f *testing.F) {
	v := newPacket(fxpVersion, 3)
	f.Add(v.finish())
	f.Add([]byte{0, 0, 0, 5, fxpVersion, 0, 0, 0, 3, 0, 0, 0, 4})
	f.Fuzz(func(t *testing.T, stream []byte) {
		cr, sw := io.Pipe()
		sr, cw := io.Pipe()
		go func() {
			io.ReadFull(sr, make([]byte, 9)) //nolint:errcheck // init
			sw.Write(stream)                 //nolint:errcheck
			sw.Close()
			io.Copy(io.Discard, sr) //nolint:errcheck
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		c, err := NewClient(ctx, cr, cw, nil)
		if err == nil {
			c.Close()
		}
		sr.Close()
	})
}

// countingWriter counts the write(2)s that reach the server's pipe.
type countingWriter struct {
	io.WriteCloser
	mu    sync.Mutex
	calls int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.calls++
	w.mu.Unlock()
	return w.WriteCloser.Write(p)
}

func (w *countingWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.calls
}

// TestReadDirWrites: a directory that fits in one reply is listed in two writes: the
// OPENDIR, whose handle the rest need, then both READDIRs together (the second brings
// the EOF); the CLOSE waits for the next request. Where the EOF comes after the entries
// have been taken, the window's next READDIRs go out first, together: three writes.
// Each READDIR in a write of its own made five.
func TestReadDirWrites(t *testing.T) {
	var w *countingWriter
	c, dir := serveThrough(t, func(in io.WriteCloser) io.Writer {
		w = &countingWriter{WriteCloser: in}
		return w
	})
	for _, name := range []string{"a", "b", "c"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	before := w.count()
	entries, err := c.ReadDir(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if n := w.count() - before; n > 3 {
		t.Errorf("listing a small directory took %d writes, want 2 or 3", n)
	}
	if len(entries) != 5 { // with . and ..
		t.Errorf("%d entries, want 5", len(entries))
	}
}

// TestDeferredRequests: requests nobody waits for yet (writes, attribute changes,
// closes, an OPEN before its LSTAT) go out with the next request someone waits for,
// in one write(2) and in order; alone, they go out within deferDelay; a wait for one
// sends it at once.
func TestDeferredRequests(t *testing.T) {
	var w *countingWriter
	c, dir := serveThrough(t, func(in io.WriteCloser) io.Writer {
		w = &countingWriter{WriteCloser: in}
		return w
	})
	ctx := context.Background()
	p := filepath.Join(dir, "f")

	before := w.count()
	h, _, err := c.OpenAndLstat(ctx, p, FlagWrite|FlagCreate|FlagExcl, Attrs{Flags: AttrPermissions, Mode: 0o600})
	if err != nil {
		t.Fatal(err)
	}
	if n := w.count() - before; n != 1 {
		t.Errorf("OPEN and LSTAT took %d writes, want 1", n)
	}
	before = w.count()
	var pending []*PendingWrite
	for i, s := range []string{"ab", "cd", "ef"} {
		pw, err := c.StartWrite(h, []byte(s), int64(2*i))
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, pw)
	}
	pw, err := c.StartFsetstat(h, Attrs{Flags: AttrPermissions, Mode: 0o640})
	if err != nil {
		t.Fatal(err)
	}
	pending = append(pending, pw)
	a, err := c.Fstat(ctx, h) // sent behind them, so it sees them all
	if err != nil {
		t.Fatal(err)
	}
	if n := w.count() - before; n != 1 {
		t.Errorf("three writes, an fsetstat and an fstat took %d writes, want 1", n)
	}
	if a.Size != 6 || a.Mode&0o777 != 0o640 {
		t.Errorf("fstat behind the deferred requests saw size %d mode %o", a.Size, a.Mode&0o777)
	}
	for _, pw := range pending {
		if err := pw.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Alone, a deferred write reaches the server without anyone waiting.
	if _, err := c.StartWrite(h, []byte("gh"), 6); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for b, _ := os.ReadFile(p); string(b) != "abcdefgh"; b, _ = os.ReadFile(p) {
		if time.Now().After(deadline) {
			t.Fatalf("a deferred write alone never reached the server: %q", b)
		}
		time.Sleep(time.Millisecond)
	}

	// A wait sends at once: with no timer to send it, it would never return.
	defer func(d time.Duration) { deferDelay = d }(deferDelay)
	deferDelay = time.Hour
	time.Sleep(10 * time.Millisecond) // the timer armed above has fired
	pw, err = c.StartWrite(h, []byte("ij"), 8)
	if err != nil {
		t.Fatal(err)
	}
	if err := pw.Wait(ctx); err != nil {
		t.Fatal(err)
	}

	// A wait for a request already on its way writes nothing: the requests deferred
	// behind it stay for their batch. Only a wait for one of them sends them.
	sent, err := c.StartWrite(h, []byte("kl"), 10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Fstat(ctx, h); err != nil { // carries the write
		t.Fatal(err)
	}
	behind, err := c.StartWrite(h, []byte("mn"), 12)
	if err != nil {
		t.Fatal(err)
	}
	before = w.count()
	if err := sent.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if n := w.count() - before; n != 0 {
		t.Errorf("waiting for a write already sent took %d writes, want 0", n)
	}
	if err := behind.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if n := w.count() - before; n != 1 {
		t.Errorf("waiting for a deferred write took %d writes, want 1", n)
	}
	c.CloseAsync(h)
	if _, err := c.MkdirAndLstat(ctx, filepath.Join(dir, "d"), Attrs{}); err != nil { // carries the CLOSE
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "abcdefghijklmn" {
		t.Errorf("file holds %q", b)
	}

	// MKDIR and its LSTAT: one write, one round trip; an existing name is an error
	// although the LSTAT finds it.
	before = w.count()
	a, err = c.MkdirAndLstat(ctx, filepath.Join(dir, "e"), Attrs{Flags: AttrPermissions, Mode: 0o750})
	if err != nil || a.Mode&0o777 != 0o750 || a.Mode&0o170000 != 0o040000 {
		t.Errorf("mkdir and lstat: mode %o, %v", a.Mode, err)
	}
	if n := w.count() - before; n != 1 {
		t.Errorf("MKDIR and LSTAT took %d writes, want 1", n)
	}
	if _, err := c.MkdirAndLstat(ctx, filepath.Join(dir, "e"), Attrs{}); err == nil {
		t.Error("mkdir of an existing directory succeeded")
	}
}

// TestWritevKeepsOrder: over a real pipe, a large WRITE goes out by writev with its
// header and the deferred small requests ahead of it; pipelined small and large
// writes, overlapping, land in the order sent (a later write wins), whatever the pipe
// takes per call.
func TestWritevKeepsOrder(t *testing.T) {
	c, dir := serve(t)
	if c.rc == nil {
		t.Fatal("the client has no descriptor for a pipe from exec: writev is not used")
	}
	ctx := context.Background()
	p := filepath.Join(dir, "f")
	h, err := c.Open(ctx, p, FlagWrite|FlagCreate|FlagExcl, Attrs{Flags: AttrPermissions, Mode: 0o600})
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 4*c.MaxWrite)
	var pending []*PendingWrite
	write := func(b []byte, off int) {
		t.Helper()
		pw, err := c.StartWrite(h, b, int64(off))
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, pw)
		copy(want[off:], b)
	}
	for round := range 3 {
		fill, base := byte('a'+round), round*c.MaxWrite
		write(bytes.Repeat([]byte{fill}, 100), base+700)             // deferred; the large one covers it
		write(bytes.Repeat([]byte{fill + 10}, c.MaxWrite), base+500) // writev, the deferred ahead of it
		write(bytes.Repeat([]byte{fill + 20}, 10), base+600)         // deferred, over the large one
	}
	for _, pw := range pending {
		if err := pw.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.CloseHandle(ctx, h); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	want = want[:2*c.MaxWrite+500+c.MaxWrite]
	if !bytes.Equal(got, want) {
		t.Fatalf("file differs from the writes in order (%d bytes, want %d)", len(got), len(want))
	}
}

// TestReadDirKeepsRequestsInFlight: a big directory is listed with READDIRs going out
// ahead of the answers, up to readdirMax at once, not two at a time (one round trip
// per 200 entries); every entry comes once, in the server's order. The fake server
// answers only once the client has stopped sending, so what it holds then is what
// the client had in flight.
func TestReadDirKeepsRequestsInFlight(t *testing.T) {
	const entries, perReply = 10000, 100
	cr, sw := io.Pipe()
	sr, cw := io.Pipe()
	type request struct {
		typ byte
		id  uint32
	}
	requests := make(chan request, 64)
	go func() {
		defer close(requests)
		io.ReadFull(sr, make([]byte, 9)) //nolint:errcheck // init
		requestsFrom(sr, func(typ byte, id uint32) { requests <- request{typ, id} })
	}()
	peak := make(chan int, 1)
	go func() {
		v := newPacket(fxpVersion, 3)
		sw.Write(v.finish()) //nolint:errcheck
		next, most := 0, 0
		var held []uint32
		answer := func() {
			most = max(most, len(held))
			for _, id := range held {
				if next >= entries {
					b := newPacket(fxpStatus, id)
					b.u32(StatusEOF)
					b.str("")
					b.str("")
					sw.Write(b.finish()) //nolint:errcheck
					continue
				}
				b := newPacket(fxpName, id)
				b.u32(perReply)
				for i := 0; i < perReply; i++ {
					name := fmt.Sprintf("f%05d", next)
					next++
					b.str(name)
					b.str(name)
					b.attrs(&Attrs{Flags: AttrSize, Size: uint64(next)})
				}
				sw.Write(b.finish()) //nolint:errcheck
			}
			held = held[:0]
		}
		for {
			select {
			case r, ok := <-requests:
				if !ok {
					peak <- most
					return
				}
				switch r.typ {
				case fxpOpendir:
					b := newPacket(fxpHandle, r.id)
					b.str("h")
					sw.Write(b.finish()) //nolint:errcheck
				case fxpReaddir:
					held = append(held, r.id)
				}
			case <-time.After(20 * time.Millisecond):
				answer()
			}
		}
	}()
	c, err := NewClient(context.Background(), cr, cw, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := c.ReadDir(ctx, "/big")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != entries {
		t.Fatalf("listed %d entries, want %d", len(list), entries)
	}
	for i, e := range list {
		if want := fmt.Sprintf("f%05d", i); e.Name != want || e.Attrs.Size != uint64(i+1) {
			t.Fatalf("entry %d is %q (size %d), want %q", i, e.Name, e.Attrs.Size, want)
		}
	}
	c.Close()
	sr.Close()
	sw.Close()
	if most := <-peak; most < readdirMax/2 {
		t.Errorf("at most %d READDIRs were in flight at once, want up to %d", most, readdirMax)
	}
}

// TestReadDirBigAgainstOpenSSH: OpenSSH's server, READDIRs kept in flight on one
// handle, a directory of 25 answers' worth: every name once.
func TestReadDirBigAgainstOpenSSH(t *testing.T) {
	c, dir := serve(t)
	const files = 2500
	want := map[string]bool{}
	for i := range files {
		name := fmt.Sprintf("file-%04d", i)
		want[name] = true
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	list, err := c.ReadDir(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list {
		if e.Name == "." || e.Name == ".." {
			continue
		}
		if !want[e.Name] {
			t.Fatalf("%q listed twice or never made", e.Name)
		}
		delete(want, e.Name)
	}
	if len(want) > 0 {
		t.Errorf("%d names not listed", len(want))
	}
	for _, e := range list {
		if e.Name != "." && e.Name != ".." && e.Nlink != 1 {
			t.Fatalf("%q: link count %d from the long name, want 1", e.Name, e.Nlink)
		}
	}
	// In parts, as each answer arrives: the same listing, in the same order.
	var parts [][]NameEntry
	if err := c.ReadDirFunc(context.Background(), dir, func(part []NameEntry) { parts = append(parts, part) }); err != nil {
		t.Fatal(err)
	}
	if len(parts) < files/100 {
		t.Errorf("listing handed out in %d parts, want one per answer (at least %d)", len(parts), files/100)
	}
	var joined []string
	for _, part := range parts {
		for _, e := range part {
			joined = append(joined, e.Name)
		}
	}
	var whole []string
	for _, e := range list {
		whole = append(whole, e.Name)
	}
	if !slices.Equal(joined, whole) {
		t.Errorf("the parts hold %d names, not the %d of the whole listing in its order", len(joined), len(whole))
	}
}

func TestNlinkFromLongname(t *testing.T) {
	for long, want := range map[string]uint32{
		"-rw-r--r--    2 user group 0 Jan  1 00:00 name": 2,
		"drwxr-xr-x  123 u g 4096 Jan  1 00:00 dir":      123,
		"-rw-r--r--\t7\tu":        7,
		"  -rw-r--r-- 1 u":        1,
		"-rw-r--r-- 4294967295 u": 4294967295,
		"-rw-r--r-- 4294967296 u": 0, // beyond 32 bits
		"-rw-r--r-- 2x u":         0,
		"-rw-r--r--":              0,
		"-rw-r--r--   ":           0,
		"":                        0,
	} {
		if got := nlinkFromLongname([]byte(long)); got != want {
			t.Errorf("nlinkFromLongname(%q) = %d, want %d", long, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { nlinkFromLongname([]byte("-rw-r--r--    2 user group")) }); n != 0 {
		t.Errorf("nlinkFromLongname allocates %v times", n)
	}
}
