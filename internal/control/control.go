// Package control is the channel between a running mount and `muxfs` commands
// (refresh, status): a Unix socket per mount, in a directory only the mount's
// owner can enter, carrying one JSON request and one JSON reply per connection.
package control

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Request is what a command asks of a mount.
type Request struct {
	Op   string `json:"op"`   // "refresh" or "status"
	Path string `json:"path"` // in the mounted tree, "/" or "/a/b"
}

// Reply is the mount's answer.
type Reply struct {
	Error string          `json:"error,omitempty"`
	Data  json.RawMessage `json:"data,omitempty"`
}

// SocketPath is where the mount at mountpoint listens: in $XDG_RUNTIME_DIR/muxfs, or
// /tmp/muxfs-UID where there is none.
func SocketPath(mountpoint string) string {
	dir := os.Getenv("XDG_RUNTIME_DIR")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), fmt.Sprintf("muxfs-%d", os.Getuid()))
	} else {
		dir = filepath.Join(dir, "muxfs")
	}
	sum := sha256.Sum256([]byte(mountpoint))
	return filepath.Join(dir, hex.EncodeToString(sum[:8])+".sock")
}

// Handler answers a request: with data (encoded as JSON; nil for none) or an error.
type Handler func(Request) (any, error)

// Serve listens for commands for the mount at mountpoint, answering with handle, until
// the returned function is called. The socket's directory is the owner's alone, so
// only the owner (and root) can ask.
func Serve(mountpoint string, handle Handler) (stop func(), err error) {
	sock := SocketPath(mountpoint)
	dir := filepath.Dir(sock)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// Refuse a directory someone else made for us: it could let them in.
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		return nil, fmt.Errorf("control directory %s must be mode 0700", dir)
	}
	os.Remove(sock) // a stale socket from a mount that crashed
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go serveConn(c, handle)
		}
	}()
	return func() { l.Close(); os.Remove(sock) }, nil
}

func serveConn(c net.Conn, handle Handler) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second)) //nolint:errcheck
	var req Request
	var reply Reply
	if err := json.NewDecoder(bufio.NewReader(c)).Decode(&req); err != nil {
		reply.Error = "bad request: " + err.Error()
	} else if data, err := handle(req); err != nil {
		reply.Error = err.Error()
	} else if data != nil {
		if reply.Data, err = json.Marshal(data); err != nil {
			reply.Error = err.Error()
		}
	}
	json.NewEncoder(c).Encode(reply) //nolint:errcheck // the client sees EOF
}

// Call sends req to the mount at mountpoint and returns the reply's data.
func Call(mountpoint string, req Request) (json.RawMessage, error) {
	c, err := net.DialTimeout("unix", SocketPath(mountpoint), 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the muxfs process of %s (%v): is it mounted by this user?", mountpoint, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second)) //nolint:errcheck
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return nil, err
	}
	var reply Reply
	if err := json.NewDecoder(c).Decode(&reply); err != nil {
		return nil, fmt.Errorf("no answer from the muxfs process of %s: %v", mountpoint, err)
	}
	if reply.Error != "" {
		return nil, errors.New(reply.Error)
	}
	return reply.Data, nil
}
