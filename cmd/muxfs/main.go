// Command muxfs mounts directories from several SSH servers into one local directory.
package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `muxfs [OPTIONS] SOURCE... MOUNTPOINT

SOURCE is [user@]host:[dir], sftp://[user@]host[:port]/dir, or a local directory.
Several sources form a union at the root of MOUNTPOINT; --config FILE gives a full
mount table (grafts at sub-paths, unions anywhere, read-only sources).

Mount options (-o name[=value],...; sshfs names where the meaning is the same):
  allow_other            let other users access the mount (needs user_allow_other
                         in /etc/fuse.conf when not root)
  default_permissions    let the kernel check permissions from file modes
  ro                     mount read-only
  nonempty               allow mounting over a non-empty directory
  port=N                 ssh port (same as -p N)
  ssh_command=CMD        run CMD instead of ssh
  sftp_server=PATH       run PATH on the server instead of the sftp subsystem
  transport=auto|ssh|native
                         auto (default): SSH in-process when ssh's configuration
                         for the host allows (plain TCP, host key in known_hosts,
                         keys usable without a prompt), else the ssh program;
                         ssh: always the ssh program; native: never it
  max_conns=N            SFTP sessions per server (default 4)
  timeout=S              every request to a server ends within S seconds, reconnects
                         and retries included (default 30)
  cache=full|meta|memory|off
                         full (default): memory caches, and file contents and
                         listings kept on disk; meta: listings only on disk;
                         memory: nothing on disk; off (or no): no caches
  cache_timeout=S        how long cached metadata is trusted (default 20;
                         sshfs 3 spells it dcache_timeout)
  dcache_stat_timeout=S, dcache_dir_timeout=S, dcache_link_timeout=S
                         the same for attributes, names and symlink targets alone
                         (default: cache_timeout; sshfs 2: cache_stat_timeout, ...)
  dcache_max_size=N      entries the memory cache holds at most (default 500000)
  dir_cache=yes|no       list subdirectories ahead of a walk (default yes)
  nocto                  opens trust metadata younger than cache_timeout instead of
                         asking the server (as sshfs; default: close-to-open)
  cache_dir=DIR          persistent cache directory (same as --cache-dir)
  cache_max_size=SIZE    file data kept on disk (default 10G; 0: no limit)
  fetch_whole=SIZE       fetch files read at random whole (default 256M; 0: off)
  cache_min_free=SIZE    free space left on the cache's file system (default 1G)
  offline=auto|off       serve the cache read-only while a server is unreachable
                         (default auto)
  entry_timeout=S        kernel cache time for names (default: cache_timeout)
  attr_timeout=S         kernel cache time for attributes (default: cache_timeout)
  negative_timeout=S     kernel cache time for missing names (default: cache_timeout)
  fsname=NAME            name shown in df and mount
  config=FILE            the config file (for fstab lines)
  compression=yes|no     ssh compression
  Name=value             any ssh_config option, passed to ssh
                         (IdentityFile, Ciphers, ProxyJump, ...)
  reconnect, kernel_cache, auto_cache, large_read, big_writes,
  dcache_clean_interval, dcache_min_clean_interval
                         accepted for sshfs compatibility: muxfs always behaves so,
                         or needs no such setting`

func main() {
	if err := newRoot().Execute(); err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "muxfs: "+oneLine(err.Error()))
		os.Exit(1)
	}
}

// exitError carries an exit status for an error that has already been reported.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// oneLine keeps error messages to the one line the user reads.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

type mountFlags struct {
	options    []string
	port       int
	sshConfig  string
	foreground bool
	debug      bool
	configFile string
	cacheDir   string
	version    bool
}

func newRoot() *cobra.Command {
	var mf mountFlags
	root := &cobra.Command{
		Use:           usage,
		Short:         "mount directories from several SSH servers into one local directory",
		Args:          cobra.ArbitraryArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if mf.version {
				fmt.Println("muxfs", version)
				return nil
			}
			if len(args) == 0 && mf.configFile == "" && len(mf.options) == 0 {
				return cmd.Help()
			}
			return runMount(mf, args)
		},
	}
	f := root.Flags()
	f.StringArrayVarP(&mf.options, "option", "o", nil, "mount options, comma-separated (see above)")
	f.IntVarP(&mf.port, "port", "p", 0, "ssh port")
	f.StringVarP(&mf.sshConfig, "ssh-config", "F", "", "ssh configuration file (ssh -F)")
	f.BoolVarP(&mf.foreground, "foreground", "f", false, "stay in the foreground")
	f.BoolVarP(&mf.debug, "debug", "d", false, "debug output (implies -f)")
	f.StringVar(&mf.configFile, "config", "", "TOML config file with the mount table")
	f.StringVar(&mf.cacheDir, "cache-dir", "", "persistent cache directory (default $XDG_CACHE_HOME/muxfs or ~/.cache/muxfs)")
	f.BoolVarP(&mf.version, "version", "V", false, "print the version")
	root.AddCommand(newUmount(), newDemo(), newRefresh(), newStatus(), newCache())
	return root
}
