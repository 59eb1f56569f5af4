package control

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestServeAndCall(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	mp := "/some/mount point"
	var got []Request
	stop, err := Serve(mp, func(r Request) (any, error) {
		got = append(got, r)
		switch r.Op {
		case "refresh":
			return nil, nil
		case "status":
			return map[string]int{"sources": 2}, nil
		}
		return nil, errors.New("unknown request")
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if _, err := Call(mp, Request{Op: "refresh", Path: "/a b"}); err != nil {
		t.Fatal(err)
	}
	if data, err := Call(mp, Request{Op: "status"}); err != nil || string(data) != `{"sources":2}` {
		t.Errorf("status data: %s, %v", data, err)
	}
	if _, err := Call(mp, Request{Op: "bogus"}); err == nil || !strings.Contains(err.Error(), "unknown request") {
		t.Errorf("error from the mount not returned: %v", err)
	}
	if len(got) != 3 || got[0].Path != "/a b" {
		t.Errorf("requests received: %+v", got)
	}
	st, err := os.Stat(filepath.Dir(SocketPath(mp)))
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("socket directory must be 0700: %v %v", st.Mode(), err)
	}
	if _, err := Call("/not/mounted", Request{Op: "refresh"}); err == nil || !strings.Contains(err.Error(), "is it mounted") {
		t.Errorf("calling a mount that is not there: %v", err)
	}
}

func TestRefusesForeignDirectory(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_RUNTIME_DIR", dir)
	if err := os.Mkdir(filepath.Join(dir, "muxfs"), 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(dir, "muxfs"), 0o777) //nolint:errcheck // umask
	if _, err := Serve("/m", func(Request) (any, error) { return nil, nil }); err == nil {
		t.Error("a control directory others can write was accepted")
	}
}
