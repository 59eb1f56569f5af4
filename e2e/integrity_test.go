package e2e

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func sum(t *testing.T, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func randomBytes(seed uint64, n int) []byte {
	return fillRandom(rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), make([]byte, n))
}

// fillRandom fills b from r and returns it.
func fillRandom(r *rand.Rand, b []byte) []byte {
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestDataIntegrity writes files of many sizes through the mount with cp, dd and mmap,
// reads them back, and compares checksums with the server's own copy.
func TestDataIntegrity(t *testing.T) {
	e := newEnv(t, 2)
	mp := e.mount(e.source(0, ""), e.source(1, ""))
	local := t.TempDir()
	sizes := []int{0, 1, 4095, 4096, 4097, 65535, 65537, 261119, 261121, 1<<20 - 1, 1<<20 + 3, 5<<20 + 17}
	for i, size := range sizes {
		name := fmt.Sprintf("f%02d-%d", i, size)
		src := filepath.Join(local, name)
		if err := os.WriteFile(src, randomBytes(uint64(i), size), 0o644); err != nil {
			t.Fatal(err)
		}
		run(t, fmt.Sprintf("cp %s %s/cp-%s", src, mp, name))
		run(t, fmt.Sprintf("dd if=%s of=%s/dd-%s bs=7777 status=none", src, mp, name))
		want := sum(t, src)
		for _, p := range []string{mp + "/cp-" + name, e.data[0] + "/cp-" + name, mp + "/dd-" + name, e.data[0] + "/dd-" + name} {
			if got := sum(t, p); got != want {
				t.Errorf("%s: checksum differs from the source", p)
			}
		}
		// Read back with an odd block size too.
		out := run(t, fmt.Sprintf("dd if=%s/cp-%s bs=3333 status=none | sha256sum", mp, name))
		if want := fmt.Sprintf("%x", want); out[:64] != want {
			t.Errorf("dd read of %s: got %s", name, out[:64])
		}
	}

	t.Run("mmap", func(t *testing.T) {
		p := mp + "/mmap.bin"
		size := 3<<20 + 123
		data := randomBytes(99, size)
		if err := os.WriteFile(p, make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		m, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		copy(m, data)
		if err := unix.Msync(m, unix.MS_SYNC); err != nil {
			t.Fatal(err)
		}
		syscall.Munmap(m) //nolint:errcheck
		f.Close()
		if !bytes.Equal(mustRead(t, e.data[0]+"/mmap.bin"), data) {
			t.Error("mmap write did not reach the server intact")
		}
		f, _ = os.Open(p)
		m, err = syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(m, data) {
			t.Error("mmap read differs")
		}
		syscall.Munmap(m) //nolint:errcheck
		f.Close()
	})

	t.Run("append, truncate, excl, seek writes", func(t *testing.T) {
		p := mp + "/log.txt"
		run(t, "echo one > "+p+" && echo two >> "+p+" && echo three >> "+p)
		if got := readString(t, e.data[0]+"/log.txt"); got != "one\ntwo\nthree\n" {
			t.Errorf("O_APPEND: got %q", got)
		}
		run(t, "truncate -s 4 "+p)
		if got := readString(t, p); got != "one\n" {
			t.Errorf("truncate: got %q", got)
		}
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte("XY"), 10); err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(12); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if got := readString(t, e.data[0]+"/log.txt"); got != "one\n\x00\x00\x00\x00\x00\x00XY" {
			t.Errorf("pwrite past EOF + ftruncate: got %q", got)
		}
		var errno syscall.Errno
		_, err = os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if !errors.As(err, &errno) || errno != syscall.EEXIST {
			t.Errorf("O_EXCL on an existing file: got %v, want EEXIST", err)
		}
		if err := os.Chmod(p, 0o600); err != nil {
			t.Fatal(err)
		}
		st, _ := os.Stat(e.data[0] + "/log.txt")
		if st.Mode().Perm() != 0o600 {
			t.Errorf("chmod: server has %v", st.Mode())
		}
		run(t, "touch -d '2001-02-03 04:05:06 UTC' "+p)
		st, _ = os.Stat(e.data[0] + "/log.txt")
		if st.ModTime().Unix() != 981173106 {
			t.Errorf("utimens: server mtime %v", st.ModTime())
		}
		// UTIME_OMIT: touch -m changes mtime only; atime stays.
		run(t, "touch -a -d '2002-01-01 00:00:00 UTC' "+p+" && touch -m -d '2003-01-01 00:00:00 UTC' "+p)
		var ss syscall.Stat_t
		if err := syscall.Stat(e.data[0]+"/log.txt", &ss); err != nil {
			t.Fatal(err)
		}
		if ss.Atim.Sec != 1009843200 || ss.Mtim.Sec != 1041379200 {
			t.Errorf("touch -a then -m: server atime %d mtime %d", ss.Atim.Sec, ss.Mtim.Sec)
		}
		if os.Geteuid() == 0 {
			if err := os.Lchown(p, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Stat(e.data[0]+"/log.txt", &ss); err != nil || ss.Uid != 65534 || ss.Gid != 65534 {
				t.Errorf("chown: server has %d:%d (%v)", ss.Uid, ss.Gid, err)
			}
		}
		if err := os.WriteFile(mp+"/script.sh", []byte("#!/bin/sh\necho ran\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if out := run(t, mp+"/script.sh"); out != "ran\n" {
			t.Errorf("executable bit: got %q", out)
		}
	})

	t.Run("parallel writers", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				data := randomBytes(uint64(1000+i), 700_000+i)
				p := fmt.Sprintf("%s/par-%d", mp, i)
				if err := os.WriteFile(p, data, 0o644); err != nil {
					t.Error(err)
					return
				}
				if !bytes.Equal(mustRead(t, fmt.Sprintf("%s/par-%d", e.data[0], i)), data) {
					t.Errorf("parallel writer %d: server copy differs", i)
				}
			}()
		}
		wg.Wait()
	})
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Error(err)
	}
	return b
}
