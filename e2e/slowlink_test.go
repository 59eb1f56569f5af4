package e2e

import (
	"bytes"
	"fmt"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/muxfs/muxfs/internal/linksim"
)

// delayProxy forwards connections to a loopback port, holding every piece of data half
// of rtt in each direction (this kernel has no netem), and returns its own port. It
// stops accepting when the test ends; its connections end with their peers. (The bench
// uses toxiproxy, a module of its own; here it would bring toxiproxy and its metrics
// libraries into muxfs' own go.mod for one test.)
func delayProxy(t *testing.T, to int, rtt time.Duration) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", to))
			if err != nil {
				c.Close()
				continue
			}
			go delayCopy(u, c, rtt/2)
			go delayCopy(c, u, rtt/2)
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// delayCopy copies src to dst, each piece d after it arrived, and closes both when
// either side ends.
func delayCopy(dst, src net.Conn, d time.Duration) {
	linksim.Copy(dst, src, 0, d)
	dst.Close()
	src.Close()
}

// TestStripedOverSlowLink: over a link with 8 ms of round trip, a big file written in
// order with an ordinary tool goes through several sessions (muxfs status counts the
// extra handles) and arrives whole; a fresh mount reads it back whole.
func TestStripedOverSlowLink(t *testing.T) {
	e := newEnv(t, 1)
	srv := e.servers[0]
	port := delayProxy(t, srv.Port, 8*time.Millisecond)
	if err := e.keys.TrustPort(srv.Port, port); err != nil {
		t.Fatal(err)
	}
	source := fmt.Sprintf("sftp://%s@127.0.0.1:%d%s", srv.User, port, e.data[0])
	want := make([]byte, 48<<20)
	rand.New(rand.NewSource(40)).Read(want)
	local := filepath.Join(e.tmp, "big")
	if err := os.WriteFile(local, want, 0o644); err != nil {
		t.Fatal(err)
	}
	mp := e.mount(source)
	run(t, fmt.Sprintf("dd if=%s of=%s/big bs=1M conv=fsync status=none", local, mp))
	if st := statusOf(t, mp); st.Sources[0].Striped == 0 {
		t.Error("the write went through one session: no extra handle in muxfs status")
	}
	if got, err := os.ReadFile(filepath.Join(e.data[0], "big")); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the server's copy differs from what was written (%d of %d bytes, %v)", len(got), len(want), err)
	}
	unmountQuietly(mp)
	mp = e.mount(source)
	run(t, fmt.Sprintf("cmp %s %s/big", local, mp))
}
