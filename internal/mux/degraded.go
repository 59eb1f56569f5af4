package mux

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"syscall"

	"github.com/muxfs/muxfs/internal/backend"
)

// Degraded wraps a member of a union so that the union goes on without it while its
// server is unreachable (mergerfs drops a missing branch silently and rclone's union
// stops altogether; muxfs says so in the log and in `muxfs status`): lookups and
// listings answer "no such file" for it, so names resolve to the other members and new
// files go where the parent exists on a live one. A member is out from the first
// request that finds it unreachable (or from a failed reconnect) until it is up again;
// while it is out, nothing waits for it. Changes already aimed at it fail as usual.
type Degraded struct {
	backend.Backend
	state   func() backend.State
	offline func() bool // nil, or whether the persistent cache serves the member now
	log     *slog.Logger
	out     atomic.Bool
}

// NewDegraded wraps b; state reports its health without waiting, offline (if not nil)
// whether the persistent cache answers for it while it is down: then its cached names
// stay in the union, read-only, and only placement leaves it out.
func NewDegraded(b backend.Backend, state func() backend.State, offline func() bool, log *slog.Logger) *Degraded {
	return &Degraded{Backend: b, state: state, offline: offline, log: log}
}

// Unwrap is the member itself: what it offers besides the Backend methods (its
// cache's Refresh and Changed) is reached through backend.As.
func (d *Degraded) Unwrap() backend.Backend { return d.Backend }

// skip reports whether lookups and listings leave the member out now.
func (d *Degraded) skip() bool {
	return !d.Available() && (d.offline == nil || !d.offline())
}

// Available reports whether the member takes part in the union now.
func (d *Degraded) Available() bool {
	st := d.state()
	if d.out.Load() {
		if st != backend.StateUp {
			return false
		}
		if d.out.CompareAndSwap(true, false) {
			d.log.Warn("source is back in its union", "source", d.String())
		}
		return true
	}
	if st == backend.StateDown {
		d.leave(errors.New("reconnecting failed"))
		return false
	}
	return true
}

func (d *Degraded) leave(cause error) {
	if d.out.CompareAndSwap(false, true) {
		msg := "source unreachable: its union goes on without it until it is back"
		if d.offline != nil && d.offline() {
			msg = "source unreachable: its union shows its cached files, read-only, until it is back"
		}
		d.log.Warn(msg, "source", d.String(), "err", cause)
	}
}

// absent is the answer for a member that is out, or that could not answer.
func (d *Degraded) absent(op, p string, err error) error {
	if err == nil || !backend.IsUnavailable(err) {
		return err
	}
	d.leave(err)
	return &backend.Error{Op: op, Source: d.String(), Path: p, Errno: syscall.ENOENT, Cause: err}
}

var errOut = errors.New("source unreachable; left out of its union")

func (d *Degraded) Lstat(ctx context.Context, p string) (backend.Attr, error) {
	if d.skip() {
		return backend.Attr{}, d.absent("lstat", p, backend.ErrUnavailable)
	}
	a, err := d.Backend.Lstat(ctx, p)
	return a, d.absent("lstat", p, err)
}

func (d *Degraded) ReadDir(ctx context.Context, p string) ([]backend.Entry, error) {
	if d.skip() {
		return nil, d.absent("readdir", p, backend.ErrUnavailable)
	}
	list, err := d.Backend.ReadDir(ctx, p)
	return list, d.absent("readdir", p, err)
}

func (d *Degraded) Statfs(ctx context.Context, p string) (backend.Statfs, error) {
	if !d.Available() {
		return backend.Statfs{}, &backend.Error{Op: "statfs", Source: d.String(), Path: p, Errno: syscall.EIO, Cause: errOut}
	}
	return d.Backend.Statfs(ctx, p)
}

// Membership says, one flag per union member of the table (in layer and branch order),
// whether it is left out of its union now. Merged listings change when it does: a
// cache of them (the kernel's) must be dropped then.
func (t *Table) Membership() []bool {
	var out []bool
	for _, l := range t.layers {
		for _, b := range l.Branches {
			if d, ok := b.Backend.(*Degraded); ok {
				out = append(out, d.skip())
			}
		}
	}
	return out
}
