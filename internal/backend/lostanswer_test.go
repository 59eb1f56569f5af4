package backend

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// loseAnswerEnv names a marker file: the test binary, started with it set, is an SFTP
// session that passes requests to OpenSSH's sftp-server and, the first time it sees
// a MKDIR or a SYMLINK (while the marker does not exist), lets the server carry it
// out but ends the connection before the answer comes back — the request done, its
// answer lost.
const loseAnswerEnv = "MUXFS_TEST_LOSE_MAKE_ANSWER"

func TestMain(m *testing.M) {
	if marker := os.Getenv(loseAnswerEnv); marker != "" {
		loseMakeAnswer(marker)
		return
	}
	if rate := os.Getenv(narrowLinkEnv); rate != "" {
		narrowLink(rate)
		return
	}
	os.Exit(m.Run())
}

func loseMakeAnswer(marker string) {
	srv := exec.Command(sftpServer)
	toSrv, _ := srv.StdinPipe()
	fromSrv, _ := srv.StdoutPipe()
	if err := srv.Start(); err != nil {
		os.Exit(1)
	}
	lost := make(chan struct{})
	go func() { // answers, until the MKDIR's or SYMLINK's is due
		for {
			p, err := readPacketRaw(fromSrv)
			if err != nil {
				os.Exit(0)
			}
			select {
			case <-lost:
				continue
			default:
			}
			os.Stdout.Write(p) //nolint:errcheck
		}
	}()
	for {
		p, err := readPacketRaw(os.Stdin)
		if err != nil {
			os.Exit(0)
		}
		const fxpMkdir, fxpSymlink = 14, 20
		if len(p) > 4 && (p[4] == fxpMkdir || p[4] == fxpSymlink) {
			if f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err == nil {
				f.Close()
				close(lost)
				toSrv.Write(p) //nolint:errcheck
				// Time for the server to make it; then the connection ends.
				time.Sleep(300 * time.Millisecond)
				os.Exit(0)
			}
		}
		toSrv.Write(p) //nolint:errcheck
	}
}

func readPacketRaw(r io.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	p := make([]byte, 4+binary.BigEndian.Uint32(n[:]))
	copy(p, n[:])
	_, err := io.ReadFull(r, p[4:])
	return p, err
}

// TestMakeAnswerLost: a MKDIR or a SYMLINK the server carried out but whose answer
// was lost with the connection is not an error after the reconnect (the directory or
// the link is there), and its attributes are asked for, since the lost answer carried
// them.
func TestMakeAnswerLost(t *testing.T) {
	if _, err := os.Stat(sftpServer); err != nil {
		t.Skip("OpenSSH sftp-server not installed")
	}
	for _, tc := range []struct {
		name string
		make func(s *SFTP) (Attr, error)
		typ  uint32
		perm uint32
	}{
		{"mkdir", func(s *SFTP) (Attr, error) { return s.Mkdir(context.Background(), "d", 0o750) }, syscall.S_IFDIR, 0o750},
		{"symlink", func(s *SFTP) (Attr, error) { return s.Symlink(context.Background(), "somewhere", "l") }, syscall.S_IFLNK, 0o777},
	} {
		t.Run(tc.name, func(t *testing.T) {
			marker := filepath.Join(t.TempDir(), "lost")
			t.Setenv(loseAnswerEnv, marker)
			ep := &Endpoint{Host: "test", SSHCommand: []string{"/bin/sh", "-c", "exec " + os.Args[0] + " -test.run=^$"},
				MaxConns: 1, Timeout: 5 * time.Second}
			pool, err := Dial(context.Background(), ep, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			pool.Acquire()
			t.Cleanup(pool.Release)
			s := newTestSource(t, 10*time.Second, t.TempDir(), pool)
			a, err := tc.make(s)
			if err != nil {
				t.Fatalf("%s whose answer was lost: %v", tc.name, err)
			}
			if _, err := os.Stat(marker); err != nil {
				t.Fatal("the answer was not lost: the test did not test")
			}
			if a.Mode&syscall.S_IFMT != tc.typ || a.Mode&0o777 != tc.perm {
				t.Errorf("attributes after the lost answer: mode %o, want type %o and permissions %o", a.Mode, tc.typ, tc.perm)
			}
			if st := pool.Stats(); st.Reconnects == 0 {
				t.Errorf("no reconnect counted: %+v", st)
			}
		})
	}
}
