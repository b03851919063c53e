package demo

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/gitfleet/gitfleet/internal/tinyguest"
)

// ErrMissingTools is returned (wrapped, naming what is missing) when QEMU or
// qemu-img is not installed.
var ErrMissingTools = errors.New("missing tools")

// installHint says how to get what the demo needs.
const installHint = "run `make demo` from a gitfleet checkout (it installs what is missing on Debian/Ubuntu), " +
	"or ./scripts/install-deps.sh, or: apt-get install qemu-system-x86 qemu-utils busybox-static"

// CheckTools reports (wrapping ErrMissingTools) which of qemu-system-x86_64
// and qemu-img are not on PATH, with how to install them.
func CheckTools() error {
	var missing []string
	for _, bin := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s not found on PATH; %s", ErrMissingTools, strings.Join(missing, " and "), installHint)
	}
	return nil
}

// DefaultCacheDir is where the demo builds the tiny guest:
// $XDG_CACHE_HOME/gitfleet/tinyguest (os.UserCacheDir, so
// ~/.cache/gitfleet/tinyguest without XDG_CACHE_HOME). When that holds no
// downloaded kernel (a kernel/ directory, made when the host's /boot
// kernel cannot be used) but the test suite's cache
// (…/gitfleet-test/tinyguest) holds one, that one is returned, so a
// machine that ran the tests downloads no second kernel. `gitfleet demo
// --help` says the same.
func DefaultCacheDir() string {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	own := filepath.Join(base, "gitfleet", "tinyguest")
	if hasKernel(own) {
		return own
	}
	if test := filepath.Join(base, "gitfleet-test", "tinyguest"); hasKernel(test) {
		return test
	}
	return own
}

func hasKernel(dir string) bool {
	fi, err := os.Stat(filepath.Join(dir, "kernel"))
	return err == nil && fi.IsDir()
}

// PrepareGuest builds (or finds cached in cacheDir) the tiny guest and
// copies its kernel and initramfs into imagesDir, where the demo fleet's
// file:// URLs point, so the demo directory stands on its own. Files
// already there are kept: a fleet pushed earlier may still name them.
func PrepareGuest(ctx context.Context, cacheDir, imagesDir string) (Guest, error) {
	tg, err := tinyguest.Build(ctx, cacheDir)
	if err != nil {
		return Guest{}, fmt.Errorf("build the tiny guest in %s: %w", cacheDir, err)
	}
	if err := os.MkdirAll(imagesDir, 0o755); err != nil {
		return Guest{}, fmt.Errorf("demo images: %w", err)
	}
	g := Guest{KernelSHA256: tg.KernelSHA256, InitrdSHA256: tg.InitrdSHA256, Cmdline: tg.Cmdline}
	if g.Kernel, err = copyArtifact(tg.Kernel, imagesDir, tg.KernelSHA256); err != nil {
		return Guest{}, err
	}
	if g.Initrd, err = copyArtifact(tg.Initrd, imagesDir, tg.InitrdSHA256); err != nil {
		return Guest{}, err
	}
	return g, nil
}

// copyArtifact copies src to dir/<base name of src> unless a file with the
// same sha256 is there, and returns the destination path.
func copyArtifact(src, dir, sum string) (string, error) {
	dst := filepath.Join(dir, filepath.Base(src))
	if have, err := tinyguest.FileSHA256(dst); err == nil && have == sum {
		return dst, nil
	}
	in, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("copy %s: %w", src, err)
	}
	defer in.Close()
	tmp := dst + ".partial"
	out, err := os.Create(tmp)
	if err != nil {
		return "", fmt.Errorf("copy %s: %w", src, err)
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(out, h), in); err != nil {
		out.Close()
		return "", fmt.Errorf("copy %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return "", fmt.Errorf("copy %s: %w", src, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		os.Remove(tmp)
		return "", fmt.Errorf("copy %s: sha256 %s, want %s (the cache changed underneath)", src, got, sum)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", fmt.Errorf("copy %s: %w", src, err)
	}
	return dst, nil
}
