// Package config turns the command line and the TOML config file into one mount table.
package config

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// Source is one directory to mount: on an SSH server, or local.
type Source struct {
	Raw      string // as the user wrote it, for messages
	Local    string // set for a local directory source
	Host     string
	User     string
	Port     int
	Dir      string // remote directory; "" is the login directory
	ReadOnly bool
	NoCreate bool // writable, but never chosen for new files

	// Per-source ssh settings from the config file; they add to the global ones.
	SSHOptions   []string
	IdentityFile string
	MaxConns     int

	// Replicas are more ways to the same storage (a replica set): reads spread over
	// them, and a failing member is survived.
	Replicas []Source
	// FailClosed makes a union fail while this source is unreachable, rather than go
	// on without it (degraded, the default).
	FailClosed bool
}

// IsRemote reports whether the source is on an SSH server.
func (s *Source) IsRemote() bool { return s.Local == "" }

// ParseSource parses `[user@]host:[path]`, `sftp://[user@]host[:port][/path]`, or a
// local directory path. A string is remote when it has a colon before any slash, as
// for scp and sshfs; `./name:x` is therefore a local path. An IPv6 address goes in
// brackets: `[::1]:/srv`.
func ParseSource(s string) (Source, error) {
	src := Source{Raw: s}
	if s == "" {
		return src, fmt.Errorf("empty source: give [user@]host:[dir], sftp://[user@]host[:port]/dir, or a local directory")
	}
	if strings.ContainsRune(s, 0) {
		return src, fmt.Errorf("source %q contains a NUL byte", s)
	}
	if strings.HasPrefix(s, "sftp://") {
		return parseURL(s)
	}
	if strings.Contains(s, "://") {
		return src, fmt.Errorf("source %q: only sftp:// URLs are supported", s)
	}
	hostPart, dir, remote := splitRemote(s)
	if !remote {
		src.Local = s
		return src, nil
	}
	src.Dir = dir
	if i := strings.LastIndex(hostPart, "@"); i >= 0 {
		src.User = hostPart[:i]
		hostPart = hostPart[i+1:]
		if src.User == "" {
			return src, fmt.Errorf("source %q: empty user name before '@'", s)
		}
	}
	if strings.HasPrefix(hostPart, "[") && strings.HasSuffix(hostPart, "]") {
		hostPart = hostPart[1 : len(hostPart)-1]
	}
	src.Host = hostPart
	return src, checkHostUser(&src)
}

// splitRemote finds the host part of a scp-style source: text before the first colon,
// if that text has no slash (a bracketed IPv6 address may hold colons).
func splitRemote(s string) (host, dir string, remote bool) {
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end > 0 && end+1 < len(s) && s[end+1] == ':' {
			return s[:end+1], s[end+2:], true
		}
	}
	// user@[v6]:dir
	if at := strings.Index(s, "@["); at >= 0 && !strings.Contains(s[:at], "/") {
		end := strings.Index(s[at:], "]")
		if end > 0 && at+end+1 < len(s) && s[at+end+1] == ':' {
			return s[:at+end+1], s[at+end+2:], true
		}
	}
	colon := strings.IndexByte(s, ':')
	if colon < 0 {
		return "", "", false
	}
	if strings.Contains(s[:colon], "/") {
		return "", "", false
	}
	return s[:colon], s[colon+1:], true
}

func parseURL(s string) (Source, error) {
	src := Source{Raw: s}
	u, err := url.Parse(s)
	if err != nil {
		return src, fmt.Errorf("source %q is not a valid sftp:// URL: %v", s, err)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return src, fmt.Errorf("source %q: sftp:// URLs take no ?query or #fragment", s)
	}
	src.Host = u.Hostname()
	if u.User != nil {
		src.User = u.User.Username()
		if _, has := u.User.Password(); has {
			return src, fmt.Errorf("source %q: passwords in URLs are not supported (they would show in ps); use keys or let ssh ask", s)
		}
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return src, fmt.Errorf("source %q: port %q is not a number from 1 to 65535", s, p)
		}
		src.Port = n
	}
	// sftp://host/dir names /dir; sftp://host/~/dir names dir below the login directory.
	src.Dir = u.Path
	if strings.HasPrefix(src.Dir, "/~/") {
		src.Dir = src.Dir[3:]
	} else if src.Dir == "/~" {
		src.Dir = ""
	}
	return src, checkHostUser(&src)
}

// checkHostUser refuses what ssh could read as an option or what cannot be a host.
func checkHostUser(src *Source) error {
	switch {
	case src.Host == "":
		return fmt.Errorf("source %q has no host name: write [user@]host:[dir]", src.Raw)
	case strings.HasPrefix(src.Host, "-"):
		return fmt.Errorf("source %q: a host name cannot begin with '-' (it would be read as an ssh option)", src.Raw)
	case strings.HasPrefix(src.User, "-"):
		return fmt.Errorf("source %q: a user name cannot begin with '-' (it would be read as an ssh option)", src.Raw)
	case strings.ContainsAny(src.Host, " \t\n\r'\"\\;&|`$<>()"):
		return fmt.Errorf("source %q: the host name contains characters a host name cannot have", src.Raw)
	case strings.ContainsAny(src.User, " \t\n\r'\"\\;&|`$<>()/:"):
		return fmt.Errorf("source %q: the user name contains characters a user name cannot have", src.Raw)
	}
	return nil
}
