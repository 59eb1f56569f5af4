package main

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/muxfs/muxfs/internal/control"
	"github.com/muxfs/muxfs/internal/mountinfo"
)

func newRefresh() *cobra.Command {
	return &cobra.Command{
		Use:   "refresh PATH...",
		Short: "forget what is cached at and below PATH in a muxfs mount, so the next access asks the servers",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, p := range args {
				mp, inside, err := findMount(p)
				if err != nil {
					return err
				}
				if _, err := control.Call(mp, control.Request{Op: "refresh", Path: inside}); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

// findMount returns the muxfs mount holding p and p's path inside it.
func findMount(p string) (mountpoint, inside string, err error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", "", err
	}
	mounts, err := muxfsMounts()
	if err != nil {
		return "", "", err
	}
	for dir := abs; ; dir = filepath.Dir(dir) {
		if mounts[dir] {
			rel, _ := filepath.Rel(dir, abs)
			if rel == "." {
				rel = ""
			}
			return dir, "/" + filepath.ToSlash(rel), nil
		}
		if dir == "/" {
			return "", "", fmt.Errorf("%s is not inside a muxfs mount", p)
		}
	}
}

// muxfsMounts lists the mount points of type fuse.muxfs.
func muxfsMounts() (map[string]bool, error) {
	all, err := mountinfo.Mounts()
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for dir, fstype := range all {
		if fstype == "fuse.muxfs" {
			out[dir] = true
		}
	}
	return out, nil
}
