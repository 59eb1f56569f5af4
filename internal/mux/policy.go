package mux

import (
	"context"
	"path"
	"syscall"

	"github.com/muxfs/muxfs/internal/backend"
	"github.com/muxfs/muxfs/internal/config"
)

// Place chooses the branch of l where a new entry at relParent/name is created, and
// makes sure the parent directory exists there. parentDirs are the branch indexes where
// relParent is a directory (from resolving the parent). It returns EROFS when no
// branch may take new files.
func (l *Layer) Place(ctx context.Context, relParent string, parentDirs []int) (int, error) {
	var candidates []int
	for i, b := range l.Branches {
		if b.Writable() && !b.NoCreate && b.Available() {
			candidates = append(candidates, i)
		}
	}
	if len(candidates) == 0 {
		return -1, syscall.EROFS
	}
	hasParent := map[int]bool{}
	for _, i := range parentDirs {
		hasParent[i] = true
	}
	var existing []int
	for _, i := range candidates {
		if hasParent[i] {
			existing = append(existing, i)
		}
	}
	switch l.Policy {
	case config.PolicyFF:
		return l.withParent(ctx, candidates[0], relParent, parentDirs)
	case config.PolicyMFS:
		best, err := l.mostFree(ctx, candidates)
		if err != nil {
			return -1, err
		}
		return l.withParent(ctx, best, relParent, parentDirs)
	case config.PolicyEPMFS:
		if len(existing) == 0 {
			return -1, syscall.EROFS
		}
		return l.mostFree(ctx, existing)
	default: // epff
		if len(existing) == 0 {
			// The parent exists only on read-only or no-create branches.
			return -1, syscall.EROFS
		}
		return existing[0], nil
	}
}

// withParent makes relParent exist on branch i, copying each missing directory's mode
// from the branch that has it, as mergerfs does for its path-creating policies.
func (l *Layer) withParent(ctx context.Context, i int, relParent string, parentDirs []int) (int, error) {
	for _, d := range parentDirs {
		if d == i {
			return i, nil
		}
	}
	var src backend.Backend
	if len(parentDirs) > 0 {
		src = l.Branches[parentDirs[0]].Backend
	}
	dst := l.Branches[i].Backend
	var missing []string
	for p := relParent; p != ""; p = parentOf(p) {
		if _, err := dst.Lstat(ctx, p); err == nil {
			break
		}
		missing = append(missing, p)
	}
	for j := len(missing) - 1; j >= 0; j-- {
		mode := uint32(0o755)
		if src != nil {
			if a, err := src.Lstat(ctx, missing[j]); err == nil {
				mode = a.Mode & 0o7777
			}
		}
		if _, err := dst.Mkdir(ctx, missing[j], mode); err != nil && backend.ToErrno(err) != syscall.EEXIST {
			return -1, err
		}
	}
	return i, nil
}

func parentOf(p string) string {
	d := path.Dir(p)
	if d == "." {
		return ""
	}
	return d
}

// mostFree returns the candidate branch with the most available bytes.
func (l *Layer) mostFree(ctx context.Context, candidates []int) (int, error) {
	if len(candidates) == 1 {
		return candidates[0], nil
	}
	free := make([]uint64, len(candidates))
	errs := make([]error, len(candidates))
	Each(len(candidates), func(k int) {
		st, err := l.Branches[candidates[k]].Backend.Statfs(ctx, "")
		free[k], errs[k] = st.Bavail*st.Bsize, err
	})
	best := -1
	for k := range candidates {
		if errs[k] == nil && (best < 0 || free[k] > free[best]) {
			best = k
		}
	}
	if best < 0 {
		return -1, errs[0]
	}
	return candidates[best], nil
}
