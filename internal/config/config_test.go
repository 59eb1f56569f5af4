package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseSource(t *testing.T) {
	cases := []struct {
		in                   string
		host, user, dir, loc string
		port                 int
		err                  string
	}{
		{in: "login1:/home/me", host: "login1", dir: "/home/me"},
		{in: "me@login1:project", user: "me", host: "login1", dir: "project"},
		{in: "login1:", host: "login1"},
		{in: "a@b@host:/x", user: "a@b", host: "host", dir: "/x"},
		{in: "[::1]:/srv", host: "::1", dir: "/srv"},
		{in: "me@[fe80::1]:/srv", user: "me", host: "fe80::1", dir: "/srv"},
		{in: "sftp://me@gw:2222/data/x", user: "me", host: "gw", port: 2222, dir: "/data/x"},
		{in: "sftp://gw/~/rel", host: "gw", dir: "rel"},
		{in: "sftp://gw", host: "gw"},
		{in: "/local/dir", loc: "/local/dir"},
		{in: "./odd:name", loc: "./odd:name"},
		{in: "relative/dir", loc: "relative/dir"},
		{in: "", err: "empty source"},
		{in: ":/x", err: "no host name"},
		{in: "@host:/x", err: "empty user name"},
		{in: "-oProxyCommand=x:/d", err: "cannot begin with '-'"},
		{in: "-l@host:/d", err: "cannot begin with '-'"},
		{in: "sftp://-oProxyCommand=x/d", err: "cannot begin with '-'"},
		{in: "sftp://u:pw@host/d", err: "passwords in URLs"},
		{in: "sftp://host:99999/d", err: "port"},
		{in: "ftp://host/d", err: "only sftp://"},
		{in: "ho;st:/d", err: "characters a host name cannot have"},
		{in: "host\x00:/d", err: "NUL"},
	}
	for _, c := range cases {
		s, err := ParseSource(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: got error %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		if s.Host != c.host || s.User != c.user || s.Dir != c.dir || s.Local != c.loc || s.Port != c.port {
			t.Errorf("%q: got %+v", c.in, s)
		}
	}
}

func FuzzParseSource(f *testing.F) {
	for _, s := range []string{"h:/x", "u@h:d", "sftp://u@h:22/x", "[::1]:/x", "/l", "-o:x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := ParseSource(in)
		if err != nil || !s.IsRemote() {
			return
		}
		if s.Host == "" || strings.HasPrefix(s.Host, "-") || strings.HasPrefix(s.User, "-") {
			t.Errorf("%q accepted with host %q user %q", in, s.Host, s.User)
		}
	})
}

func TestOptions(t *testing.T) {
	c := &Config{Options: Defaults()}
	err := c.ApplyOptions(`allow_other,default_permissions,max_conns=8,port=2222,IdentityFile=/k,Ciphers=aes128-gcm@openssh.com\,aes256-gcm@openssh.com,attr_timeout=2.5,reconnect,ro,rw,_netdev,transport=native`)
	if err != nil {
		t.Fatal(err)
	}
	o := c.Options
	if !o.AllowOther || !o.DefaultPermissions || o.MaxConns != 8 || o.Port != 2222 || !o.ReadOnly || o.AttrTimeout != 2500*time.Millisecond || o.Transport != "native" {
		t.Errorf("options: %+v", o)
	}
	if strings.Join(o.SSHOptions, "|") != "IdentityFile=/k|Ciphers=aes128-gcm@openssh.com,aes256-gcm@openssh.com" {
		t.Errorf("ssh options: %q", o.SSHOptions)
	}
	for _, bad := range []string{"frob", "max_conns=0", "max_conns=x", "port=0", "allow_other=1", "IdentityFile", "attr_timeout=-1", "transport=tcp", "transport"} {
		if err := (&Config{Options: Defaults()}).ApplyOptions(bad); err == nil {
			t.Errorf("-o %s accepted", bad)
		}
	}
	if ConfigPath("ro,config=/etc/m.toml,x") != "/etc/m.toml" {
		t.Error("config= not found")
	}
}

func writeTOML(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "m.toml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadFile(t *testing.T) {
	p := writeTOML(t, `
mountpoint = "/mnt/hpc"

[options]
max_conns = 2
allow_other = true
ssh_options = ["IdentityFile=/k"]

[[mount]]
path = "/"
policy = "mfs"
sources = ["login1:/home/me", {url = "login1:/project/me", read_only = true}]

[[mount]]
path = "/FOO/"
sources = [{url = "gw1:/P/FOO", port = 2200, user = "layton", identity_file = "/id", ssh_options = ["Compression=yes"], max_conns = 1}]
`)
	c := &Config{Options: Defaults()}
	if err := c.LoadFile(p); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Mountpoint != "/mnt/hpc" || c.Options.MaxConns != 2 || !c.Options.AllowOther || len(c.Mounts) != 2 {
		t.Fatalf("config: %+v", c)
	}
	root, foo := c.Mounts[0], c.Mounts[1]
	if root.Path != "/" || root.Policy != "mfs" || len(root.Sources) != 2 || !root.Sources[1].ReadOnly {
		t.Errorf("root mount: %+v", root)
	}
	s := foo.Sources[0]
	if foo.Path != "/FOO" || s.Port != 2200 || s.User != "layton" || s.IdentityFile != "/id" || s.MaxConns != 1 || s.SSHOptions[0] != "Compression=yes" {
		t.Errorf("graft: %+v", foo)
	}
}

func TestLoadFileErrors(t *testing.T) {
	cases := []struct{ text, want string }{
		{"[[mount]\n", ":1:"},
		{"[options]\nmax_conns = 0\n", ":2: option -o max_conns=0"},
		{"[[mount]]\npath = \"/\"\nsources = [\"a:/x\"]\npolicy = \"best\"\n", ":4: unknown policy"},
		{"[[mount]]\npath = \"rel\"\nsources = [\"a:/x\"]\n", "must begin with /"},
		{"[[mount]]\npath = \"/\"\nsources = [\"a:/x\"]\n[[mount]]\npath = \"/\"\nsources = [\"b:/x\"]\n", "given twice"},
		{"[[mount]]\npath = \"/\"\nsources = []\n", "has no sources"},
		{"[[mount]]\npath = \"/\"\nsources = [{url = \"a:/x\", colour = 1}]\n", "unknown source setting"},
		{"[[mount]]\npath = \"/\"\nsources = [3]\n", "a source is a string"},
		{"[[mount]]\npath = \"/\"\nsources = [\"ok:/x\",\n \"-x:/y\"]\n", ":4: source"},
		{"unknown = 1\n", ":1: unknown setting"},
		{"[options]\nssh_options = [\"Bogus=1\"]\n", "not an ssh_config option"},
	}
	for _, c := range cases {
		p := writeTOML(t, c.text)
		err := (&Config{Options: Defaults()}).LoadFile(p)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want %q", c.text, err, c.want)
		}
	}
}

// FuzzOptions: any -o list is applied or refused with an error, never a panic, and
// what is accepted stays within the documented ranges.
func FuzzOptions(f *testing.F) {
	for _, s := range []string{"allow_other,max_conns=8", "timeout=0.5", "cache=meta,cache_max_size=1.5G", "cache_min_free=NaN", "IdentityFile=/k", `a\,b`, "cache_timeout=-1", "port=0", "dcache_stat_timeout=3,dcache_max_size=10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		c := &Config{Options: Defaults()}
		if err := c.ApplyOptions(in); err != nil {
			return
		}
		o := c.Options
		if o.MaxConns < 1 || o.MaxConns > 64 || o.Timeout < 100*time.Millisecond || o.Port < 0 || o.Port > 65535 || o.CacheTimeout < 0 ||
			o.CacheMaxSize < 0 || (o.CacheMaxSize > 0 && o.CacheMaxSize < 1<<20) || o.CacheMinFree < 0 || o.CacheEntries < 0 ||
			min(o.StatTimeout, o.DirTimeout, o.LinkTimeout) < -1 ||
			(o.DiskCache != DiskOff && o.DiskCache != DiskMeta && o.DiskCache != DiskFull) {
			t.Errorf("%q accepted out of range: %+v", in, o)
		}
	})
}

// FuzzConfigFile: any file content loads or fails with an error naming the file.
func FuzzConfigFile(f *testing.F) {
	f.Add("[[mount]]\npath = \"/\"\nsources = [\"h:/x\", { url = \"g:/y\", replicas = [\"k:/y\"], on_down = \"fail-closed\" }]\n")
	f.Add("mountpoint = \"~/m\"\n[options]\ntimeout = 5\n")
	f.Add("[[mount]]\npath = \"x\"")
	f.Fuzz(func(t *testing.T, content string) {
		file := filepath.Join(t.TempDir(), "c.toml")
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		c := &Config{Options: Defaults()}
		if err := c.LoadFile(file); err != nil {
			if !strings.Contains(err.Error(), file) && !strings.Contains(err.Error(), "source") && !strings.Contains(err.Error(), "option") {
				t.Errorf("error does not say where: %v", err)
			}
			return
		}
		for _, m := range c.Mounts {
			for _, s := range m.Sources {
				for _, r := range append([]Source{s}, s.Replicas...) {
					if r.IsRemote() && (r.Host == "" || strings.HasPrefix(r.Host, "-")) {
						t.Errorf("accepted source %+v", r)
					}
				}
			}
		}
	})
}

func TestCacheOptions(t *testing.T) {
	c := &Config{Options: Defaults()}
	if c.Options.DiskCache != DiskFull || !c.Options.Offline || c.Options.CacheMaxSize != 10<<30 {
		t.Errorf("defaults: %+v", c.Options)
	}
	if err := c.ApplyOptions("cache=meta,cache_max_size=512M,cache_min_free=2g,offline=off,cache_dir=/x,fetch_whole=64M"); err != nil {
		t.Fatal(err)
	}
	o := c.Options
	if o.DiskCache != DiskMeta || o.CacheMaxSize != 512<<20 || o.CacheMinFree != 2<<30 || o.Offline || o.CacheDir != "/x" || o.FetchWhole != 64<<20 {
		t.Errorf("got %+v", o)
	}
	if err := c.ApplyOptions("cache=no"); err != nil || c.Options.Cache || c.Options.DiskCache != DiskOff {
		t.Errorf("cache=no: %+v %v", c.Options, err)
	}
	for _, bad := range []string{"cache=maybe", "cache_max_size=lots", "cache_max_size=-1", "offline=sometimes"} {
		if err := c.ApplyOptions(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// TestSSHFSCacheTimeouts: sshfs 3's dcache_* options and sshfs 2's cache_* spellings
// set the memory cache's timeouts per kind, which the kernel's timeouts follow.
func TestSSHFSCacheTimeouts(t *testing.T) {
	apply := func(opts string) Options {
		t.Helper()
		c := &Config{Options: Defaults()}
		if err := c.ApplyOptions(opts); err != nil {
			t.Fatalf("-o %s: %v", opts, err)
		}
		return c.Options
	}
	s := time.Second
	o := apply("")
	if stat, dir, link := o.MetaTimeouts(); stat != 20*s || dir != 20*s || link != 20*s || o.ListingTimeout() != 20*s {
		t.Errorf("defaults: %v %v %v", stat, dir, link)
	}
	for _, opts := range []string{"dcache_timeout=7", "cache_timeout=7"} {
		o := apply(opts)
		stat, dir, link := o.MetaTimeouts()
		entry, attr, negative := o.KernelTimeouts()
		if stat != 7*s || dir != 7*s || link != 7*s || entry != 7*s || attr != 7*s || negative != 7*s {
			t.Errorf("-o %s: meta %v %v %v, kernel %v %v %v", opts, stat, dir, link, entry, attr, negative)
		}
	}
	for _, opts := range []string{
		"dcache_timeout=30,dcache_stat_timeout=2,dcache_dir_timeout=60,dcache_link_timeout=5",
		"cache_timeout=30,cache_stat_timeout=2,cache_dir_timeout=60,cache_link_timeout=5",
	} {
		o := apply(opts)
		stat, dir, link := o.MetaTimeouts()
		entry, attr, negative := o.KernelTimeouts()
		if stat != 2*s || dir != 60*s || link != 5*s {
			t.Errorf("-o %s: meta %v %v %v", opts, stat, dir, link)
		}
		// A listing holds names and attributes: kept for the shorter.
		if o.ListingTimeout() != 2*s {
			t.Errorf("-o %s: listings kept %v", opts, o.ListingTimeout())
		}
		if entry != 60*s || attr != 2*s || negative != 60*s {
			t.Errorf("-o %s: kernel %v %v %v", opts, entry, attr, negative)
		}
	}
	// The kernel's own options still win.
	o = apply("dcache_stat_timeout=2,attr_timeout=9,entry_timeout=1")
	if entry, attr, _ := o.KernelTimeouts(); entry != s || attr != 9*s {
		t.Errorf("explicit kernel timeouts: %v %v", entry, attr)
	}
	if o := apply("dcache_max_size=1000,dcache_clean_interval=60,dcache_min_clean_interval=5,cache_clean_interval=60"); o.CacheEntries != 1000 {
		t.Errorf("dcache_max_size: %d", o.CacheEntries)
	}
	for bad, want := range map[string]string{
		"dcache_max_size=0":      "at least 1",
		"dcache_max_size=many":   "number of entries",
		"dcache_stat_timeout=-2": "number of seconds",
		"dcache_link_timeout":    "dcache_link_timeout",
		"cache_max_size=10000":   "dcache_max_size",
		"cache_max_size=512K":    "too small",
		"dcache_timeout=forever": "number of seconds",
	} {
		c := &Config{Options: Defaults()}
		if err := c.ApplyOptions(bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("-o %s: %v, want an error saying %q", bad, err, want)
		}
	}
	if o := apply("cache_max_size=0"); o.CacheMaxSize != 0 {
		t.Errorf("cache_max_size=0 (no limit): %d", o.CacheMaxSize)
	}
}

func TestNoCTO(t *testing.T) {
	mount := func(opts string) (*Config, error) {
		c := &Config{Options: Defaults(), Mountpoint: "/mnt"}
		if err := c.AddSourcesAtRoot([]string{"h:/d"}); err != nil {
			t.Fatal(err)
		}
		if err := c.ApplyOptions(opts); err != nil {
			return c, err
		}
		return c, c.Validate()
	}
	if c, err := mount("nocto"); err != nil || !c.Options.NoCTO {
		t.Errorf("nocto: %v, NoCTO %v", err, c.Options.NoCTO)
	}
	if c, err := mount("nocto,cto"); err != nil || c.Options.NoCTO {
		t.Errorf("nocto,cto: %v, NoCTO %v", err, c.Options.NoCTO)
	}
	// Without the persistent cache of contents nocto would change nothing: refused.
	for _, bad := range []string{"nocto,cache=meta", "nocto,cache=memory", "nocto,cache=no", "nocto=yes", "cto=1"} {
		if _, err := mount(bad); err == nil {
			t.Errorf("-o %s accepted", bad)
		}
	}
}
