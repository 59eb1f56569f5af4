package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/muxfs/muxfs/internal/mountinfo"
)

func newUmount() *cobra.Command {
	var lazy bool
	cmd := &cobra.Command{
		Use:   "umount [-l] MOUNTPOINT",
		Short: "unmount a muxfs mount (as fusermount3 -u does)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return umount(args[0], lazy)
		},
	}
	cmd.Flags().BoolVarP(&lazy, "lazy", "l", false, "detach now even if files are open there")
	return cmd
}

func umount(mp string, lazy bool) error {
	abs, err := filepath.Abs(mp)
	if err != nil {
		return err
	}
	if !mountinfo.IsMounted(abs) {
		return fmt.Errorf("%s is not mounted", mp)
	}
	args := []string{"-u"}
	if lazy {
		args = append(args, "-z")
	}
	out, err := exec.Command("fusermount3", append(args, abs)...).CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if strings.Contains(msg, "busy") {
			return fmt.Errorf("%s is busy: close the files and shells using it (see `fuser -vm %s`), or use `muxfs umount -l %s`", mp, mp, mp)
		}
		if msg == "" {
			msg = err.Error()
		}
		return fmt.Errorf("cannot unmount %s: %s", mp, msg)
	}
	return nil
}
