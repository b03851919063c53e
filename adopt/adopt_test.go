package adopt

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
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/golden"
)

// virtManagerXML is testdata/web-01.xml, as virt-manager defines a
// Debian guest, with its disk at disk.
func virtManagerXML(t *testing.T, disk string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/web-01.xml")
	if err != nil {
		t.Fatal(err)
	}
	return []byte(strings.ReplaceAll(string(b), "@DISK@", disk))
}

func needQEMUImg(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed (apt-get install qemu-utils)")
	}
}

// makeDisk makes a 1 GiB qcow2 with qemu-img, as virt-manager does.
func makeDisk(t *testing.T, dir string) string {
	t.Helper()
	needQEMUImg(t)
	disk := filepath.Join(dir, "web-01.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", disk, "1G").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	return disk
}

func hashFile(t *testing.T, path string) string {
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

// TestFromLibvirtReport pins, field by field, what an import makes of a
// domain virt-manager defined: the rendered VM file (report and object)
// is golden, names no host path, and validates as a VM file.
func TestFromLibvirtReport(t *testing.T) {
	disk := makeDisk(t, t.TempDir())
	p, err := FromLibvirt("web-01.xml", virtManagerXML(t, disk), Options{Host: "hv-a"})
	if err != nil {
		t.Fatal(err)
	}
	if err := Inspect(context.Background(), p, "qemu-img"); err != nil {
		t.Fatal(err)
	}
	out, err := p.Render()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), filepath.Dir(disk)) {
		t.Errorf("the VM file names the host path %s:\n%s", disk, out)
	}
	golden.Check(t, "web-01.vm.yaml", out)
	fleet := t.TempDir()
	os.MkdirAll(filepath.Join(fleet, "hosts"), 0o755)
	os.MkdirAll(filepath.Join(fleet, "vms"), 0o755)
	os.WriteFile(filepath.Join(fleet, "hosts", "hv-a.yaml"), []byte("apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec:\n  networks:\n    default: {nat: {cidr: 10.77.0.0/24}}\n"), 0o644)
	os.WriteFile(filepath.Join(fleet, p.Path("")), out, 0o644)
	f, err := desired.NewLoader("").Load(desired.DirTree(fleet))
	if err != nil {
		t.Fatalf("the rendered file does not validate: %v", err)
	}
	if vm := f.VMs["web-01"]; vm == nil || vm.Spec.MAC != "52:54:00:6b:3c:9a" || vm.Spec.RootDisk == nil {
		t.Errorf("loaded VM = %+v", vm)
	}
	want := desired.VMSpec{Host: "hv-a", VCPUs: 1, MemoryMB: 128, DiskGB: 1, Network: "default",
		MAC: "52:54:00:6b:3c:9a", RootDisk: &desired.RootDisk{Adopt: true}}
	if got := p.Spec; got.Host != want.Host || got.VCPUs != want.VCPUs || got.MemoryMB != want.MemoryMB || got.DiskGB != want.DiskGB ||
		got.Network != want.Network || got.MAC != want.MAC || got.RootDisk == nil || !got.RootDisk.Adopt || got.Image != nil {
		t.Errorf("spec = %+v\nwant %+v", got, want)
	}
	if p.Disk != disk || len(p.Blocking()) != 0 {
		t.Errorf("disk %q, blocking %v; want %q and nothing blocking", p.Disk, p.Blocking(), disk)
	}
}

// TestFromLibvirtRefusals: what would lose a guest's boot or data
// blocks; XML that does not parse names its line; a defined domain with
// an id (one libvirt runs) is refused by Inspect.
func TestFromLibvirtRefusals(t *testing.T) {
	base := string(virtManagerXML(t, "/var/lib/libvirt/images/web-01.qcow2"))
	tests := []struct {
		name, from, to string
		blocks         []string // Sources of the blocking lines, by prefix after FILE:LINE:COL
	}{
		{"tpm: a new one", "</devices>", "<tpm model='tpm-crb'><backend type='emulator' version='2.0'/></tpm></devices>", []string{"domain/devices/tpm[0]"}},
		{"hostdev", "</devices>", "<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x0000' bus='0x65' slot='0x00' function='0x0'/></source></hostdev></devices>",
			[]string{"domain/devices/hostdev[0]"}},
		{"second disk in qcow2", "<controller type='usb'", "<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='/var/lib/libvirt/images/data.qcow2'/><target dev='vdb' bus='virtio'/></disk><controller type='usb'",
			[]string{"domain/devices/disk[2] type=qcow2"}},
		{"second disk raw: a volume", "<controller type='usb'", "<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='/var/lib/libvirt/images/data.img'/><target dev='vdb' bus='virtio'/></disk><controller type='usb'",
			nil},
		{"raw disk", "type='qcow2' discard='unmap'", "type='raw'", []string{"domain/devices/disk[0] type=raw"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := FromLibvirt("dom.xml", []byte(strings.Replace(base, tt.from, tt.to, 1)), Options{Host: "hv-a"})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, l := range p.Blocking() {
				_, src, _ := strings.Cut(l.Source, " ")
				got = append(got, src)
			}
			if strings.Join(got, "|") != strings.Join(tt.blocks, "|") {
				t.Errorf("blocking = %q, want %q\n%s", got, tt.blocks, p.ReportText())
			}
		})
	}
	t.Run("syntax error names its line", func(t *testing.T) {
		bad := strings.Replace(base, "<vcpu placement='static'>1</vcpu>", "<vcpu placement='static'>1</vcpus>", 1)
		_, err := FromLibvirt("dom.xml", []byte(bad), Options{Host: "hv-a"})
		if !errors.Is(err, ErrInvalidSource) || !strings.Contains(err.Error(), "dom.xml:11:") {
			t.Errorf("err = %v; want ErrInvalidSource at dom.xml:11", err)
		}
	})
	for _, bad := range []struct{ from, to, want string }{
		{"<vcpu placement='static'>1</vcpu>", "<vcpu placement='static'>two</vcpu>", `dom.xml:11:3: <vcpu> "two" is not a number`},
		{"<memory unit='KiB'>131072</memory>", `<memory unit="GiB">x</memory>`, `dom.xml:9:3: <memory> "x" is not a number`},
		{"<vcpu placement='static'>1</vcpu>", "<vcpu placement='static' current='one'>1</vcpu>", `dom.xml:11:3: <vcpu> current="one" is not a number`},
	} {
		t.Run("bad number "+bad.to, func(t *testing.T) {
			_, err := FromLibvirt("dom.xml", []byte(strings.Replace(base, bad.from, bad.to, 1)), Options{Host: "hv-a"})
			if !errors.Is(err, ErrInvalidSource) || !strings.Contains(fmt.Sprint(err), bad.want) || strings.Contains(fmt.Sprint(err), "strconv") {
				t.Errorf("err = %v; want ErrInvalidSource with %q", err, bad.want)
			}
		})
	}
	t.Run("running domain", func(t *testing.T) {
		p, err := FromLibvirt("dom.xml", []byte(strings.Replace(base, "<domain type='kvm'>", "<domain type='kvm' id='7'>", 1)), Options{Host: "hv-a"})
		if err != nil {
			t.Fatal(err)
		}
		if err := Inspect(context.Background(), p, "qemu-img"); !errors.Is(err, ErrRunning) {
			t.Errorf("Inspect = %v; want ErrRunning", err)
		}
	})
	t.Run("report places fields", func(t *testing.T) {
		p, err := FromLibvirt("dom.xml", []byte(base), Options{Host: "hv-a"})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(p.ReportText(), "dom.xml:90:5 domain/devices/graphics[0] type=spice") {
			t.Errorf("no graphics line at its position:\n%s", p.ReportText())
		}
	})
}

// TestFromLibvirtReportComplete: every element of the domain that says
// something of the guest is in the report — PS/2 input, features, clock,
// power management, the on_* actions — and the report is in line order.
func TestFromLibvirtReportComplete(t *testing.T) {
	p, err := FromLibvirt("dom.xml", virtManagerXML(t, "/var/lib/libvirt/images/web-01.qcow2"), Options{Host: "hv-a"})
	if err != nil {
		t.Fatal(err)
	}
	report := p.ReviewText()
	for _, want := range []string{
		"dom.xml:17:5 domain/features/acpi: QEMU's default",
		"dom.xml:18:5 domain/features/apic: QEMU's default",
		"not expressible        dom.xml:19:5 domain/features/vmport",
		"dom.xml:22:3 domain/clock offset=utc: QEMU's default",
		"dom.xml:23:5 domain/clock/timer[0] name=rtc",
		"dom.xml:27:3 domain/on_poweroff destroy",
		"dom.xml:28:3 domain/on_reboot restart: QEMU's default",
		"dom.xml:29:3 domain/on_crash destroy",
		"dom.xml:30:3 domain/pm",
		"dom.xml:88:5 domain/devices/input[1] type=mouse bus=ps2: QEMU's default",
		"dom.xml:89:5 domain/devices/input[2] type=keyboard bus=ps2: QEMU's default",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q:\n%s", want, report)
		}
	}
	last := 0
	for _, l := range p.Report {
		line, _ := strconv.Atoi(strings.Split(strings.Fields(l.Source)[0], ":")[1])
		if line < last {
			t.Errorf("the report is not in line order: %q after line %d\n%s", l.Source, last, report)
		}
		last = line
	}
}

// TestFromLibvirtMachine: firmware, Secure Boot, TPM, machine type and
// CPU mode map to the VM's machine fields; what does not come along (the
// UEFI variables, a TPM's state, host-model) is reported.
func TestFromLibvirtMachine(t *testing.T) {
	base := string(virtManagerXML(t, "/var/lib/libvirt/images/web-01.qcow2"))
	const osQ35 = "<type arch='x86_64' machine='pc-q35-7.2'>hvm</type>"
	tests := []struct {
		name     string
		from, to string
		want     func(s desired.VMSpec) bool
		report   string // in the report
		blocking int
	}{
		{"bios, q35, host-passthrough", "", "", func(s desired.VMSpec) bool {
			return s.Firmware == "" && s.Machine == "pc-q35-7.2" && s.CPUModel == "host" && !s.TPM
		}, "domain/os/type machine=pc-q35-7.2 → spec.machine", 0},
		{"efi firmware", "<os>", "<os firmware='efi'>", func(s desired.VMSpec) bool {
			return s.Firmware == desired.FirmwareUEFI && !s.SecureBoot
		}, "domain/os firmware=efi → spec.firmware", 0},
		{"pflash loader, secure, nvram", osQ35, osQ35 + "<loader readonly='yes' secure='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE_4M.ms.fd</loader><nvram>/var/lib/libvirt/qemu/nvram/web-01_VARS.fd</nvram>",
			func(s desired.VMSpec) bool { return s.Firmware == desired.FirmwareUEFI && s.SecureBoot },
			"domain/os/nvram: not carried: the VM starts with fresh UEFI variables from the template; boot entries must be re-created", 0},
		{"tpm", "</devices>", "<tpm model='tpm-crb'><backend type='emulator' version='2.0'/></tpm></devices>",
			func(s desired.VMSpec) bool { return s.TPM }, "domain/devices/tpm[0] → spec.tpm: a new TPM: the old TPM's state is not carried", 1},
		{"host-model", "mode='host-passthrough'", "mode='host-model'", func(s desired.VMSpec) bool { return s.CPUModel == "" },
			"not expressible        dom.xml:21:3 domain/cpu mode=host-model", 0},
		{"machine that is no QEMU name", "machine='pc-q35-7.2'", "machine='pc,q35'", func(s desired.VMSpec) bool { return s.Machine == "" },
			"domain/os/type machine=pc,q35: not a QEMU machine name", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := base
			if tt.from != "" {
				if !strings.Contains(doc, tt.from) {
					t.Fatalf("fixture lacks %q", tt.from)
				}
				doc = strings.Replace(doc, tt.from, tt.to, 1)
			}
			p, err := FromLibvirt("dom.xml", []byte(doc), Options{Host: "hv-a"})
			if err != nil {
				t.Fatal(err)
			}
			if !tt.want(p.Spec) || !strings.Contains(p.ReviewText(), tt.report) || len(p.Blocking()) != tt.blocking {
				t.Errorf("spec %+v, %d blocking (want %d); want %q in the report:\n%s", p.Spec, len(p.Blocking()), tt.blocking, tt.report, p.ReviewText())
			}
			if strings.Contains(p.ReportText(), "SeaBIOS") && p.Spec.Firmware == desired.FirmwareUEFI {
				t.Errorf("a UEFI guest's report speaks of SeaBIOS:\n%s", p.ReportText())
			}
		})
	}
}

// TestLockedByRunningQEMU starts a real QEMU on a disk: the lock probe
// and Inspect refuse it while it runs, Stage is never reached, and the
// disk is byte for byte what it was.
func TestLockedByRunningQEMU(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	dir := t.TempDir()
	disk := makeDisk(t, dir)
	before := hashFile(t, disk)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	qmp := filepath.Join(dir, "qmp.sock")
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", "-machine", "q35,accel=tcg", "-m", "64", "-nodefaults", "-display", "none",
		"-S", "-qmp", "unix:"+qmp+",server=on,wait=off",
		"-drive", "file="+disk+",if=none,id=d0,format=qcow2", "-device", "virtio-blk-pci,drive=d0")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	// QEMU has locked the image once its QMP socket exists.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(qmp); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("QEMU did not start")
		}
	}
	if err := Locked(disk); !errors.Is(err, ErrRunning) {
		t.Fatalf("Locked = %v while QEMU runs the disk; want ErrRunning", err)
	}
	p, err := FromDisk(disk, 1, 128, "52:54:00:6b:3c:9a", Options{Host: "hv-a", Name: "web-01"})
	if err != nil {
		t.Fatal(err)
	}
	if err := Inspect(ctx, p, "qemu-img"); !errors.Is(err, ErrRunning) {
		t.Errorf("Inspect = %v; want ErrRunning", err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if err := Locked(disk); err != nil {
		t.Errorf("Locked after QEMU exited = %v", err)
	}
	if after := hashFile(t, disk); after != before {
		t.Errorf("disk changed: sha256 %s, was %s", after, before)
	}
}

// TestStage: on one filesystem the disk is renamed (same inode), and
// Unstage puts it back; across filesystems a copy that fails half-way
// leaves the original byte for byte as it was and no staged file.
func TestStage(t *testing.T) {
	t.Run("rename", func(t *testing.T) {
		dir := t.TempDir()
		disk := makeDisk(t, dir)
		before := hashFile(t, disk)
		var st0 = inode(t, disk)
		state := filepath.Join(dir, "state")
		s, err := Stage(disk, state, "web-01")
		if err != nil {
			t.Fatal(err)
		}
		if s.Method != MethodRename || s.Path != filepath.Join(state, "adopt", "web-01", "root.qcow2") || inode(t, s.Path) != st0 {
			t.Errorf("staged %+v (inode %d, was %d); want a rename to adopt/web-01/root.qcow2", s, inode(t, s.Path), st0)
		}
		if _, err := Stage(makeDisk(t, t.TempDir()), state, "web-01"); !errors.Is(err, ErrAlreadyStaged) {
			t.Errorf("second Stage = %v; want ErrAlreadyStaged", err)
		}
		if err := s.Unstage(); err != nil {
			t.Fatal(err)
		}
		if hashFile(t, disk) != before {
			t.Error("the disk changed")
		}
	})
	t.Run("copy fails half-way", func(t *testing.T) {
		disk := makeDisk(t, t.TempDir())
		// Write known bytes past the header so the copy has chunks to fail on.
		f, err := os.OpenFile(disk, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.Write(make([]byte, 3<<20))
		f.Close()
		before := hashFile(t, disk)
		state, err := os.MkdirTemp("/dev/shm", "gitfleet-adopt-")
		if err != nil {
			t.Skip("no /dev/shm for a second filesystem")
		}
		defer os.RemoveAll(state)
		if sameFilesystem(disk, state) {
			t.Skip("/dev/shm is on the test directory's filesystem")
		}
		copyHook = func(written int64) error {
			if written >= 2<<20 {
				return errors.New("disk full (injected)")
			}
			return nil
		}
		defer func() { copyHook = nil }()
		if _, err := Stage(disk, state, "web-01"); err == nil || !strings.Contains(err.Error(), "injected") {
			t.Fatalf("Stage = %v; want the injected failure", err)
		}
		if hashFile(t, disk) != before {
			t.Error("the original changed")
		}
		left, _ := filepath.Glob(filepath.Join(state, "adopt", "web-01", "*"))
		if len(left) != 0 {
			t.Errorf("the failed copy left %v", left)
		}
		copyHook = nil
		s, err := Stage(disk, state, "web-01")
		if err != nil {
			t.Fatal(err)
		}
		if s.Method == MethodRename || hashFile(t, s.Path) != before || hashFile(t, disk) != before {
			t.Errorf("staged %+v: want a copy equal to the original, the original kept", s)
		}
	})
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}
