package fusefs

import (
	"strings"
	"sync"

	"github.com/muxfs/muxfs/internal/backend"
)

// inodeTable hands out inode numbers that stay the same for a (source, path) while
// mounted, and follow a file when it is renamed. It is a trie per source so that a
// directory rename moves its whole subtree in one step.
type inodeTable struct {
	mu    sync.Mutex
	next  uint64
	roots map[int]*inoEntry
	// linked holds the numbers given to a second path (alias): only these can have
	// other names to look for (names).
	linked map[uint64]struct{}
}

type inoEntry struct {
	ino      uint64
	children map[string]*inoEntry
}

// rootIno is FUSE's fixed root node id.
const rootIno = 1

func newInodeTable() *inodeTable {
	return &inodeTable{next: rootIno + 1, roots: map[int]*inoEntry{}}
}

// walk returns the entry for rel under source, creating entries when create is set.
func (t *inodeTable) walk(source int, rel string, create bool) (parent *inoEntry, name string, e *inoEntry) {
	cur := t.roots[source]
	if cur == nil {
		if !create {
			return nil, "", nil
		}
		cur = &inoEntry{}
		t.roots[source] = cur
	}
	if rel == "" {
		return nil, "", cur
	}
	parts := strings.Split(rel, "/")
	for i, p := range parts {
		next := cur.children[p]
		if next == nil {
			if !create {
				return nil, "", nil
			}
			if cur.children == nil {
				cur.children = map[string]*inoEntry{}
			}
			next = &inoEntry{}
			cur.children[p] = next
		}
		if i == len(parts)-1 {
			return cur, p, next
		}
		cur = next
	}
	return nil, "", cur
}

// get returns the inode number of rel on source, allocating one on first use.
func (t *inodeTable) get(source int, rel string) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, _, e := t.walk(source, rel, true)
	if e.ino == 0 {
		e.ino = t.next
		t.next++
	}
	return e.ino
}

// forget drops rel (and everything below it): a new file there gets a new number, as
// it must while the old one may still be open.
func (t *inodeTable) forget(source int, rel string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if parent, name, e := t.walk(source, rel, false); e != nil && parent != nil {
		delete(parent.children, name)
	}
}

// move carries rel's number and subtree to its new path.
func (t *inodeTable) move(source int, from, to string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	parent, name, e := t.walk(source, from, false)
	if e == nil || parent == nil {
		return
	}
	delete(parent.children, name)
	if np, nn, _ := t.walk(source, to, true); np != nil {
		np.children[nn] = e
	}
}

// alias gives rel on source the number ino: a hard link made through the mount.
func (t *inodeTable) alias(source int, rel string, ino uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, _, e := t.walk(source, rel, true)
	e.ino = ino
	if t.linked == nil {
		t.linked = map[uint64]struct{}{}
	}
	t.linked[ino] = struct{}{}
}

// names returns the paths on source that have the number ino: a file's hard links
// made through the mount. For such a file it walks the whole table (links made
// through the mount are rare); for any other it returns nil at once.
func (t *inodeTable) names(source int, ino uint64) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.linked[ino]; !ok {
		return nil
	}
	var out []string
	var walk func(e *inoEntry, rel string)
	walk = func(e *inoEntry, rel string) {
		if e.ino == ino {
			out = append(out, rel)
		}
		for name, c := range e.children {
			walk(c, backend.Child(rel, name))
		}
	}
	if r := t.roots[source]; r != nil {
		walk(r, "")
	}
	return out
}
