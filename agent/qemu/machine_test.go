package qemu

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
)

func needUEFI(t *testing.T) {
	t.Helper()
	needQEMU(t)
	if _, err := selectFirmware(DefaultFirmwareDirs, "x86_64", "q35", false); err != nil {
		t.Skipf("no OVMF (apt-get install ovmf): %v", err)
	}
}

func needSWTPM(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("swtpm"); err != nil {
		t.Skip("swtpm not installed (apt-get install swtpm)")
	}
}

// machineProbe is the tiny guest's user-data: it says whether it booted
// under UEFI, prints the test variable it finds (written by its previous
// boot) and writes it anew with this boot's number, and reads the TPM's
// clock (TPM2_ReadClock, no session) to print its resetCount, which the
// TPM keeps in its non-volatile state and the firmware's TPM2_Startup
// increments at every boot.
const machineProbe = `#!/bin/sh
v=/sys/firmware/efi/efivars/GitfleetTest-3b8a4c2e-1f6d-4d8a-9c5e-7a1b2c3d4e5f
if [ -d /sys/firmware/efi ]; then echo "efi yes"; else echo "efi no"; fi
mount -t efivarfs efivarfs /sys/firmware/efi/efivars || echo "efivarfs failed"
if [ -e $v ]; then n=$(tail -c +5 $v); echo "var boot-$n"; else n=0; echo "var none"; fi
printf '\007\000\000\000%s' $((n + 1)) > /tmp/var
dd if=/tmp/var of=$v bs=64 2>/dev/null && echo "var written"
if [ -e /sys/class/tpm/tpm0 ]; then echo "tpm0 yes $(cat /sys/class/tpm/tpm0/tpm_version_major)"; else echo "tpm0 no"; fi
exec 3<>/dev/tpm0 && printf '\200\001\000\000\000\012\000\000\001\201' >&3 && echo "tpmclock $(dd bs=64 count=1 <&3 2>/dev/null | hexdump -v -e '1/1 "%02x"')"
`

// resetCount is TPM2_ReadClock's resetCount in the guest's "tpmclock"
// probe line of the last boot in serial: response header (10 bytes),
// time (8), clock (8), then resetCount (4, big-endian).
func resetCount(t *testing.T, serial string) int64 {
	t.Helper()
	m := regexp.MustCompile(`probe tpmclock ([0-9a-f]+)`).FindAllStringSubmatch(serial, -1)
	if len(m) == 0 || len(m[len(m)-1][1]) < 60 {
		t.Fatalf("no TPM2_ReadClock answer in the guest's output:\n%s", strings.Join(guestLines(serial), "\n"))
	}
	hex := m[len(m)-1][1]
	if hex[:4] != "8001" || hex[12:20] != "00000000" {
		t.Fatalf("TPM2_ReadClock failed: %s", hex)
	}
	n, err := strconv.ParseInt(hex[52:60], 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A tiny guest boots with firmware: uefi (OVMF, the code read-only and a
// variables file of the VM's own) and tpm: true (swtpm); a UEFI variable
// it writes and its TPM's state survive a restart, the files have the
// owners and modes the design says, and no swtpm outlives the VM.
func TestUEFIAndTPMSurviveARestart(t *testing.T) {
	needUEFI(t)
	needSWTPM(t)
	t.Parallel()
	srv := newArtifactServer(t)
	spec := guestSpec(t, srv)
	spec.Firmware, spec.TPM = desired.FirmwareUEFI, true
	spec.MemoryMB = 512 // OVMF faults in 128 MiB
	spec.CloudInit = &desired.CloudInit{UserData: machineProbe}
	cache, vmRoot := t.TempDir(), t.TempDir()
	name := "uefi-01"
	dir := filepath.Join(vmRoot, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := newTestProvisioner(t, cache, vmRoot, srv)
	t.Cleanup(func() { p.Destroy(context.Background(), name) })
	ctx := context.Background()
	m := agent.Machine{Name: name, Dir: dir, Spec: spec, InstanceID: "i-uefi-1"}
	if err := p.PrepareRootDisk(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := p.Boot(ctx, m); err != nil {
		t.Fatal(err)
	}
	s := waitSerial(t, dir, "probe tpmclock")
	for _, want := range []string{"probe efi yes", "probe var none", "probe var written", "probe tpm0 yes 2"} {
		if !strings.Contains(s, want) {
			t.Errorf("first boot: no %q:\n%s", want, strings.Join(guestLines(s), "\n"))
		}
	}
	first := resetCount(t, s)
	checkMachineFiles(t, p, dir)
	swtpmPid := p.machines[name].swtpmPid()
	if swtpmPid == 0 {
		t.Fatal("no swtpm runs beside the VM")
	}

	if err := p.Shutdown(ctx, name); err != nil {
		t.Fatal(err)
	}
	if alive(swtpmPid) {
		t.Errorf("swtpm (pid %d) outlived its VM", swtpmPid)
	}
	if err := p.Boot(ctx, m); err != nil {
		t.Fatal(err)
	}
	waitSerial(t, dir, "probe var boot-1")
	deadline := time.Now().Add(2 * time.Minute)
	for strings.Count(serial(dir), "probe tpmclock") < 2 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	s = serial(dir)
	if second := resetCount(t, s); second <= first {
		t.Errorf("the TPM's resetCount went from %d to %d across a restart: its state was not kept", first, second)
	}
	// A swtpm that dies under a running VM makes the VM count as down,
	// and says why.
	if err := syscall.Kill(p.machines[name].swtpmPid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for p.Running(name) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if p.Running(name) {
		t.Error("the VM still counts as running without its swtpm")
	}
	if why := p.FailureReason(name); !strings.Contains(why, "swtpm is gone") {
		t.Errorf("FailureReason = %q, want the swtpm named", why)
	}
	if err := p.Destroy(ctx, name); err != nil {
		t.Fatal(err)
	}
	for _, f := range MachineStateFiles {
		if _, err := os.Lstat(filepath.Join(dir, f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Destroy left %s: %v", f, err)
		}
	}
}

// checkMachineFiles checks the machine state files of a running VM: the
// variables file the agent's, 0600, of the template's size; the TPM's
// directory and state QEMU's user's, 0700 and 0600.
func checkMachineFiles(t *testing.T, p *Provisioner, dir string) {
	t.Helper()
	fi, err := os.Lstat(filepath.Join(dir, UEFIVarsFile))
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v %v, want a regular file of mode 0600", UEFIVarsFile, err, fi)
	}
	uid, _ := p.tpmOwner()
	for _, f := range []struct {
		name string
		dir  bool
	}{{TPMDir, true}, {filepath.Join(TPMDir, tpmStateFile), false}} {
		fi, err := os.Lstat(filepath.Join(dir, f.name))
		if err != nil {
			t.Errorf("%s: %v", f.name, err)
			continue
		}
		if err := checkOwned(filepath.Join(dir, f.name), fi, f.dir, uid); err != nil {
			t.Error(err)
		}
	}
}

func alive(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid) + "/cmdline")
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	return err == nil && !strings.Contains(string(b), ") Z ")
}
