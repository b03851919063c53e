package desired

import (
	"strings"
	"testing"
)

// machineHost is a Host file of arch arch ("" writes none).
func machineHost(name, arch string) string {
	s := "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: " + name + "}\nspec:\n  capacity: {vcpus: 8}\n"
	if arch != "" {
		s += "  arch: " + arch + "\n"
	}
	return s
}

// The machine model's fields on their own: each refusal names the file,
// line, column and field.
func TestMachineFieldsValidate(t *testing.T) {
	tests := []struct {
		name  string
		extra string
		want  []string
	}{
		{"uefi with secure boot and a tpm", "  firmware: uefi\n  secureBoot: true\n  tpm: true\n  machine: q35\n  cpuModel: max\n", nil},
		{"explicit bios", "  firmware: bios\n", nil},
		{"unknown firmware", "  firmware: coreboot\n", []string{
			`obj.yaml:13:13: spec.firmware: must be bios or uefi, got "coreboot"`}},
		{"secure boot without uefi", "  secureBoot: true\n", []string{
			`obj.yaml:13:15: spec.secureBoot: needs firmware: uefi (Secure Boot is a UEFI feature; the VM's firmware is bios)`}},
		{"secure boot with explicit bios", "  firmware: bios\n  secureBoot: true\n", []string{
			`obj.yaml:14:15: spec.secureBoot: needs firmware: uefi (Secure Boot is a UEFI feature; the VM's firmware is bios)`}},
		{"secure boot on pc", "  firmware: uefi\n  secureBoot: true\n  machine: pc\n", []string{
			`obj.yaml:15:12: spec.machine: "pc": Secure Boot on amd64 needs a q35 machine (its firmware runs in SMM)`}},
		{"machine with options", "  machine: q35,smm=off\n", []string{
			`obj.yaml:13:12: spec.machine: "q35,smm=off" must be 1 to 64 letters, digits, '-', '_' or '.' (a QEMU name, without options)`}},
		{"cpu model with options", "  cpuModel: host,-vmx\n", []string{
			`obj.yaml:13:13: spec.cpuModel: "host,-vmx" must be 1 to 64 letters, digits, '-', '_' or '.' (a QEMU name, without options)`}},
		{"unknown arch", "  arch: riscv64\n", []string{
			`obj.yaml:13:9: spec.arch: must be amd64 or arm64, got "riscv64"`}},
		{"arm64 image without uefi", "  arch: arm64\n", []string{
			`obj.yaml:13:9: spec.firmware: is bios, but arch arm64 has no BIOS: an image boots only with firmware: uefi (or give a kernel for a direct kernel boot)`}},
		{"arm64 image with bios", "  arch: arm64\n  firmware: bios\n", []string{
			`obj.yaml:14:13: spec.firmware: is bios, but arch arm64 has no BIOS: an image boots only with firmware: uefi (or give a kernel for a direct kernel boot)`}},
		{"arm64 on q35", "  arch: arm64\n  firmware: uefi\n  machine: q35\n", []string{
			`obj.yaml:15:12: spec.machine: "q35": arm64 guests run on the virt machine`}},
		{"firmware change opt-in", "  firmware: uefi\n  allowFirmwareChangeFrom: bios\n", nil},
		{"opt-in naming the firmware asked for", "  firmware: uefi\n  allowFirmwareChangeFrom: uefi\n", []string{
			`obj.yaml:14:28: spec.firmware: is uefi, and allowFirmwareChangeFrom names it too: allowFirmwareChangeFrom names the firmware a created VM is changed from, another than firmware`}},
		{"opt-in of an unknown firmware", "  allowFirmwareChangeFrom: efi\n", []string{
			`obj.yaml:13:28: spec.allowFirmwareChangeFrom: must be bios or uefi, got "efi"`}},
		{"tpm as a string", "  tpm: \"yes\"\n", []string{
			`obj.yaml:13:8: spec.tpm: must be true or false, got the string "yes"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errs := parseFile("obj.yaml", []byte(vm(vmBody+tt.extra)))
			got := errStrings(errs)
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

// A VM's arch is cross-checked against its Host's spec.arch (amd64 when
// absent), and an arm64 Host's VM that boots an image needs UEFI.
func TestMachineArchMatchesTheHost(t *testing.T) {
	vmFile := func(host, extra string) string {
		return "apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata: {name: v}\nspec:\n  host: " + host +
			"\n  vcpus: 1\n  memoryMB: 512\n  diskGB: 1\n  image: {url: https://example.org/d.qcow2, sha256: " + sumA + "}\n" + extra
	}
	tests := []struct {
		name     string
		hostArch string
		vm       string
		want     string
	}{
		{"arm64 VM on an arm64 host", "arm64", vmFile("h", "  arch: arm64\n  firmware: uefi\n"), ""},
		{"amd64 VM on a host of no arch", "", vmFile("h", "  arch: amd64\n"), ""},
		{"arm64 VM on a host of no arch", "", vmFile("h", "  arch: arm64\n  firmware: uefi\n"),
			`vms/v.yaml:10:9: spec.arch: is arm64, but Host "h" is amd64 (its spec.arch): a host runs guests of its own architecture`},
		{"amd64 VM on an arm64 host", "arm64", vmFile("h", "  arch: amd64\n"),
			`vms/v.yaml:10:9: spec.arch: is amd64, but Host "h" is arm64 (its spec.arch): a host runs guests of its own architecture`},
		{"image VM of no arch on an arm64 host", "arm64", vmFile("h", ""),
			`vms/v.yaml:5:9: spec.host: Host "h" is arm64, which has no BIOS: an image boots there only with firmware: uefi (or give a kernel for a direct kernel boot)`},
		{"unknown host arch", "sparc", vmFile("h", ""),
			`hosts/h.yaml:6:9: spec.arch: must be amd64 or arm64, got "sparc"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewLoader("").Load(newMemTree(map[string]string{"hosts/h.yaml": machineHost("h", tt.hostArch), "vms/v.yaml": tt.vm}, nil))
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("Load:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

// A firmware change of a VM says in the plan that the agent refuses it,
// unless allowFirmwareChangeFrom names the old firmware; the other machine
// fields restart the VM.
func TestPlanSaysAFirmwareChangeIsRefused(t *testing.T) {
	base := planFleet(planHost("hv-a"), planVM("web-01", "hv-a"))
	refused := planFleet(planHost("hv-a"), planVM("web-01", "hv-a", func(s *VMSpec) { s.Firmware = FirmwareUEFI; s.TPM = true }))
	allowed := planFleet(planHost("hv-a"), planVM("web-01", "hv-a", func(s *VMSpec) {
		s.Firmware, s.AllowFirmwareChangeFrom = FirmwareUEFI, FirmwareBIOS
	}))
	tpmOnly := planFleet(planHost("hv-a"), planVM("web-01", "hv-a", func(s *VMSpec) { s.TPM = true }))
	change := func(head *Fleet) PlanChange {
		t.Helper()
		p := ComputePlan(base, head, PlanOptions{})
		if len(p.Hosts) != 1 || len(p.Hosts[0].Changes) != 1 {
			t.Fatalf("plan: %+v", p.Hosts)
		}
		return p.Hosts[0].Changes[0]
	}
	c := change(refused)
	want := "firmware change from bios to uefi refused: the guest was installed for its firmware and will likely not boot on another; the VM keeps its firmware unless the spec also sets allowFirmwareChangeFrom: bios"
	if strings.Join(c.Warnings, "\n") != want {
		t.Errorf("warnings of a firmware change without the opt-in:\n%s\nwant:\n%s", strings.Join(c.Warnings, "\n"), want)
	}
	for _, f := range c.Fields {
		if f.Effect != EffectRestart {
			t.Errorf("%s: effect %q, want %q", f.Field, f.Effect, EffectRestart)
		}
	}
	c = change(allowed)
	want = "firmware changes from bios to uefi (allowed by allowFirmwareChangeFrom: bios): the guest's boot loader was installed for bios and will likely not boot"
	if strings.Join(c.Warnings, "\n") != want {
		t.Errorf("warnings of an allowed firmware change:\n%s\nwant:\n%s", strings.Join(c.Warnings, "\n"), want)
	}
	c = change(tpmOnly)
	if len(c.Warnings) != 0 || len(c.Fields) != 1 || c.Fields[0].Field != "spec.tpm" || c.Fields[0].Effect != EffectRestart {
		t.Errorf("tpm only: %+v", c)
	}
}
