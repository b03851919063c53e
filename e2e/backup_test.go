package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent/backup"
	"github.com/gitfleet/gitfleet/agent/qemu"
	"github.com/gitfleet/gitfleet/internal/tinyguest"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/e2etest"
)

// backedUpVM is db-01's file on hostName with a volume and extra spec
// lines (its backup policy, or where it is restored from).
func (a *artifacts) backedUpVM(hostName, volume, marker, extra string) string {
	var ud strings.Builder
	for _, l := range strings.Split(strings.TrimSuffix(tinyguest.KnownDataScript(marker), "\n"), "\n") {
		ud.WriteString("      " + l + "\n")
	}
	return fmt.Sprintf(`apiVersion: gitfleet.dev/v1alpha1
kind: VM
metadata: {name: db-01}
spec:
  host: %s
  vcpus: 1
  memoryMB: 128
  diskGB: 1
  kernel:
    url: %s
    sha256: %s
    initrd: {url: %s, sha256: %s}
    cmdline: %q
  volumes: [%s]
%s  cloudInit:
    userData: |
%s`, hostName, a.srv.URL+"/vmlinuz", sha(a.kernel), a.srv.URL+"/initrd", sha(a.initrd), a.guest.Cmdline, volume, extra, ud.String())
}

// TestBackupDeleteAndRestoreOnAnotherHost is the whole path through git:
// a BackupRepository (a local restic repository) and a VM are pushed; the
// running guest writes known data; the VM opts into backups and its
// scheduled backup shows in the status branch; the VM's file is removed (the
// reviewed delete: quarantine, destroy, finalize); then the VM is pushed
// on a second host with restore: latest, and its guest finds its data
// with the same hashes.
func TestBackupDeleteAndRestoreOnAnotherHost(t *testing.T) {
	f := newFleet(t)
	for _, bin := range []string{"restic", "nbdcopy", "qemu-nbd"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed (scripts/install-deps.sh installs it)", bin)
		}
	}
	const hostB = "e2e-b"
	repoDir := filepath.Join(f.dir, "restic-repo")
	pw := filepath.Join(f.dir, "restic-password")
	require.NoError(t, os.WriteFile(pw, []byte("e2e backup password\n"), 0o600))
	secrets := fmt.Sprintf("backupRepositories:\n  store: {passwordFile: %q}\n", pw)
	cfg, err := os.ReadFile(f.agentCfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(f.agentCfg, append(cfg, secrets...), 0o644))
	stateB := filepath.Join(f.dir, "state-b")
	cfgB := filepath.Join(f.dir, "agent-b.yaml")
	withB := strings.Replace(strings.Replace(string(cfg), "host: "+host+"\n", "host: "+hostB+"\n", 1), f.stateDir, stateB, 1)
	require.NoError(t, os.WriteFile(cfgB, []byte(withB+secrets), 0o644))

	f.startController()
	f.startAgent()
	agentB := f.start("agent-b", "agent", "--config", cfgB)
	t.Cleanup(func() {
		agentB.cmd.Process.Signal(syscall.SIGKILL)
		<-agentB.done
		for _, pid := range qemuPids(stateB) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if t.Failed() {
			b, _ := os.ReadFile(agentB.log)
			t.Logf("=== agent-b log (last 6 KB):\n%s", tail(b, 6<<10))
		}
	})
	marker := fmt.Sprintf("gitfleet-e2e-known-data-%d", os.Getpid())
	hostBFile := strings.ReplaceAll(hostFile, "name: "+host+"}", "name: "+hostB+"}")
	f.push("a backed-up vm", map[string]string{
		"hosts/e2e.yaml":   hostFile,
		"hosts/e2e-b.yaml": hostBFile,
		"backup/store.yaml": fmt.Sprintf("apiVersion: gitfleet.dev/v1alpha1\nkind: BackupRepository\nmetadata: {name: store}\n"+
			"spec: {url: %q, hosts: [%s, %s], maintenance: %s}\n", repoDir, host, hostB, host),
		"volumes/db-01-data.yaml": volumeFile("db-01-data"),
		"vms/db-01.yaml":          f.art.backedUpVM(host, "db-01-data", marker, ""),
	})
	hashRE := regexp.MustCompile(`probe hash root ([0-9a-f]{64})\s+tinyguest: probe hash vol ([0-9a-f]{64})`)
	var hashes []string
	f.waitFor("db-01 wrote its data", func() (bool, string) {
		s := f.serial("db-01")
		hashes = hashRE.FindStringSubmatch(s)
		return strings.Contains(s, "probe wrote "+marker) && hashes != nil, s
	})
	// Opted in once the data is written (a backup is due at once): an
	// edit that changes nothing on the guest.
	f.push("back db-01 up", map[string]string{"vms/db-01.yaml": f.art.backedUpVM(host, "db-01-data", marker,
		"  backup: {repository: store, schedule: every 1h, keep: {last: 3}}\n")})
	var b status.Backup
	f.waitFor("db-01's backup in status", func() (bool, string) {
		v := f.status().VM("db-01")
		if v == nil || v.Backup == nil {
			return false, fmt.Sprintf("%+v", v)
		}
		b = *v.Backup
		return !b.LastSuccess.IsZero(), fmt.Sprintf("%+v", b)
	})
	assert.Empty(t, b.LastError)
	assert.Equal(t, backup.ConsistencyCrash, b.Consistency)
	assert.NotEmpty(t, b.LastBackupID)
	assert.Len(t, f.guestPids("db-01"), 1, "backed up while it runs, not restarted")
	assert.Contains(t, f.serial("db-01"), "probe wrote "+marker)
	assert.NotContains(t, f.serial("db-01"), "probe found "+marker, "booted once")

	f.push("remove db-01", nil, "vms/db-01.yaml")
	f.waitFor("db-01 finalized: gone from the snapshot", func() (bool, string) {
		s := f.snapshot()
		return s != nil && s.VM("db-01") == nil && len(f.guestPids("db-01")) == 0, fmt.Sprintf("%+v", s.VM("db-01"))
	})

	f.push("restore db-01 on e2e-b", map[string]string{
		"volumes/db-01-data-b.yaml": strings.ReplaceAll(volumeFile("db-01-data-b"), "host: "+host, "host: "+hostB),
		"vms/db-01.yaml": f.art.backedUpVM(hostB, "db-01-data-b", marker,
			fmt.Sprintf("  restore: {repository: store, host: %s, backup: %s}\n", host, b.LastBackupID)),
	})
	serialB := func() string {
		out, _ := os.ReadFile(filepath.Join(stateB, "vms", "db-01", qemu.SerialLog))
		return string(out)
	}
	f.waitFor("db-01 restored on e2e-b finds its data", func() (bool, string) {
		s := serialB()
		return strings.Contains(s, "probe found "+marker) && hashRE.MatchString(s), s
	})
	assert.Equal(t, hashes[1:], hashRE.FindStringSubmatch(serialB())[1:], "the restored guest reads the same root disk and volume")
	f.waitFor("db-01 ready on e2e-b", func() (bool, string) {
		v := e2etest.Status(t, f.bare, hostB).VM("db-01")
		return v != nil && v.Phase == status.PhaseReady, fmt.Sprintf("%+v", v)
	})
}
