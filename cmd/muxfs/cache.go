package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/muxfs/muxfs/internal/control"
	"github.com/muxfs/muxfs/internal/diskcache"
)

func newCache() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "cache",
		Short: "inspect, clear or warm the persistent local cache",
	}
	cmd.PersistentFlags().StringVar(&dir, "cache-dir", "", "cache directory (default $XDG_CACHE_HOME/muxfs or ~/.cache/muxfs)")
	cacheDir := func() (string, error) {
		if dir != "" {
			return dir, nil
		}
		return diskcache.DefaultDir()
	}
	status := &cobra.Command{
		Use:   "status",
		Short: "per cached source: files, directories, size, and hit ratio while mounted",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := cacheDir()
			if err != nil {
				return err
			}
			live := liveCacheStats()
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintf(tw, "cache directory %s\n", d)
			fmt.Fprintln(tw, "SOURCE\tFILES\tDIRS\tSIZE\tHIT RATIO\tSTATE")
			var total int64
			for _, sd := range diskcache.SourceDirs(d) {
				st, ok := live[sd]
				state := "mounted"
				if !ok {
					rs, err := diskcache.ReadStats(sd)
					st.Stats = rs
					if err != nil {
						state = "in use elsewhere"
					} else {
						state = "not mounted"
					}
				} else if st.offline {
					state = "mounted, offline"
				}
				ratio := "-"
				if n := st.HitBytes + st.Fetched; n > 0 {
					ratio = fmt.Sprintf("%.0f%%", 100*float64(st.HitBytes)/float64(n))
				}
				total += st.Bytes
				fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", st.Source, st.Files, st.Dirs, fmtBytes(st.Bytes), ratio, state)
			}
			fmt.Fprintf(tw, "total\t\t\t%s\t\t\n", fmtBytes(total))
			return tw.Flush()
		},
	}
	clear := &cobra.Command{
		Use:   "clear [SOURCE]",
		Short: "drop what is cached for SOURCE (as `muxfs cache status` names it), or for every source",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := cacheDir()
			if err != nil {
				return err
			}
			want := ""
			if len(args) == 1 {
				want = args[0]
			}
			cleared := map[string]bool{}
			// Mounted sources are cleared by their mount (it holds the database).
			for _, mp := range ownMounts() {
				data, err := control.Call(mp, control.Request{Op: "cache-clear", Path: want})
				if err != nil {
					continue
				}
				var names []string
				json.Unmarshal(data, &names) //nolint:errcheck // nothing cleared there
				for _, n := range names {
					cleared[n] = true
				}
			}
			for _, sd := range diskcache.SourceDirs(d) {
				st, err := diskcache.ReadStats(sd)
				if err != nil || cleared[st.Source] || (want != "" && st.Source != want) {
					continue
				}
				if err := os.RemoveAll(sd); err != nil {
					return err
				}
				cleared[st.Source] = true
			}
			if want != "" && !cleared[want] {
				return fmt.Errorf("nothing cached for %q — see `muxfs cache status` for the source names", want)
			}
			names := make([]string, 0, len(cleared))
			for n := range cleared {
				names = append(names, n)
			}
			sort.Strings(names)
			for _, n := range names {
				fmt.Fprintln(cmd.OutOrStdout(), "cleared", n)
			}
			return nil
		},
	}
	var parallel int
	warm := &cobra.Command{
		Use:   "warm PATH...",
		Short: "read every file below PATH in a muxfs mount into the persistent cache, in parallel, with progress",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return warmPaths(cmd.ErrOrStderr(), args, parallel)
		},
	}
	warm.Flags().IntVarP(&parallel, "jobs", "j", 8, "files read at once")
	cmd.AddCommand(status, clear, warm)
	return cmd
}

// ownMounts lists this user's muxfs mounts (those whose control socket is ours).
func ownMounts() []string {
	mounts, err := muxfsMounts()
	if err != nil {
		return nil
	}
	var out []string
	for mp := range mounts {
		if _, err := os.Stat(control.SocketPath(mp)); err == nil {
			out = append(out, mp)
		}
	}
	sort.Strings(out)
	return out
}

type liveStats struct {
	diskcache.Stats
	offline bool
}

// liveCacheStats asks every running mount of this user for its stores' numbers, by
// cache directory.
func liveCacheStats() map[string]liveStats {
	out := map[string]liveStats{}
	for _, mp := range ownMounts() {
		data, err := control.Call(mp, control.Request{Op: "cache-status"})
		if err != nil {
			continue
		}
		var stats []diskcache.Stats
		if json.Unmarshal(data, &stats) != nil {
			continue
		}
		offline := map[string]bool{}
		if sd, err := control.Call(mp, control.Request{Op: "status"}); err == nil {
			var ms mountStatus
			if json.Unmarshal(sd, &ms) == nil {
				for _, s := range ms.Sources {
					offline[s.Source] = s.State == "offline"
				}
			}
		}
		for _, s := range stats {
			out[s.Dir] = liveStats{s, offline[s.Source]}
		}
	}
	return out
}

// warmPaths reads every regular file below the paths (which must be in muxfs mounts)
// with jobs readers at once, so that the mount's persistent cache holds them.
func warmPaths(out io.Writer, paths []string, jobs int) error {
	type item struct {
		path string
		size int64
	}
	var files []item
	var total int64
	for _, p := range paths {
		if _, _, err := findMount(p); err != nil {
			return err
		}
		err := filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.Type().IsRegular() {
				info, err := d.Info()
				if err != nil {
					return err
				}
				files = append(files, item{q, info.Size()})
				total += info.Size()
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("listing %s: %v", p, err)
		}
	}
	visible := false
	if f, ok := out.(*os.File); ok {
		visible = term.IsTerminal(int(f.Fd()))
	}
	bar := progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(out),
		progressbar.OptionSetVisibility(visible),
		progressbar.OptionShowBytes(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionClearOnFinish(),
	)
	var done, failed atomic.Int64
	var firstErr error
	var errMu sync.Mutex
	work := make(chan item)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < max(jobs, 1); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1<<20)
			for it := range work {
				err := warmFile(it.path, buf, func(n int) { bar.Add(n) }) //nolint:errcheck // display only
				if err != nil {
					failed.Add(1)
					errMu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					errMu.Unlock()
				}
				n := done.Add(1)
				bar.Describe(fmt.Sprintf("%d/%d files", n, len(files)))
			}
		}()
	}
	for _, it := range files {
		work <- it
	}
	close(work)
	wg.Wait()
	bar.Finish() //nolint:errcheck // display only
	took := time.Since(start)
	fmt.Fprintf(out, "warmed %d files, %s in %s (%s/s)\n", len(files)-int(failed.Load()), fmtBytes(total),
		took.Round(100*time.Millisecond), fmtBytes(int64(float64(total)/max(took.Seconds(), 0.001))))
	if firstErr != nil {
		return fmt.Errorf("%d files could not be read, the first: %v", failed.Load(), firstErr)
	}
	return nil
}

// warmFile reads a file to its end and tells the kernel it need not keep the pages:
// the point is the persistent cache, not the page cache.
func warmFile(p string, buf []byte, progress func(int)) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	for {
		n, err := f.Read(buf)
		progress(n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
	}
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED) //nolint:errcheck // a hint
	return nil
}
