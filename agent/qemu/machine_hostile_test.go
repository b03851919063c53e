package qemu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
)

// A snapshot cannot say where a VM's variables or TPM state live: the
// spec has no such field (the parser refuses one), the paths are the VM
// directory's fixed names, and what is planted at those names is refused,
// never followed; a machine type or CPU model carrying QEMU options is
// refused before QEMU sees it.
func TestAForgedSnapshotCannotPlaceMachineState(t *testing.T) {
	for _, field := range []string{"uefiVars: /etc/shadow", "tpmState: /var/lib/other-vm/tpm", "nvram: ../../x"} {
		spec := desired.VMSpec{Host: "hv-a", VCPUs: 1, MemoryMB: 512, DiskGB: 5, Power: desired.PowerRunning, Firmware: desired.FirmwareUEFI, TPM: true}
		snap := "host: hv-a\nepoch: 4\nsource: {commit: abc, branch: main}\nhostSpec: {}\nvms:\n  - name: web-01\n    specHash: " + string(desired.SpecHash(spec)) +
			"\n    spec: {host: hv-a, vcpus: 1, memoryMB: 512, diskGB: 5, power: running, firmware: uefi, tpm: true, " + field + "}\n    tombstoned: false\nvolumes: []\n"
		if _, err := snapshots.ParseSnapshot([]byte(snap)); err == nil || !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("a snapshot whose spec has %q: %v, want an unknown field", field, err)
		}
	}

	p := newTestProvisioner(t, t.TempDir(), t.TempDir(), nil)
	for _, spec := range []desired.VMSpec{
		{Machine: "q35,smm=off"}, {CPUModel: "max,+vmx"}, {Firmware: "/usr/share/OVMF/OVMF_CODE.fd"}, {Arch: "arm64"},
	} {
		if _, err := p.machineModel(spec); !agent.IsPermanent(err) {
			t.Errorf("machineModel(%+v) = %v, want a permanent error", spec, err)
		}
	}

	fw, err := selectFirmware(DefaultFirmwareDirs, "x86_64", "q35", false)
	if err != nil {
		t.Skipf("no OVMF (apt-get install ovmf): %v", err)
	}
	dir := t.TempDir()
	secret := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(secret, []byte("host only"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(dir, UEFIVarsFile)); err != nil {
		t.Fatal(err)
	}
	if err := ensureVars(dir, fw); !errors.Is(err, ErrUnsafeFile) || !agent.IsPermanent(err) {
		t.Errorf("ensureVars over a planted symbolic link: %v, want a permanent ErrUnsafeFile", err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "host only" {
		t.Errorf("the link's target was written: %q", b)
	}
}

// The variables file is made from the template once and never
// overwritten; one of another size is an error, not a fresh copy.
func TestUEFIVarsAreMadeOnceAndNeverReplaced(t *testing.T) {
	fw, err := selectFirmware(DefaultFirmwareDirs, "x86_64", "q35", false)
	if err != nil {
		t.Skipf("no OVMF (apt-get install ovmf): %v", err)
	}
	dir := t.TempDir()
	vars := filepath.Join(dir, UEFIVarsFile)
	if err := ensureVars(dir, fw); err != nil {
		t.Fatal(err)
	}
	tmpl, _ := os.ReadFile(fw.vars)
	got, _ := os.ReadFile(vars)
	if string(got) != string(tmpl) {
		t.Fatalf("%s is not a copy of the template %s", UEFIVarsFile, fw.vars)
	}
	// What the guest wrote stays.
	f, _ := os.OpenFile(vars, os.O_WRONLY, 0)
	f.WriteAt([]byte("guest wrote this"), 100)
	f.Close()
	if err := ensureVars(dir, fw); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(vars); !strings.Contains(string(got), "guest wrote this") {
		t.Error("a second ensureVars replaced the VM's variables")
	}
	if err := os.Truncate(vars, 4096); err != nil {
		t.Fatal(err)
	}
	if err := ensureVars(dir, fw); !agent.IsPermanent(err) || !strings.Contains(err.Error(), "never replaced") {
		t.Errorf("ensureVars of a truncated file: %v, want a permanent error", err)
	}
	if fi, _ := os.Stat(vars); fi.Size() != 4096 {
		t.Errorf("the truncated variables were replaced (%d bytes)", fi.Size())
	}
}

// Two VMs never share a TPM state: each VM's state is its own
// directory's, each swtpm runs in its own VM's state, and a VM whose
// tpm/ is a link to another VM's is refused.
func TestTwoVMsNeverShareATPM(t *testing.T) {
	needSWTPM(t)
	root := t.TempDir()
	p := newTestProvisioner(t, t.TempDir(), root, nil)
	ctx := context.Background()
	var states []*vmState
	for _, name := range []string{"a", "b"} {
		if err := os.Mkdir(filepath.Join(root, name), 0o700); err != nil {
			t.Fatal(err)
		}
		st := p.state(name, filepath.Join(root, name))
		if err := p.prepareTPM(ctx, st); err != nil {
			t.Fatal(err)
		}
		tpm, err := p.startSWTPM(st)
		if err != nil {
			t.Fatal(err)
		}
		tpm.qemu.Close() // no QEMU: with --terminate, swtpm ends with its channel
		states = append(states, st)
	}
	t.Cleanup(func() {
		for _, st := range states {
			st.stopSWTPM()
		}
	})
	a, b := states[0], states[1]
	if pa, pb := a.swtpmPid(), b.swtpmPid(); pa != 0 && pa == pb {
		t.Errorf("both VMs name swtpm pid %d", pa)
	}
	sa, _ := os.Stat(filepath.Join(a.path(TPMDir), tpmStateFile))
	sb, _ := os.Stat(filepath.Join(b.path(TPMDir), tpmStateFile))
	if sa == nil || sb == nil || os.SameFile(sa, sb) {
		t.Fatalf("the two VMs' TPM states: %v and %v, want two files", sa, sb)
	}

	// c's tpm/ is a link to a's: refused, and a's state untouched.
	c := filepath.Join(root, "c")
	os.Mkdir(c, 0o700)
	if err := os.Symlink(a.path(TPMDir), filepath.Join(c, TPMDir)); err != nil {
		t.Fatal(err)
	}
	if err := p.prepareTPM(ctx, p.state("c", c)); !errors.Is(err, ErrTPMState) || !agent.IsPermanent(err) {
		t.Errorf("prepareTPM of a tpm/ that links to another VM's: %v, want a permanent ErrTPMState", err)
	}

	// A state that vanished is an error, never a fresh TPM.
	a.stopSWTPM()
	if err := os.Remove(filepath.Join(a.path(TPMDir), tpmStateFile)); err != nil {
		t.Fatal(err)
	}
	if err := p.prepareTPM(ctx, a); !errors.Is(err, ErrTPMState) || !strings.Contains(err.Error(), "is lost") {
		t.Errorf("prepareTPM of a TPM whose state is gone: %v, want ErrTPMState", err)
	}
	if _, err := os.Stat(filepath.Join(a.path(TPMDir), tpmStateFile)); !errors.Is(err, os.ErrNotExist) {
		t.Error("a fresh TPM state was made in place of the lost one")
	}
}

// The firmware is chosen from the descriptors, first by file name, by
// interface, architecture, machine and Secure Boot; a name in an earlier
// directory replaces the same name in a later one, and an empty file
// hides it.
func TestSelectFirmwareFromDescriptors(t *testing.T) {
	files := t.TempDir()
	file := func(name string) string {
		p := filepath.Join(files, name)
		os.WriteFile(p, []byte("fd"), 0o644)
		return p
	}
	code, vars, sbCode, sbVars, armCode, armVars := file("code"), file("vars"), file("sb-code"), file("sb-vars"), file("arm-code"), file("arm-vars")
	desc := func(codePath, varsPath, arch, machine string, features ...string) string {
		f := `"` + strings.Join(features, `","`) + `"`
		if len(features) == 0 {
			f = ""
		}
		return `{"interface-types":["uefi"],"mapping":{"device":"flash","executable":{"filename":"` + codePath + `","format":"raw"},` +
			`"nvram-template":{"filename":"` + varsPath + `","format":"raw"}},"targets":[{"architecture":"` + arch + `","machines":["` + machine + `"]}],"features":[` + f + `]}`
	}
	system, local := t.TempDir(), t.TempDir()
	write := func(dir, name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(system, "10-bios.json", `{"interface-types":["bios"],"mapping":{"device":"memory"}}`)
	write(system, "20-broken.json", `{not json`)
	write(system, "30-missing.json", desc("/nonexistent/code", vars, "x86_64", "pc-q35-*"))
	write(system, "40-secure.json", desc(sbCode, sbVars, "x86_64", "pc-q35-*", "secure-boot", "enrolled-keys", "requires-smm"))
	write(system, "50-secure-no-keys.json", desc(sbCode, vars, "x86_64", "pc-q35-*", "secure-boot", "requires-smm"))
	write(system, "60-plain.json", desc(code, vars, "x86_64", "pc-q35-*"))
	write(system, "70-arm.json", desc(armCode, armVars, "aarch64", "virt-*"))
	dirs := []string{local, system}
	tests := []struct {
		arch, machine string
		sb            bool
		code          string
		smm           bool
	}{
		{"x86_64", "q35", false, code, false},
		{"x86_64", "pc-q35-7.2", false, code, false},
		{"x86_64", "q35", true, sbCode, true},
		{"aarch64", "virt", false, armCode, false},
	}
	for _, tt := range tests {
		fw, err := selectFirmware(dirs, tt.arch, tt.machine, tt.sb)
		if err != nil || fw.code != tt.code || fw.smm != tt.smm {
			t.Errorf("selectFirmware(%s, %s, secureBoot %v) = %+v, %v; want code %s, smm %v", tt.arch, tt.machine, tt.sb, fw, err, tt.code, tt.smm)
		}
	}
	for _, tt := range []struct {
		arch, machine string
		sb            bool
	}{{"x86_64", "pc", false}, {"aarch64", "virt", true}, {"riscv64", "virt", false}} {
		if _, err := selectFirmware(dirs, tt.arch, tt.machine, tt.sb); !errors.Is(err, ErrNoFirmware) {
			t.Errorf("selectFirmware(%s, %s, %v) = %v, want ErrNoFirmware", tt.arch, tt.machine, tt.sb, err)
		}
	}
	// The host's own file replaces the distribution's, and an empty one hides it.
	write(local, "60-plain.json", desc(armCode, armVars, "x86_64", "pc-q35-*"))
	if fw, err := selectFirmware(dirs, "x86_64", "q35", false); err != nil || fw.code != armCode {
		t.Errorf("with a local 60-plain.json: %+v, %v", fw, err)
	}
	write(local, "60-plain.json", "")
	if _, err := selectFirmware(dirs, "x86_64", "q35", false); !errors.Is(err, ErrNoFirmware) || !strings.Contains(err.Error(), "30-missing.json") {
		t.Errorf("with 60-plain.json hidden: %v, want ErrNoFirmware naming the skipped descriptor", err)
	}
}

// With secureBoot the distribution's Secure Boot build with Microsoft's
// keys enrolled is chosen (it requires SMM), and real QEMU starts the VM
// with it: q35 with SMM, the flash secure, the code read-only.
func TestSecureBootStartsOnRealOVMF(t *testing.T) {
	needUEFI(t)
	t.Parallel()
	fw, err := selectFirmware(DefaultFirmwareDirs, "x86_64", "q35", true)
	if err != nil {
		t.Skipf("no Secure Boot OVMF: %v", err)
	}
	if !fw.smm || !strings.Contains(fw.vars, "ms") {
		t.Errorf("Secure Boot firmware %+v: want the SMM build with Microsoft's keys enrolled", fw)
	}
	srv := newArtifactServer(t)
	spec := guestSpec(t, srv)
	spec.Firmware, spec.SecureBoot, spec.MemoryMB = desired.FirmwareUEFI, true, 512
	vmRoot := t.TempDir()
	p := newTestProvisioner(t, t.TempDir(), vmRoot, srv)
	name := "sb-01"
	dir := filepath.Join(vmRoot, name)
	os.MkdirAll(dir, 0o700)
	t.Cleanup(func() { p.Destroy(context.Background(), name) })
	m := agent.Machine{Name: name, Dir: dir, Spec: spec, InstanceID: "i-sb-1"}
	ctx := context.Background()
	if err := p.PrepareRootDisk(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := p.Boot(ctx, m); err != nil {
		t.Fatal(err)
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(p.machines[name].pid()) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	args := strings.ReplaceAll(string(cmdline), "\x00", " ")
	for _, want := range []string{"q35,accel=tcg,smm=on", "driver=cfi.pflash01,property=secure,value=on", "readonly=on,file=" + fw.code, "file=" + filepath.Join(dir, UEFIVarsFile)} {
		if !strings.Contains(args, want) {
			t.Errorf("QEMU's command line lacks %q:\n%s", want, args)
		}
	}
	if tmpl, _ := os.ReadFile(fw.vars); len(tmpl) == 0 {
		t.Fatal("empty template")
	} else if got, _ := os.ReadFile(filepath.Join(dir, UEFIVarsFile)); len(got) != len(tmpl) {
		t.Errorf("%s is %d bytes, the enrolled template %d", UEFIVarsFile, len(got), len(tmpl))
	}
}
