package fusefs

import (
	"fmt"
	"path"
	"strings"

	"github.com/hanwen/go-fuse/v2/fs"

	"github.com/muxfs/muxfs/internal/backend"
)

// refresher is a source with a cache that can be dropped for a subtree.
type refresher interface{ Refresh(rel string) }

// Refresh forgets everything cached at or below vp (a path in the mounted tree): muxfs'
// own caches at once, and the kernel's names, attributes and pages through
// notifications, so the next access asks the servers.
func (f *FS) Refresh(vp string) error {
	vp = path.Clean("/" + vp)
	layers, rels := f.table.Affected(vp)
	if len(layers) == 0 {
		return fmt.Errorf("%s is not in the mounted tree", vp)
	}
	for i, l := range layers {
		for _, b := range l.Branches {
			if r, ok := backend.As[refresher](b.Backend); ok {
				r.Refresh(rels[i])
			}
		}
	}
	inode := &f.root.Inode
	for _, name := range strings.Split(strings.Trim(vp, "/"), "/") {
		if name == "" {
			continue
		}
		if inode = inode.GetChild(name); inode == nil {
			return nil // the kernel knows nothing below: nothing to tell it
		}
	}
	// Notifications must not run under our locks or inside a FUSE request; Refresh
	// holds none and runs for the control socket. It waits for them, so that `muxfs
	// refresh` returns once the kernel has forgotten too: when they ran behind it, a
	// listing read right after the refresh could still come from the kernel's copy.
	notifyTree(inode)
	return nil
}

// notifyTree tells the kernel to forget the names below inode, and the pages of every
// file and the listing of every directory it knows there.
func notifyTree(inode *fs.Inode) {
	for name, ch := range inode.Children() {
		notifyTree(ch)
		inode.NotifyEntry(name)
	}
	inode.NotifyContent(0, 0)
}
