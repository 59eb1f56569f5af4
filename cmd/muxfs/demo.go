package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/muxfs/muxfs/internal/config"
	"github.com/muxfs/muxfs/internal/sshd"
)

func newDemo() *cobra.Command {
	var keep bool
	cmd := &cobra.Command{
		Use:   "demo [MOUNTPOINT]",
		Short: "start two throwaway SSH servers on loopback and mount them as one union",
		Long: `demo starts two sshd processes on 127.0.0.1 with their own keys and sample
content, mounts both as one union, shows a short tour, and on a terminal keeps serving
until Ctrl-C or until the mount is unmounted. Everything it made is removed at the end.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDemo(args, keep)
		},
	}
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the temporary directory (servers' data) at the end")
	return cmd
}

// demoFiles are the sample trees: a "home" and a "project" directory of one user, as
// in the SSHFS-MUX article, with one name on both servers to show shadowing and one
// directory on both to show merging.
var demoFiles = map[string]map[string]string{
	"home": {
		"README.txt":     "This README lives on server 1 (home). Server 2 has one too, hidden by this one.\n",
		"src/main.c":     "#include <stdio.h>\nint util(void);\nint main(void) { printf(\"%d\\n\", util()); return 0; }\n",
		"src/Makefile":   "demo: main.c util.c\n\tcc -o demo main.c util.c\n",
		"notes/todo.txt": "- try muxfs\n",
		"jobs/run.sh":    "#!/bin/sh\necho running on $(hostname)\n",
	},
	"project": {
		"README.txt":       "This README on server 2 (project) is shadowed by server 1's.\n",
		"src/util.c":       "int util(void) { return 42; }\n",
		"data/results.csv": "run,value\n1,0.5\n2,0.7\n",
		"data/input/a.dat": strings.Repeat("muxfs demo data\n", 4096),
	},
}

func runDemo(args []string, keep bool) error {
	tmp, err := os.MkdirTemp("", "muxfs-demo-")
	if err != nil {
		return err
	}
	if !keep {
		defer os.RemoveAll(tmp)
	}
	keys, err := sshd.NewKeys(filepath.Join(tmp, "client"))
	if err != nil {
		return err
	}
	mp := filepath.Join(tmp, "mnt")
	if len(args) == 1 {
		mp = args[0]
	} else if err := os.Mkdir(mp, 0o755); err != nil {
		return err
	}
	cfg := &config.Config{Options: config.Defaults(), Mountpoint: mp}
	cfg.Options.Foreground = true
	cfg.Options.SSHOptions = keys.SSHOptions()
	// The demo's throwaway servers must not leave entries in the user's cache.
	cfg.Options.CacheDir = filepath.Join(tmp, "cache")
	root := config.Mount{Path: "/", Policy: config.PolicyEPFF}
	var servers []*sshd.Server
	defer func() {
		for _, s := range servers {
			s.Stop()
		}
	}()
	dataDirs := map[string]string{}
	for i, name := range []string{"home", "project"} {
		data := filepath.Join(tmp, "server"+fmt.Sprint(i+1), name)
		for rel, content := range demoFiles[name] {
			p := filepath.Join(data, rel)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			mode := os.FileMode(0o644)
			if strings.HasSuffix(rel, ".sh") {
				mode = 0o755
			}
			if err := os.WriteFile(p, []byte(content), mode); err != nil {
				return err
			}
		}
		srv, err := sshd.Start(filepath.Join(tmp, "server"+fmt.Sprint(i+1), "sshd"), keys)
		if err != nil {
			return err
		}
		servers = append(servers, srv)
		dataDirs[name] = data
		src, err := config.ParseSource(fmt.Sprintf("%s@127.0.0.1:%s", srv.User, data))
		if err != nil {
			return err
		}
		src.Port = srv.Port
		root.Sources = append(root.Sources, src)
	}
	cfg.Mounts = []config.Mount{root}
	mp, err = checkMountpoint(mp, false)
	if err != nil {
		return err
	}
	cfg.Mountpoint = mp
	fmt.Printf("muxfs demo: two SSH servers on 127.0.0.1:%d and 127.0.0.1:%d\n", servers[0].Port, servers[1].Port)
	fmt.Printf("  server 1 exports %s\n  server 2 exports %s\n  muxed into       %s\n\n", dataDirs["home"], dataDirs["project"], mp)
	return serve(cfg, func(mp string) error {
		return demoTour(mp, dataDirs, servers)
	})
}

// cutPIDs stands in a demo step for the servers' session processes, found only when
// the step runs.
const cutPIDs = "SERVER-SESSION-PIDS"

// demoTour drives the mount from a shell, a separate process, as a user would.
func demoTour(mp string, dataDirs map[string]string, servers []*sshd.Server) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	steps := []struct{ say, cmd string }{
		{"one tree, names from both servers, each listed once", "ls -l " + mp},
		{"README.txt is on both servers: the first source wins", "cat " + mp + "/README.txt"},
		{"src/ exists on both servers: its contents merge", "ls " + mp + "/src"},
		{"a build reading from both servers", "cd " + mp + "/src && cc -o /tmp/muxfs-demo-bin main.c util.c && /tmp/muxfs-demo-bin; rm -f /tmp/muxfs-demo-bin"},
		{"a new file goes where its directory exists (data/ is on server 2)", "echo hello > " + mp + "/data/new.txt && ls " + dataDirs["project"] + "/data"},
		{"rename and remove work as on a local disk", "mv " + mp + "/data/new.txt " + mp + "/data/renamed.txt && rm " + mp + "/data/renamed.txt && ls " + mp + "/data"},
		{"capacity is the sum of both servers", "df -h " + mp},
		{"every SSH connection cut at the servers (their sshd processes killed): muxfs reconnects by itself, nothing fails",
			"kill -KILL " + cutPIDs + "; cat " + mp + "/README.txt && md5sum " + mp + "/src/*.c"},
		{"the health of each server: sessions, round-trip time, traffic, reconnects", self + " status " + mp},
	}
	for _, s := range steps {
		if strings.Contains(s.cmd, cutPIDs) {
			var pids []string
			for _, srv := range servers {
				for _, p := range srv.Sessions() {
					pids = append(pids, strconv.Itoa(p))
				}
			}
			s.cmd = strings.Replace(s.cmd, cutPIDs, strings.Join(pids, " "), 1)
		}
		fmt.Printf("# %s\n$ %s\n", s.say, strings.ReplaceAll(s.cmd, mp, "MNT"))
		c := exec.Command("/bin/sh", "-c", s.cmd)
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		if err := c.Run(); err != nil {
			if strings.Contains(s.cmd, "cc ") {
				if _, lerr := exec.LookPath("cc"); lerr != nil {
					fmt.Println("(no C compiler here: step skipped)")
					continue
				}
			}
			return fmt.Errorf("demo step %q failed: %v", s.cmd, err)
		}
		fmt.Println()
	}
	if term.IsTerminal(int(os.Stdin.Fd())) {
		fmt.Printf("The mount stays at %s (MNT above). Try it from another shell;\n", mp)
		fmt.Printf("press Ctrl-C here or run `muxfs umount %s` to end the demo.\n", mp)
	} else {
		fmt.Println("demo finished: unmounting and stopping the servers.")
	}
	return nil
}
