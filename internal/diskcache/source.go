package diskcache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/muxfs/muxfs/internal/backend"
	"github.com/muxfs/muxfs/internal/cache"
)

// Source puts a store in front of a backend: file contents are served from and kept in
// the cache (with data set, -o cache=full), and while the source is unreachable what
// the cache holds is served read-only (with offline set, -o offline=auto).
type Source struct {
	backend.Backend
	st      *Store
	data    bool
	offline bool
	state   func() backend.State
	log     *slog.Logger
	wasOff  atomic.Bool
	pf      *prefetcher
}

// Wrap returns b with the store in front. state reports b's health without waiting.
func Wrap(b backend.Backend, st *Store, data, offline bool, state func() backend.State, log *slog.Logger) *Source {
	return &Source{Backend: b, st: st, data: data, offline: offline, state: state, log: log, pf: newPrefetcher()}
}

// Persister is the store as the memory cache's keeper of listings; the listings it is
// given also feed the content prefetch.
func (s *Source) Persister() cache.Persister { return persister{s.st, s} }

type persister struct {
	*Store
	s *Source
}

func (p persister) SaveListing(dir string, list []backend.Entry, at time.Time) {
	p.Store.SaveListing(dir, list, at)
	if p.s.data {
		p.s.listed(dir, list, false) // fetched ahead of a walk (cache.Prefetcher)
	}
}

func (p persister) Listed(dir string, list []backend.Entry) {
	if p.s.data {
		p.s.listed(dir, list, true) // reached by a walk
	}
}

// Lstat and ReadDir tell the store what the server answered (Store.seen).
func (s *Source) Lstat(ctx context.Context, p string) (backend.Attr, error) {
	a, err := s.Backend.Lstat(ctx, p)
	if err == nil && s.data {
		s.st.seen(p, a)
	}
	return a, err
}

func (s *Source) ReadDir(ctx context.Context, p string) ([]backend.Entry, error) {
	list, err := s.Backend.ReadDir(ctx, p)
	if err == nil && s.data {
		s.st.seenListing(p, list)
	}
	return list, err
}

// Store is the source's store.
func (s *Source) Store() *Store { return s.st }

// Offline reports whether the source is unreachable and served from the cache.
func (s *Source) Offline() bool {
	off := s.offline && s.state() == backend.StateDown
	if was := s.wasOff.Swap(off); was != off {
		if off {
			s.log.Warn("source offline: serving what the cache holds, read-only", "source", s.String())
		} else {
			s.log.Warn("source back online", "source", s.String())
		}
	}
	return off
}

// readOnlyNow refuses a change while the source is offline, at once and clearly.
func (s *Source) readOnlyNow(op, p string) error {
	if !s.Offline() {
		return nil
	}
	return &backend.Error{Op: op, Source: s.String(), Path: p, Errno: syscall.EROFS,
		Cause: errors.New("the source is offline: its cached files are read-only until it is back")}
}

func (s *Source) Mkdir(ctx context.Context, p string, mode uint32) (backend.Attr, error) {
	if err := s.readOnlyNow("mkdir", p); err != nil {
		return backend.Attr{}, err
	}
	return s.Backend.Mkdir(ctx, p, mode)
}

func (s *Source) Rmdir(ctx context.Context, p string) error {
	if err := s.readOnlyNow("rmdir", p); err != nil {
		return err
	}
	return s.Backend.Rmdir(ctx, p)
}

func (s *Source) Symlink(ctx context.Context, target, p string) (backend.Attr, error) {
	if err := s.readOnlyNow("symlink", p); err != nil {
		return backend.Attr{}, err
	}
	return s.Backend.Symlink(ctx, target, p)
}

func (s *Source) Link(ctx context.Context, from, to string) error {
	if err := s.readOnlyNow("link", to); err != nil {
		return err
	}
	return s.Backend.Link(ctx, from, to)
}

// Unlink, Rename and SetAttr also drop the cached data of the paths they change: a new
// file there must not inherit it.
func (s *Source) Unlink(ctx context.Context, p string) error {
	if err := s.readOnlyNow("unlink", p); err != nil {
		return err
	}
	return s.st.dropDuring(func() error { return s.Backend.Unlink(ctx, p) }, true, p)
}

func (s *Source) Rename(ctx context.Context, from, to string) error {
	if err := s.readOnlyNow("rename", from); err != nil {
		return err
	}
	return s.st.dropDuring(func() error { return s.Backend.Rename(ctx, from, to) }, true, from, to)
}

func (s *Source) SetAttr(ctx context.Context, p string, set backend.SetAttr) (backend.Attr, error) {
	if err := s.readOnlyNow("setattr", p); err != nil {
		return backend.Attr{}, err
	}
	var a backend.Attr
	op := func() error {
		var err error
		a, err = s.Backend.SetAttr(ctx, p, set)
		return err
	}
	var err error
	if set.Valid&backend.SetSize != 0 {
		err = s.st.dropDuring(op, false, p)
	} else if err = op(); err == nil && s.data {
		s.st.changed(p, a)
	}
	return a, err
}

func writing(flags int) bool {
	return flags&(os.O_WRONLY|os.O_RDWR) != 0 || flags&os.O_TRUNC != 0
}

func (s *Source) Open(ctx context.Context, p string, flags int, mode uint32) (backend.File, error) {
	w := writing(flags) || flags&os.O_CREATE != 0
	if w {
		if err := s.readOnlyNow("open", p); err != nil {
			return nil, err
		}
	}
	if !w && s.data && !s.Offline() {
		if f, ok := s.openCached(ctx, p); ok {
			return f, nil
		}
	}
	var f backend.File
	var err error
	if !w && s.data && s.Offline() {
		err = fmt.Errorf("%w: offline", backend.ErrUnavailable)
	} else {
		f, err = s.Backend.Open(ctx, p, flags, mode)
	}
	if err != nil {
		if !w && s.data && s.offline && backend.IsUnavailable(err) {
			if e := s.st.acquireOffline(p); e != nil {
				return &cachedFile{e: e, src: s.String()}, nil
			}
		}
		return nil, err
	}
	if !s.data {
		return f, nil
	}
	return &file{File: f, e: s.st.acquire(p, f.OpenedAttr()), writing: w, appending: flags&os.O_APPEND != 0, s: s}, nil
}

// file is an open remote file whose contents go through the cache.
type file struct {
	backend.File
	e       *entry
	writing bool
	// appending: the server puts each write at its end of the file, which may not be
	// the offset the kernel gave (another client appended): the writer's reads are
	// not served from what it wrote.
	appending bool
	prefetch  bool // opened by the content prefetch, not by a user
	once      sync.Once
	s         *Source
	reads     readTracker
}

func (f *file) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	user := !f.writing && !f.prefetch
	if n, ok := f.e.readAt(p, off); ok {
		if user {
			f.s.noteRead(f.e, &f.reads, off, n)
		}
		return n, nil
	}
	n, err := f.File.ReadAt(ctx, p, off)
	if n > 0 {
		f.e.fill(p[:n], off, f.File.OpenedAttr())
		if user && f.s.noteRead(f.e, &f.reads, off, n) {
			f.s.fetchWhole(f.e, f.File.OpenedAttr())
		}
	}
	return n, err
}

// readTracker tells whether a file was read from its start to its end in order, as a
// walk reading contents does, or at random.
type readTracker struct {
	mu    sync.Mutex
	next  int64 // how far the file was read from its start without a gap
	last  int64 // end of the previous read
	reads int
	jumps int // reads that did not start where the previous one ended
}

// randomAfter: this many reads, most of them jumps, make a file read at random. The
// kernel's read-ahead sends a sequential stream's reads slightly out of order at
// times; it never makes most of them jumps.
const randomAfter = 32

// read records a read of n bytes at off of a file of the given size. It reports
// whether the file has just been read whole from its start (once), and whether it has
// just been found to be read at random.
func (r *readTracker) read(off int64, n int, size int64) (whole, random bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if off <= r.next {
		before := r.next
		r.next = max(r.next, off+int64(n))
		whole = size > 0 && before < size && r.next >= size
	}
	r.reads++
	if off != r.last {
		r.jumps++
	}
	r.last = off + int64(n)
	return whole, r.jumps == randomAfter && r.jumps*2 > r.reads
}

// noteRead records a user's read: a small file read whole (at the read that reaches
// its end, not at its close, which the kernel sends later) is news for the content
// prefetch. It reports whether the file has just been found to be read at random.
func (s *Source) noteRead(e *entry, r *readTracker, off int64, n int) (random bool) {
	e.mu.Lock()
	size, p := e.rec.Size, e.path
	e.mu.Unlock()
	whole, random := r.read(off, n, size)
	if whole && size <= prefetchMaxSize {
		s.wholeRead(p)
	}
	return random
}

func (f *file) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	n, err := f.File.WriteAt(ctx, p, off)
	if n > 0 {
		f.e.write(p[:n], off, !f.appending)
	}
	return n, err
}

func (f *file) SetAttr(ctx context.Context, set backend.SetAttr) error {
	err := f.File.SetAttr(ctx, set)
	if err == nil && set.Valid&backend.SetSize != 0 {
		f.e.truncate(set.Size)
	}
	return err
}

// Stat waits for every write (see backend.File): its answer is the file the cached
// data now shows.
func (f *file) Stat(ctx context.Context) (backend.Attr, error) {
	a, err := f.File.Stat(ctx)
	if err == nil && f.writing {
		f.e.written(a)
	}
	return a, err
}

func (f *file) Close(ctx context.Context) error {
	err := f.File.Close(ctx)
	f.once.Do(f.e.release)
	return err
}

// PassthroughFd offers the kernel the cache file of a fully cached file opened for
// reading: it then reads it without muxfs (FUSE passthrough).
func (f *file) PassthroughFd() (int, bool) {
	if f.writing {
		return 0, false
	}
	return f.e.passthroughFd()
}

func (e *entry) passthroughFd() (int, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.valid || !e.rec.Spans.covers(0, e.rec.Size) || e.rec.Size == 0 {
		return 0, false
	}
	f, err := e.fileLocked()
	if err != nil || !e.rec.Spans.covers(0, e.rec.Size) { // a queued write failed
		return 0, false
	}
	e.passthrough = true
	return int(f.Fd()), true
}

// cachedFile is a file served from the cache alone: while its source is offline
// (attr nil: what the cache holds is readable, the rest fails with EIO, and nothing
// can be changed), or held whole and just checked against the server (attr: the
// server's attributes, openCached).
type cachedFile struct {
	e     *entry
	src   string
	attr  *backend.Attr
	s     *Source // set when online: its reads still show a walk (content prefetch)
	once  sync.Once
	reads readTracker

	// remote is the file opened on the server once the cache no longer holds what
	// is read: the file changed on the server (another open saw it) or was truncated
	// by path. Reads then see what the server has, as they would through sshfs.
	remoteMu sync.Mutex
	remote   backend.File
}

func (f *cachedFile) err(op string, errno syscall.Errno, why string) error {
	return &backend.Error{Op: op, Source: f.src, Path: f.e.path, Errno: errno, Cause: errors.New(why)}
}

func (f *cachedFile) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if n, ok := f.e.readAt(p, off); ok {
		if f.s != nil {
			f.s.noteRead(f.e, &f.reads, off, n)
		}
		return n, nil
	}
	if f.s == nil {
		return 0, f.err("read", syscall.EIO, "this part of the file is not cached and the source is offline")
	}
	r, err := f.server(ctx)
	if err != nil {
		return 0, err
	}
	return r.ReadAt(ctx, p, off)
}

// server returns the file opened on the server, opening it at the first call. Only a
// drop that leaves the path naming the same file (a truncate, a change seen by another
// open) gets here: after an unlink or a rename the entry keeps its data (dropKeep).
func (f *cachedFile) server(ctx context.Context) (backend.File, error) {
	f.remoteMu.Lock()
	defer f.remoteMu.Unlock()
	if f.remote == nil {
		r, err := f.s.Backend.Open(ctx, f.e.path, os.O_RDONLY, 0)
		if err != nil {
			return nil, err
		}
		f.remote = r
	}
	return f.remote, nil
}

func (f *cachedFile) WriteAt(context.Context, []byte, int64) (int, error) {
	if f.attr != nil {
		return 0, f.err("write", syscall.EBADF, "the file is open for reading only")
	}
	return 0, f.err("write", syscall.EROFS, "the source is offline: cached files are read-only")
}

func (f *cachedFile) SetAttr(context.Context, backend.SetAttr) error {
	return f.err("setattr", syscall.EROFS, "the source is offline: cached files are read-only")
}

func (f *cachedFile) Flush(context.Context) error { return nil }
func (f *cachedFile) Drain(context.Context)       {}
func (f *cachedFile) Sync(context.Context) error  { return nil }

// Changed reaches the file opened on the server, if any; the cache's entry takes every
// write of the mount as it is made.
func (f *cachedFile) Changed() {
	f.remoteMu.Lock()
	defer f.remoteMu.Unlock()
	if f.remote != nil {
		f.remote.Changed()
	}
}

func (f *cachedFile) OpenedAttr() backend.Attr {
	if f.attr != nil {
		return *f.attr
	}
	f.e.mu.Lock()
	defer f.e.mu.Unlock()
	return backend.Attr{Mode: syscall.S_IFREG | 0o444, Size: f.e.rec.Size, Mtime: time.Unix(0, f.e.rec.Mtime)}
}

func (f *cachedFile) Stat(context.Context) (backend.Attr, error) { return f.OpenedAttr(), nil }

func (f *cachedFile) Close(ctx context.Context) error {
	f.once.Do(f.e.release)
	f.remoteMu.Lock()
	defer f.remoteMu.Unlock()
	if f.remote != nil {
		return f.remote.Close(ctx)
	}
	return nil
}

func (f *cachedFile) PassthroughFd() (int, bool) { return f.e.passthroughFd() }
