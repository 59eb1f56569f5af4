package backend

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/muxfs/muxfs/internal/sftp"
)

// stripeSource serves a file "big" of size random bytes over a test pool, with links
// counted as slow from minRTT on, and measures the link once (a round trip).
func stripeSource(t *testing.T, minRTT time.Duration, size int, seed int64) (*SFTP, *Pool, []byte) {
	t.Helper()
	old, oldRate := stripeMinRTT, paceMaxRate
	stripeMinRTT = minRTT
	paceMaxRate = 0 // no link is narrow here, however slow the race detector makes it
	t.Cleanup(func() { stripeMinRTT, paceMaxRate = old, oldRate })
	dir := t.TempDir()
	want := randomBytes(size, seed)
	os.WriteFile(filepath.Join(dir, "big"), want, 0o644) //nolint:errcheck
	pool := newTestPool(t, "")
	s := newTestSource(t, 10*time.Second, dir, pool)
	if _, err := s.Lstat(context.Background(), "big"); err != nil {
		t.Fatal(err)
	}
	return s, pool, want
}

// readSequentially opens "big" and reads it whole in 1 MiB pieces, calling before (if
// set) ahead of each read; it checks the data read and returns the file, open until
// the test ends.
func readSequentially(t *testing.T, s *SFTP, want []byte, before func(off int)) File {
	t.Helper()
	ctx := context.Background()
	f, err := s.Open(ctx, "big", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close(ctx) }) //nolint:errcheck
	got := make([]byte, len(want))
	for off := 0; off < len(want); off += 1 << 20 {
		if before != nil {
			before(off)
		}
		if n, err := f.ReadAt(ctx, got[off:off+1<<20], int64(off)); err != nil || n != 1<<20 {
			t.Fatalf("read at %d: %d, %v", off, n, err)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatal("data read differs from the file")
	}
	return f
}

// waitStriped gives the read-ahead time to open an extra handle once the stream is at
// full window (past 16 MiB).
func waitStriped(s *SFTP, off int) {
	for deadline := time.Now().Add(2 * time.Second); off > 16<<20 && s.striped.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStripedRead: over a slow link, a big sequential read goes through a second
// session too, and the data is the file's.
func TestStripedRead(t *testing.T) {
	s, pool, want := stripeSource(t, time.Nanosecond, 64<<20, 3) // every link is slow
	readSequentially(t, s, want, func(off int) { waitStriped(s, off) })
	if s.striped.Load() == 0 {
		t.Fatal("no extra handle was opened")
	}
	checkSpread(t, pool, "read", func(st sftp.Stats) int64 { return st.BytesIn })
}

// checkSpread checks that at least two of the pool's sessions carried more than 8 MiB
// of file data (bytes tells which way).
func checkSpread(t *testing.T, pool *Pool, what string, bytes func(sftp.Stats) int64) {
	t.Helper()
	pool.mu.Lock()
	defer pool.mu.Unlock()
	busy := 0
	per := map[*sftp.Client]int64{}
	for _, ss := range pool.sessions {
		per[ss.client] = bytes(ss.client.Stats())
		if per[ss.client] > 8<<20 {
			busy++
		}
	}
	if busy < 2 {
		t.Errorf("the %s did not go through two sessions: bytes per session %v", what, per)
	}
}

// TestStripedReadSurvivesLostSessions: every session killed halfway through a striped
// read; the read goes on, correct, on new ones.
func TestStripedReadSurvivesLostSessions(t *testing.T) {
	s, pool, want := stripeSource(t, time.Nanosecond, 64<<20, 4)
	readSequentially(t, s, want, func(off int) {
		waitStriped(s, off)
		if off == len(want)/2 {
			if s.striped.Load() == 0 {
				t.Error("not striped when the sessions were killed")
			}
			signalSessions(t, pool, syscall.SIGKILL)
		}
	})
}

// TestSlowLinkOnlyStripes: on a link faster than stripeMinRTT, nothing is striped.
func TestSlowLinkOnlyStripes(t *testing.T) {
	s, _, want := stripeSource(t, time.Hour, 40<<20, 5)
	readSequentially(t, s, want, nil)
	if n := s.striped.Load(); n != 0 {
		t.Errorf("%d extra handles opened on a fast link", n)
	}
}

// TestReadAheadGrowsWithLargeReads: reads larger than the read-ahead window (the disk
// cache's whole-file fetch reads 1 MiB at a time) grow it to its maximum; the window
// used to start over each time such a read overtook it, and stayed at 512 KiB.
func TestReadAheadGrowsWithLargeReads(t *testing.T) {
	s, _, want := stripeSource(t, time.Hour, 24<<20, 6)
	f := readSequentially(t, s, want, nil)
	sf := f.(*sftpFile)
	sf.ra.mu.Lock()
	defer sf.ra.mu.Unlock()
	if sf.ra.window != readAheadMax {
		t.Errorf("read-ahead window %d after 24 reads of 1 MiB, want %d", sf.ra.window, readAheadMax)
	}
}

// TestBigReadWarmsPool: the first sequential read of a big file over a slow link has
// the pool open its missing sessions, before the read-ahead reaches the window that
// striping waits for; those sessions take the first one's packet limits without asking.
// A small file, or a fast link, opens none.
func TestBigReadWarmsPool(t *testing.T) {
	for _, tc := range []struct {
		name   string
		minRTT time.Duration
		size   int
		warm   bool
	}{
		{"big file, slow link", time.Nanosecond, stripeMinSize + 1<<20, true},
		{"small file, slow link", time.Nanosecond, stripeMinSize - 1<<20, false},
		{"big file, fast link", time.Hour, stripeMinSize + 1<<20, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, pool, want := stripeSource(t, tc.minRTT, tc.size, 9)
			pool.ep.MaxConns = 4
			ctx := context.Background()
			f, err := s.Open(ctx, "big", os.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close(ctx) //nolint:errcheck
			got := make([]byte, 256<<10)
			if _, err := f.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, want[:len(got)]) {
				t.Fatalf("first read: %v, or the data differs", err)
			}
			pool.mu.Lock()
			n := len(pool.sessions) + pool.opening
			first := pool.sessions[0].client
			pool.mu.Unlock()
			ra := &f.(*sftpFile).ra
			ra.mu.Lock()
			window := ra.window
			ra.mu.Unlock()
			if window >= stripeAfter {
				t.Fatalf("read-ahead window already %d after one read: the test proves nothing", window)
			}
			if !tc.warm {
				if n != 1 {
					t.Errorf("%d sessions open or opening, want the one", n)
				}
				return
			}
			if n != pool.ep.MaxConns {
				t.Fatalf("%d sessions open or opening after the first read, want %d", n, pool.ep.MaxConns)
			}
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				pool.mu.Lock()
				ss := append([]*session(nil), pool.sessions...)
				pool.mu.Unlock()
				if len(ss) == pool.ep.MaxConns {
					for _, x := range ss[1:] {
						if x.client.Limits() != first.Limits() || x.client.Stats().Requests > 0 {
							t.Errorf("a session the pool added has limits %+v after %d requests, want the first's %+v and none",
								x.client.Limits(), x.client.Stats().Requests, first.Limits())
						}
					}
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d sessions after 10 s, want %d", len(ss), pool.ep.MaxConns)
				}
			}
		})
	}
}

// TestSpareOpensFewAtOnce: a pool filled up for a striped read starts at most
// maxOpening handshakes at once (sshd refuses connections beyond MaxStartups), and
// more once those are done.
func TestSpareOpensFewAtOnce(t *testing.T) {
	pool := newTestPool(t, "")
	pool.ep.MaxConns = 8
	none := func(*sftp.Client) bool { return true } // every session is in use
	if c := pool.spare(none); c != nil {
		t.Fatal("spare returned a session that was to be excluded")
	}
	pool.mu.Lock()
	started := len(pool.sessions) + pool.opening - 1 // one session came with Dial
	pool.mu.Unlock()
	if started != maxOpening {
		t.Errorf("%d sessions started at once for 7 missing, want %d", started, maxOpening)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		pool.spare(none)
		pool.mu.Lock()
		n := len(pool.sessions)
		pool.mu.Unlock()
		if n == pool.ep.MaxConns {
			return
		}
	}
	t.Error("the pool was not filled up")
}

// TestReadAheadSharedByConcurrentReaders: read-ahead chunks keep their bytes in the
// packets that carried them, recycled once the last reader is done with them. Readers
// of one handle at different places (the kernel's concurrent reads, two programs
// reading one file) drop and refill the read-ahead under each other while a second
// file's reads reuse the recycled packets: every byte read must be the file's.
func TestReadAheadSharedByConcurrentReaders(t *testing.T) {
	s, _, want := stripeSource(t, time.Hour, 24<<20, 7)
	other := randomBytes(8<<20, 8)
	os.WriteFile(s.members[0].abs("other"), other, 0o644) //nolint:errcheck
	ctx := context.Background()
	open := func(name string) File {
		f, err := s.Open(ctx, name, os.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close(ctx) }) //nolint:errcheck
		return f
	}
	f, g := open("big"), open("other")
	errs := make(chan error, 4)
	read := func(f File, data []byte, start, step int) {
		buf := make([]byte, step)
		for i := range len(data) / step {
			off := (start + i*step) % len(data)
			n, err := f.ReadAt(ctx, buf, int64(off))
			end := min(off+step, len(data))
			if err == nil && (n != end-off || !bytes.Equal(buf[:n], data[off:end])) {
				err = fmt.Errorf("read of %d bytes at %d: got %d bytes, not the file's", step, off, n)
			}
			if err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}
	go read(f, want, 0, 128<<10)
	go read(f, want, 64<<10, 128<<10)
	go read(f, want, 12<<20, 96<<10)
	go read(g, other, 0, 1<<20)
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// writeInPieces writes data at off in pieces of 1 MiB, calling before (if set) ahead
// of each.
func writeInPieces(t *testing.T, f File, data []byte, off int, before func(off int)) {
	t.Helper()
	for o := 0; o < len(data); o += 1 << 20 {
		if before != nil {
			before(off + o)
		}
		piece := data[o:min(len(data), o+1<<20)]
		if n, err := f.WriteAt(context.Background(), piece, int64(off+o)); err != nil || n != len(piece) {
			t.Fatalf("write at %d: %d, %v", off+o, n, err)
		}
	}
}

// waitExtraOpened gives an extra handle being opened for a file written in order past
// a window (and a margin) time to open, so that the next write puts it to use. With
// none being opened (the pool had no spare session yet, and is opening one), the next
// write tries again.
func waitExtraOpened(f File, off int) {
	sf := f.(*sftpFile)
	pool := sf.handle().m.pool
	for deadline := time.Now().Add(2 * time.Second); off > 12<<20 && time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		pool.mu.Lock()
		sessions := pool.opening == 0 // none being opened for the extra handle to go on
		pool.mu.Unlock()
		sf.st.mu.Lock()
		done := len(sf.st.extra)+len(sf.st.candidates) > 0 || len(sf.st.opening) == 0 && !sf.st.choosing && sessions
		sf.st.mu.Unlock()
		if done {
			return
		}
	}
}

func createForWriting(t *testing.T, s *SFTP, name string) File {
	t.Helper()
	f, err := s.Open(context.Background(), name, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func checkServerFile(t *testing.T, s *SFTP, name string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(s.members[0].abs(name))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s on the server: %d bytes, not the %d written", name, len(got), len(want))
	}
}

// TestStripedWrite: over a slow link, a big file written in order goes through a
// second session too, and the server has every byte.
func TestStripedWrite(t *testing.T) {
	s, pool, _ := stripeSource(t, time.Nanosecond, 0, 9)
	want := randomBytes(64<<20, 10)
	f := createForWriting(t, s, "out")
	writeInPieces(t, f, want, 0, func(off int) { waitExtraOpened(f, off) })
	if err := f.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s.striped.Load() == 0 {
		t.Fatal("no extra handle was opened")
	}
	checkServerFile(t, s, "out", want)
	checkSpread(t, pool, "write", func(st sftp.Stats) int64 { return st.BytesOut })
}

// TestStripedWriteWhilePoolFills: with more sessions than are opened at once
// (maxOpening) and sessions slow to connect, a striped write puts the extra handles of
// the first sessions to use while the others still connect, not once the pool is full.
func TestStripedWriteWhilePoolFills(t *testing.T) {
	old, oldRate := stripeMinRTT, paceMaxRate
	stripeMinRTT, paceMaxRate = time.Nanosecond, 0
	t.Cleanup(func() { stripeMinRTT, paceMaxRate = old, oldRate })
	dir := t.TempDir()
	pool := newTestPoolScript(t, "sleep 0.3; exec "+sftpServer)
	pool.ep.MaxConns = 2*maxOpening + 2
	s := newTestSource(t, 10*time.Second, dir, pool)
	want := randomBytes(64<<20, 13)
	f := createForWriting(t, s, "out")
	sessionsAtFirstUse := 0
	writeInPieces(t, f, want, 0, func(off int) {
		if off > 8<<20 {
			time.Sleep(20 * time.Millisecond) // a slow writer: the pool fills meanwhile
		}
		if sf := f.(*sftpFile); sessionsAtFirstUse == 0 && sf.handles() > 1 {
			pool.mu.Lock()
			sessionsAtFirstUse = len(pool.sessions)
			pool.mu.Unlock()
		}
	})
	if err := f.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkServerFile(t, s, "out", want)
	if sessionsAtFirstUse == 0 {
		t.Fatal("the write never went through an extra handle")
	}
	if sessionsAtFirstUse == pool.ep.MaxConns {
		t.Errorf("extra handles put to use only once all %d sessions were open", pool.ep.MaxConns)
	}
}

// TestStripedWriteSurvivesLostSessions: every session killed halfway through a striped
// write; the writes in flight go again, and the file is whole once closed.
func TestStripedWriteSurvivesLostSessions(t *testing.T) {
	s, pool, _ := stripeSource(t, time.Nanosecond, 0, 11)
	want := randomBytes(64<<20, 12)
	f := createForWriting(t, s, "out")
	writeInPieces(t, f, want, 0, func(off int) {
		waitExtraOpened(f, off)
		if off == len(want)/2 {
			if !f.(*sftpFile).st.wrote.Load() {
				t.Error("no write went through an extra handle before the sessions were killed")
			}
			signalSessions(t, pool, syscall.SIGKILL)
		}
	})
	if err := f.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkServerFile(t, s, "out", want)
}

// stripedFile is "out", created and written in order over a slow link until its writes
// go through an extra handle too, with every write acknowledged: what it holds is
// returned, and the session of one extra handle.
func stripedFile(t *testing.T, seed int64) (*SFTP, *Pool, *sftpFile, []byte, *sftp.Client) {
	t.Helper()
	s, pool, _ := stripeSource(t, time.Nanosecond, 0, seed)
	f := createForWriting(t, s, "out")
	t.Cleanup(func() { f.Close(context.Background()) }) //nolint:errcheck
	var want []byte
	for len(want) < 64<<20 && !f.(*sftpFile).st.wrote.Load() { // on a busy machine, opening the extra handle takes a while
		more := randomBytes(1<<20, seed+int64(len(want)))
		writeInPieces(t, f, more, len(want), func(off int) { waitExtraOpened(f, off) })
		want = append(want, more...)
	}
	if err := f.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	sf := f.(*sftpFile)
	sf.st.mu.Lock()
	defer sf.st.mu.Unlock()
	if !sf.st.wrote.Load() || len(sf.st.extra) == 0 {
		t.Fatal("no write went through an extra handle")
	}
	return s, pool, sf, want, sf.st.extra[0].c
}

// signalSession sends sig to the server process of c's session.
func signalSession(t *testing.T, p *Pool, c *sftp.Client, sig syscall.Signal) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.sessions {
		if s.client == c {
			if err := s.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatal("no such session")
}

// stalledOnExtra writes 512 KiB more in order to a striped file while the server of
// its extra handle's session is stopped, so that some of those writes wait there; the
// server goes on 300 ms later. It returns the file's contents as written. (Less than
// the pipe to the stopped server holds: the file's sender must not block on it, which
// would hold back whatever follows and hide a request sent out of order.)
func stalledOnExtra(t *testing.T, pool *Pool, f *sftpFile, model []byte, extra *sftp.Client) []byte {
	t.Helper()
	signalSession(t, pool, extra, syscall.SIGSTOP)
	time.AfterFunc(300*time.Millisecond, func() { signalSession(t, pool, extra, syscall.SIGCONT) })
	more := randomBytes(512<<10, int64(len(model)))
	writeInPieces(t, f, more, len(model), nil)
	f.wb.mu.Lock()
	n := f.wb.onExtra
	f.wb.mu.Unlock()
	if n == 0 {
		t.Fatal("no write waits on the stopped extra handle")
	}
	return append(model, more...)
}

// TestStripedWriteElsewhereWaits: a write back over bytes still in flight on an extra
// handle must not reach the server before them (it would be overwritten by the older
// data): a write out of order waits for every write in flight.
func TestStripedWriteElsewhereWaits(t *testing.T) {
	s, pool, f, model, extra := stripedFile(t, 23)
	model = stalledOnExtra(t, pool, f, model, extra)
	again := randomBytes(1<<20+1000, 25)
	at := len(model) - 1<<20 - 500
	writeInPieces(t, f, again, at, nil)
	model = append(model[:at], again...)
	if err := f.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkServerFile(t, s, "out", model)
}

// TestStripedWriteTruncateWaits: a truncation goes to the file's own handle after the
// writes in flight on extra handles, which would otherwise grow the file again.
func TestStripedWriteTruncateWaits(t *testing.T) {
	s, pool, f, model, extra := stripedFile(t, 26)
	model = stalledOnExtra(t, pool, f, model, extra)
	model = model[:len(model)-1<<20]
	if err := f.SetAttr(context.Background(), SetAttr{Valid: SetSize, Size: int64(len(model))}); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkServerFile(t, s, "out", model)
}

// TestStripedWriteStatAndReadWait: the size and the bytes of a file being written
// include the writes in flight on its extra handles.
func TestStripedWriteStatAndReadWait(t *testing.T) {
	_, pool, f, model, extra := stripedFile(t, 28)
	ctx := context.Background()
	model = stalledOnExtra(t, pool, f, model, extra)
	if a, err := f.Stat(ctx); err != nil || a.Size != int64(len(model)) {
		t.Fatalf("stat while written: size %d, %v; want %d", a.Size, err, len(model))
	}
	model = stalledOnExtra(t, pool, f, model, extra)
	got := make([]byte, 1<<20)
	if n, err := f.ReadAt(ctx, got, int64(len(model)-1<<20)); err != nil || !bytes.Equal(got[:n], model[len(model)-1<<20:]) {
		t.Fatalf("read while written: %d bytes, %v, or not what was written", n, err)
	}
}

// TestStripedWriteHeldChangeKeepsOrder: a change of times held behind the writes (see
// holdSetLocked) goes out on the file's own handle; a write after it must not overtake
// it on an extra handle, or the change would land last and undo the write's mtime.
func TestStripedWriteHeldChangeKeepsOrder(t *testing.T) {
	s, pool, f, model, _ := stripedFile(t, 30)
	ctx := context.Background()
	signalSession(t, pool, f.handle().c, syscall.SIGSTOP)
	time.AfterFunc(300*time.Millisecond, func() { signalSession(t, pool, f.handle().c, syscall.SIGCONT) })
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := f.SetAttr(ctx, SetAttr{Valid: SetTimes, Atime: old, Mtime: old}); err != nil {
		t.Fatal(err)
	}
	f.wb.mu.Lock()
	f.wb.turn = len(f.st.extra) // a write dealt now would go to the first extra handle
	f.wb.mu.Unlock()
	more := randomBytes(f.handle().c.MaxWrite, 31) // one request, sent at once
	writeInPieces(t, f, more, len(model), nil)
	if err := f.Close(ctx); err != nil {
		t.Fatal(err)
	}
	checkServerFile(t, s, "out", append(model, more...))
	if st, err := os.Stat(s.members[0].abs("out")); err != nil || st.ModTime().Equal(old) {
		t.Errorf("mtime %v, %v: the change of times landed after the writes that followed it", st.ModTime(), err)
	}
}

// TestStripedWriteExtraLost: an extra handle's session dies with writes in flight on
// it; they go again on the file's own handle, and the file is whole once closed.
func TestStripedWriteExtraLost(t *testing.T) {
	s, pool, f, model, extra := stripedFile(t, 32)
	signalSession(t, pool, extra, syscall.SIGSTOP)
	more := randomBytes(512<<10, 33)
	writeInPieces(t, f, more, len(model), nil)
	model = append(model, more...)
	signalSession(t, pool, extra, syscall.SIGKILL)
	more = randomBytes(6<<20, 34)
	writeInPieces(t, f, more, len(model), nil)
	model = append(model, more...)
	if err := f.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkServerFile(t, s, "out", model)
}

// writeAroundAChange writes 40 MiB in order to "out" over a slow link, calling change
// once the first 4 MiB are written (before any extra handle is opened), closes the
// file, and returns what was written and whether the file gave up striping.
func writeAroundAChange(t *testing.T, seed int64, change func(s *SFTP)) (*SFTP, []byte, bool) {
	t.Helper()
	s, _, _ := stripeSource(t, time.Nanosecond, 0, seed)
	want := randomBytes(40<<20, seed+1)
	f := createForWriting(t, s, "out")
	writeInPieces(t, f, want[:4<<20], 0, nil)
	change(s)
	writeInPieces(t, f, want[4<<20:], 4<<20, func(off int) { waitExtraOpened(f, off) })
	sf := f.(*sftpFile)
	sf.st.mu.Lock()
	gaveUp := sf.st.decided && !sf.st.slow
	sf.st.mu.Unlock()
	if err := f.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, want, gaveUp
}

// TestStripedWriteRefusesAnotherFile: a file replaced on the server while it is written
// (its path now names another file) is not opened again by path for striping: every
// write reaches the file opened, and the new file at the path is left alone.
func TestStripedWriteRefusesAnotherFile(t *testing.T) {
	other := []byte("another file, made where the first one was\n")
	s, want, refused := writeAroundAChange(t, 19, func(s *SFTP) {
		if err := os.Rename(s.members[0].abs("out"), s.members[0].abs("moved")); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(s.members[0].abs("out"), other, 0o644) //nolint:errcheck
	})
	if !refused {
		t.Error("no second open of the path was made and refused")
	}
	if n := s.striped.Load(); n != 0 {
		t.Errorf("%d extra handles kept for a path that names another file", n)
	}
	checkServerFile(t, s, "moved", want)
	checkServerFile(t, s, "out", other)
}

// TestStripedWriteGivesUpOnAGonePath: a file removed on the server while it is written
// cannot be opened again by its path; after the first failed open no more are tried
// (each write would send one), and the writes go on through the file's own handle.
func TestStripedWriteGivesUpOnAGonePath(t *testing.T) {
	_, _, gaveUp := writeAroundAChange(t, 36, func(s *SFTP) {
		if err := os.Remove(s.members[0].abs("out")); err != nil {
			t.Fatal(err)
		}
	})
	if !gaveUp {
		t.Error("opens of the removed path still tried after one failed")
	}
}

// TestSlowLinkOnlyStripesWrites: on a link faster than stripeMinRTT, a big write stays
// on one session.
func TestSlowLinkOnlyStripesWrites(t *testing.T) {
	s, _, _ := stripeSource(t, time.Hour, 0, 21)
	want := randomBytes(24<<20, 22)
	f := createForWriting(t, s, "out")
	writeInPieces(t, f, want, 0, nil)
	if err := f.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := s.striped.Load(); n != 0 {
		t.Errorf("%d extra handles opened on a fast link", n)
	}
	checkServerFile(t, s, "out", want)
}
