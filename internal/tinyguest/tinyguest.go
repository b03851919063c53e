// Package tinyguest builds the smallest guest that proves a gitfleet VM
// works: a Debian kernel and a busybox-static initramfs whose /init loads
// the virtio and filesystem modules, mounts the NoCloud seed, prints the
// instance-id and the size of every disk to the serial console, asks for a
// DHCP lease, pings its router once and stays up until an ACPI powerdown.
//
// Every line the guest prints starts with "tinyguest: " but the readiness
// marker, in this order:
//
//	tinyguest: init <kernel release>
//	tinyguest: seed /dev/vdX instance-id=<id> hostname=<name>   (or "seed none")
//	tinyguest: disk vdX serial=<virtio serial> bytes=<size in bytes>   (one per disk)
//	tinyguest: nic eth0 mac=<mac>
//	tinyguest: lease eth0 ip=<ip> router=<ip>
//	tinyguest: ping <router> ok   (or "failed": one ICMP echo to the router)
//	tinyguest: silent boot   (instead of what follows, when the root disk begins with "tinyguest-silent")
//	tinyguest: ready
//	GITFLEET-GUEST-READY   (gitfleet's console readiness marker, alone on its line)
//	tinyguest: probe <line>   (each line the seed's user-data prints, when it is a #!/bin/sh script)
//	tinyguest: console <line>   (each line typed on the serial console, after ready)
//	tinyguest: power button   (on ACPI powerdown, just before it powers off)
//
// The virtio-serial ports (the guest agent's channel among them) are
// /dev/vportNpM; no udev makes /dev/virtio-ports/<name> links, so a seed's
// script finds a port by the name in /sys/class/virtio-ports/vportNpM/name.
//
// Build needs busybox-static (/bin/busybox) on the host, and a Debian
// kernel: one already extracted in the cache directory, the host's own
// /boot/vmlinuz-* with /lib/modules, or the package linux-image-amd64
// depends on, fetched with `apt-get download` and unpacked with
// `dpkg-deb -x`. Results are cached by content, so only the first Build on a
// machine touches apt.
package tinyguest

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

//go:embed init.sh
var initScript []byte

//go:embed udhcpc.sh
var udhcpcScript []byte

// Cmdline is the kernel command line the guest expects: the console on the
// first serial port, which gitfleet's QEMU backend logs to a file and
// serves on a socket for gitfleet console.
const Cmdline = "console=ttyS0 loglevel=4"

// LinePrefix starts every line the guest's /init prints but the
// readiness marker.
const LinePrefix = "tinyguest: "

// Guest is a built tiny guest: absolute paths of its kernel and initramfs
// (a gzip-compressed newc cpio) inside the cache directory, their sha256 as
// lowercase hex, so they can be named as a spec's kernel artifacts, the
// kernel release and the modules the initramfs loads, in load order.
type Guest struct {
	Kernel        string
	KernelSHA256  string
	Initrd        string
	InitrdSHA256  string
	KernelRelease string
	Modules       []string
	Cmdline       string
}

// BusyboxPath is where Build takes the static busybox from.
var BusyboxPath = "/bin/busybox"

// Build finds or builds the tiny guest under cacheDir (created if needed)
// and returns it. Concurrent Builds on one cacheDir, also from separate
// processes, serialize on a lock file there. It fails when busybox is
// missing or not static, or when no kernel can be found or downloaded.
func Build(ctx context.Context, cacheDir string) (*Guest, error) {
	unlock, err := openCache(cacheDir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	root, release, err := findKernel(ctx, cacheDir)
	if err != nil {
		return nil, err
	}
	return assemble(cacheDir, root, release, BusyboxPath, Cmdline, "initrd")
}

// openCache makes cacheDir when it is missing and takes its lock; the
// caller runs the returned unlock when done.
func openCache(cacheDir string) (unlock func(), err error) {
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("tiny guest cache %s: %w", cacheDir, err)
	}
	return lockDir(cacheDir)
}

// assemble stores the kernel of release found under root and an
// initramfs of busybox and that kernel's modules in cacheDir, by
// content (the initramfs as initrdName), and returns the guest they
// make with kernel command line cmdline.
func assemble(cacheDir, root, release, busybox, cmdline, initrdName string) (*Guest, error) {
	g := &Guest{KernelRelease: release, Cmdline: cmdline}
	var err error
	if g.Kernel, g.KernelSHA256, err = storeByContent(cacheDir, "vmlinuz-"+release, filepath.Join(root, "boot", "vmlinuz-"+release), nil); err != nil {
		return nil, err
	}
	initrd, mods, err := buildInitrd(busybox, filepath.Join(root, "lib", "modules", release))
	if err != nil {
		return nil, err
	}
	g.Modules = mods
	if g.Initrd, g.InitrdSHA256, err = storeByContent(cacheDir, initrdName, "", initrd); err != nil {
		return nil, err
	}
	return g, nil
}

// CmdlineARM64 is the kernel command line of the arm64 guest: its first
// serial port is the virt machine's PL011 UART.
const CmdlineARM64 = "console=ttyAMA0 loglevel=4"

// BuildARM64 finds or builds the tiny guest for arm64 under cacheDir, as
// Build does for the host: Debian's arm64 kernel (the package
// linux-image-arm64:arm64 depends on) and busybox-static:arm64, fetched
// with apt-get download (the host needs dpkg --add-architecture arm64 and
// an apt-get update) and unpacked into cacheDir/kernel-arm64 and
// cacheDir/busybox-arm64 once. Its initramfs is the same /init, with the
// arm64 kernel's modules.
func BuildARM64(ctx context.Context, cacheDir string) (*Guest, error) {
	unlock, err := openCache(cacheDir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	root, release, ok := kernelIn(filepath.Join(cacheDir, "kernel-arm64"))
	if !ok {
		if err := downloadKernel(ctx, cacheDir, "linux-image-arm64:arm64", "kernel-arm64"); err != nil {
			return nil, err
		}
		if root, release, ok = kernelIn(filepath.Join(cacheDir, "kernel-arm64")); !ok {
			return nil, fmt.Errorf("find arm64 kernel: unpacked package in %s has no boot/vmlinuz-* with modules", cacheDir)
		}
	}
	busybox := filepath.Join(cacheDir, "busybox-arm64", "bin", "busybox")
	if _, err := os.Stat(busybox); err != nil {
		if err := downloadDeb(ctx, cacheDir, "busybox-static:arm64", "busybox-arm64"); err != nil {
			return nil, err
		}
	}
	return assemble(cacheDir, root, release, busybox, CmdlineARM64, "initrd-arm64")
}

// lockDir takes an exclusive flock on dir/.lock.
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock tiny guest cache: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock tiny guest cache: %w", err)
	}
	return func() { f.Close() }, nil
}

// findKernel returns a root directory holding boot/vmlinuz-<release> and
// lib/modules/<release>, and the release.
func findKernel(ctx context.Context, cacheDir string) (root, release string, err error) {
	// 1. Already unpacked into the cache.
	if r, rel, ok := kernelIn(filepath.Join(cacheDir, "kernel")); ok {
		return r, rel, nil
	}
	// 2. The host's own kernel.
	if r, rel, ok := hostKernel(); ok {
		return r, rel, nil
	}
	// 3. Debian's linux-image-amd64.
	if err := downloadKernel(ctx, cacheDir, "linux-image-amd64", "kernel"); err != nil {
		return "", "", err
	}
	if r, rel, ok := kernelIn(filepath.Join(cacheDir, "kernel")); ok {
		return r, rel, nil
	}
	return "", "", fmt.Errorf("find kernel: unpacked package in %s has no boot/vmlinuz-* with modules", cacheDir)
}

func kernelIn(root string) (string, string, bool) {
	matches, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	sort.Sort(sort.Reverse(sort.StringSlice(matches)))
	for _, m := range matches {
		rel := strings.TrimPrefix(filepath.Base(m), "vmlinuz-")
		if fi, err := os.Stat(filepath.Join(root, "lib", "modules", rel, "kernel")); err == nil && fi.IsDir() {
			return root, rel, true
		}
	}
	return "", "", false
}

func hostKernel() (string, string, bool) {
	r, rel, ok := kernelIn("/")
	if !ok {
		return "", "", false
	}
	if f, err := os.Open(filepath.Join(r, "boot", "vmlinuz-"+rel)); err != nil {
		return "", "", false // not readable by this user
	} else {
		f.Close()
	}
	// Distribution kernels may ship compressed modules, which insmod in the
	// guest cannot load; such a host kernel is not usable.
	ms, err := loadModuleSet(filepath.Join(r, "lib", "modules", rel))
	if err != nil {
		return "", "", false
	}
	if _, err := ms.closure(wantModules); err != nil {
		return "", "", false
	}
	return r, rel, true
}

// downloadKernel fetches the kernel package meta (linux-image-amd64,
// linux-image-arm64:arm64) depends on and unpacks it to cacheDir/dst.
func downloadKernel(ctx context.Context, cacheDir, meta, dst string) error {
	out, err := exec.CommandContext(ctx, "apt-cache", "depends", meta).CombinedOutput()
	if err != nil {
		return fmt.Errorf("find kernel package: apt-cache depends %s: %v: %s", meta, err, bytes.TrimSpace(out))
	}
	pkg := ""
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Depends: "); ok && strings.HasPrefix(v, "linux-image-") {
			pkg = strings.TrimSpace(v)
			break
		}
	}
	if pkg == "" {
		return fmt.Errorf("find kernel package: %s depends on no linux-image-* (run apt-get update; for arm64, dpkg --add-architecture arm64 first)", meta)
	}
	return downloadDeb(ctx, cacheDir, pkg, dst)
}

// downloadDeb fetches the package pkg with apt-get download and unpacks
// it with dpkg-deb -x to cacheDir/dst.
func downloadDeb(ctx context.Context, cacheDir, pkg, dst string) error {
	tmp, err := os.MkdirTemp(cacheDir, "download-")
	if err != nil {
		return fmt.Errorf("download %s: %w", pkg, err)
	}
	defer os.RemoveAll(tmp)
	os.Chmod(tmp, 0o755) // apt's sandbox user must be able to write here
	cmd := exec.CommandContext(ctx, "apt-get", "download", pkg)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("download %s: apt-get download: %v: %s", pkg, err, bytes.TrimSpace(out))
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return fmt.Errorf("download %s: expected one .deb, found %d", pkg, len(debs))
	}
	unpacked := filepath.Join(tmp, "root")
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", debs[0], unpacked).CombinedOutput(); err != nil {
		return fmt.Errorf("unpack %s: dpkg-deb -x: %v: %s", debs[0], err, bytes.TrimSpace(out))
	}
	if err := os.Rename(unpacked, filepath.Join(cacheDir, dst)); err != nil {
		return fmt.Errorf("unpack %s: %w", pkg, err)
	}
	return nil
}

// buildInitrd assembles the gzip-compressed cpio initramfs and returns it
// with the modules it loads.
func buildInitrd(busyboxPath, modDir string) ([]byte, []string, error) {
	busybox, err := os.ReadFile(busyboxPath)
	if err != nil {
		return nil, nil, fmt.Errorf("read busybox (install busybox-static): %w", err)
	}
	if !isStatic(busyboxPath) {
		return nil, nil, fmt.Errorf("busybox %s is dynamically linked: install busybox-static", busyboxPath)
	}
	ms, err := loadModuleSet(modDir)
	if err != nil {
		return nil, nil, err
	}
	mods, err := ms.closure(wantModules)
	if err != nil {
		return nil, nil, fmt.Errorf("tiny guest modules: %w", err)
	}

	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	cw := &cpioWriter{w: zw}
	entries := []cpioEntry{
		{Name: "bin", Mode: cpioTypeDir | 0o755},
		{Name: "dev", Mode: cpioTypeDir | 0o755},
		{Name: "dev/console", Mode: cpioTypeChar | 0o600, RdevMajor: 5, RdevMinor: 1},
		{Name: "etc", Mode: cpioTypeDir | 0o755},
		{Name: "lib", Mode: cpioTypeDir | 0o755},
		{Name: "lib/modules", Mode: cpioTypeDir | 0o755},
		{Name: "proc", Mode: cpioTypeDir | 0o755},
		{Name: "sbin", Mode: cpioTypeDir | 0o755},
		{Name: "sys", Mode: cpioTypeDir | 0o755},
		{Name: "tmp", Mode: cpioTypeDir | 0o1777},
		{Name: "bin/busybox", Mode: cpioTypeFile | 0o755, Data: busybox},
		{Name: "bin/sh", Mode: cpioTypeSymlink | 0o777, Data: []byte("busybox")},
		{Name: "init", Mode: cpioTypeFile | 0o755, Data: initScript},
		{Name: "etc/udhcpc.script", Mode: cpioTypeFile | 0o755, Data: udhcpcScript},
		{Name: "etc/modules", Mode: cpioTypeFile | 0o644, Data: []byte(strings.Join(mods, "\n") + "\n")},
	}
	for _, m := range mods {
		data, err := os.ReadFile(ms.paths[m])
		if err != nil {
			return nil, nil, fmt.Errorf("tiny guest modules: %w", err)
		}
		entries = append(entries, cpioEntry{Name: "lib/modules/" + m + ".ko", Mode: cpioTypeFile | 0o644, Data: data})
	}
	for _, e := range entries {
		if err := cw.add(e); err != nil {
			return nil, nil, fmt.Errorf("write initramfs: %w", err)
		}
	}
	if err := cw.close(); err != nil {
		return nil, nil, fmt.Errorf("write initramfs: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, nil, fmt.Errorf("write initramfs: %w", err)
	}
	return buf.Bytes(), mods, nil
}

func isStatic(path string) bool {
	out, err := exec.Command("file", "-L", path).Output()
	if err != nil {
		// Without file(1), look for a program interpreter ourselves.
		data, err := os.ReadFile(path)
		return err == nil && !bytes.Contains(data[:min(len(data), 4096)], []byte("/lib64/ld-linux"))
	}
	return bytes.Contains(out, []byte("statically linked")) || bytes.Contains(out, []byte("static-pie"))
}

// storeByContent writes data (or copies src) to cacheDir/<stem>-<sha12>
// unless that file exists, and returns its path and sha256.
func storeByContent(cacheDir, stem, src string, data []byte) (string, string, error) {
	if data == nil {
		var err error
		if data, err = os.ReadFile(src); err != nil {
			return "", "", fmt.Errorf("read %s: %w", src, err)
		}
	}
	sum := sha256.Sum256(data)
	hexsum := hex.EncodeToString(sum[:])
	dst := filepath.Join(cacheDir, stem+"-"+hexsum[:12])
	if have, err := FileSHA256(dst); err == nil && have == hexsum {
		return dst, hexsum, nil
	}
	tmp := dst + ".partial"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return "", "", fmt.Errorf("store %s: %w", dst, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", "", fmt.Errorf("store %s: %w", dst, err)
	}
	return dst, hexsum, nil
}

// FileSHA256 returns the lowercase hex sha256 of the file at path, the form
// artifact specs carry.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// TestCacheDir is where the test suites build the tiny guest and keep it
// across runs, so only the first run on a machine unpacks a kernel:
// $GITFLEET_TEST_CACHE/tinyguest, or <user cache dir>/gitfleet-test/tinyguest
// (os.UserCacheDir, falling back to the temporary directory).
func TestCacheDir() string {
	if d := os.Getenv("GITFLEET_TEST_CACHE"); d != "" {
		return filepath.Join(d, "tinyguest")
	}
	d, err := os.UserCacheDir()
	if err != nil {
		d = os.TempDir()
	}
	return filepath.Join(d, "gitfleet-test", "tinyguest")
}
