package mux

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/muxfs/muxfs/internal/backend"
	"github.com/muxfs/muxfs/internal/config"
)

// TestDegradedMember: a member that is down drops out of resolution and placement,
// and comes back when it is up.
func TestDegradedMember(t *testing.T) {
	l, dirs := layer(t, 2, config.PolicyEPFF)
	put(t, filepath.Join(dirs[0], "d", "only0"))
	put(t, filepath.Join(dirs[1], "d", "only1"))
	put(t, filepath.Join(dirs[1], "top"))
	var state atomic.Int32 // backend.State of member 0
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	l.Branches[0].Backend = NewDegraded(l.Branches[0].Backend, func() backend.State { return backend.State(state.Load()) }, nil, log)
	ctx := context.Background()

	f, err := l.Resolve(ctx, "d")
	if err != nil || len(f.Dirs) != 2 {
		t.Fatalf("both members up: %+v %v", f, err)
	}
	state.Store(int32(backend.StateDown))
	f, err = l.Resolve(ctx, "d")
	if err != nil || f.Index != 1 || len(f.Dirs) != 1 {
		t.Errorf("member 0 down: resolved %+v %v, want only member 1", f, err)
	}
	if _, err := l.Branches[0].Backend.ReadDir(ctx, "d"); backend.ToErrno(err) != syscall.ENOENT {
		t.Errorf("listing a member that is out: %v, want ENOENT", err)
	}
	if i, err := l.Place(ctx, "d", []int{0, 1}); err != nil || i != 1 {
		t.Errorf("placement with member 0 down: %d %v, want member 1", i, err)
	}
	state.Store(int32(backend.StateUp))
	if f, err := l.Resolve(ctx, "d"); err != nil || len(f.Dirs) != 2 {
		t.Errorf("member 0 back: %+v %v", f, err)
	}
}

// TestDegradedUnavailableAnswer: an answer that says the member could not be reached
// takes it out at once, without waiting for its state to change.
func TestDegradedUnavailableAnswer(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	d := NewDegraded(unreachable{}, func() backend.State { return backend.StateConnecting }, nil, log)
	if _, err := d.Lstat(context.Background(), "x"); backend.ToErrno(err) != syscall.ENOENT {
		t.Errorf("got %v, want ENOENT", err)
	}
	if d.Available() {
		t.Error("still available after an unavailable answer")
	}
}

type unreachable struct{ backend.Backend }

func (unreachable) String() string { return "unreachable" }

func (unreachable) Lstat(context.Context, string) (backend.Attr, error) {
	return backend.Attr{}, &backend.Error{Op: "lstat", Errno: syscall.EIO, Cause: backend.ErrUnavailable}
}

// TestOfflineMemberStaysVisible: a member that is down but served by the persistent
// cache keeps its names in the union, read-only: placement leaves it out.
func TestOfflineMemberStaysVisible(t *testing.T) {
	l, dirs := layer(t, 2, config.PolicyEPFF)
	put(t, filepath.Join(dirs[0], "d", "only0"))
	put(t, filepath.Join(dirs[1], "d", "only1"))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	down := func() backend.State { return backend.StateDown }
	l.Branches[0].Backend = NewDegraded(l.Branches[0].Backend, down, func() bool { return true }, log)
	ctx := context.Background()
	f, err := l.Resolve(ctx, "d/only0")
	if err != nil || f.Index != 0 {
		t.Errorf("name of the offline member: %+v %v, want it found on member 0", f, err)
	}
	if i, err := l.Place(ctx, "d", []int{0, 1}); err != nil || i != 1 {
		t.Errorf("placement with member 0 offline: %d %v, want member 1", i, err)
	}
}

// refreshing is a member with a cache to drop.
type refreshing struct {
	unreachable
	dropped []string
}

func (r *refreshing) Refresh(rel string) { r.dropped = append(r.dropped, rel) }

// TestDegradedReachesMember: what a member offers besides the Backend methods (its
// cache's Refresh and Changed) is found through the wrapper, and the wrapper's own
// methods are found first.
func TestDegradedReachesMember(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	m := &refreshing{}
	d := NewDegraded(m, func() backend.State { return backend.StateUp }, nil, log)
	r, ok := backend.As[interface{ Refresh(string) }](d)
	if !ok {
		t.Fatal("Refresh not found through the wrapper")
	}
	r.Refresh("sub")
	if len(m.dropped) != 1 || m.dropped[0] != "sub" {
		t.Errorf("the member's Refresh got %q", m.dropped)
	}
	if a, ok := backend.As[interface{ Available() bool }](d); !ok || a != any(d) {
		t.Errorf("Available: got %v %v, want the wrapper's own", a, ok)
	}
	if _, ok := backend.As[interface{ Changed(string) }](d); ok {
		t.Error("found a Changed that no backend in the chain has")
	}
}
