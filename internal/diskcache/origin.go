package diskcache

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// origin is what a source's cache directory says about its source (source.json).
type origin struct {
	Source string `json:"source"` // the name the cache is kept under (SourceKey)
	// Given is the source as the user gave it, and Roots each member's directory as
	// its server resolved it: a mount that cannot reach the server finds its cache,
	// and its name, from them (Cache.Known).
	Given string   `json:"given,omitempty"`
	Roots []string `json:"roots,omitempty"`
}

const originFile = "source.json"

func readOrigin(dir string) (origin, time.Time, bool) {
	path := filepath.Join(dir, originFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return origin{}, time.Time{}, false
	}
	var o origin
	if json.Unmarshal(b, &o) != nil {
		return origin{}, time.Time{}, false
	}
	var mtime time.Time
	if fi, err := os.Stat(path); err == nil {
		mtime = fi.ModTime()
	}
	return o, mtime, true
}

// writeOrigin replaces source.json whole (a crash leaves the old one or the new one).
func writeOrigin(dir string, o origin) error {
	b, err := json.Marshal(o)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, originFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, originFile))
}

// SetOrigin records how the user gave this store's source and where its directories
// resolved (see origin).
func (st *Store) SetOrigin(given string, roots []string) error {
	o, _, ok := readOrigin(st.dir)
	if ok && o.Source == st.name && o.Given == given && slices.Equal(o.Roots, roots) {
		return nil
	}
	return writeOrigin(st.dir, origin{Source: st.name, Given: given, Roots: roots})
}

// Known returns the name and resolved directories of the cache an earlier mount kept
// for a source given as given; the most recent one if it resolved differently over
// time.
func (c *Cache) Known(given string) (source string, roots []string, ok bool) {
	entries, err := os.ReadDir(c.Dir)
	if err != nil {
		return "", nil, false
	}
	var newest time.Time
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(c.Dir, e.Name())
		o, mtime, found := readOrigin(dir)
		if !found || o.Given != given || e.Name() != SourceKey(o.Source) {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "meta.db")); err != nil {
			continue
		}
		if !ok || mtime.After(newest) {
			source, roots, ok, newest = o.Source, o.Roots, true, mtime
		}
	}
	return source, roots, ok
}
