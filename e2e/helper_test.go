package e2e

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/pkg/sftp"
)

// runHelper runs inside a child process: code that must not run in the test process,
// such as a fake server that muxfs starts as its ssh command.
func runHelper(name string, args []string) int {
	switch name {
	case "hostile-sftp":
		return hostileSFTP()
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
