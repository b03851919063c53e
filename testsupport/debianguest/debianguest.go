// Package debianguest provides the real Debian 12 cloud guest that tests
// boot where only a real distribution proves the point: cloud-init running
// the NoCloud seed, sshd answering with the keys of the VM spec,
// qemu-guest-agent. It runs scripts/build-debian-image.sh, which builds the
// guest from Debian packages (mmdebstrap, mkfs.ext4 -d, qemu-img; no loop
// device, no bootloader) and caches it keyed on the script's own text, so
// only the first Build on a machine spends minutes and network.
//
// The guest boots directly: a VM spec names Kernel (with Initrd and
// Cmdline) and Image, whose ext4 root filesystem covers the whole disk
// (the first virtio disk, /dev/vda). Cloud-init's default user is
// "debian"; the seed's sshAuthorizedKeys land there.
package debianguest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// User is the account cloud-init creates and gives the seed's SSH keys.
const User = "debian"

// Guest is a built image: absolute paths inside the cache, with each
// artifact's sha256 as lowercase hex (the form a VM spec's artifacts
// carry), and the kernel command line to boot it with.
type Guest struct {
	Dir          string
	Image        string // root.qcow2: qcow2, ext4 on the whole disk
	ImageSHA256  string
	Kernel       string
	KernelSHA256 string
	Initrd       string
	InitrdSHA256 string
	Cmdline      string
}

// Script is the path of scripts/build-debian-image.sh in the source tree
// this package was built from.
func Script() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "scripts", "build-debian-image.sh")
}

// Missing names what this host lacks to build the guest ("" when nothing):
// root, mmdebstrap, mkfs.ext4, qemu-img or flock. Tests skip with it.
func Missing() string {
	if os.Geteuid() != 0 {
		return "root (mmdebstrap --mode=root)"
	}
	for _, tool := range []string{"mmdebstrap", "mkfs.ext4", "qemu-img", "flock"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " (scripts/install-deps.sh installs it)"
		}
	}
	return ""
}

// Build finds or builds the guest under cacheDir and returns it. A cold
// build takes minutes and fetches packages through the host's apt
// sources; a warm one reads a few files. Concurrent Builds, also from
// separate processes, serialize on a lock in cacheDir. It fails with the
// tail of the script's output when the build does.
func Build(ctx context.Context, cacheDir string) (*Guest, error) {
	cmd := exec.CommandContext(ctx, "bash", Script(), cacheDir)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		tail := errb.Bytes()
		if len(tail) > 2048 {
			tail = tail[len(tail)-2048:]
		}
		return nil, fmt.Errorf("build debian guest: %s: %v: %s", Script(), err, bytes.TrimSpace(tail))
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	dir := lines[len(lines)-1]
	g := &Guest{Dir: dir, Image: filepath.Join(dir, "root.qcow2"), Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd.img")}
	cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	if err != nil {
		return nil, fmt.Errorf("debian guest: %w", err)
	}
	g.Cmdline = strings.TrimSpace(string(cmdline))
	sums, err := readSums(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		return nil, err
	}
	for _, a := range []struct {
		name string
		sum  *string
	}{{"root.qcow2", &g.ImageSHA256}, {"vmlinuz", &g.KernelSHA256}, {"initrd.img", &g.InitrdSHA256}} {
		if *a.sum = sums[a.name]; len(*a.sum) != 64 {
			return nil, fmt.Errorf("debian guest: %s/SHA256SUMS has no sha256 for %s", dir, a.name)
		}
	}
	return g, nil
}

// readSums reads a sha256sum(1) file into file name -> hex sum.
func readSums(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("debian guest: %w", err)
	}
	defer f.Close()
	sums := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) == 2 {
			sums[strings.TrimPrefix(fields[1], "*")] = fields[0]
		}
	}
	return sums, sc.Err()
}

// TestCacheDir is where test suites build the guest and keep it across
// runs: $GITFLEET_TEST_CACHE/debianguest, or <user cache
// dir>/gitfleet-test/debianguest (os.UserCacheDir, falling back to the
// temporary directory), beside the tiny guest's.
func TestCacheDir() string {
	if d := os.Getenv("GITFLEET_TEST_CACHE"); d != "" {
		return filepath.Join(d, "debianguest")
	}
	d, err := os.UserCacheDir()
	if err != nil {
		d = os.TempDir()
	}
	return filepath.Join(d, "gitfleet-test", "debianguest")
}
