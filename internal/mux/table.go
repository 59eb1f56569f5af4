// Package mux is the namespace of a muxfs mount: which sources serve which path, how a
// union resolves a name, and where new files go. It knows nothing of FUSE, so its rules
// are tested directly.
package mux

import (
	"context"
	"fmt"
	"path"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/muxfs/muxfs/internal/backend"
)

// Branch is one source as a member of a layer.
type Branch struct {
	ID       int // unique in the mount: keys inode numbers
	Backend  backend.Backend
	ReadOnly bool
	NoCreate bool
}

// Layer is the set of sources placed at one path: one source, or a union.
type Layer struct {
	Path     string // "/" or "/FOO"
	Policy   string
	Branches []*Branch
}

// Table is the mount table, sorted by path.
type Table struct {
	layers []*Layer
}

// NewTable builds a table; paths must be clean, absolute and distinct.
func NewTable(layers []*Layer) (*Table, error) {
	t := &Table{layers: append([]*Layer(nil), layers...)}
	sort.Slice(t.layers, func(i, j int) bool { return t.layers[i].Path < t.layers[j].Path })
	for i, l := range t.layers {
		if path.Clean(l.Path) != l.Path || !strings.HasPrefix(l.Path, "/") {
			return nil, fmt.Errorf("mount path %q is not clean and absolute", l.Path)
		}
		if i > 0 && t.layers[i-1].Path == l.Path {
			return nil, fmt.Errorf("mount path %s given twice", l.Path)
		}
		if len(l.Branches) == 0 {
			return nil, fmt.Errorf("mount path %s has no sources", l.Path)
		}
	}
	return t, nil
}

// Layers returns the layers, sorted by path.
func (t *Table) Layers() []*Layer { return t.layers }

// within reports whether p is at or below dir, and the rest of p relative to dir.
func within(p, dir string) (string, bool) {
	if dir == "/" {
		return strings.TrimPrefix(p, "/"), true
	}
	if p == dir {
		return "", true
	}
	if strings.HasPrefix(p, dir+"/") {
		return p[len(dir)+1:], true
	}
	return "", false
}

// Enclosing returns the layer serving virtual path p (the one with the longest path
// that contains p) and p relative to it, or nil if no layer contains p.
func (t *Table) Enclosing(p string) (*Layer, string) {
	for i := len(t.layers) - 1; i >= 0; i-- {
		if rel, ok := within(p, t.layers[i].Path); ok {
			return t.layers[i], rel
		}
	}
	return nil, ""
}

// Junction reports whether p is a directory the table itself guarantees: a layer's
// path, or an ancestor of one. Such a directory exists whatever the sources hold.
func (t *Table) Junction(p string) bool {
	for _, l := range t.layers {
		if _, ok := within(l.Path, p); ok {
			return true
		}
	}
	return false
}

// JunctionChildren returns the names directly below p that are junctions belonging to
// deeper layers (they shadow same-named entries of p's own sources).
func (t *Table) JunctionChildren(p string) []string {
	var names []string
	seen := map[string]bool{}
	for _, l := range t.layers {
		rel, ok := within(l.Path, p)
		if !ok || rel == "" {
			continue
		}
		first, _, _ := strings.Cut(rel, "/")
		if !seen[first] {
			seen[first] = true
			names = append(names, first)
		}
	}
	return names
}

// Affected returns the layers holding something at or below vp, each with the path of
// vp inside it ("" where vp contains the whole layer).
func (t *Table) Affected(vp string) (layers []*Layer, rels []string) {
	for _, l := range t.layers {
		if _, ok := within(l.Path, vp); ok {
			layers, rels = append(layers, l), append(rels, "")
		}
	}
	if l, rel := t.Enclosing(vp); l != nil && rel != "" {
		layers, rels = append(layers, l), append(rels, rel)
	}
	return layers, rels
}

// Found is the result of resolving a name in a layer.
type Found struct {
	Index int // index of the winning branch in the layer
	Attr  backend.Attr
	// Dirs lists the branch indexes where the path is a directory, in order: the
	// members of a merged directory. Empty for a non-directory.
	Dirs []int
}

// Resolve looks rel up in every branch of l at once and applies the union rule: the
// first branch (in the order given) that has the name wins; if it is a directory, every
// branch holding a directory there joins the merge. ENOENT if no branch has it. An
// error from a branch that might have shadowed the winner is returned rather than
// guessed around.
func (l *Layer) Resolve(ctx context.Context, rel string) (Found, error) {
	type result struct {
		attr backend.Attr
		err  error
	}
	results := make([]result, len(l.Branches))
	Each(len(l.Branches), func(i int) {
		a, err := l.Branches[i].Backend.Lstat(ctx, rel)
		results[i] = result{a, err}
	})
	found := Found{Index: -1}
	for i, r := range results {
		if r.err != nil {
			if backend.ToErrno(r.err) == syscall.ENOENT || backend.ToErrno(r.err) == syscall.ENOTDIR {
				continue
			}
			if found.Index < 0 {
				return Found{}, r.err
			}
			continue // a later branch's failure cannot change the winner
		}
		if found.Index < 0 {
			found.Index = i
			found.Attr = r.attr
			if !r.attr.IsDir() {
				return found, nil
			}
		}
		if r.attr.IsDir() {
			found.Dirs = append(found.Dirs, i)
		}
	}
	if found.Index < 0 {
		return Found{}, syscall.ENOENT
	}
	return found, nil
}

// Writable reports whether the branch accepts changes.
func (b *Branch) Writable() bool { return !b.ReadOnly }

// Available reports whether the branch takes part in its union now: false for a
// member left out while unreachable (see Degraded).
func (b *Branch) Available() bool {
	if d, ok := b.Backend.(interface{ Available() bool }); ok {
		return d.Available()
	}
	return true
}

// Each calls f(0) … f(n-1) at once, each in its own goroutine, and returns when all
// have: members of a union are asked in parallel. One is called directly: handing it
// to another goroutine (and thread) costs more than the call when it is answered from
// memory, as most lookups and listings of a walk are.
func Each(n int, f func(i int)) {
	if n == 1 {
		f(0)
		return
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(i)
		}()
	}
	wg.Wait()
}
