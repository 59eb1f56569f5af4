package backend

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// pipeBatch is a batchConn over one end of a synchronous in-memory pipe: a write(2)
// there returns only once the other end has read it, so a test can tell a queued
// packet from one written at once.
func pipeBatch(t *testing.T) (*batchConn, net.Conn) {
	t.Helper()
	a, peer := net.Pipe()
	b := newBatchConn(a)
	t.Cleanup(func() { b.Close(); peer.Close() })
	return b, peer
}

func returnsWithin(d time.Duration, f func()) bool {
	done := make(chan struct{})
	go func() { f(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// Small and large packets, in turn, arrive whole and in order: a small one after a
// queued large one must join the queue, not overtake it.
func TestBatchConnKeepsOrder(t *testing.T) {
	b, peer := pipeBatch(t)
	var want bytes.Buffer
	var packets [][]byte
	for i := range 200 {
		n := 100 + i
		if i%3 != 0 {
			n = 32<<10 + i
		}
		p := bytes.Repeat([]byte{byte(i)}, n)
		packets = append(packets, p)
		want.Write(p)
	}
	errc := make(chan error, 1)
	go func() {
		for _, p := range packets {
			buf := append([]byte(nil), p...)
			if _, err := b.Write(buf); err != nil {
				errc <- err
				return
			}
			clear(buf) // the caller reuses its buffer: what was queued must be a copy
		}
		errc <- nil
	}()
	got := make([]byte, want.Len())
	if _, err := io.ReadFull(peer, got); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatal("the bytes arrived changed or out of order")
	}
}

// Stream packets sent while a write is in flight leave together: the writer is not
// held up by a slow reader until the queue is full, and the reader gets several
// packets from one write.
func TestBatchConnGathers(t *testing.T) {
	b, peer := pipeBatch(t)
	packet := make([]byte, 32<<10)
	if !returnsWithin(2*time.Second, func() {
		for range 8 {
			b.Write(packet) //nolint:errcheck // checked by the reads below
		}
	}) {
		t.Fatal("stream packets waited for the reader: they were not queued")
	}
	buf := make([]byte, 1<<20)
	largest, total := 0, 0
	for total < 8*len(packet) {
		n, err := peer.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		largest = max(largest, n)
		total += n
	}
	if largest <= len(packet) {
		t.Fatalf("largest write %d bytes: the packets went out one by one", largest)
	}
}

// A small packet with nothing queued is written at once: its Write returns only
// once the other end has it (on a synchronous pipe), not after a hand-over.
func TestBatchConnSmallDirect(t *testing.T) {
	b, peer := pipeBatch(t)
	if returnsWithin(200*time.Millisecond, func() { b.Write(make([]byte, 64)) }) { //nolint:errcheck // no error expected
		t.Fatal("a small packet was queued instead of written at once")
	}
	io.ReadFull(peer, make([]byte, 64)) //nolint:errcheck // unblocks the write
}

// The queue is bounded: a writer past batchMax waits for the reader.
func TestBatchConnBackpressure(t *testing.T) {
	b, peer := pipeBatch(t)
	total := 4 * batchMax
	if returnsWithin(300*time.Millisecond, func() {
		packet := make([]byte, 32<<10)
		for range total / len(packet) {
			b.Write(packet) //nolint:errcheck // checked by the reads below
		}
	}) {
		t.Fatal("4 × batchMax was queued with nobody reading")
	}
	if _, err := io.ReadFull(peer, make([]byte, total)); err != nil {
		t.Fatal(err)
	}
}

// A write that fails in the flusher fails the writes after it, and Close ends the
// writers waiting for room.
func TestBatchConnError(t *testing.T) {
	b, peer := pipeBatch(t)
	peer.Close()
	packet := make([]byte, 32<<10)
	var err error
	for range 100 {
		if _, err = b.Write(packet); err != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("writes after the peer closed: %v", err)
	}

	b2, _ := pipeBatch(t)
	waiting := make(chan error, 1)
	go func() {
		for {
			if _, err := b2.Write(packet); err != nil {
				waiting <- err
				return
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	b2.Close()
	select {
	case err := <-waiting:
		if !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.ErrClosedPipe) {
			t.Fatalf("a writer waiting for room got %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Close left a writer waiting for room")
	}
}
