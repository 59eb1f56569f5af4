package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/muxfs/muxfs/internal/control"
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
				if err := control.Call(mp, control.Request{Op: "refresh", Path: inside}); err != nil {
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
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		// Fields after the "-" separator: fstype, source, options.
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) && fields[i+1] == "fuse.muxfs" && len(fields) > 4 {
				out[unescapeMountinfo(fields[4])] = true
			}
		}
	}
	return out, sc.Err()
}
