package qemu

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/tinyguest"
)

// arm64Spec serves the arm64 tiny guest from srv and returns a kernel
// boot spec for it.
func arm64Spec(t *testing.T, srv *artifactServer) desired.VMSpec {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	g, err := tinyguest.BuildARM64(ctx, tinyguest.TestCacheDir())
	if err != nil {
		t.Fatalf("build the arm64 tiny guest (dpkg --add-architecture arm64; apt-get update): %v", err)
	}
	k, err := os.ReadFile(g.Kernel)
	if err != nil {
		t.Fatal(err)
	}
	i, err := os.ReadFile(g.Initrd)
	if err != nil {
		t.Fatal(err)
	}
	ka, ia := srv.add("/arm64/vmlinuz", k), srv.add("/arm64/initrd", i)
	return desired.VMSpec{
		VCPUs: 1, MemoryMB: 256, DiskGB: 1, Arch: desired.ArchARM64,
		Kernel:    &desired.Kernel{URL: ka.URL, SHA256: ka.SHA256, Initrd: &ia, Cmdline: g.Cmdline},
		CloudInit: &desired.CloudInit{UserData: "#cloud-config\n"},
	}
}

// An arm64 tiny guest (Debian's arm64 kernel, busybox-static:arm64)
// boots under qemu-system-aarch64 on the virt machine with TCG and
// reaches ready; the provisioner reports arm64, emulated on this x86
// machine.
func TestARM64GuestBootsUnderTCG(t *testing.T) {
	needQEMUImg(t)
	if _, err := exec.LookPath("qemu-system-aarch64"); err != nil {
		t.Skip("qemu-system-aarch64 not installed (apt-get install qemu-system-arm)")
	}
	t.Parallel()
	srv := newArtifactServer(t)
	spec := arm64Spec(t, srv)
	cache, vmRoot := t.TempDir(), t.TempDir()
	p, err := New(Config{
		CacheDir: cache, Accel: AccelTCG, Arch: "arm64", Artifacts: loopbackPolicy(),
		MachineDir:       func(n string) string { return filepath.Join(vmRoot, n) },
		PowerdownTimeout: 5 * time.Second, BootTimeout: 60 * time.Second, Logger: quietLog().Logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	if p.Arch() != "arm64" || p.cfg.QEMU != "qemu-system-aarch64" {
		t.Fatalf("Arch %q, QEMU %q", p.Arch(), p.cfg.QEMU)
	}
	if got, want := p.Emulated(), !strings.HasPrefix(runtimeArch(), "arm64"); got != want {
		t.Errorf("Emulated() = %v on %s", got, runtimeArch())
	}
	name := "arm-01"
	dir := filepath.Join(vmRoot, name)
	os.MkdirAll(dir, 0o700)
	t.Cleanup(func() { p.Destroy(context.Background(), name) })
	ctx := context.Background()
	m := agent.Machine{Name: name, Dir: dir, Spec: spec, InstanceID: "i-arm-1"}
	if err := p.PrepareRootDisk(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := p.Boot(ctx, m); err != nil {
		t.Fatal(err)
	}
	s := waitSerial(t, dir, "GITFLEET-GUEST-READY")
	lines := strings.Join(guestLines(s), "\n")
	for _, want := range []string{"-arm64", "instance-id=i-arm-1", "serial=gitfleet-root"} {
		if !strings.Contains(lines, want) {
			t.Errorf("no %q in the guest's lines:\n%s", want, lines)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for !p.Readiness(name).Ready {
		if time.Now().After(deadline) {
			t.Fatalf("the guest printed its marker but never read as ready: %+v", p.Readiness(name))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A guest of another architecture than the host's is refused before any
// disk is made or QEMU started: by the spec's arch, and by the kernel's
// own header when the spec says nothing.
func TestAGuestOfAnotherArchIsRefusedBeforeBoot(t *testing.T) {
	needQEMUImg(t)
	srv := newArtifactServer(t)
	spec := arm64Spec(t, srv)
	vmRoot := t.TempDir()
	p, err := New(Config{CacheDir: t.TempDir(), Accel: AccelTCG, Arch: "amd64", Artifacts: loopbackPolicy(),
		MachineDir: func(n string) string { return filepath.Join(vmRoot, n) }, Logger: quietLog().Logger})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		arch desired.Arch
		want string
	}{
		{"by the spec", desired.ArchARM64, "the VM is arm64, but this host runs amd64 guests"},
		{"by the kernel's header", "", "the kernel is a boot image for arm64, but this host runs amd64 guests"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(vmRoot, "wrong")
			os.MkdirAll(dir, 0o700)
			s := spec
			s.Arch = tt.arch
			m := agent.Machine{Name: "wrong", Dir: dir, Spec: s, InstanceID: "i-wrong"}
			err := p.PrepareRootDisk(context.Background(), m)
			if !agent.IsPermanent(err) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("PrepareRootDisk = %v, want a permanent error saying %q", err, tt.want)
			}
			if _, err := os.Stat(filepath.Join(dir, RootDiskFile)); err == nil {
				t.Error("a root disk was made for a guest of another architecture")
			}
			if tt.arch != "" {
				if err := p.Boot(context.Background(), m); !agent.IsPermanent(err) || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("Boot = %v, want a permanent error saying %q", err, tt.want)
				}
			}
		})
	}
}

func runtimeArch() string { return runtime.GOARCH }
