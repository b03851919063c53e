package qemu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/adopt"
	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
)

func sha256File(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func runTool(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
	return string(out)
}

// TestAdoptLibvirtGuest brings in a VM made outside gitfleet: a qcow2
// disk with data at a known offset, described by the domain XML
// virt-manager writes (adopt/testdata/web-01.xml). The import stages it
// by a rename; the agent adopts it (no qemu-img create: the qemu-img it
// runs logs every call), boots it with the domain's MAC and no NoCloud
// seed, and after a shutdown the data is where it was and the disk holds
// what it held, byte for byte in the file, the guest having written
// nothing. A second, raw disk of the domain comes along as a Volume, the
// guest sees it, and it too is unchanged. The tiny guest boots by direct kernel, so its spec gets the
// kernel an imported VM of a bootable disk would not need.
func TestAdoptLibvirtGuest(t *testing.T) {
	needQEMU(t)
	if _, err := exec.LookPath("qemu-io"); err != nil {
		t.Skip("qemu-io not installed (qemu-utils)")
	}
	t.Parallel()
	ctx := context.Background()
	work := t.TempDir()
	disk := filepath.Join(work, "images", "web-01.qcow2")
	os.MkdirAll(filepath.Dir(disk), 0o755)
	runTool(t, "qemu-img", "create", "-q", "-f", "qcow2", disk, "1G")
	runTool(t, "qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 512M 64k", disk)
	data := filepath.Join(work, "images", "web-01-data.img")
	if err := os.WriteFile(data, append([]byte("guest data at offset 0"), make([]byte, 8<<20-len("guest data at offset 0"))...), 0o644); err != nil {
		t.Fatal(err)
	}
	dataHash := sha256File(t, data)
	ref := filepath.Join(work, "reference.qcow2")
	runTool(t, "cp", "--sparse=always", disk, ref)
	before := sha256File(t, disk)

	xml, err := os.ReadFile("../../adopt/testdata/web-01.xml")
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.ReplaceAll(string(xml), "@DISK@", disk)
	doc = strings.Replace(doc, "<controller type='usb'", "<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='"+data+
		"'/><target dev='vdb' bus='virtio'/></disk><controller type='usb'", 1)
	plan, err := adopt.FromLibvirt("web-01.xml", []byte(doc), adopt.Options{Host: "hv-a"})
	if err != nil {
		t.Fatal(err)
	}
	if err := adopt.Inspect(ctx, plan, "qemu-img"); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(work, "state")
	store, err := agent.OpenStore(state)
	if err != nil {
		t.Fatal(err)
	}
	all, err := adopt.StagePlan(plan, state)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[1].Path != store.VolumePath("web-01-vdb") {
		t.Fatalf("staged %+v; want the root disk and volume web-01-vdb", all)
	}
	staged := all[0]
	if staged.Method != adopt.MethodRename || staged.Path != store.AdoptedDisk(plan.Name) {
		t.Fatalf("staged %+v; want a rename to %s", staged, store.AdoptedDisk(plan.Name))
	}
	ino := inodeOf(t, staged.Path)

	// qemu-img through a wrapper that logs each call.
	calls := filepath.Join(work, "qemu-img.calls")
	wrapper := filepath.Join(work, "qemu-img")
	real, _ := exec.LookPath("qemu-img")
	os.WriteFile(wrapper, []byte("#!/bin/sh\necho \"$*\" >> "+calls+"\nexec "+real+" \"$@\"\n"), 0o755)

	srv := newArtifactServer(t)
	spec := plan.Spec
	spec.Kernel = guestSpec(t, srv).Kernel
	spec.Network = "" // the test host has no network "default": user-mode networking
	if spec.CPUModel != "host" {
		t.Fatalf("host-passthrough mapped to cpuModel %q, want host", spec.CPUModel)
	}
	spec.CPUModel = "" // host needs KVM; this machine runs TCG, as the import's report says
	m := agent.Machine{Name: plan.Name, Dir: store.VMDir(plan.Name), Spec: spec, InstanceID: "i-adopt-1",
		Volumes: []string{store.VolumePath("web-01-vdb")}}
	if err := os.MkdirAll(m.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{
		CacheDir: filepath.Join(work, "cache"), Accel: AccelTCG, Artifacts: loopbackPolicy(), QEMUImg: wrapper,
		MachineDir: store.VMDir, AdoptedDisk: store.AdoptedDisk,
		PowerdownTimeout: 30 * time.Second, KillTimeout: 5 * time.Second, BootTimeout: 60 * time.Second,
		Logger: quietLog().Logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Destroy(context.Background(), m.Name) })
	if err := p.PrepareRootDisk(ctx, m); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(m.Dir, RootDiskFile)
	if inodeOf(t, root) != ino {
		t.Errorf("the root disk is not the staged disk's inode: it was copied or made")
	}
	if _, err := os.Stat(staged.Path); !os.IsNotExist(err) {
		t.Errorf("the staged disk is still at %s: %v", staged.Path, err)
	}
	if err := p.Boot(ctx, m); err != nil {
		t.Fatal(err)
	}
	lines := strings.Join(guestLines(waitSerial(t, m.Dir, "tinyguest: ready")), "\n")
	for _, want := range []string{"seed none", "disk vda serial=gitfleet-root bytes=1073741824",
		"serial=web-01-vdb bytes=" + strconv.Itoa(8<<20), "nic eth0 mac=52:54:00:6b:3c:9a"} {
		if !strings.Contains(lines, want) {
			t.Errorf("the guest did not say %q:\n%s", want, lines)
		}
	}
	if _, err := os.Stat(filepath.Join(m.Dir, SeedFile)); !os.IsNotExist(err) {
		t.Errorf("a seed was written for the adopted VM: %v", err)
	}
	if err := p.Shutdown(ctx, m.Name); err != nil {
		t.Fatal(err)
	}
	logged, _ := os.ReadFile(calls)
	if strings.Contains(string(logged), "create") {
		t.Errorf("qemu-img create ran for an adopted disk:\n%s", logged)
	}
	if out := runTool(t, "qemu-io", "-f", "qcow2", "-r", "-c", "read -P 0x5a 512M 64k", root); !strings.Contains(out, "read 65536/65536 bytes") {
		t.Errorf("the data at 512 MiB is gone: %s", out)
	}
	runTool(t, "qemu-img", "compare", "-f", "qcow2", "-F", "qcow2", ref, root)
	if sha256File(t, store.VolumePath("web-01-vdb")) != dataHash {
		t.Error("the data disk adopted as a volume changed")
	}
	if after := sha256File(t, root); after != before {
		t.Errorf("the disk file changed: sha256 %s, was %s (the guest wrote nothing)", after, before)
	}
}

func inodeOf(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// TestAdoptRootDiskRefusals: nothing staged is ErrDiskNotStaged (the
// engine waits for it); a staged file that is not a self-contained qcow2
// is permanent and stays where it was staged; a backend without an adopt
// directory refuses permanently. No root disk is made in any case.
func TestAdoptRootDiskRefusals(t *testing.T) {
	work := t.TempDir()
	store, err := agent.OpenStore(filepath.Join(work, "state"))
	if err != nil {
		t.Fatal(err)
	}
	m := agent.Machine{Name: "web-01", Dir: store.VMDir("web-01"), InstanceID: "i-1"}
	m.Spec.DiskGB, m.Spec.RootDisk = 1, &desired.RootDisk{Adopt: true}
	os.MkdirAll(m.Dir, 0o700)
	cfg := Config{CacheDir: filepath.Join(work, "cache"), Accel: AccelTCG, MachineDir: store.VMDir, AdoptedDisk: store.AdoptedDisk, Logger: quietLog().Logger}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := p.PrepareRootDisk(ctx, m); !errors.Is(err, agent.ErrDiskNotStaged) || agent.IsPermanent(err) {
		t.Errorf("nothing staged: %v; want ErrDiskNotStaged, not permanent", err)
	}
	staged := store.AdoptedDisk("web-01")
	os.MkdirAll(filepath.Dir(staged), 0o700)
	os.WriteFile(staged, []byte("a raw disk, not qcow2"), 0o600)
	if err := p.PrepareRootDisk(ctx, m); !errors.Is(err, ErrImageNotSelfContained) || !agent.IsPermanent(err) {
		t.Errorf("raw staged disk: %v; want a permanent ErrImageNotSelfContained", err)
	}
	if _, err := os.Stat(staged); err != nil {
		t.Errorf("the refused disk left its staging place: %v", err)
	}
	cfg.AdoptedDisk = nil
	bare, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := bare.PrepareRootDisk(ctx, m); !agent.IsPermanent(err) {
		t.Errorf("no adopt directory: %v; want permanent", err)
	}
	if _, err := os.Stat(filepath.Join(m.Dir, RootDiskFile)); !os.IsNotExist(err) {
		t.Errorf("a root disk was made: %v", err)
	}
}
