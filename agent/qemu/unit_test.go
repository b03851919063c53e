package qemu

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/hostnet"
	"github.com/gitfleet/gitfleet/desired"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

func TestDetectAccel(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	vmx := write("cpuinfo-vmx", "processor\t: 0\nflags\t\t: fpu vme de pse vmx sse2\n")
	svm := write("cpuinfo-svm", "processor\t: 0\nflags\t\t: fpu svm lm\n")
	none := write("cpuinfo-none", "processor\t: 0\nflags\t\t: fpu vme de pse sse2 hypervisor\n")
	kvm := write("kvm", "")
	missing := filepath.Join(dir, "no-kvm")

	for _, tc := range []struct {
		name, cpuinfo, kvm, want string
	}{
		{"vmx and kvm", vmx, kvm, AccelKVM},
		{"svm and kvm", svm, kvm, AccelKVM},
		{"flags but no /dev/kvm", vmx, missing, AccelTCG},
		{"/dev/kvm but no flags", none, kvm, AccelTCG},
		{"no cpuinfo", missing, kvm, AccelTCG},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := detectAccel(tc.cpuinfo, tc.kvm); got != tc.want {
				t.Errorf("detectAccel = %s, want %s", got, tc.want)
			}
		})
	}
}

// On this project's machines /dev/kvm exists but the CPU flags show no
// hardware virtualization, and such a /dev/kvm hangs QEMU: auto must pick
// TCG.
func TestAutoPicksTCGWithoutVirtFlags(t *testing.T) {
	if cpuHasVirt("/proc/cpuinfo") {
		t.Skip("this CPU shows vmx/svm: auto may rightly pick KVM here")
	}
	p, err := New(Config{CacheDir: t.TempDir(), Accel: AccelAuto})
	if err != nil {
		t.Fatal(err)
	}
	if p.Accel() != AccelTCG {
		t.Errorf("auto picked %s on a CPU without vmx/svm, want tcg", p.Accel())
	}
	if _, err := New(Config{CacheDir: t.TempDir(), Accel: "xen"}); err == nil {
		t.Error("New accepted accel xen")
	}
}

func TestMACFor(t *testing.T) {
	a, b := macFor("web-01"), macFor("web-02")
	if a != macFor("web-01") {
		t.Error("MAC is not stable for one name")
	}
	if a == b {
		t.Errorf("web-01 and web-02 share MAC %s", a)
	}
	for _, mac := range []string{a, b} {
		var first byte
		if _, err := fmt.Sscanf(mac[:2], "%x", &first); err != nil {
			t.Fatal(err)
		}
		if first&0x02 == 0 || first&0x01 != 0 {
			t.Errorf("MAC %s is not locally administered unicast", mac)
		}
	}
}

func TestArgsGolden(t *testing.T) {
	l := launch{
		name: "web-01", dir: "/var/lib/gitfleet/vms/web-01", accel: AccelTCG,
		vcpus: 2, memMB: 512,
		root: "/var/lib/gitfleet/vms/web-01/root.qcow2", seed: "/var/lib/gitfleet/vms/web-01/seed.iso",
		volumes: []string{"/var/lib/gitfleet/volumes/web-01-data.img", "/srv/odd,name.img"},
		kernel:  "/var/cache/gitfleet/k", initrd: "/var/cache/gitfleet/i", cmdline: "console=ttyS0",
		mac: macFor("web-01"), sshPort: 2201, runAs: "gitfleet-qemu", sandbox: true,
	}
	got := strings.Join(l.args(), "\n") + "\n"
	got += "--- kvm\n" + strings.Join(launch{name: "k", dir: "/d", accel: AccelKVM, vcpus: 1, memMB: 128, root: "/d/r", seed: "/d/s", mac: macFor("k"), sshPort: 1}.args()[:6], "\n") + "\n"
	tapped := l
	tapped.tap, tapped.sshPort = "gft0123456789ab", 0
	a := tapped.args()
	i := slices.Index(a, "-netdev")
	got += "--- tap\n" + strings.Join(a[i:i+4], "\n") + "\n"
	uefi := l
	uefi.machineModel = machineModel{arch: archs[desired.ArchAMD64], machine: "q35", tpm: true,
		fw: &uefiFirmware{code: "/usr/share/OVMF/OVMF_CODE_4M.ms.fd", vars: "/usr/share/OVMF/OVMF_VARS_4M.ms.fd", format: "raw", smm: true}}
	uefi.vars, uefi.tpmFD = "/var/lib/gitfleet/vms/web-01/uefi-vars.fd", 3
	a = uefi.args()
	i = slices.Index(a, "-display")
	got += "--- uefi secure boot tpm\n" + strings.Join(a[2:4], "\n") + "\n" + strings.Join(a[i+2:i+2+14], "\n") + "\n"
	arm := l
	arm.machineModel = machineModel{arch: archs[desired.ArchARM64], machine: "virt", cpu: "max", tpm: true}
	arm.tpmFD = 3
	a = arm.args()
	i = slices.Index(a, "-tpmdev")
	got += "--- arm64\n" + strings.Join(a[2:6], "\n") + "\n" + strings.Join(a[i-2:i+4], "\n") + "\n"
	nics := tapped
	nics.model = "e1000e"
	nics.more = []launchNIC{{tap: "gft00000000000b", mac: "52:54:00:91:92:01"}, {tap: "gft00000000000c", mac: "52:54:00:91:92:02", model: "rtl8139"}}
	a = nics.args()
	i = slices.Index(a, "-netdev")
	got += "--- nics\n" + strings.Join(a[i:i+12], "\n") + "\n"
	got += "--- scope\n" + strings.Join(scopeArgs("web-01", []string{"qemu-system-x86_64", "-name", "guest=web-01"}), "\n") + "\n"
	golden := filepath.Join("testdata", "args.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if got != string(want) {
		t.Errorf("args differ from %s (run with -update after checking):\n%s", golden, got)
	}
}

func TestCmdlineNames(t *testing.T) {
	// This test process is not a QEMU for any VM.
	if cmdlineNames(os.Getpid(), "web-01", "/x/qemu.pid") {
		t.Error("the test process reads as VM web-01")
	}
	if cmdlineNames(1<<30, "web-01", "/x/qemu.pid") {
		t.Error("a pid that does not exist reads as VM web-01")
	}
}

func TestTrimTail(t *testing.T) {
	in := []byte("line one\nline two\nqemu-system-x86_64: -drive x: Could not open\n\n")
	if got := string(trimTail(in, 30)); got != "qemu-system-x86_64: -drive x: Could not open" && !strings.HasSuffix(got, "Could not open") {
		t.Errorf("trimTail = %q", got)
	}
	if got := string(trimTail(in, 1000)); !strings.HasPrefix(got, "line one") {
		t.Errorf("trimTail kept %q", got)
	}
}

func TestSSHPortPersistedAndReallocated(t *testing.T) {
	p, err := New(Config{CacheDir: t.TempDir(), Accel: AccelTCG, Logger: quietLog().Logger})
	if err != nil {
		t.Fatal(err)
	}
	a := p.state("a", t.TempDir())
	b := p.state("b", t.TempDir())
	pa, err := p.sshPort(a)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := p.sshPort(b)
	if err != nil {
		t.Fatal(err)
	}
	if pa == pb {
		t.Fatalf("two VMs share port %d", pa)
	}
	if saved, _ := readPort(a.path(PortFile)); saved != pa {
		t.Errorf("port file says %d, allocated %d", saved, pa)
	}
	// A new Provisioner (agent restart) keeps the port.
	p2, _ := New(Config{CacheDir: t.TempDir(), Accel: AccelTCG, Logger: quietLog().Logger})
	if again, err := p2.sshPort(p2.state("a", a.dir)); err != nil || again != pa {
		t.Errorf("after restart: port %d (%v), want %d", again, err, pa)
	}
	// Someone else took it while the VM was down: a new one is allocated
	// and saved.
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", pa))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	moved, err := p2.sshPort(p2.state("a", a.dir))
	if err != nil || moved == pa {
		t.Fatalf("taken port: got %d (%v)", moved, err)
	}
	if saved, _ := readPort(a.path(PortFile)); saved != moved {
		t.Errorf("port file says %d, allocated %d", saved, moved)
	}
	if addr := p2.Address("a"); addr.SSH != fmt.Sprintf("127.0.0.1:%d", moved) || addr.IP != "" {
		t.Errorf("Address of a stopped VM = %+v", addr)
	}
}

// qcow2Stub is the header of an empty qcow2 version 3 image of size
// bytes: enough for checkRootDisk, in tests that never start QEMU on it.
func qcow2Stub(size int64) []byte {
	h := make([]byte, 112) // the 104-byte header, then the end of extensions
	be := binary.BigEndian
	copy(h, qcow2Magic)
	be.PutUint32(h[4:], 3)
	be.PutUint32(h[20:], 16) // cluster_bits
	be.PutUint64(h[24:], uint64(size))
	be.PutUint32(h[96:], 4)    // refcount_order
	be.PutUint32(h[100:], 104) // header_length
	return h
}

func TestNetworkWithoutHostNetworkingIsPermanent(t *testing.T) {
	p, err := New(Config{CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, RootDiskFile), qcow2Stub(1<<30), 0o600)
	lan := desired.Network{Bridge: "br0"}
	for _, m := range []agent.Machine{
		{Name: "web-01", Dir: dir, Spec: desired.VMSpec{Network: "lan"}, Networks: map[string]desired.Network{"lan": lan}},
		{Name: "web-01", Dir: dir, Spec: desired.VMSpec{Network: "lan"}},
	} {
		err := p.Boot(context.Background(), m)
		if !agent.IsPermanent(err) || !strings.Contains(err.Error(), `network "lan"`) {
			t.Errorf("Boot on network %q (definition %v) = %v; want a permanent error naming it", m.Spec.Network, m.Networks, err)
		}
	}
	if err := p.ReconcileNetworks(context.Background(), map[string]desired.Network{"lan": lan}, nil, nil); err == nil {
		t.Error("ReconcileNetworks without host networking accepted a host network")
	}
}

func TestMachineWithoutDirectoryIsPermanent(t *testing.T) {
	p, err := New(Config{CacheDir: t.TempDir(), Accel: AccelTCG, Logger: quietLog().Logger})
	if err != nil {
		t.Fatal(err)
	}
	m := agent.Machine{Name: "nowhere", Spec: desired.VMSpec{DiskGB: 1}}
	for name, step := range map[string]func(context.Context, agent.Machine) error{
		"PrepareRootDisk": p.PrepareRootDisk,
		"Boot":            p.Boot,
	} {
		t.Run(name, func(t *testing.T) {
			err := step(context.Background(), m)
			if !agent.IsPermanent(err) || !strings.Contains(err.Error(), "nowhere: no directory") {
				t.Errorf("%s without a directory: %v, want a permanent error naming the VM", name, err)
			}
		})
	}
}

// TestSeedStaticAddressesRenderWithCloudInit hands the network-config of a
// VM with static addresses to cloud-init's own renderer and checks what a
// Debian guest's systemd-networkd would be told.
func TestSeedStaticAddressesRenderWithCloudInit(t *testing.T) {
	ci, err := exec.LookPath("cloud-init")
	if err != nil {
		t.Skip("cloud-init is not installed")
	}
	mac := macFor("db-01")
	static := staticFor(&desired.StaticIP{
		Addresses:   []string{"10.77.0.20/24"},
		Nameservers: &desired.Nameservers{Search: []string{"lab.example"}},
	}, hostnet.Attachment{Gateway: netip.MustParseAddr("10.77.0.1")})
	files, err := seedFiles("db-01", "i-1", mac, nil, static)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	in := filepath.Join(dir, "network-config")
	os.WriteFile(in, files["network-config"], 0o600)
	out, err := exec.Command(ci, "devel", "net-convert", "-p", in, "-k", "yaml", "-d", filepath.Join(dir, "out"),
		"-D", "debian", "-O", "networkd", "-m", "eth0,"+mac).CombinedOutput()
	if err != nil {
		t.Fatalf("net-convert: %v: %s", err, out)
	}
	var rendered []byte
	filepath.WalkDir(filepath.Join(dir, "out"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := os.ReadFile(p)
			rendered = append(rendered, b...)
		}
		return nil
	})
	for _, want := range []string{"MACAddress=" + mac, "DHCP=no", "Address=10.77.0.20/24", "Gateway=10.77.0.1", "DNS=10.77.0.1", "Domains=lab.example"} {
		if !bytes.Contains(rendered, []byte(want)) {
			t.Errorf("networkd config lacks %q:\n%s\nfrom\n%s", want, rendered, files["network-config"])
		}
	}
}

// TestSeedTwoNICsRenderWithCloudInit: the network-config of a VM with two
// NICs, one by DHCP and one static, is what cloud-init's own renderer
// turns into a networkd config for each, each matched by its MAC.
func TestSeedTwoNICsRenderWithCloudInit(t *testing.T) {
	ci, err := exec.LookPath("cloud-init")
	if err != nil {
		t.Skip("cloud-init is not installed")
	}
	first, second := macFor("router"), "52:54:00:91:92:01"
	static := staticFor(&desired.StaticIP{Addresses: []string{"10.92.0.20/24"}},
		hostnet.Attachment{Gateway: netip.MustParseAddr("10.92.0.1")})
	files, err := seedFilesNICs("router", "i-1", []seedNIC{{mac: first}, {mac: second, static: static}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	in := filepath.Join(dir, "network-config")
	os.WriteFile(in, files["network-config"], 0o600)
	out, err := exec.Command(ci, "devel", "net-convert", "-p", in, "-k", "yaml", "-d", filepath.Join(dir, "out"),
		"-D", "debian", "-O", "networkd", "-m", "eth0,"+first, "-m", "eth1,"+second).CombinedOutput()
	if err != nil {
		t.Fatalf("net-convert: %v: %s", err, out)
	}
	rendered := map[string]string{}
	filepath.WalkDir(filepath.Join(dir, "out"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".network") {
			b, _ := os.ReadFile(p)
			rendered[filepath.Base(p)] = string(b)
		}
		return nil
	})
	var nic0, nic1 string
	for _, b := range rendered {
		switch {
		case strings.Contains(b, "MACAddress="+first):
			nic0 = b
		case strings.Contains(b, "MACAddress="+second):
			nic1 = b
		}
	}
	if !strings.Contains(nic0, "DHCP=ipv4") || !strings.Contains(nic0, "Name=nic0") {
		t.Errorf("first NIC's networkd config is not DHCP on nic0:\n%s\nfrom\n%s", nic0, files["network-config"])
	}
	for _, want := range []string{"Name=nic1", "Address=10.92.0.20/24", "Gateway=10.92.0.1"} {
		if !strings.Contains(nic1, want) {
			t.Errorf("second NIC's networkd config lacks %q:\n%s\nfrom\n%s", want, nic1, files["network-config"])
		}
	}
}
