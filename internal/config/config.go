package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Placement policies for new files and directories in a union (mergerfs names).
const (
	PolicyEPFF  = "epff"  // first writable source where the parent directory exists
	PolicyFF    = "ff"    // first writable source; the parent path is created there
	PolicyMFS   = "mfs"   // writable source with the most free space; parent path created
	PolicyEPMFS = "epmfs" // most free space among those where the parent exists
)

var policies = []string{PolicyEPFF, PolicyFF, PolicyMFS, PolicyEPMFS}

// Mount places sources at a path of the mounted tree. Several sources form a union.
type Mount struct {
	Path    string // absolute, cleaned: "/" or "/FOO"
	Policy  string
	Sources []Source
}

// Values of -o cache= for the persistent cache.
const (
	DiskOff  = "off"
	DiskMeta = "meta"
	DiskFull = "full"
)

// Options are the mount-wide settings. Names follow sshfs where the meaning is the same.
type Options struct {
	Foreground         bool
	Debug              bool
	AllowOther         bool
	DefaultPermissions bool
	ReadOnly           bool
	NonEmpty           bool
	FsName             string

	// ssh
	Port       int
	ConfigFile string
	SSHCommand []string
	SFTPServer string
	Transport  string // auto (""), ssh or native: how SFTP sessions reach the server
	SSHOptions []string
	MaxConns   int
	// Timeout bounds every request to a server, reconnects and retries included; a
	// session that leaves requests unanswered this long is dropped.
	Timeout time.Duration

	// Memory caches (sshfs names): attributes, listings, missing names and symlink
	// targets are kept for CacheTimeout, or per kind for StatTimeout, DirTimeout and
	// LinkTimeout (negative: CacheTimeout), up to CacheEntries entries; DirCache also
	// lists subdirectories ahead of a walk.
	Cache        bool
	CacheTimeout time.Duration
	StatTimeout  time.Duration
	DirTimeout   time.Duration
	LinkTimeout  time.Duration
	CacheEntries int
	DirCache     bool
	// NoCTO turns close-to-open off: an open for reading trusts attributes a server
	// gave within CacheTimeout instead of asking again (NFS' nocto).
	NoCTO bool

	// The persistent cache: DiskCache is "off", "meta" (listings kept across mounts)
	// or "full" (file contents too), in CacheDir ("": the default directory), within
	// CacheMaxSize bytes of data and leaving CacheMinFree bytes free; Offline serves
	// it read-only while a source is unreachable.
	DiskCache    string
	CacheDir     string
	CacheMaxSize int64
	CacheMinFree int64
	// FetchWhole: files read at random up to this size are fetched whole into the
	// persistent cache in the background (0: never).
	FetchWhole int64
	Offline    bool

	// Kernel cache timeouts; negative means "the same as CacheTimeout" (or, with the
	// caches off, libfuse's defaults of 1 s, 1 s and 0 s).
	EntryTimeout    time.Duration
	AttrTimeout     time.Duration
	NegativeTimeout time.Duration
}

// MetaTimeouts resolves sshfs' per-kind timeouts: attributes (stat), names (dir:
// listings and missing names) and symlink targets (link).
func (o *Options) MetaTimeouts() (stat, dir, link time.Duration) {
	or := func(v time.Duration) time.Duration {
		if v >= 0 {
			return v
		}
		return o.CacheTimeout
	}
	return or(o.StatTimeout), or(o.DirTimeout), or(o.LinkTimeout)
}

// ListingTimeout is how long muxfs keeps a listing, and the kernel its copy: a
// listing carries names and their attributes together, so the shorter of the two
// timeouts.
func (o *Options) ListingTimeout() time.Duration {
	stat, dir, _ := o.MetaTimeouts()
	return min(stat, dir)
}

// KernelTimeouts resolves the kernel's entry, attribute and negative-entry timeouts.
// With the caches on they follow the names' and the attributes' timeouts, so that a
// warm tree is answered by the kernel itself; changes made through the mount are seen
// at once either way, and `muxfs refresh` drops everything for a subtree.
func (o *Options) KernelTimeouts() (entry, attr, negative time.Duration) {
	stat, dir, _ := o.MetaTimeouts()
	pick := func(v, cached, plain time.Duration) time.Duration {
		switch {
		case v >= 0:
			return v
		case o.Cache:
			return cached
		}
		return plain
	}
	return pick(o.EntryTimeout, dir, time.Second),
		pick(o.AttrTimeout, stat, time.Second),
		pick(o.NegativeTimeout, dir, 0)
}

// Config is the whole mount: where, what, how.
type Config struct {
	Mountpoint string
	Mounts     []Mount
	Options    Options
}

// Defaults returns the options a mount starts from.
func Defaults() Options {
	return Options{
		MaxConns:        4,
		Timeout:         30 * time.Second,
		Cache:           true,
		DiskCache:       DiskFull,
		CacheMaxSize:    10 << 30,
		FetchWhole:      256 << 20,
		CacheMinFree:    1 << 30,
		Offline:         true,
		CacheTimeout:    20 * time.Second, // sshfs' default
		StatTimeout:     -1,
		DirTimeout:      -1,
		LinkTimeout:     -1,
		DirCache:        true,
		EntryTimeout:    -1,
		AttrTimeout:     -1,
		NegativeTimeout: -1,
	}
}

// sshOptionNames are the ssh_config(5) keywords accepted as `-o Name=value` and passed
// to ssh, as sshfs does. Matching is case-insensitive, like ssh's.
var sshOptionNames = map[string]bool{}

func init() {
	for _, n := range strings.Fields(`AddKeysToAgent AddressFamily BatchMode BindAddress
		BindInterface CanonicalDomains CanonicalizeFallbackLocal CanonicalizeHostname
		CanonicalizeMaxDots CanonicalizePermittedCNAMEs CASignatureAlgorithms CertificateFile
		CheckHostIP Ciphers Compression ConnectionAttempts ConnectTimeout ControlMaster
		ControlPath ControlPersist EnableEscapeCommandline EscapeChar FingerprintHash
		GlobalKnownHostsFile GSSAPIAuthentication GSSAPIDelegateCredentials HashKnownHosts
		HostbasedAcceptedAlgorithms HostbasedAuthentication HostKeyAlgorithms HostKeyAlias
		HostName IdentitiesOnly IdentityAgent IdentityFile IPQoS KbdInteractiveAuthentication
		KbdInteractiveDevices KexAlgorithms KnownHostsCommand LogLevel LogVerbose MACs
		NoHostAuthenticationForLocalhost NumberOfPasswordPrompts PasswordAuthentication
		PKCS11Provider Port PreferredAuthentications ProxyCommand ProxyJump ProxyUseFdpass
		PubkeyAcceptedAlgorithms PubkeyAcceptedKeyTypes PubkeyAuthentication RekeyLimit
		RequiredRSASize RevokedHostKeys SecurityKeyProvider SendEnv ServerAliveCountMax
		ServerAliveInterval SetEnv StrictHostKeyChecking TCPKeepAlive UpdateHostKeys User
		UserKnownHostsFile VerifyHostKeyDNS VisualHostKey`) {
		sshOptionNames[strings.ToLower(n)] = true
	}
}

// acceptedNoOps are sshfs options muxfs takes for compatibility (existing fstab lines
// and scripts keep working) without anything to do: their behaviour is built in.
var acceptedNoOps = map[string]string{
	"reconnect":     "muxfs always reconnects",
	"kernel_cache":  "muxfs keeps the page cache while a file is unchanged",
	"auto_cache":    "muxfs keeps the page cache while a file is unchanged",
	"large_read":    "muxfs always uses large requests",
	"big_writes":    "muxfs always uses large requests",
	"delay_connect": "muxfs connects at mount to report errors at once",
	// sshfs' cleaning intervals: muxfs drops an expired entry when it meets it, and
	// half the entries when dcache_max_size is reached.
	"dcache_clean_interval":     "muxfs drops expired entries as it meets them",
	"dcache_min_clean_interval": "muxfs drops expired entries as it meets them",
	"cache_clean_interval":      "muxfs drops expired entries as it meets them",
	"cache_min_clean_interval":  "muxfs drops expired entries as it meets them",
	// Standard mount(8) options that mount.fuse3 passes on.
	"rw": "", "dev": "", "nodev": "", "suid": "", "nosuid": "", "exec": "", "noexec": "",
	"atime": "", "noatime": "", "nodiratime": "", "relatime": "", "async": "", "auto": "",
	"noauto": "", "user": "", "nouser": "", "users": "", "_netdev": "", "nofail": "", "defaults": "",
}

// ApplyOptions applies a comma-separated `-o` list. Unknown options are errors: a typo
// must not silently mount with different settings.
func (c *Config) ApplyOptions(list string) error {
	for _, item := range splitOptions(list) {
		if item == "" {
			continue
		}
		key, val, hasVal := strings.Cut(item, "=")
		if err := c.applyOption(key, val, hasVal); err != nil {
			return err
		}
	}
	return nil
}

// splitOptions splits on commas not escaped with a backslash (sshfs convention).
func splitOptions(s string) []string {
	var out []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case s[i] == ',':
			out = append(out, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(s[i])
		}
	}
	return append(out, cur.String())
}

func (c *Config) applyOption(key, val string, hasVal bool) error {
	o := &c.Options
	needVal := func() error {
		if !hasVal || val == "" {
			return fmt.Errorf("option -o %s needs a value: -o %s=VALUE", key, key)
		}
		return nil
	}
	flag := func(dst *bool) error {
		if hasVal {
			return fmt.Errorf("option -o %s takes no value", key)
		}
		*dst = true
		return nil
	}
	yesNo := func(dst *bool) error {
		switch val {
		case "yes":
			*dst = true
		case "no":
			*dst = false
		default:
			return fmt.Errorf("option -o %s=%s: want yes or no", key, val)
		}
		return nil
	}
	seconds := func(dst *time.Duration) error {
		if err := needVal(); err != nil {
			return err
		}
		f, err := strconv.ParseFloat(val, 64)
		if err != nil || f < 0 {
			return fmt.Errorf("option -o %s=%s: want a number of seconds", key, val)
		}
		*dst = time.Duration(f * float64(time.Second))
		return nil
	}
	switch key {
	case "allow_other":
		return flag(&o.AllowOther)
	case "default_permissions":
		return flag(&o.DefaultPermissions)
	case "ro":
		return flag(&o.ReadOnly)
	case "nonempty":
		return flag(&o.NonEmpty)
	case "debug":
		o.Debug = true
		return nil
	case "fsname":
		if err := needVal(); err != nil {
			return err
		}
		o.FsName = val
	case "port":
		if err := needVal(); err != nil {
			return err
		}
		return setPort(&o.Port, val)
	case "ssh_command":
		if err := needVal(); err != nil {
			return err
		}
		o.SSHCommand = strings.Fields(val)
	case "sftp_server":
		if err := needVal(); err != nil {
			return err
		}
		o.SFTPServer = val
	case "transport":
		if err := needVal(); err != nil {
			return err
		}
		if val != "auto" && val != "ssh" && val != "native" {
			return fmt.Errorf("option -o transport=%s: want auto, ssh or native", val)
		}
		o.Transport = val
	case "max_conns":
		if err := needVal(); err != nil {
			return err
		}
		n, err := strconv.Atoi(val)
		if err != nil || n < 1 || n > 64 {
			return fmt.Errorf("option -o max_conns=%s: want a number from 1 to 64", val)
		}
		o.MaxConns = n
	case "timeout":
		if err := seconds(&o.Timeout); err != nil {
			return err
		}
		if o.Timeout < 100*time.Millisecond {
			return fmt.Errorf("option -o timeout=%s: want at least 0.1 seconds (requests must end some time)", val)
		}
	case "cache":
		// sshfs' yes/no turns the memory caches on or off; off, memory (memory
		// caches only), meta and full also choose what the persistent cache keeps.
		switch val {
		case "yes":
			o.Cache = true
		case "no", DiskOff:
			o.Cache, o.DiskCache = false, DiskOff
		case "memory":
			o.Cache, o.DiskCache = true, DiskOff
		case DiskMeta, DiskFull:
			o.Cache, o.DiskCache = true, val
		default:
			return fmt.Errorf("option -o cache=%s: want off, memory, meta or full (or yes/no as in sshfs)", val)
		}
	case "cache_dir":
		if err := needVal(); err != nil {
			return err
		}
		o.CacheDir = expandHome(val)
	case "cache_max_size", "cache_min_free", "fetch_whole":
		if err := needVal(); err != nil {
			return err
		}
		n, err := ParseSize(val)
		if err != nil {
			return fmt.Errorf("option -o %s=%s: %v", key, val, err)
		}
		switch key {
		case "cache_max_size":
			if n > 0 && n < 1<<20 {
				// sshfs 2 had an option of this name counting cached entries (10000
				// by default): taken as bytes, an old fstab line would leave the
				// persistent cache next to nothing.
				return fmt.Errorf("option -o cache_max_size=%s: under 1M is too small for the persistent cache's data (a size such as 10G; 0: no limit); sshfs' count of cached entries is -o dcache_max_size=N", val)
			}
			o.CacheMaxSize = n
		case "cache_min_free":
			o.CacheMinFree = n
		default:
			o.FetchWhole = n
		}
	case "offline":
		switch val {
		case "auto":
			o.Offline = true
		case "off":
			o.Offline = false
		default:
			return fmt.Errorf("option -o offline=%s: want auto or off", val)
		}
	case "dir_cache":
		return yesNo(&o.DirCache)
	case "nocto":
		return flag(&o.NoCTO)
	case "cto":
		// NFS' spelling of the default, for a line that wants to say it.
		var cto bool
		if err := flag(&cto); err != nil {
			return err
		}
		o.NoCTO = false
	// sshfs 3 spells its cache options dcache_*, sshfs 2 cache_*: fstab lines of both
	// work unchanged.
	case "cache_timeout", "dcache_timeout":
		return seconds(&o.CacheTimeout)
	case "cache_stat_timeout", "dcache_stat_timeout":
		return seconds(&o.StatTimeout)
	case "cache_dir_timeout", "dcache_dir_timeout":
		return seconds(&o.DirTimeout)
	case "cache_link_timeout", "dcache_link_timeout":
		return seconds(&o.LinkTimeout)
	case "dcache_max_size":
		if err := needVal(); err != nil {
			return err
		}
		n, err := strconv.Atoi(val)
		if err != nil || n < 1 {
			return fmt.Errorf("option -o dcache_max_size=%s: want a number of entries, at least 1", val)
		}
		o.CacheEntries = n
	case "entry_timeout":
		return seconds(&o.EntryTimeout)
	case "attr_timeout":
		return seconds(&o.AttrTimeout)
	case "negative_timeout":
		return seconds(&o.NegativeTimeout)
	case "config":
		// Handled by the command line before the other options; accepted here so that
		// an fstab line can carry it.
		return nil
	case "compression":
		// sshfs spells it in lower case with yes/no.
		if err := needVal(); err != nil {
			return err
		}
		o.SSHOptions = append(o.SSHOptions, "Compression="+val)
	default:
		if _, ok := acceptedNoOps[key]; ok {
			return nil
		}
		if sshOptionNames[strings.ToLower(key)] {
			if err := needVal(); err != nil {
				return err
			}
			o.SSHOptions = append(o.SSHOptions, key+"="+val)
			return nil
		}
		return fmt.Errorf("unknown option -o %s — see `muxfs --help` for the list", key)
	}
	return nil
}

// ParseSize reads a size: a number of bytes with an optional K, M, G or T suffix
// (powers of 1024; "10G", "512M"); 0 means no limit.
func ParseSize(s string) (int64, error) {
	mult := int64(1)
	num := strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B")
	if num != "" {
		switch num[len(num)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			num = num[:len(num)-1]
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || !(f >= 0 && f*float64(mult) <= 1<<62) {
		return 0, fmt.Errorf("want a size such as 10G, 512M or 0")
	}
	return int64(f * float64(mult)), nil
}

func setPort(dst *int, val string) error {
	n, err := strconv.Atoi(val)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q: want a number from 1 to 65535", val)
	}
	*dst = n
	return nil
}

// ConfigPath returns the value of a `config=FILE` item in a -o list, if any.
func ConfigPath(list string) string {
	for _, item := range splitOptions(list) {
		if v, ok := strings.CutPrefix(item, "config="); ok {
			return v
		}
	}
	return ""
}

// AddSourcesAtRoot adds command-line sources to the union at "/".
func (c *Config) AddSourcesAtRoot(args []string) error {
	for _, a := range args {
		s, err := ParseSource(a)
		if err != nil {
			return err
		}
		i := c.mountIndex("/")
		if i < 0 {
			c.Mounts = append(c.Mounts, Mount{Path: "/", Policy: PolicyEPFF})
			i = len(c.Mounts) - 1
		}
		c.Mounts[i].Sources = append(c.Mounts[i].Sources, s)
	}
	return nil
}

func (c *Config) mountIndex(p string) int {
	for i := range c.Mounts {
		if c.Mounts[i].Path == p {
			return i
		}
	}
	return -1
}

// Validate checks the whole table once everything is applied.
func (c *Config) Validate() error {
	if len(c.Mounts) == 0 {
		return errors.New("no source given: muxfs [OPTIONS] SOURCE... MOUNTPOINT (or --config FILE)")
	}
	if c.Mountpoint == "" {
		return errors.New("no mount point given: muxfs [OPTIONS] SOURCE... MOUNTPOINT")
	}
	sort.SliceStable(c.Mounts, func(i, j int) bool { return c.Mounts[i].Path < c.Mounts[j].Path })
	for _, m := range c.Mounts {
		if len(m.Sources) == 0 {
			return fmt.Errorf("mount path %s has no sources", m.Path)
		}
	}
	if c.Options.NoCTO && (!c.Options.Cache || c.Options.DiskCache != DiskFull) {
		// Only a file held whole on disk can open with no request: nocto would
		// silently do nothing.
		return errors.New("option -o nocto works through the persistent cache of file contents: " +
			"drop the -o cache= option (cache=full is the default) or drop nocto")
	}
	return nil
}

// tomlFile is the config file's shape. See docs/configuration.md.
type tomlFile struct {
	Mountpoint string         `toml:"mountpoint"`
	Options    map[string]any `toml:"options"`
	Mount      []tomlMount    `toml:"mount"`
}

type tomlMount struct {
	Path    string       `toml:"path"`
	Policy  string       `toml:"policy"`
	Sources []tomlSource `toml:"sources"`
}

// tomlSource is a source string, or a table with the string in `url` and settings.
type tomlSource struct {
	URL          string   `toml:"url"`
	ReadOnly     bool     `toml:"read_only"`
	NoCreate     bool     `toml:"no_create"`
	Port         int      `toml:"port"`
	User         string   `toml:"user"`
	IdentityFile string   `toml:"identity_file"`
	SSHOptions   []string `toml:"ssh_options"`
	MaxConns     int      `toml:"max_conns"`
	Replicas     []string `toml:"replicas"`
	OnDown       string   `toml:"on_down"`
}

func (s *tomlSource) UnmarshalTOML(v any) error {
	switch v := v.(type) {
	case string:
		s.URL = v
		return nil
	case map[string]any:
		known := map[string]bool{"url": true, "read_only": true, "no_create": true, "port": true,
			"user": true, "identity_file": true, "ssh_options": true, "max_conns": true,
			"replicas": true, "on_down": true}
		for k := range v {
			if !known[k] {
				return fmt.Errorf("unknown source setting %q (known: url, replicas, read_only, no_create, on_down, port, user, identity_file, ssh_options, max_conns)", k)
			}
		}
		get := func(k string, dst any) error {
			raw, ok := v[k]
			if !ok {
				return nil
			}
			switch d := dst.(type) {
			case *string:
				x, ok := raw.(string)
				if !ok {
					return fmt.Errorf("source setting %s must be a string", k)
				}
				*d = x
			case *bool:
				x, ok := raw.(bool)
				if !ok {
					return fmt.Errorf("source setting %s must be true or false", k)
				}
				*d = x
			case *int:
				x, ok := raw.(int64)
				if !ok {
					return fmt.Errorf("source setting %s must be a whole number", k)
				}
				*d = int(x)
			case *[]string:
				arr, ok := raw.([]any)
				if !ok {
					return fmt.Errorf("source setting %s must be a list of strings", k)
				}
				for _, e := range arr {
					x, ok := e.(string)
					if !ok {
						return fmt.Errorf("source setting %s must be a list of strings", k)
					}
					*d = append(*d, x)
				}
			}
			return nil
		}
		for k, dst := range map[string]any{"url": &s.URL, "read_only": &s.ReadOnly, "no_create": &s.NoCreate,
			"port": &s.Port, "user": &s.User, "identity_file": &s.IdentityFile, "ssh_options": &s.SSHOptions,
			"max_conns": &s.MaxConns, "replicas": &s.Replicas, "on_down": &s.OnDown} {
			if err := get(k, dst); err != nil {
				return err
			}
		}
		if s.URL == "" {
			return errors.New("a source table needs url = \"host:dir\"")
		}
		return nil
	}
	return fmt.Errorf("a source is a string \"host:dir\" or a table {url = \"host:dir\", ...}, not %T", v)
}

// LoadFile reads a TOML config file into c. Errors name the file and, where it can be
// found, the line.
func (c *Config) LoadFile(file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("config file: %v", err)
	}
	var tf tomlFile
	md, err := toml.Decode(string(data), &tf)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			// Count from the byte offset: the parser puts an error found at a line's
			// end (an unclosed bracket) on the next line.
			line := pe.Position.Line
			if pe.Position.Start >= 0 && pe.Position.Start <= len(data) {
				line = bytes.Count(data[:pe.Position.Start], []byte("\n")) + 1
			}
			return fmt.Errorf("%s:%d: %s", file, line, pe.Message)
		}
		return fmt.Errorf("%s:%d: %v", file, lineOfError(string(data), err), err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		k := und[0]
		return fmt.Errorf("%s:%d: unknown setting %q", file, lineOf(string(data), k[len(k)-1]), k.String())
	}
	at := func(needle string) string { return fmt.Sprintf("%s:%d", file, lineOf(string(data), needle)) }
	if tf.Mountpoint != "" {
		c.Mountpoint = expandHome(tf.Mountpoint)
	}
	for k, v := range tf.Options {
		if err := c.applyTOMLOption(k, v); err != nil {
			return fmt.Errorf("%s: %v", at(k), err)
		}
	}
	for _, m := range tf.Mount {
		where := at(`"` + m.Path + `"`)
		if m.Path == "" {
			return fmt.Errorf("%s: a [[mount]] needs path = \"/...\"", file)
		}
		if !strings.HasPrefix(m.Path, "/") {
			return fmt.Errorf("%s: mount path %q must begin with /", where, m.Path)
		}
		p := path.Clean(m.Path)
		if c.mountIndex(p) >= 0 {
			return fmt.Errorf("%s: mount path %s is given twice; list all its sources in one [[mount]]", where, p)
		}
		if m.Policy == "" {
			m.Policy = PolicyEPFF
		}
		if !validPolicy(m.Policy) {
			return fmt.Errorf("%s: unknown policy %q (known: %s)", at(m.Policy), m.Policy, strings.Join(policies, ", "))
		}
		mount := Mount{Path: p, Policy: m.Policy}
		for _, ts := range m.Sources {
			s, err := ParseSource(expandHome(ts.URL))
			if err != nil {
				return fmt.Errorf("%s: %v", at(ts.URL), err)
			}
			s.ReadOnly, s.NoCreate = ts.ReadOnly, ts.NoCreate
			if ts.Port != 0 {
				if s.Local != "" {
					return fmt.Errorf("%s: port set for local source %s", at(ts.URL), ts.URL)
				}
				s.Port = ts.Port
			}
			if ts.User != "" {
				s.User = ts.User
			}
			s.IdentityFile = expandHome(ts.IdentityFile)
			s.SSHOptions = ts.SSHOptions
			s.MaxConns = ts.MaxConns
			if err := checkHostUser(&s); s.IsRemote() && err != nil {
				return fmt.Errorf("%s: %v", at(ts.URL), err)
			}
			switch ts.OnDown {
			case "", "degraded":
			case "fail-closed":
				s.FailClosed = true
			default:
				return fmt.Errorf("%s: on_down = %q: want \"degraded\" or \"fail-closed\"", at(ts.OnDown), ts.OnDown)
			}
			for _, r := range ts.Replicas {
				rs, err := ParseSource(r)
				if err != nil {
					return fmt.Errorf("%s: replica: %v", at(r), err)
				}
				if !s.IsRemote() || !rs.IsRemote() {
					return fmt.Errorf("%s: replicas are SSH servers: %q and its replicas must all be host:dir", at(r), ts.URL)
				}
				if ts.Port != 0 && rs.Port == 0 {
					rs.Port = ts.Port
				}
				if ts.User != "" && rs.User == "" {
					rs.User = ts.User
				}
				if err := checkHostUser(&rs); err != nil {
					return fmt.Errorf("%s: %v", at(r), err)
				}
				s.Replicas = append(s.Replicas, rs)
			}
			mount.Sources = append(mount.Sources, s)
		}
		if len(mount.Sources) == 0 {
			return fmt.Errorf("%s: mount path %s has no sources", where, p)
		}
		c.Mounts = append(c.Mounts, mount)
	}
	return nil
}

func validPolicy(p string) bool {
	for _, q := range policies {
		if p == q {
			return true
		}
	}
	return false
}

func (c *Config) applyTOMLOption(k string, v any) error {
	switch v := v.(type) {
	case bool:
		if !v {
			return nil
		}
		return c.applyOption(k, "", false)
	case string:
		return c.applyOption(k, v, true)
	case int64:
		return c.applyOption(k, strconv.FormatInt(v, 10), true)
	case float64:
		return c.applyOption(k, strconv.FormatFloat(v, 'f', -1, 64), true)
	case []any:
		if k != "ssh_options" {
			return fmt.Errorf("option %s takes one value, not a list", k)
		}
		for _, e := range v {
			s, ok := e.(string)
			if !ok || !strings.Contains(s, "=") {
				return fmt.Errorf("ssh_options entries are strings \"Name=value\", not %v", e)
			}
			name, _, _ := strings.Cut(s, "=")
			if !sshOptionNames[strings.ToLower(name)] {
				return fmt.Errorf("ssh_options: %q is not an ssh_config option", name)
			}
			c.Options.SSHOptions = append(c.Options.SSHOptions, s)
		}
		return nil
	}
	return fmt.Errorf("option %s has a value of unsupported type %T", k, v)
}

// lineOf is the 1-based line of the first occurrence of needle, or 0.
func lineOf(text, needle string) int {
	if needle == "" {
		return 0
	}
	i := strings.Index(text, needle)
	if i < 0 {
		return 0
	}
	return strings.Count(text[:i], "\n") + 1
}

// lineOfError finds the line that a decode error's quoted value sits on.
func lineOfError(text string, err error) int {
	msg := err.Error()
	if i := strings.Index(msg, `"`); i >= 0 {
		if j := strings.Index(msg[i+1:], `"`); j >= 0 {
			return lineOf(text, msg[i+1:i+1+j])
		}
	}
	return 0
}

func expandHome(p string) string {
	if p == "~" || strings.HasPrefix(p, "~/") {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, p[1:])
		}
	}
	return p
}
