package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// unmountAndWait unmounts mp and waits until its muxfs process has exited (and so
// released the cache database).
func unmountAndWait(t *testing.T, mp string, cmd *exec.Cmd) {
	t.Helper()
	if out, err := exec.Command("fusermount3", "-u", mp).CombinedOutput(); err != nil {
		t.Fatalf("unmount %s: %v\n%s", mp, err, out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(cmd.Process.Pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatal("muxfs did not exit after unmount")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cacheStatus is the part of `muxfs status --json` these tests read.
type cacheStatus struct {
	PID     int
	RSS     int64 `json:"rss_bytes"`
	PeakRSS int64 `json:"peak_rss_bytes"`
	Sources []struct {
		Source           string
		State            string
		DiskBytes        int64 `json:"disk_cache_bytes"`
		DiskHitBytes     int64 `json:"disk_cache_hit_bytes"`
		DiskFetchedBytes int64 `json:"disk_cache_fetched_bytes"`
		Striped          int64
		Members          []struct {
			BytesRead int64 `json:"bytes_read"`
		}
	}
}

// peakRSS is the peak resident memory of process pid, in bytes (VmHWM).
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kib << 10
		}
	}
	t.Fatalf("process %d: no VmHWM", pid)
	return 0
}

func statusOf(t *testing.T, mp string) cacheStatus {
	t.Helper()
	var st cacheStatus
	out := run(t, muxfsBin+" status --json "+mp)
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	return st
}

// serverFile writes a file on the server with an mtime in the past (a file that just
// changed is kept out of the persistent records for two seconds: see docs).
func serverFile(t *testing.T, p string, data []byte) {
	t.Helper()
	writeFile(t, p, string(data))
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
}

func dropPageCache() {
	exec.Command("sync").Run()                                     //nolint:errcheck
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o200) //nolint:errcheck // not root: only the remount counts
}

// TestPersistentCacheAcrossRemount: a file read once is read again after a remount
// (and a dropped page cache) without a byte from the server; a file changed on the
// server meanwhile shows its new content; the cache directory is the user's alone.
func TestPersistentCacheAcrossRemount(t *testing.T) {
	e := newEnv(t, 1)
	cacheDir := filepath.Join(e.tmp, "cache")
	big := randomData(24<<20, 11)
	serverFile(t, e.data[0]+"/big", big)
	serverFile(t, e.data[0]+"/changes", []byte("version 1"))
	serverFile(t, e.data[0]+"/tree/a/b/c.txt", []byte("deep"))

	mp := e.mountpoint()
	cmd := e.mountAt(mp, e.source(0, ""), "--cache-dir", cacheDir)
	if got, _ := os.ReadFile(mp + "/big"); !bytes.Equal(got, big) {
		t.Fatal("cold read differs")
	}
	readString(t, mp+"/changes")
	run(t, "ls -lR "+mp+"/tree")
	time.Sleep(1500 * time.Millisecond) // the cache commits every second
	unmountAndWait(t, mp, cmd)

	st, err := os.Stat(cacheDir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("cache directory: %v %v, want mode 0700", st, err)
	}
	serverFile(t, e.data[0]+"/changes", []byte("version 2, longer"))
	dropPageCache()

	cmd = e.mountAt(mp, e.source(0, ""), "--cache-dir", cacheDir)
	if got, _ := os.ReadFile(mp + "/big"); !bytes.Equal(got, big) {
		t.Fatal("read from the persistent cache differs")
	}
	if got := readString(t, mp+"/changes"); got != "version 2, longer" {
		t.Errorf("a file changed on the server while unmounted reads %q", got)
	}
	s := statusOf(t, mp).Sources[0]
	if read := s.Members[0].BytesRead; read > 1<<20 {
		t.Errorf("after the remount %d bytes of file data came from the server (want only the changed file)", read)
	}
	t.Logf("after remount: %d bytes from the server, %d from the cache (the rest straight from the cache file by passthrough)", s.Members[0].BytesRead, s.DiskHitBytes)

	// The mount's memory, as the kernel counts it: its peak read before and after
	// the status call brackets the status' own.
	pid := statusOf(t, mp).PID
	before := peakRSS(t, pid)
	ms := statusOf(t, mp)
	if after := peakRSS(t, pid); ms.PeakRSS < before || ms.PeakRSS > after || ms.RSS <= 0 || ms.RSS > ms.PeakRSS {
		t.Errorf("status gives memory %d, peak %d; the kernel's peak was %d before and %d after", ms.RSS, ms.PeakRSS, before, after)
	}

	// Changed behind muxfs' back while mounted: seen at the next open.
	serverFile(t, e.data[0]+"/changes", []byte("version 3"))
	if got := readString(t, mp+"/changes"); got != "version 3" {
		t.Errorf("a file changed on the server while mounted reads %q", got)
	}
	unmountAndWait(t, mp, cmd)
}

// TestNoCTO: with -o nocto an open of a file the cache holds whole asks the server
// nothing while the file's attributes are younger than cache_timeout — a change made
// on the server shows only after it, as on sshfs — and the default (close-to-open)
// shows it at the next open.
func TestNoCTO(t *testing.T) {
	e := newEnv(t, 1)
	serverFile(t, e.data[0]+"/f", []byte("version 1"))
	mp := e.mountpoint()
	e.mountAt(mp, e.source(0, ""), "--cache-dir", filepath.Join(e.tmp, "cache"), "-o", "nocto,cache_timeout=4")
	readString(t, mp+"/f")
	serverFile(t, e.data[0]+"/f", []byte("version 2, longer"))
	if got := readString(t, mp+"/f"); got != "version 1" {
		t.Errorf("nocto, within cache_timeout: %q; want the cached %q (no request at open)", got, "version 1")
	}
	time.Sleep(4500 * time.Millisecond)
	if got := readString(t, mp+"/f"); got != "version 2, longer" {
		t.Errorf("nocto, after cache_timeout: %q", got)
	}
}

// TestCacheEviction: with -o cache_max_size the cache stays within the limit,
// evicting the least recently used files.
func TestCacheEviction(t *testing.T) {
	e := newEnv(t, 1)
	cacheDir := filepath.Join(e.tmp, "cache")
	for i := 0; i < 8; i++ {
		serverFile(t, fmt.Sprintf("%s/f%d", e.data[0], i), randomData(1<<20, int64(i)))
	}
	mp := e.mount(e.source(0, ""), "--cache-dir", cacheDir, "-o", "cache_max_size=3M")
	for i := 0; i < 8; i++ {
		os.ReadFile(fmt.Sprintf("%s/f%d", mp, i)) //nolint:errcheck
	}
	deadline := time.Now().Add(10 * time.Second)
	var held int64
	for time.Now().Before(deadline) {
		if held = statusOf(t, mp).Sources[0].DiskBytes; held <= 3<<20 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if held > 3<<20 {
		t.Errorf("cache holds %d bytes with cache_max_size=3M", held)
	}
	var onDisk int64
	filepath.Walk(cacheDir, func(_ string, info os.FileInfo, err error) error { //nolint:errcheck
		if err == nil && !info.IsDir() && info.Name() != "meta.db" && info.Name() != "source.json" {
			onDisk += info.Size()
		}
		return nil
	})
	if onDisk > 3<<20+1<<20 {
		t.Errorf("cache files take %d bytes with cache_max_size=3M", onDisk)
	}
}

// TestCacheCrashSafety: muxfs killed with SIGKILL while files are being read and
// overwritten; after a remount on the same cache every file reads exactly as the
// server has it.
func TestCacheCrashSafety(t *testing.T) {
	e := newEnv(t, 1)
	cacheDir := filepath.Join(e.tmp, "cache")
	const n = 6
	for i := 0; i < n; i++ {
		serverFile(t, fmt.Sprintf("%s/f%d", e.data[0], i), randomData(2<<20, int64(i)))
	}
	for round := 0; round < 3; round++ {
		mp := e.mountpoint()
		cmd := e.mountAt(mp, e.source(0, ""), "--cache-dir", cacheDir)
		for i := 0; i < n; i++ {
			os.ReadFile(fmt.Sprintf("%s/f%d", mp, i)) //nolint:errcheck // cache them
		}
		time.Sleep(1200 * time.Millisecond) // committed
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				p := fmt.Sprintf("%s/f%d", mp, k%n)
				if k%2 == 0 {
					f, err := os.OpenFile(p, os.O_WRONLY, 0)
					if err == nil {
						f.WriteAt(randomData(300<<10, int64(k)), int64(k%5)*300<<10) //nolint:errcheck
						f.Close()
					}
				} else {
					os.ReadFile(p) //nolint:errcheck
				}
			}
		}()
		time.Sleep(time.Duration(700+round*400) * time.Millisecond)
		syscall.Kill(cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck
		close(stop)
		<-done
		exec.Command("fusermount3", "-u", "-z", mp).Run() //nolint:errcheck
		for syscall.Kill(cmd.Process.Pid, 0) == nil {
			time.Sleep(20 * time.Millisecond)
		}
		// The killed muxfs had its ssh sessions write to the server until they died:
		// let the server settle, then compare.
		time.Sleep(300 * time.Millisecond)
		mp2 := e.mountpoint()
		cmd2 := e.mountAt(mp2, e.source(0, ""), "--cache-dir", cacheDir)
		for i := 0; i < n; i++ {
			got, err := os.ReadFile(fmt.Sprintf("%s/f%d", mp2, i))
			want, _ := os.ReadFile(fmt.Sprintf("%s/f%d", e.data[0], i))
			if err != nil || sha256.Sum256(got) != sha256.Sum256(want) {
				t.Fatalf("round %d: f%d after the crash differs from the server's copy (%v)", round, i, err)
			}
		}
		unmountAndWait(t, mp2, cmd2)
	}
}

// TestContentPrefetch: reading small files whole (grep -r) makes muxfs fetch the
// other small files of the directories the walk goes through, ahead of it: with the
// server gone right after one file was read, its siblings and the files of a
// subdirectory listed since are still readable, from the cache. A large file is not
// fetched ahead.
func TestContentPrefetch(t *testing.T) {
	e := newEnv(t, 1)
	cacheDir := filepath.Join(e.tmp, "cache")
	for i := 0; i < 20; i++ {
		serverFile(t, fmt.Sprintf("%s/src/f%02d.c", e.data[0], i), []byte(fmt.Sprintf("int f%d;\n", i)))
		serverFile(t, fmt.Sprintf("%s/src/sub/g%02d.c", e.data[0], i), []byte(fmt.Sprintf("int g%d;\n", i)))
	}
	serverFile(t, e.data[0]+"/src/big.bin", bytes.Repeat([]byte("x"), 300<<10))
	mp := e.mountpoint()
	cmd := e.mountAt(mp, e.source(0, ""), "--cache-dir", cacheDir, "-o", "timeout=3")
	defer unmountAndWait(t, mp, cmd)
	names(t, mp+"/src")
	if got := readString(t, mp+"/src/f00.c"); got != "int f0;\n" {
		t.Fatalf("read: %q", got)
	}
	names(t, mp+"/src/sub") // the walk goes on into a subdirectory
	time.Sleep(1500 * time.Millisecond)
	e.servers[0].Kill()
	waitStatus(t, mp, `"state": "offline"`)
	for i := 0; i < 20; i++ {
		if got, err := os.ReadFile(fmt.Sprintf("%s/src/f%02d.c", mp, i)); err != nil || string(got) != fmt.Sprintf("int f%d;\n", i) {
			t.Errorf("sibling f%02d.c offline: %q, %v (not fetched ahead)", i, got, err)
		}
		if got, err := os.ReadFile(fmt.Sprintf("%s/src/sub/g%02d.c", mp, i)); err != nil || string(got) != fmt.Sprintf("int g%d;\n", i) {
			t.Errorf("sub/g%02d.c offline: %q, %v (not fetched ahead)", i, got, err)
		}
	}
	if _, err := os.ReadFile(mp + "/src/big.bin"); !errors.Is(err, syscall.EIO) {
		t.Errorf("a large file was fetched ahead too: %v", err)
	}
}

// TestOffline: with the server gone, what the cache holds stays readable (listings
// included), the rest fails with EIO, changes fail with EROFS, and status says
// offline; when the server is back, so is the mount.
func TestOffline(t *testing.T) {
	e := newEnv(t, 1)
	cacheDir := filepath.Join(e.tmp, "cache")
	serverFile(t, e.data[0]+"/docs/cached.txt", []byte("kept"))
	// Larger than what the content prefetch fetches when a sibling is read whole.
	serverFile(t, e.data[0]+"/docs/uncached.txt", bytes.Repeat([]byte("not read\n"), 40<<10))
	os.MkdirAll(e.data[0]+"/links", 0o755)                      //nolint:errcheck
	os.Symlink("../docs/cached.txt", e.data[0]+"/links/latest") //nolint:errcheck
	mp := e.mountpoint()
	cmd := e.mountAt(mp, e.source(0, ""), "--cache-dir", cacheDir, "-o", "timeout=3")
	names(t, mp+"/docs")
	if readString(t, mp+"/docs/cached.txt") != "kept" {
		t.Fatal("read before going offline")
	}
	if readString(t, mp+"/links/latest") != "kept" {
		t.Fatal("read through a symlink before going offline")
	}
	time.Sleep(1200 * time.Millisecond) // the cache commits every second
	e.servers[0].Kill()
	waitStatus(t, mp, `"state": "offline"`)
	if got := strings.Join(names(t, mp+"/docs"), " "); got != "cached.txt uncached.txt" {
		t.Errorf("offline listing: %q", got)
	}
	if got := readString(t, mp+"/docs/cached.txt"); got != "kept" {
		t.Errorf("offline read of a cached file: %q", got)
	}
	if _, err := os.ReadFile(mp + "/docs/uncached.txt"); !errors.Is(err, syscall.EIO) {
		t.Errorf("offline read of an uncached file: %v, want EIO", err)
	}
	if err := os.WriteFile(mp+"/docs/new.txt", []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("offline write: %v, want EROFS", err)
	}
	if err := os.Mkdir(mp+"/docs/d", 0o755); !errors.Is(err, syscall.EROFS) {
		t.Errorf("offline mkdir: %v, want EROFS", err)
	}
	if out := run(t, muxfsBin+" cache status --cache-dir "+cacheDir); !strings.Contains(out, "offline") {
		t.Errorf("cache status does not say offline:\n%s", out)
	}
	if err := e.servers[0].Restart(); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, mp, `"state": "up"`)
	writeFile(t, mp+"/docs/new.txt", "back")
	if readString(t, e.data[0]+"/docs/new.txt") != "back" {
		t.Error("write after the server came back did not reach it")
	}
	// The write dropped the stored listing (when its file is released, which the
	// kernel does just after close returns): list it again.
	time.Sleep(200 * time.Millisecond)
	names(t, mp+"/docs")
	time.Sleep(1200 * time.Millisecond)
	unmountAndWait(t, mp, cmd)

	// A fresh mount (empty memory caches) whose server then goes away: the listings
	// and contents stored by the earlier mount answer.
	mp = e.mountpoint()
	cmd = e.mountAt(mp, e.source(0, ""), "--cache-dir", cacheDir, "-o", "timeout=3")
	e.servers[0].Kill()
	waitStatus(t, mp, `"state": "offline"`)
	if got := strings.Join(names(t, mp+"/docs"), " "); got != "cached.txt new.txt uncached.txt" {
		t.Errorf("listing stored by the previous mount: %q", got)
	}
	if got := readString(t, mp+"/docs/cached.txt"); got != "kept" {
		t.Errorf("content stored by the previous mount: %q", got)
	}
	// Symlink targets are stored too: a path through a symlink resolves offline.
	if got, err := os.Readlink(mp + "/links/latest"); err != nil || got != "../docs/cached.txt" {
		t.Errorf("symlink target stored by the previous mount: %q %v", got, err)
	}
	if got := readString(t, mp+"/links/latest"); got != "kept" {
		t.Errorf("read through a symlink, offline: %q", got)
	}
	unmountAndWait(t, mp, cmd)

	// Mounting while the server is down: a cache that knows the source starts it
	// offline (the background mount users run says so on the terminal, and succeeds);
	// one that does not, or -o offline=off, fails as any unreachable server does.
	other := e.mountpoint()
	muxfsFails(t, other, "cannot connect", "-o", e.sshOpts()+",timeout=3", "--cache-dir", filepath.Join(e.tmp, "other-cache"), e.source(0, ""), other)
	muxfsFails(t, other, "cannot connect", "-o", e.sshOpts()+",timeout=3,offline=off", "--cache-dir", cacheDir, e.source(0, ""), other)
	mp = e.mountpoint()
	t.Cleanup(func() { unmountQuietly(mp) })
	out, err := exec.Command(muxfsBin, "-o", e.sshOpts()+",timeout=3", "--cache-dir", cacheDir, e.source(0, ""), mp).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "mounted from the cache, read-only until it answers") || strings.Count(string(out), "\n") != 1 {
		t.Fatalf("mount while the server is down: %v, %q", err, out)
	}
	waitStatus(t, mp, `"state": "offline"`)
	if got := strings.Join(names(t, mp+"/docs"), " "); got != "cached.txt new.txt uncached.txt" {
		t.Errorf("listing of a source started offline: %q", got)
	}
	if got := readString(t, mp+"/docs/cached.txt"); got != "kept" {
		t.Errorf("content of a source started offline: %q", got)
	}
	if err := os.WriteFile(mp+"/docs/later.txt", []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write to a source started offline: %v, want EROFS", err)
	}
	// The server comes back: the source goes online by itself, writable.
	if err := e.servers[0].Restart(); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, mp, `"state": "up"`)
	writeFile(t, mp+"/docs/later.txt", "online again")
	if readString(t, e.data[0]+"/docs/later.txt") != "online again" {
		t.Error("write after a source started offline came online did not reach the server")
	}
	if out, err := exec.Command(muxfsBin, "umount", mp).CombinedOutput(); err != nil {
		t.Fatalf("muxfs umount: %v\n%s", err, out)
	}
	waitGone(t, mp)
}

// TestCacheSeparatesSources: two sources with the same remote paths keep separate
// cache entries.
func TestCacheSeparatesSources(t *testing.T) {
	e := newEnv(t, 2)
	cacheDir := filepath.Join(e.tmp, "cache")
	serverFile(t, e.data[0]+"/same/name.txt", []byte("from server one"))
	serverFile(t, e.data[1]+"/same/name.txt", []byte("from server two"))
	conf := filepath.Join(e.tmp, "grafts.toml")
	writeFile(t, conf, fmt.Sprintf("[[mount]]\npath = \"/one\"\nsources = [%q]\n\n[[mount]]\npath = \"/two\"\nsources = [%q]\n",
		e.source(0, ""), e.source(1, "")))
	for round := 0; round < 2; round++ {
		mp := e.mountpoint()
		cmd := e.mountAt(mp, "--config", conf, "--cache-dir", cacheDir)
		if got := readString(t, mp+"/one/same/name.txt"); got != "from server one" {
			t.Errorf("round %d: /one reads %q", round, got)
		}
		if got := readString(t, mp+"/two/same/name.txt"); got != "from server two" {
			t.Errorf("round %d: /two reads %q", round, got)
		}
		time.Sleep(1200 * time.Millisecond)
		unmountAndWait(t, mp, cmd)
	}
	if dirs, _ := filepath.Glob(cacheDir + "/*/meta.db"); len(dirs) != 2 {
		t.Errorf("want one cache per source, found %d", len(dirs))
	}
}

// TestCacheCommands: warm fills the cache through the mount, status reports it, and
// clear empties it.
func TestCacheCommands(t *testing.T) {
	e := newEnv(t, 1)
	cacheDir := filepath.Join(e.tmp, "cache")
	for i := 0; i < 20; i++ {
		serverFile(t, fmt.Sprintf("%s/proj/sub%d/file%d", e.data[0], i%4, i), randomData(100<<10, int64(i)))
	}
	mp := e.mount(e.source(0, ""), "--cache-dir", cacheDir)
	out := run(t, muxfsBin+" cache warm "+mp+"/proj 2>&1")
	if !strings.Contains(out, "warmed 20 files") {
		t.Errorf("warm says:\n%s", out)
	}
	time.Sleep(1200 * time.Millisecond)
	status := run(t, muxfsBin+" cache status --cache-dir "+cacheDir)
	if !strings.Contains(status, " 20 ") || !strings.Contains(status, "mounted") {
		t.Errorf("cache status after warming 20 files:\n%s", status)
	}
	run(t, muxfsBin+" cache clear --cache-dir "+cacheDir)
	if s := statusOf(t, mp).Sources[0]; s.DiskBytes != 0 {
		t.Errorf("after clear the cache holds %d bytes", s.DiskBytes)
	}
	if _, err := exec.Command(muxfsBin, "cache", "clear", "--cache-dir", cacheDir, "no-such-source").CombinedOutput(); err == nil {
		t.Error("clearing an unknown source succeeded")
	}
}
