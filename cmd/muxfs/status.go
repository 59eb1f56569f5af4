package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/muxfs/muxfs/internal/backend"
	"github.com/muxfs/muxfs/internal/control"
)

type memberStatus = backend.MemberStatus

func newStatus() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status [MOUNTPOINT]",
		Short: "show each source's state, sessions, round-trip time, traffic, errors and reconnects",
		Long: `Show the health of a muxfs mount (or of every muxfs mount of this user): per source
its state (up, degraded: a replica member is out, connecting, down, offline: served
from the persistent cache, local), SSH
sessions, round-trip time, requests in flight, bytes read and written, errors,
requests retried after a lost connection, reconnects, memory-cache hits, and the
persistent cache's size and share of file data read from it; and the mount's
resident memory, now and at its peak.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var mps []string
			if len(args) == 1 {
				mp, inside, err := findMount(args[0])
				if err != nil {
					return err
				}
				if inside != "/" {
					return fmt.Errorf("%s is inside the mount %s: give the mount point", args[0], mp)
				}
				mps = []string{mp}
			} else {
				mounts, err := muxfsMounts()
				if err != nil {
					return err
				}
				for mp := range mounts {
					// Only our own mounts answer: the sockets live in our runtime dir.
					if _, err := os.Stat(control.SocketPath(mp)); err == nil {
						mps = append(mps, mp)
					}
				}
				sort.Strings(mps)
				if len(mps) == 0 {
					return fmt.Errorf("no muxfs mount of this user is running")
				}
			}
			var all []mountStatus
			for _, mp := range mps {
				data, err := control.Call(mp, control.Request{Op: "status"})
				if err != nil {
					return err
				}
				var st mountStatus
				if err := json.Unmarshal(data, &st); err != nil {
					return fmt.Errorf("unreadable status from %s: %v", mp, err)
				}
				all = append(all, st)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if len(args) == 1 {
					return enc.Encode(all[0])
				}
				return enc.Encode(all)
			}
			for i, st := range all {
				if i > 0 {
					fmt.Fprintln(out)
				}
				printStatus(out, st)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printStatus(out io.Writer, st mountStatus) {
	memory := ""
	if st.RSS > 0 {
		memory = fmt.Sprintf(", memory %s, peak %s", fmtBytes(st.RSS), fmtBytes(st.PeakRSS))
	}
	fmt.Fprintf(out, "muxfs on %s (pid %d, up %s%s)\n", st.Mountpoint, st.PID,
		(time.Duration(st.Uptime) * time.Second).Round(time.Second), memory)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tAT\tSTATE\tSESSIONS\tRTT\tIN FLIGHT\tREAD\tWRITTEN\tERRORS\tRETRIED\tRECONNECTS\tCACHE HITS\tDISK CACHE")
	for _, s := range st.Sources {
		hits := "-"
		if n := s.CacheHits + s.CacheMisses; n > 0 {
			hits = fmt.Sprintf("%.0f%%", 100*float64(s.CacheHits)/float64(n))
		}
		// Memory-cache hits (lookups, listings), then the persistent cache: its size
		// and the share of file data read from it.
		disk := "-"
		if s.DiskBytes > 0 || s.DiskHitBytes+s.DiskFetchedBytes > 0 {
			disk = fmtBytes(s.DiskBytes)
			if n := s.DiskHitBytes + s.DiskFetchedBytes; n > 0 {
				disk += fmt.Sprintf(", %.0f%% hits", 100*float64(s.DiskHitBytes)/float64(n))
			}
		}
		hits += "\t" + disk
		if len(s.Members) == 0 {
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\t-\t-\t-\t%d\t-\t-\t%s\n", s.Source, s.At, s.State, s.Errors, hits)
			continue
		}
		if len(s.Members) == 1 {
			m := s.Members[0]
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", s.Source, s.At, s.State, memberCols(m), s.Errors, s.Retries, colsTail(m, hits))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t\t\t\t\t\t%d\t%d\t\t%s\n", s.Source, s.At, s.State, s.Errors, s.Retries, hits)
		for _, m := range s.Members {
			name := "  " + m.Server
			if m.Writer {
				name += " (writer)"
			}
			fmt.Fprintf(tw, "%s\t\t%s\t%s\t\t\t%d\t\t\n", name, m.State, memberCols(m), m.Reconnects)
		}
	}
	tw.Flush()
	for _, s := range st.Sources {
		for _, m := range s.Members {
			if m.State != "up" && m.LastError != "" {
				fmt.Fprintf(out, "%s: %s\n", m.Server, firstLine(m.LastError))
			}
		}
	}
}

func memberCols(m memberStatus) string {
	sessions := strconv.Itoa(m.Sessions)
	if m.Transport != "" {
		sessions += " " + m.Transport
	}
	return fmt.Sprintf("%s\t%s\t%d\t%s\t%s", sessions, fmtRTT(m.RTTMillis), m.InFlight, fmtBytes(m.BytesRead), fmtBytes(m.BytesWritten))
}

func colsTail(m memberStatus, hits string) string {
	return fmt.Sprintf("%d\t%s", m.Reconnects, hits)
}

func fmtRTT(ms float64) string {
	if ms == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fms", ms)
}

func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
