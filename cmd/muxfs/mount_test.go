package main

import (
	"log"
	"testing"
	"time"

	"github.com/muxfs/muxfs/internal/config"
	"github.com/muxfs/muxfs/internal/mountinfo"
)

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/tab\011x`: "/tab\tx", `/plain`: "/plain", `/bad\9`: `/bad\9`} {
		if got := mountinfo.Unescape(in); got != want {
			t.Errorf("%q: got %q, want %q", in, got, want)
		}
	}
}

func TestBuildConfig(t *testing.T) {
	flags := log.Flags()
	t.Cleanup(func() { log.SetFlags(flags) })
	log.SetFlags(log.LstdFlags)
	cfg, err := buildConfig(mountFlags{options: []string{"max_conns=2", "ro"}, port: 2222, debug: true},
		[]string{"h1:/a", "u@h2:b", "/mnt/x"})
	if err != nil {
		t.Fatal(err)
	}
	o := cfg.Options
	if cfg.Mountpoint != "/mnt/x" || o.MaxConns != 2 || !o.ReadOnly || o.Port != 2222 || !o.Foreground {
		t.Errorf("config: %+v", cfg)
	}
	if len(cfg.Mounts) != 1 || len(cfg.Mounts[0].Sources) != 2 || cfg.Mounts[0].Policy != config.PolicyEPFF {
		t.Errorf("mounts: %+v", cfg.Mounts)
	}
	if log.Flags()&log.Lmicroseconds == 0 {
		t.Error("-d leaves the request trace stamped in whole seconds")
	}
	if got := fsName(cfg); got != "h1:/a+1" {
		t.Errorf("fsname: %q", got)
	}
	if _, err := buildConfig(mountFlags{}, []string{"/mnt/x"}); err == nil {
		t.Error("no sources accepted")
	}
}

// TestNewMeta: the memory cache gets sshfs' per-kind timeouts (listings the shorter of
// attributes' and names', symlink targets their own) and dcache_max_size.
func TestNewMeta(t *testing.T) {
	o := config.Defaults()
	m := newMeta(&o)
	if m.TTL != 20*time.Second || m.LinkTTL != 20*time.Second || m.MaxEntries <= 0 {
		t.Errorf("defaults: TTL %v, LinkTTL %v, MaxEntries %d", m.TTL, m.LinkTTL, m.MaxEntries)
	}
	c := &config.Config{Options: config.Defaults()}
	if err := c.ApplyOptions("dcache_stat_timeout=3,dcache_dir_timeout=60,dcache_link_timeout=7,dcache_max_size=1000"); err != nil {
		t.Fatal(err)
	}
	m = newMeta(&c.Options)
	if m.TTL != 3*time.Second || m.LinkTTL != 7*time.Second || m.MaxEntries != 1000 {
		t.Errorf("TTL %v, LinkTTL %v, MaxEntries %d; want 3s, 7s, 1000", m.TTL, m.LinkTTL, m.MaxEntries)
	}
}
