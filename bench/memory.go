package main

import (
	"slices"

	"github.com/prometheus/procfs"
)

// peakMemory is the memory a mounted system took: the sum of the peak resident set
// sizes (VmHWM) of the processes serving the mount points mps, in bytes; 0 if none
// runs. They are each process with one of mps among its arguments (the file system's
// daemon: sshfs, muxfs, rclone, mergerfs), each process in one of the process groups
// of the commands that mounted them (sshfs' first ssh, started before sshfs went to
// the background: its parent has exited), and every process below those (sshfs'
// further ssh, muxfs' with `-o transport=ssh`). Each process' own peak is summed, an
// upper bound of their peak together, since the kernel keeps no peak for a group.
//
// sshfs users report its memory growing over big trees (shared/anchors.md); a user
// choosing between these systems on a login node with a memory limit asks how much
// each takes for the same work, which the speed tables do not say.
func peakMemory(mps []string, groups []int) uint64 {
	procs, err := procfs.AllProcs()
	if err != nil {
		return 0
	}
	children := map[int][]procfs.Proc{}
	var roots []procfs.Proc
	for _, p := range procs {
		st, err := p.Stat()
		if err != nil {
			continue
		}
		children[st.PPID] = append(children[st.PPID], p)
		if slices.Contains(groups, st.PGRP) {
			roots = append(roots, p)
			continue
		}
		args, err := p.CmdLine()
		if err == nil && slices.ContainsFunc(args, func(a string) bool { return slices.Contains(mps, a) }) {
			roots = append(roots, p)
		}
	}
	var total uint64
	seen := map[int]bool{}
	for len(roots) > 0 {
		p := roots[len(roots)-1]
		roots = roots[:len(roots)-1]
		if seen[p.PID] {
			continue
		}
		seen[p.PID] = true
		if st, err := p.NewStatus(); err == nil {
			total += st.VmHWM
		}
		roots = append(roots, children[p.PID]...)
	}
	return total
}
