// Package mountinfo reads /proc/self/mountinfo: which directories are mount points,
// and of which file system type.
package mountinfo

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// Mounts returns the mount points of this mount namespace with their file system
// types ("fuse.muxfs", "ext4", ...).
func Mounts() (map[string]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		fstype := ""
		// The fields after the "-" separator are: fstype, source, options.
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) {
				fstype = fields[i+1]
				break
			}
		}
		out[Unescape(fields[4])] = fstype
	}
	return out, sc.Err()
}

// IsMounted reports whether dir is a mount point.
func IsMounted(dir string) bool {
	m, err := Mounts()
	if err != nil {
		return false
	}
	_, ok := m[dir]
	return ok
}

// Unescape undoes the kernel's octal escapes (\040 for space, ...).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
