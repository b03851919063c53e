package qemu

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckRootDiskHeader pins what a root disk's header may name: no
// backing file or the cached image it was made from, never an external
// data file or encryption.
func TestCheckRootDiskHeader(t *testing.T) {
	needQEMUImg(t)
	cache := t.TempDir()
	base := filepath.Join(cache, strings.Repeat("ab", 32))
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", base, "16M").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	mk := func(t *testing.T, args ...string) string {
		disk := filepath.Join(t.TempDir(), RootDiskFile)
		a := append([]string{"create", "-q", "-f", "qcow2"}, args...)
		if out, err := exec.Command("qemu-img", append(a, disk, "32M")...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return disk
	}
	t.Run("blank", func(t *testing.T) {
		d, err := checkRootDisk(mk(t), cache)
		if err != nil || d.backing != "" || d.virtualSize != 32<<20 {
			t.Errorf("checkRootDisk = %+v, %v", d, err)
		}
	})
	t.Run("backed by a cached image", func(t *testing.T) {
		d, err := checkRootDisk(mk(t, "-F", "qcow2", "-b", base), cache)
		if err != nil || d.backing != filepath.Base(base) {
			t.Errorf("checkRootDisk = %+v, %v", d, err)
		}
	})
	for _, tc := range []struct {
		name    string
		backing string
	}{
		{"backed by a file outside the cache", "/etc/hostname"},
		{"backed by a path into the cache through ..", cache + "/../" + filepath.Base(cache) + "/" + filepath.Base(base)},
		{"backed by a file in the cache not named by a sha256", filepath.Join(cache, "other")},
		{"backed by a relative path", filepath.Base(base)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			disk := mk(t)
			rebase(t, disk, tc.backing, "raw")
			if _, err := checkRootDisk(disk, cache); !errors.Is(err, ErrImageNotSelfContained) || !strings.Contains(err.Error(), "backing file") {
				t.Errorf("checkRootDisk: %v", err)
			}
		})
	}
	t.Run("external data file", func(t *testing.T) {
		disk := mk(t)
		b, _ := os.ReadFile(disk)
		binary.BigEndian.PutUint64(b[72:], binary.BigEndian.Uint64(b[72:])|qcow2IncompatDataFile)
		os.WriteFile(disk, b, 0o600)
		if _, err := checkRootDisk(disk, cache); !errors.Is(err, ErrImageNotSelfContained) || !strings.Contains(err.Error(), "data file") {
			t.Errorf("checkRootDisk: %v", err)
		}
	})
	t.Run("not a regular file", func(t *testing.T) {
		link := filepath.Join(t.TempDir(), RootDiskFile)
		os.Symlink(mk(t), link)
		if _, err := checkRootDisk(link, cache); !errors.Is(err, ErrUnsafeFile) {
			t.Errorf("checkRootDisk of a symbolic link: %v", err)
		}
	})
	t.Run("not qcow2", func(t *testing.T) {
		disk := filepath.Join(t.TempDir(), RootDiskFile)
		os.WriteFile(disk, bytes.Repeat([]byte{0}, 4096), 0o600)
		if _, err := checkRootDisk(disk, cache); err == nil || !strings.Contains(err.Error(), "not a qcow2") {
			t.Errorf("checkRootDisk of zeros: %v", err)
		}
	})
}
