package qemu

import (
	"bufio"
	"os"
	"runtime"
	"strings"
)

// Accelerator names as Config.Accel and Provisioner.Accel use them.
const (
	AccelAuto = "auto"
	AccelKVM  = "kvm"
	AccelTCG  = "tcg"
)

// detectAccel picks KVM only when the CPU advertises hardware
// virtualization (vmx or svm in cpuinfo's flags) AND kvmDev opens
// read-write; otherwise TCG. The flags are checked first: some sandboxes
// expose a /dev/kvm that opens but hangs QEMU, and there the flags are
// missing.
func detectAccel(cpuinfo, kvmDev string) string {
	// arm64's cpuinfo names no virtualization flag: /dev/kvm alone says.
	if runtime.GOARCH != "arm64" && !cpuHasVirt(cpuinfo) {
		return AccelTCG
	}
	f, err := os.OpenFile(kvmDev, os.O_RDWR, 0)
	if err != nil {
		return AccelTCG
	}
	f.Close()
	return AccelKVM
}

// cpuHasVirt reports whether a "flags" line of the cpuinfo file lists vmx
// (Intel VT-x) or svm (AMD-V).
func cpuHasVirt(cpuinfo string) bool {
	f, err := os.Open(cpuinfo)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(key) != "flags" {
			continue
		}
		for _, fl := range strings.Fields(val) {
			if fl == "vmx" || fl == "svm" {
				return true
			}
		}
	}
	return false
}
