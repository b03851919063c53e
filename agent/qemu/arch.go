package qemu

import (
	"debug/elf"
	"fmt"
	"os"
	"runtime"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
)

// archInfo is what one host architecture runs guests with: QEMU's name
// of it (firmware descriptors' target architecture), the QEMU binary, the
// default machine type, and the ELF machine of its kernels.
type archInfo struct {
	arch     desired.Arch
	qemuArch string
	binary   string
	machine  string
	elf      elf.Machine
}

// archs are the architectures the backend runs.
var archs = map[desired.Arch]archInfo{
	desired.ArchAMD64: {desired.ArchAMD64, "x86_64", "qemu-system-x86_64", "q35", elf.EM_X86_64},
	desired.ArchARM64: {desired.ArchARM64, "aarch64", "qemu-system-aarch64", "virt", elf.EM_AARCH64},
}

// hostArch is Config.Arch resolved: "" is the architecture this agent
// was built for (runtime.GOARCH).
func hostArch(name string) (archInfo, error) {
	if name == "" {
		name = runtime.GOARCH
	}
	a, ok := archs[desired.Arch(name)]
	if !ok {
		return archInfo{}, fmt.Errorf("arch %q: want amd64 or arm64", name)
	}
	return a, nil
}

// Arch is the architecture of the host's guests (Config.Arch, by
// default the agent's own): "amd64" or "arm64", for status.
func (p *Provisioner) Arch() string { return string(p.arch.arch) }

// Emulated reports whether guests run under TCG on an architecture other
// than the agent's own CPU's (qemu-system-aarch64 on an x86 host, as in
// CI): every instruction is translated, and guests are slow.
func (p *Provisioner) Emulated() bool {
	return p.accel == AccelTCG && string(p.arch.arch) != runtime.GOARCH
}

// checkArch refuses, as a permanent error before boot, a spec whose arch
// is not the host's, and a kernel whose ELF header names another
// machine than the host's. A kernel that is not ELF (an x86 bzImage, an
// arm64 Image, a compressed EFI zboot image) has no header to read; its
// architecture is then the spec's.
func (p *Provisioner) checkArch(spec desired.VMSpec, kernel string) error {
	if spec.Arch != "" && spec.Arch != p.arch.arch {
		return agent.Permanent(fmt.Errorf("arch: the VM is %s, but this host runs %s guests", spec.Arch, p.arch.arch))
	}
	if kernel == "" {
		return nil
	}
	m, ok, err := kernelMachine(kernel)
	if err != nil {
		return fmt.Errorf("arch: read kernel: %w", err)
	}
	if ok && m != p.arch.elf {
		return agent.Permanent(fmt.Errorf("arch: the kernel is an ELF image for %s, but this host runs %s guests (%s)", m, p.arch.arch, p.arch.elf))
	}
	if !ok {
		if got, ok := bootImageArch(kernel); ok && got != p.arch.arch {
			return agent.Permanent(fmt.Errorf("arch: the kernel is a boot image for %s, but this host runs %s guests", got, p.arch.arch))
		}
	}
	return nil
}

// kernelMachine reads the ELF header of the kernel at path; ok is false
// when it is not ELF.
func kernelMachine(path string) (elf.Machine, bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	ef, err := elf.NewFile(f)
	if err != nil {
		return 0, false, nil
	}
	return ef.Machine, true, nil
}

// bootImageArch reads the architecture of a Linux boot image that is
// not ELF: an arm64 Image has "ARM\x64" at offset 56, an x86 bzImage
// "HdrS" at offset 0x202 (Linux's Documentation/arch/arm64/booting.rst
// and x86/boot.rst).
func bootImageArch(path string) (desired.Arch, bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	head := make([]byte, 0x206)
	if n, _ := f.ReadAt(head, 0); n < len(head) {
		return "", false
	}
	switch {
	case string(head[56:60]) == "ARM\x64":
		return desired.ArchARM64, true
	case string(head[0x202:0x206]) == "HdrS":
		return desired.ArchAMD64, true
	}
	return "", false
}
