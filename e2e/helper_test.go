package e2e

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/pkg/sftp"
)

// runHelper runs inside a child process: code that must not run in the test process,
// such as a fake server that muxfs starts as its ssh command.
func runHelper(name string, args []string) int {
	switch name {
	case "hostile-sftp":
		return hostileSFTP()
	case "broken-sftp":
		return brokenSFTP()
	default:
		fmt.Fprintln(os.Stderr, "unknown helper", name)
		return 2
	}
}

type stdio struct {
	io.Reader
	io.WriteCloser
}

// hostileSFTP serves an in-memory tree on stdin/stdout whose listings also carry names
// no file system may contain.
func hostileSFTP() int {
	h := sftp.InMemHandler()
	h.FileList = hostileLister{h.FileList}
	srv := sftp.NewRequestServer(stdio{os.Stdin, os.Stdout}, h)
	if err := srv.Serve(); err != nil && err != io.EOF {
		fmt.Fprintln(os.Stderr, "hostile-sftp:", err)
		return 1
	}
	return 0
}

type hostileLister struct{ sftp.FileLister }

func (l hostileLister) Filelist(r *sftp.Request) (sftp.ListerAt, error) {
	inner, err := l.FileLister.Filelist(r)
	if err != nil || r.Method != "List" {
		return inner, err
	}
	var all []os.FileInfo
	buf := make([]os.FileInfo, 64)
	for off := int64(0); ; {
		n, err := inner.ListAt(buf, off)
		all = append(all, buf[:n]...)
		off += int64(n)
		if err != nil || n == 0 {
			break
		}
	}
	for _, bad := range []string{"..", ".", "../escape", "a/b", "nul\x00byte", ""} {
		all = append(all, fakeInfo(bad))
	}
	return listerAt(all), nil
}

type listerAt []os.FileInfo

func (l listerAt) ListAt(dst []os.FileInfo, off int64) (int, error) {
	if off >= int64(len(l)) {
		return 0, io.EOF
	}
	n := copy(dst, l[off:])
	if off+int64(n) >= int64(len(l)) {
		return n, io.EOF
	}
	return n, nil
}

type fakeInfo string

func (f fakeInfo) Name() string       { return string(f) }
func (f fakeInfo) Size() int64        { return 1 }
func (f fakeInfo) Mode() os.FileMode  { return 0o644 }
func (f fakeInfo) ModTime() time.Time { return time.Unix(0, 0) }
func (f fakeInfo) IsDir() bool        { return false }
func (f fakeInfo) Sys() any           { return nil }

// brokenSFTP runs OpenSSH's sftp-server behind a proxy that breaks the answer to any
// request naming a trigger file: evil-garbage gets a well-framed reply that does not
// parse, evil-huge a packet header claiming 2 GiB, evil-stall half a reply and then
// silence, evil-size attributes with a size beyond 2^63.
func brokenSFTP() int {
	srv := exec.Command("/usr/lib/openssh/sftp-server")
	in, _ := srv.StdinPipe()
	out, _ := srv.StdoutPipe()
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "broken-sftp:", err)
		return 1
	}
	var mu sync.Mutex
	broken := map[uint32]string{}
	go func() {
		defer in.Close()
		for {
			pkt, err := readRawPacket(os.Stdin)
			if err != nil {
				return
			}
			if len(pkt) >= 9 && pkt[4] != 1 { // not INIT: has a request id
				for _, trig := range []string{"evil-garbage", "evil-huge", "evil-stall", "evil-size"} {
					if bytes.Contains(pkt, []byte(trig)) {
						mu.Lock()
						broken[binary.BigEndian.Uint32(pkt[5:9])] = trig
						mu.Unlock()
					}
				}
			}
			if _, err := in.Write(pkt); err != nil {
				return
			}
		}
	}()
	for {
		pkt, err := readRawPacket(out)
		if err != nil {
			return 0
		}
		var trig string
		if len(pkt) >= 9 && pkt[4] != 2 { // not VERSION
			id := binary.BigEndian.Uint32(pkt[5:9])
			mu.Lock()
			trig = broken[id]
			delete(broken, id)
			mu.Unlock()
		}
		switch trig {
		case "evil-garbage":
			// ATTRS announcing every field, carrying none.
			pkt = append([]byte{0, 0, 0, 9, 105}, pkt[5:9]...)
			pkt = append(pkt, 0xff, 0xff, 0xff, 0xff)
		case "evil-huge":
			pkt = []byte{0x7f, 0xff, 0xff, 0xff, 105}
		case "evil-stall":
			os.Stdout.Write(pkt[:len(pkt)/2]) //nolint:errcheck
			select {}
		case "evil-size":
			if pkt[4] == 105 && binary.BigEndian.Uint32(pkt[9:13])&1 != 0 {
				binary.BigEndian.PutUint64(pkt[13:21], 1<<63+4096)
			}
		}
		if _, err := os.Stdout.Write(pkt); err != nil {
			return 0
		}
	}
}

func readRawPacket(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > 1<<20 {
		return nil, fmt.Errorf("packet of %d bytes", n)
	}
	pkt := make([]byte, 4+n)
	copy(pkt, hdr[:])
	_, err := io.ReadFull(r, pkt[4:])
	return pkt, err
}
