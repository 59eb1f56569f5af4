// Package cache keeps what muxfs has learnt from its sources so that it need not ask
// again: attributes, directory listings, missing names and symlink targets, for a
// limited time.
package cache

import (
	"context"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/muxfs/muxfs/internal/backend"
)

// Meta is the metadata cache of one mount, shared by its sources. Attributes, listings
// and missing names live for TTL, symlink targets for LinkTTL; changes made through
// muxfs drop the entries they affect at once.
type Meta struct {
	TTL     time.Duration
	LinkTTL time.Duration
	// MaxEntries bounds memory (attributes, listed names and symlink targets); beyond
	// it the expired entries and, if need be, others go until half is free.
	MaxEntries int

	mu      sync.Mutex
	attrs   map[key]attrEntry
	dirs    map[key]*dirEntry
	links   map[key]linkEntry
	entries int // attrs, listed names and links
	// kids indexes the paths that hold entries, and their ancestors, by parent
	// directory, so that InvalidateTree visits a subtree only: scanning every entry
	// at each rmdir, under mu, made an rm -rf quadratic in the cache's size.
	kids    map[key]map[string]struct{}
	sources map[int]struct{} // the sources with entries, for InvalidateTree(-1, ...)
	flight  singleflight.Group

	// gens are bumped by every invalidation (hashed by path): an answer fetched while
	// a change was made is not stored, as it may predate the change.
	gens [256]uint64
}

func slot(source int, p string) int {
	h := uint32(2166136261) ^ uint32(source)
	for i := 0; i < len(p); i++ {
		h = (h ^ uint32(p[i])) * 16777619
	}
	return int(h % 256)
}

// stamp is taken before asking a source; store only if it is still current.
func (m *Meta) stamp(source int, p string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gens[slot(source, p)]
}

type key struct {
	source int
	path   string
}

type attrEntry struct {
	attr    backend.Attr
	missing bool // the name was looked up and does not exist
	expires time.Time
}

type linkEntry struct {
	target  string
	expires time.Time
}

type dirEntry struct {
	list    []backend.Entry
	byName  map[string]int
	expires time.Time
	// seen is when the source gave the listing: a stored listing answered at its first
	// use in a mount is fresh for the TTL, but it is as old as it is (Meta.recent).
	seen time.Time
	// names: fetched for lookups of names in it (Prefetcher.missed), it answers for
	// the names it holds and not for others: a name made outside the mount since is
	// asked for, as it was before the directory was listed.
	names bool
	// dirty names are being changed through muxfs (written to): the listing still
	// says they exist, but their attributes must be asked for, and the listing is not
	// given out whole until it is fetched again.
	dirty map[string]bool
	// shared: list has been handed out (listing, putListing's caller) and must not
	// change under its holder; the next change copies it first, and later ones change
	// the copy in place. Copying at every change made filling a directory of n files
	// through muxfs cost O(n²): 100,000 creates in one directory copied some 500 GB.
	shared bool
}

// own makes d's list safe to change in place.
func (d *dirEntry) own() {
	if d.shared {
		d.list = slices.Clone(d.list)
		d.shared = false
	}
}

// put sets name's entry, adding it if new; it reports whether it was added.
func (d *dirEntry) put(e backend.Entry) (added bool) {
	d.own()
	delete(d.dirty, e.Name)
	if i, in := d.byName[e.Name]; in {
		d.list[i] = e
		return false
	}
	d.list = append(d.list, e)
	d.byName[e.Name] = len(d.list) - 1
	return true
}

// markDirty marks name as being changed through muxfs (dirEntry.dirty).
func (d *dirEntry) markDirty(name string) {
	if d.dirty == nil {
		d.dirty = map[string]bool{}
	}
	d.dirty[name] = true
}

// remove takes name out of the listing, moving the last entry into its place (a
// listing's order is the server's, which promises none); it reports whether name was
// there.
func (d *dirEntry) remove(name string) bool {
	i, in := d.byName[name]
	if !in {
		return false
	}
	d.own()
	last := len(d.list) - 1
	if i != last {
		d.list[i] = d.list[last]
		d.byName[d.list[i].Name] = i
	}
	d.list[last] = backend.Entry{}
	d.list = d.list[:last]
	delete(d.byName, name)
	delete(d.dirty, name)
	return true
}

// DefaultMaxEntries bounds the cache when the user sets no bound (dcache_max_size).
const DefaultMaxEntries = 500_000

// NewMeta returns an empty cache whose entries, symlink targets included, live for ttl.
func NewMeta(ttl time.Duration) *Meta {
	return &Meta{TTL: ttl, LinkTTL: ttl, MaxEntries: DefaultMaxEntries, attrs: map[key]attrEntry{},
		dirs: map[key]*dirEntry{}, links: map[key]linkEntry{},
		kids: map[key]map[string]struct{}{}, sources: map[int]struct{}{}}
}

// indexLocked adds k's path, and those of its ancestors not there yet, to kids.
func (m *Meta) indexLocked(k key) {
	m.sources[k.source] = struct{}{}
	for p := k.path; p != ""; {
		dir := parent(p)
		pk := key{k.source, dir}
		s := m.kids[pk]
		if s == nil {
			s = map[string]struct{}{}
			m.kids[pk] = s
		}
		if _, in := s[p]; in {
			return
		}
		s[p] = struct{}{}
		p = dir
	}
}

// unindexLocked removes k's path from kids once nothing is cached at or below it, and
// then its ancestors that are left empty.
func (m *Meta) unindexLocked(k key) {
	for k.path != "" {
		if _, in := m.attrs[k]; in {
			return
		}
		if _, in := m.dirs[k]; in {
			return
		}
		if _, in := m.links[k]; in {
			return
		}
		if len(m.kids[k]) > 0 {
			return
		}
		pk := key{k.source, parent(k.path)}
		s := m.kids[pk]
		delete(s, k.path)
		if len(s) > 0 {
			return
		}
		delete(m.kids, pk)
		k = pk
	}
}

// subtreeLocked returns the keys of p and of every indexed path below it.
func (m *Meta) subtreeLocked(source int, p string) []key {
	keys := []key{{source, p}}
	for i := 0; i < len(keys); i++ {
		for c := range m.kids[keys[i]] {
			keys = append(keys, key{source, c})
		}
	}
	return keys
}

func parentOf(p string) (dir, name string) {
	if p == "" {
		return "", ""
	}
	d, n := path.Split(p)
	return strings.TrimSuffix(d, "/"), n
}

// lookup answers an lstat from the cache: the attributes, a known miss (found false,
// ok true), or nothing (ok false). A fresh listing of the parent answers for every
// name in it, and for every name not in it.
func (m *Meta) lookup(source int, p string, now time.Time) (a backend.Attr, found, ok bool) {
	a, found, ok, _ = m.answer(source, p, now)
	return a, found, ok
}

// recent answers like lookup, for an existing name only, and only with attributes the
// source gave within the TTL — not a stored listing's, answered at its first use in a
// mount however old it is. With close-to-open off (nocto), an open trusts them.
func (m *Meta) recent(source int, p string, now time.Time) (backend.Attr, bool) {
	a, found, ok, seen := m.answer(source, p, now)
	return a, ok && found && now.Sub(seen) < m.TTL
}

// answer is lookup's answer and when the source gave it.
func (m *Meta) answer(source int, p string, now time.Time) (a backend.Attr, found, ok bool, seen time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.answerLocked(source, p, now)
}

func (m *Meta) answerLocked(source int, p string, now time.Time) (a backend.Attr, found, ok bool, seen time.Time) {
	if e, hit := m.attrs[key{source, p}]; hit && now.Before(e.expires) {
		// Attributes are stored as the source answers them, for the TTL.
		return e.attr, !e.missing, true, e.expires.Add(-m.TTL)
	}
	if p == "" {
		return backend.Attr{}, false, false, time.Time{}
	}
	dir, name := parentOf(p)
	if d, hit := m.dirs[key{source, dir}]; hit && now.Before(d.expires) {
		if i, in := d.byName[name]; in {
			if d.dirty[name] {
				return backend.Attr{}, false, false, time.Time{}
			}
			return d.list[i].Attr, true, true, d.seen
		}
		if d.names {
			return backend.Attr{}, false, false, time.Time{}
		}
		return backend.Attr{}, false, true, d.seen
	}
	return backend.Attr{}, false, false, time.Time{}
}

// hasListing reports whether a listing of p is cached and unexpired, even one that
// does not answer for a file being written in it.
func (m *Meta) hasListing(source int, p string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, hit := m.dirs[key{source, p}]
	return hit && now.Before(d.expires)
}

// oldListing reports whether p's listing is cached, unexpired, but older than the TTL:
// a listing stored by an earlier mount, answered at its first use in this one.
func (m *Meta) oldListing(source int, p string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, hit := m.dirs[key{source, p}]
	return hit && now.Before(d.expires) && now.Sub(d.seen) >= m.TTL
}

// putEntry stores v at p in one of m's per-path maps (attributes, symlink targets),
// unless a change to p was made since stamp was taken; a new key is counted and
// indexed, and the cache trimmed.
func putEntry[V any](m *Meta, entries map[key]V, source int, p string, v V, now time.Time, stamp uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gens[slot(source, p)] != stamp {
		return
	}
	putLocked(m, entries, key{source, p}, v, now)
}

// putLocked is putEntry's store, for a caller holding m.mu that has checked its stamp.
func putLocked[V any](m *Meta, entries map[key]V, k key, v V, now time.Time) {
	if _, had := entries[k]; !had {
		m.entries++
		m.indexLocked(k)
	}
	entries[k] = v
	m.trimLocked(now)
}

func (m *Meta) putAttr(source int, p string, a backend.Attr, missing bool, now time.Time, stamp uint64) {
	putEntry(m, m.attrs, source, p, attrEntry{attr: a, missing: missing, expires: now.Add(m.TTL)}, now, stamp)
}

// link answers a readlink from the cache.
func (m *Meta) link(source int, p string, now time.Time) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, hit := m.links[key{source, p}]
	return e.target, hit && now.Before(e.expires)
}

func (m *Meta) putLink(source int, p, target string, now time.Time, stamp uint64) {
	putEntry(m, m.links, source, p, linkEntry{target: target, expires: now.Add(m.LinkTTL)}, now, stamp)
}

func (m *Meta) listing(source int, p string, now time.Time) (list []backend.Entry, expires time.Time, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d, hit := m.dirs[key{source, p}]; hit && now.Before(d.expires) && len(d.dirty) == 0 {
		d.shared = true
		return d.list, d.expires, true
	}
	return nil, time.Time{}, false
}

// putListing caches a listing for the TTL from now; seen is when the source gave it.
func (m *Meta) putListing(source int, p string, list []backend.Entry, now, seen time.Time, stamp uint64) {
	m.putListingAs(source, p, list, now, seen, stamp, false)
}

// putListingAs is putListing, for lookups' names only if names (dirEntry.names).
func (m *Meta) putListingAs(source int, p string, list []backend.Entry, now, seen time.Time, stamp uint64, names bool) {
	byName := make(map[string]int, len(list))
	for i, e := range list {
		byName[e.Name] = i
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gens[slot(source, p)] != stamp {
		return
	}
	k := key{source, p}
	if old, had := m.dirs[k]; had {
		m.entries -= len(old.list)
	} else {
		m.indexLocked(k)
	}
	m.dirs[k] = &dirEntry{list: list, byName: byName, expires: now.Add(m.TTL), seen: seen, shared: true, names: names}
	m.entries += len(list)
	m.trimLocked(now)
}

// putNames caches a listing fetched for the lookups missing in p (see dirEntry.names),
// unless p's listing is cached already.
func (m *Meta) putNames(source int, p string, list []backend.Entry, now time.Time, stamp uint64) {
	if !m.hasListing(source, p, now) {
		m.putListingAs(source, p, list, now, now, stamp, true)
	}
}

// trimLocked keeps the cache within MaxEntries: expired entries go first, then, if
// needed, arbitrary ones (Go's map order) until half the limit is free.
func (m *Meta) trimLocked(now time.Time) {
	if m.entries <= m.MaxEntries {
		return
	}
	for k, e := range m.attrs {
		if !now.Before(e.expires) || m.entries > m.MaxEntries/2 {
			m.dropAttrLocked(k)
		}
	}
	for k, d := range m.dirs {
		if !now.Before(d.expires) || m.entries > m.MaxEntries/2 {
			m.dropListingLocked(k)
		}
	}
	for k, e := range m.links {
		if !now.Before(e.expires) || m.entries > m.MaxEntries/2 {
			m.dropLinkLocked(k)
		}
	}
}

// Invalidate drops what is known of p: its attributes, its listing, and its parent's
// listing (which holds p's attributes and says whether p exists).
func (m *Meta) Invalidate(source int, p string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.forgetLocked(source, p)
	if p != "" {
		m.dropLocked(key{source, parent(p)})
	}
}

// forgetLocked drops p's own entries and makes answers to p or its parent fetched
// meanwhile unstorable; it returns p's name and its parent's cached listing, if any.
func (m *Meta) forgetLocked(source int, p string) (name string, parentList *dirEntry) {
	dir, name := parentOf(p)
	m.gens[slot(source, p)]++
	m.gens[slot(source, dir)]++
	m.dropLocked(key{source, p})
	if p == "" {
		return name, nil
	}
	return name, m.dirs[key{source, dir}]
}

func parent(p string) string {
	dir, _ := parentOf(p)
	return dir
}

// Created records an entry just made (or opened for writing, or changed) through
// muxfs, with attributes a: p's own entries go, and a fresh listing of its parent is
// kept with p in it, so that the next names looked up in a directory being filled
// (an untar, a build's outputs) are answered without a request.
func (m *Meta) Created(source int, p string, a backend.Attr) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if name, d := m.forgetLocked(source, p); d != nil && d.put(backend.Entry{Name: name, Attr: a}) {
		m.entries++
	}
}

// Removed records that p was removed through muxfs (an unlink, an rmdir, the old name
// of a rename): what is cached at or below p goes, and p's name leaves its directory's
// listing, which stays, so that the directory's other names are still answered
// without a request (a build after `make clean`, an rm -rf). It returns what the cache
// knew of p's attributes, for a rename to carry them to the new name. tree: p is, or
// may be, a directory.
func (m *Meta) Removed(source int, p string, tree bool) (a backend.Attr, known bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a, found, ok, _ := m.answerLocked(source, p, time.Now())
	if tree {
		// Answers below p fetched meanwhile hash anywhere: none may be stored.
		for i := range m.gens {
			m.gens[i]++
		}
	}
	for _, k := range m.subtreeLocked(source, p) {
		m.dropLocked(k)
	}
	if name, d := m.forgetLocked(source, p); d != nil && d.remove(name) {
		m.entries--
	}
	return a, ok && found
}

// Dirtied records that p's content (size, mtime) is changing through muxfs: its
// attributes must be asked for again, while its parent's listing still answers for
// the other names.
func (m *Meta) Dirtied(source int, p string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if name, d := m.forgetLocked(source, p); d != nil {
		d.markDirty(name)
	}
}

// Settled records the server's attributes a of p after the changes made to it through
// a handle now closed, asked for (FSTAT) after them: stat and lookup answer with them,
// from p's own entry and from its parent's listing, until the TTL. If p changed since
// stamp was taken, before that FSTAT, it is only Dirtied.
func (m *Meta) Settled(source int, p string, a backend.Attr, stamp uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fresh := m.gens[slot(source, p)] == stamp
	name, d := m.forgetLocked(source, p)
	if !fresh {
		if d != nil {
			d.markDirty(name)
		}
		return
	}
	if d != nil && d.put(backend.Entry{Name: name, Attr: a}) {
		m.entries++
	}
	now := time.Now()
	putLocked(m, m.attrs, key{source, p}, attrEntry{attr: a, expires: now.Add(m.TTL)}, now)
}

// Arrived records that p now exists, put there through muxfs with attributes that
// are not known (a rename of a file just written): its directory's listing keeps
// answering for its other names and for missing ones, and p's attributes are asked
// for at its next lookup.
func (m *Meta) Arrived(source int, p string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	name, d := m.forgetLocked(source, p)
	if d == nil {
		return
	}
	if d.put(backend.Entry{Name: name}) {
		m.entries++
	}
	d.markDirty(name)
}

// EntriesChanged records that a name was made or removed in dir through muxfs: the
// server moved the directory's mtime and ctime, so its own attributes are asked for
// again, whether cached for it or in its parent's listing (where its name is marked
// as changing, as a file being written is), while its own listing, kept up to date
// by the change, stays. rsync -a sets a directory's times once its files are in, and
// sets them again only if a stat shows them moved since: an mtime kept from before
// the files' renames hid the move, and the server kept the time of the last rename.
func (m *Meta) EntriesChanged(source int, dir string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	// Answers to dir fetched meanwhile may be of before the change.
	m.gens[slot(source, dir)]++
	m.dropAttrLocked(key{source, dir})
	if dir == "" {
		return
	}
	up, name := parentOf(dir)
	m.gens[slot(source, up)]++
	if d := m.dirs[key{source, up}]; d != nil {
		if _, in := d.byName[name]; in {
			d.markDirty(name)
		}
	}
}

// MadeDir records a directory just created through muxfs: it is empty.
func (m *Meta) MadeDir(source int, p string, now time.Time) {
	m.putListing(source, p, nil, now, now, m.stamp(source, p))
}

func (m *Meta) dropLocked(k key) {
	m.dropAttrLocked(k)
	m.dropListingLocked(k)
	m.dropLinkLocked(k)
}

func (m *Meta) dropLinkLocked(k key) {
	if _, had := m.links[k]; had {
		delete(m.links, k)
		m.entries--
		m.unindexLocked(k)
	}
}

func (m *Meta) dropAttrLocked(k key) {
	if _, had := m.attrs[k]; had {
		delete(m.attrs, k)
		m.entries--
		m.unindexLocked(k)
	}
}

func (m *Meta) dropListingLocked(k key) {
	if d, had := m.dirs[k]; had {
		delete(m.dirs, k)
		m.entries -= len(d.list)
		m.unindexLocked(k)
	}
}

// InvalidateTree drops p and everything below it, on one source or (source < 0) all.
func (m *Meta) InvalidateTree(source int, p string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.gens {
		m.gens[i]++
	}
	sources := []int{source}
	if source < 0 {
		sources = slices.Collect(maps.Keys(m.sources))
	}
	for _, src := range sources {
		for _, k := range m.subtreeLocked(src, p) {
			m.dropLocked(k)
		}
		if p != "" {
			// The parent's listing named p; its attributes are still right.
			m.dropListingLocked(key{src, parent(p)})
		}
	}
}

// Source wraps a backend with the cache. Reads of metadata are answered from the cache
// when fresh; every change made through it drops the entries it affects.
type Source struct {
	backend.Backend
	id   int
	meta *Meta
	// prefetch, if set, lists the subdirectories of each directory listed, in the
	// background, so that a walk (find, ls -R, a build) finds them cached.
	prefetch *Prefetcher

	hits, misses atomic.Int64 // lookups and listings answered from the cache, or not

	// persist, if set, keeps listings across mounts (the disk cache); offline then
	// says when the source cannot be reached and the stored listings answer alone.
	persist Persister
	offline func() bool

	storedMu   sync.Mutex
	storedUsed map[string]bool // stored listings already answered in this mount

	// recording orders what a change made through muxfs records — its entries in
	// memory, then its stored ones — against the copies made between the source,
	// memory and the persistent cache: a stored listing loaded into memory
	// (storedListing), and a listing, attributes or a symlink target fetched and
	// stored (store). Changes hold it shared (they record at once), the copies
	// exclusive. Without it, a listing loaded after a change had dropped it from
	// memory but before it was forgotten on disk was kept in memory as if fresh, and
	// what was fetched before the change could be stored after it.
	recording sync.RWMutex

	// noCTO: a read-only open trusts attributes the source gave within the TTL
	// instead of asking again (-o nocto; docs/design.md, "Persistent cache").
	noCTO bool
	// openingUntil (Unix ns): with noCTO, files are being opened for reading (a walk
	// reading contents) until then.
	openingUntil atomic.Int64
}

// openWalkLinger: after an open for reading, a walk counts as opening files this long.
const openWalkLinger = 2 * time.Second

// opening reports whether, with close-to-open off, a walk is opening files for reading:
// listings are then worth fetching afresh, for its opens to trust.
func (s *Source) opening(now time.Time) bool {
	return s.noCTO && now.UnixNano() < s.openingUntil.Load()
}

// TrustedOpener is a backend that can open a file with no request, from attributes the
// caller vouches for (the persistent cache, for a file it holds whole). ok false: it
// cannot, and the caller opens the file as usual.
type TrustedOpener interface {
	OpenTrusted(p string, a backend.Attr) (f backend.File, ok bool)
}

// SetNoCTO turns close-to-open off (on is the default): an open for reading of a file
// whose attributes the source gave within the TTL takes them as the server's, so a
// file the persistent cache holds whole opens with no request, as on sshfs, where a
// change made on the server shows within cache_timeout.
func (s *Source) SetNoCTO(on bool) { s.noCTO = on }

// Persister keeps directory listings across mounts: the persistent cache.
type Persister interface {
	SaveListing(p string, list []backend.Entry, at time.Time)
	LoadListing(p string) ([]backend.Entry, time.Time, bool)
	SaveAttr(p string, a backend.Attr)
	LoadAttr(p string) (backend.Attr, bool)
	SaveLink(p, target string)
	LoadLink(p string) (string, bool)
	ForgetListings(dirs ...string)
	// ForgetListing drops only dir's listing (a file in it changed; the directory's
	// own attributes did not).
	ForgetListing(dir string)
	ForgetTree(dir string)
	// Listed is told of every listing handed out, from wherever it came.
	Listed(dir string, list []backend.Entry)
}

// SetPersist attaches a persistent store of listings. offline reports, without
// waiting, whether the source is unreachable.
func (s *Source) SetPersist(p Persister, offline func() bool) {
	s.persist, s.offline = p, offline
}

// Stats returns how many lookups and listings the cache answered, and how many it
// passed on to the source.
func (s *Source) Stats() (hits, misses int64) { return s.hits.Load(), s.misses.Load() }

// Wrap returns b with the cache in front. id tells sources apart in the cache.
func Wrap(b backend.Backend, id int, meta *Meta, prefetch *Prefetcher) *Source {
	return &Source{Backend: b, id: id, meta: meta, prefetch: prefetch}
}

func (s *Source) Lstat(ctx context.Context, p string) (backend.Attr, error) {
	now := time.Now()
	if a, found, ok := s.meta.lookup(s.id, p, now); ok {
		s.hits.Add(1)
		if !found {
			return backend.Attr{}, syscall.ENOENT
		}
		return a, nil
	}
	if s.persist != nil && s.offline() {
		return s.offlineLstat(ctx, p)
	}
	s.misses.Add(1)
	if s.prefetch != nil && p != "" {
		s.prefetch.missed(s, parent(p))
	}
	stamp := s.meta.stamp(s.id, p)
	a, err := s.Backend.Lstat(ctx, p)
	switch {
	case err == nil:
		s.meta.putAttr(s.id, p, a, false, now, stamp)
		s.store(p, stamp, func() { s.persist.SaveAttr(p, a) })
	case backend.ToErrno(err) == syscall.ENOENT:
		s.meta.putAttr(s.id, p, backend.Attr{}, true, now, stamp)
	}
	return a, err
}

// Readlink answers from the cache while the target is younger than LinkTTL (sshfs'
// link timeout): `ls -l` of a directory of symlinks, or a path resolved through one
// again and again, otherwise costs a round trip per symlink every time. A symlink
// changed through muxfs is dropped at once (Symlink, Unlink, Rename all pass here);
// one replaced on the server shows within LinkTTL, or at `muxfs refresh`. Targets
// are also kept in the persistent cache, for an offline mount to resolve them.
func (s *Source) Readlink(ctx context.Context, p string) (string, error) {
	now := time.Now()
	if t, ok := s.meta.link(s.id, p, now); ok {
		s.hits.Add(1)
		return t, nil
	}
	if s.persist != nil && s.offline() {
		if t, ok := s.persist.LoadLink(p); ok {
			s.hits.Add(1)
			return t, nil
		}
		return "", &backend.Error{Op: "readlink", Source: s.String(), Path: p, Errno: syscall.EIO,
			Cause: fmt.Errorf("%w: offline, and this symlink is not cached", backend.ErrUnavailable)}
	}
	s.misses.Add(1)
	stamp := s.meta.stamp(s.id, p)
	t, err := s.Backend.Readlink(ctx, p)
	if err == nil {
		s.meta.putLink(s.id, p, t, now, stamp)
		s.store(p, stamp, func() { s.persist.SaveLink(p, t) })
	}
	return t, err
}

func (s *Source) ReadDir(ctx context.Context, p string) ([]backend.Entry, error) {
	list, err := s.readDir(ctx, p)
	if err == nil && s.persist != nil {
		s.persist.Listed(p, list)
	}
	return list, err
}

func (s *Source) readDir(ctx context.Context, p string) ([]backend.Entry, error) {
	now := time.Now()
	if list, expires, ok := s.meta.listing(s.id, p, now); ok {
		backend.NoteListingExpiry(ctx, expires)
		s.hits.Add(1)
		if s.prefetch != nil {
			// The walk goes on below: keep one level ahead of it.
			s.prefetch.children(s, p, list)
		}
		return list, nil
	}
	if list, ok := s.storedListing(ctx, p, now, true, false); ok {
		s.hits.Add(1)
		return list, nil
	}
	if s.persist != nil && s.offline() {
		return nil, &backend.Error{Op: "readdir", Source: s.String(), Path: p, Errno: syscall.EIO,
			Cause: fmt.Errorf("%w: offline, and this directory is not cached", backend.ErrUnavailable)}
	}
	s.misses.Add(1)
	list, err := s.fetchListing(ctx, p)
	if err != nil {
		return nil, err
	}
	backend.NoteListingExpiry(ctx, now.Add(s.meta.TTL))
	if s.prefetch != nil {
		s.prefetch.children(s, p, list)
	}
	return list, nil
}

// fetchListing lists p on the source and caches the answer. Concurrent fetches of one
// directory (a walk reaching a directory that is being listed ahead) share one request
// — but only one sent after every change the caller may have seen: a request sent
// before a change through the mount (an rmdir the caller made, say, while the prefetch
// was listing the directory, or the mkdir of a directory the prefetch found missing)
// answers, or fails, as things were before it, and the caller asks again. The stamps order them: a directory's stamp only grows, at every change.
func (s *Source) fetchListing(ctx context.Context, p string) ([]backend.Entry, error) {
	type fetched struct {
		list  []backend.Entry
		stamp uint64
	}
	for {
		seen := s.meta.stamp(s.id, p)
		v, err, _ := s.meta.flight.Do(fmt.Sprintf("%d\x00%s", s.id, p), func() (any, error) {
			now := time.Now()
			stamp := s.meta.stamp(s.id, p)
			list, err := s.Backend.ReadDir(ctx, p)
			if err != nil {
				return fetched{stamp: stamp}, err
			}
			s.meta.putListing(s.id, p, list, now, now, stamp)
			s.store(p, stamp, func() {
				s.persist.SaveListing(p, list, now)
				// Fetched by this mount: its stored copy is not a first use later.
				s.markStoredUsed(p)
			})
			return fetched{list, stamp}, nil
		})
		if f := v.(fetched); f.stamp >= seen {
			return f.list, err
		}
	}
}

// fetchNames lists p for the lookups missing in it (Prefetcher.missed). The listing
// answers for the names it holds only (dirEntry.names), and is not kept in the
// persistent cache, whose copy would answer for every name.
func (s *Source) fetchNames(ctx context.Context, p string) {
	now := time.Now()
	stamp := s.meta.stamp(s.id, p)
	if list, err := s.Backend.ReadDir(ctx, p); err == nil {
		s.meta.putNames(s.id, p, list, now, stamp)
	}
}

// storedListing answers a listing from the persistent cache (see the comment inside
// for when it is fetched again). staleOK: a walk (or an offline lookup) asked, and an
// old listing will do. Otherwise an old listing is not answered while the source is
// up: the caller (the prefetch, in the background) fetches it instead. youngOnly: only
// a listing younger than the TTL will do, even at its first use in this mount (for a
// walk opening files with close-to-open off, whose opens trust nothing older).
func (s *Source) storedListing(ctx context.Context, p string, now time.Time, staleOK, youngOnly bool) ([]backend.Entry, bool) {
	if s.persist == nil {
		return nil, false
	}
	offline := s.offline()
	s.recording.Lock()
	list, at, ok := s.persist.LoadListing(p)
	if !ok || youngOnly && now.Sub(at) >= s.meta.TTL {
		s.recording.Unlock()
		return nil, false
	}
	// The first use in this mount counts as a fresh look, good for the TTL, as if the
	// listing had just been fetched: a remounted tree is then warm with no request at
	// all. Used again after that (the memory copy expired), an old listing is
	// answered at once and fetched again behind the caller.
	first := s.markStoredUsed(p)
	fresh := first || now.Sub(at) < s.meta.TTL
	if !fresh && !staleOK && !offline {
		s.recording.Unlock()
		return nil, false
	}
	s.meta.putListing(s.id, p, list, now, at, s.meta.stamp(s.id, p))
	s.recording.Unlock()
	backend.NoteListingStored(ctx)
	switch {
	case !fresh && !offline:
		go s.fetchListing(context.Background(), p) //nolint:errcheck // a failed refresh keeps the stored answer
		// Answered stale: whoever keeps it should ask again soon, for the refetch.
		backend.NoteListingExpiry(ctx, now)
	case staleOK && !offline && now.Sub(at) >= s.meta.TTL && s.opening(now):
		// A walk that is opening files (see Open) asked for this listing: it will
		// open this directory's files too, and then go below. The listing is
		// fetched again behind this answer, and its subdirectories ahead of the walk
		// (the prefetch fetches them from the server while the walk opens files).
		go s.fetchListing(context.Background(), p) //nolint:errcheck // a failed refetch leaves opens asking
		if s.prefetch != nil {
			s.prefetch.children(s, p, list)
		}
		backend.NoteListingExpiry(ctx, now.Add(s.meta.TTL))
	default:
		backend.NoteListingExpiry(ctx, now.Add(s.meta.TTL))
	}
	// No listing ahead here: the subdirectories are most likely stored too.
	return list, true
}

// markStoredUsed records that this mount has used (or fetched) the listing of p, and
// reports whether it had not before.
func (s *Source) markStoredUsed(p string) bool {
	s.storedMu.Lock()
	defer s.storedMu.Unlock()
	if s.storedUsed == nil {
		s.storedUsed = map[string]bool{}
	}
	first := !s.storedUsed[p]
	s.storedUsed[p] = true
	return first
}

// offlineLstat answers a lookup from the stored listing of the parent while the source
// is offline.
func (s *Source) offlineLstat(ctx context.Context, p string) (backend.Attr, error) {
	if p == "" {
		return backend.Attr{Mode: syscall.S_IFDIR | 0o555}, nil
	}
	dir, name := parentOf(p)
	// The path's own attributes first: they are stored at every lookup, open and
	// close, so they are newer than a listing of its directory.
	if a, ok := s.persist.LoadAttr(p); ok {
		return a, nil
	}
	if list, ok := s.storedListing(ctx, dir, time.Now(), true, false); ok {
		for _, e := range list {
			if e.Name == name {
				return e.Attr, nil
			}
		}
		return backend.Attr{}, syscall.ENOENT
	}
	if _, _, ok := s.persist.LoadListing(p); ok {
		// Its own attributes were dropped by a change inside it, but it was listed:
		// a directory.
		return backend.Attr{Mode: syscall.S_IFDIR | 0o555}, nil
	}
	return backend.Attr{}, &backend.Error{Op: "lstat", Source: s.String(), Path: p, Errno: syscall.EIO,
		Cause: fmt.Errorf("%w: offline, and this directory is not cached", backend.ErrUnavailable)}
}

// Refresh drops everything cached at or below p.
func (s *Source) Refresh(p string) {
	defer s.record()()
	s.meta.InvalidateTree(s.id, p)
	if s.persist != nil {
		s.persist.ForgetTree(p)
	}
}

// store runs save, which keeps in the persistent cache what was asked of the source
// about p since stamp was taken, unless p changed through the mount since then (see
// recording).
func (s *Source) store(p string, stamp uint64, save func()) {
	if s.persist == nil {
		return
	}
	s.recording.Lock()
	defer s.recording.Unlock()
	if s.meta.stamp(s.id, p) == stamp {
		save()
	}
}

// record is held while a change made through muxfs is recorded, in memory and on
// disk: `defer s.record()()` (see recording).
func (s *Source) record() (done func()) {
	s.recording.RLock()
	return s.recording.RUnlock
}

func (s *Source) changed(paths ...string) {
	defer s.record()()
	for _, p := range paths {
		s.meta.Invalidate(s.id, p)
		s.forgetStored(p)
	}
}

// forgetStored drops what is stored of p, and its directory's listing. The
// directory's own stored attributes stay: they serve only offline lookups, where an
// old mtime is better than not finding the directory at all.
func (s *Source) forgetStored(p string) {
	if s.persist != nil {
		dir, _ := parentOf(p)
		s.persist.ForgetListings(p)
		s.persist.ForgetListing(dir)
	}
}

// Changed drops what is cached of p, as a change made through p would: the mount
// changed the file through another of its names (a hard link made through it), and
// attributes are cached by path.
func (s *Source) Changed(p string) { s.changed(p) }

// changedContent is changed for a file whose content (size, mtime) changes through a
// handle: its stored attributes stay, as the handle's next Stat stores them anew; its
// directory's listing, which holds the file's old size, goes.
func (s *Source) changedContent(p string) {
	defer s.record()()
	s.meta.Dirtied(s.id, p)
	if s.persist != nil {
		dir, _ := parentOf(p)
		s.persist.ForgetListing(dir)
	}
}

// settledContent is changedContent for a file closed with attributes a from its last
// Stat, asked for after every change made through it, stamp taken before.
func (s *Source) settledContent(p string, a backend.Attr, stamp uint64) {
	defer s.record()()
	s.meta.Settled(s.id, p, a, stamp)
	if s.persist != nil {
		dir, _ := parentOf(p)
		s.persist.ForgetListing(dir)
	}
}

// changedTree is changed for a path whose whole subtree changes (rmdir, rename).
func (s *Source) changedTree(p string) {
	defer s.record()()
	s.meta.InvalidateTree(s.id, p)
	s.forgetStoredTree(p)
}

// forgetStoredTree is forgetStored for a path whose whole subtree changes.
func (s *Source) forgetStoredTree(p string) {
	if s.persist != nil {
		dir, _ := parentOf(p)
		s.persist.ForgetTree(p)
		s.persist.ForgetListing(dir)
	}
}

func (s *Source) Mkdir(ctx context.Context, p string, mode uint32) (backend.Attr, error) {
	a, err := s.Backend.Mkdir(ctx, p, mode)
	if err != nil {
		s.changed(p)
		return a, err
	}
	// Later lookups need no request, beside it (changedTo) nor in it: it is empty.
	defer s.record()()
	s.changedToLocked(p, a)
	s.meta.MadeDir(s.id, p, time.Now())
	s.entriesChangedLocked(p)
	return a, nil
}

// entriesChangedLocked records, with record held, that each of paths was made or
// removed through muxfs: its directory's times moved (Meta.EntriesChanged), and the
// stored listing that holds them — its parent's — goes too.
func (s *Source) entriesChangedLocked(paths ...string) {
	for _, p := range paths {
		dir := parent(p)
		s.meta.EntriesChanged(s.id, dir)
		if s.persist != nil && dir != "" {
			s.persist.ForgetListing(parent(dir))
		}
	}
}

// changedTo records that p was made or changed through muxfs and has attributes a,
// just taken from the server: they replace p's in its directory's listing, which
// stays (the next name looked up there — an untar's next directory — needs no
// request), and answer the next stat of p (the kernel's, after a SETATTR).
func (s *Source) changedTo(p string, a backend.Attr) {
	defer s.record()()
	s.changedToLocked(p, a)
}

// changedToLocked is changedTo with record held.
func (s *Source) changedToLocked(p string, a backend.Attr) {
	s.meta.Created(s.id, p, a)
	s.meta.putAttr(s.id, p, a, false, time.Now(), s.meta.stamp(s.id, p))
	s.forgetStored(p)
}

func (s *Source) Rmdir(ctx context.Context, p string) error {
	if err := s.Backend.Rmdir(ctx, p); err != nil {
		s.changedTree(p)
		return err
	}
	defer s.record()()
	s.meta.Removed(s.id, p, true)
	s.forgetStoredTree(p)
	s.entriesChangedLocked(p)
	return nil
}

func (s *Source) Unlink(ctx context.Context, p string) error {
	if err := s.Backend.Unlink(ctx, p); err != nil {
		s.changed(p)
		return err
	}
	defer s.record()()
	if a, known := s.meta.Removed(s.id, p, false); known && a.Nlink > 1 {
		// The file's other names, here too perhaps, lost a link.
		s.meta.Invalidate(s.id, p)
	}
	s.forgetStored(p)
	s.entriesChangedLocked(p)
	return nil
}

// Rename keeps both directories' listings: the old name leaves one, and the new one
// joins the other with the attributes the old name had (a rename changes neither
// size nor mtime), when they are known; otherwise the new name's directory is asked
// again (as for Unlink, also when a file replaced there had other names). What was
// cached below either name goes.
func (s *Source) Rename(ctx context.Context, from, to string) error {
	if err := s.Backend.Rename(ctx, from, to); err != nil {
		s.changedTree(from)
		s.changedTree(to)
		return err
	}
	defer s.record()()
	a, known := s.meta.Removed(s.id, from, true)
	switch old, had := s.meta.Removed(s.id, to, true); {
	case had && old.Nlink > 1:
		// A file replaced at the new name that has other names: they lost a link.
		s.meta.Invalidate(s.id, to)
	case known:
		s.meta.Created(s.id, to, a)
	default:
		// A file just written (git's config.lock renamed to config): the rest of
		// the directory's listing still answers, the lock's next create included.
		s.meta.Arrived(s.id, to)
	}
	s.forgetStoredTree(from)
	s.forgetStoredTree(to)
	s.entriesChangedLocked(from, to)
	return nil
}

// Symlink records the new link as Mkdir records a directory: its directory's listing
// stays, with the link's attributes in it, and its target is known.
func (s *Source) Symlink(ctx context.Context, target, p string) (backend.Attr, error) {
	a, err := s.Backend.Symlink(ctx, target, p)
	if err != nil {
		s.changed(p)
		return a, err
	}
	defer s.record()()
	s.changedToLocked(p, a)
	s.meta.putLink(s.id, p, target, time.Now(), s.meta.stamp(s.id, p))
	s.entriesChangedLocked(p)
	return a, nil
}

func (s *Source) Link(ctx context.Context, from, to string) error {
	err := s.Backend.Link(ctx, from, to)
	s.changed(from, to)
	if err == nil {
		defer s.record()()
		s.entriesChangedLocked(to)
	}
	return err
}

func (s *Source) SetAttr(ctx context.Context, p string, set backend.SetAttr) (backend.Attr, error) {
	a, err := s.Backend.SetAttr(ctx, p, set)
	if err != nil {
		s.changed(p) // it may have been made in part
		return a, err
	}
	s.changedTo(p, a)
	return a, nil
}

func (s *Source) Open(ctx context.Context, p string, flags int, mode uint32) (backend.File, error) {
	writing := flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_CREAT|syscall.O_TRUNC) != 0
	if t, ok := s.Backend.(TrustedOpener); ok && s.noCTO && !writing && !backend.BeingWritten(ctx) {
		now := time.Now()
		s.openingUntil.Store(now.Add(openWalkLinger).UnixNano())
		if a, ok := s.meta.recent(s.id, p, now); ok {
			if f, ok := t.OpenTrusted(p, a); ok {
				s.hits.Add(1)
				return f, nil
			}
		} else if dir, _ := parentOf(p); s.persist != nil && s.meta.oldListing(s.id, dir, now) && !s.offline() {
			// The directory was answered from a listing stored by an earlier mount:
			// this open asks the server as usual, and the listing is fetched again
			// behind it, so that the directory's next opens (a walk reading its
			// files) are trusted — one request per directory, not one per file. Only
			// while files are opened (here, and in storedListing): a walk that merely
			// lists (find) fetches nothing.
			go s.fetchListing(context.Background(), dir) //nolint:errcheck // a failed refetch leaves opens asking
		}
	}
	stamp := s.meta.stamp(s.id, p)
	f, err := s.Backend.Open(ctx, p, flags, mode)
	if err != nil {
		return nil, err
	}
	if writing {
		done := s.record()
		s.meta.Created(s.id, p, f.OpenedAttr())
		s.forgetStored(p)
		if flags&syscall.O_CREAT != 0 {
			// Made, perhaps: an open cannot tell whether the name was there.
			s.entriesChangedLocked(p)
		}
		done()
		return &file{File: f, s: s, path: p}, nil
	}
	// An open is a fresh look at the file: later stats agree with it.
	s.meta.putAttr(s.id, p, f.OpenedAttr(), false, time.Now(), stamp)
	s.store(p, stamp, func() { s.persist.SaveAttr(p, f.OpenedAttr()) })
	return f, nil
}

// file drops the cached attributes of a file being written as it changes, and at its
// close keeps what its last Stat found, when nothing changed the path since: make
// stats every object it has just had written before it runs ar, and the next stat
// after a close was otherwise a round trip each.
type file struct {
	backend.File
	s    *Source
	path string

	mu      sync.Mutex
	stat    backend.Attr // the last Stat's answer, if statted
	statted bool
	stamp   uint64 // the path's stamp before that Stat
}

func (f *file) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	defer f.s.changedContent(f.path)
	return f.File.WriteAt(ctx, p, off)
}

func (f *file) SetAttr(ctx context.Context, set backend.SetAttr) error {
	defer f.s.changedContent(f.path)
	return f.File.SetAttr(ctx, set)
}

func (f *file) Close(ctx context.Context) error {
	err := f.File.Close(ctx)
	f.mu.Lock()
	a, statted, stamp := f.stat, f.statted, f.stamp
	f.mu.Unlock()
	if err != nil || !statted {
		f.s.changedContent(f.path)
		return err
	}
	f.s.settledContent(f.path, a, stamp)
	return nil
}

// Stat waits for the file's writes: its answer is what the file now is, kept for an
// offline mount and, if nothing changes the path before, for after the close.
func (f *file) Stat(ctx context.Context) (backend.Attr, error) {
	stamp := f.s.meta.stamp(f.s.id, f.path)
	a, err := f.File.Stat(ctx)
	if err != nil {
		return a, err
	}
	f.mu.Lock()
	f.stat, f.statted, f.stamp = a, true, stamp
	f.mu.Unlock()
	if f.s.persist != nil {
		f.s.persist.SaveAttr(f.path, a)
	}
	return a, nil
}
