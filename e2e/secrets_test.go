package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/qemu"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/sealed"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// ageKeygen runs the binary's age-keygen and returns the recipient.
func ageKeygen(t *testing.T, out string) string {
	t.Helper()
	b, err := exec.Command(binary, "age-keygen", "--out", out, "--host", host).CombinedOutput()
	require.NoError(t, err, "%s", b)
	first, _, _ := strings.Cut(string(b), "\n")
	r := strings.TrimSpace(strings.TrimPrefix(first, "Public key:"))
	require.True(t, strings.HasPrefix(r, "age1"), "%s", b)
	return r
}

// seedUserData reads user-data back from a VM's NoCloud seed (ISO9660).
func seedUserData(t *testing.T, path string) []byte {
	t.Helper()
	b, err := file.OpenFromPath(path, true)
	require.NoError(t, err)
	defer b.Close()
	fi, err := b.Stat()
	require.NoError(t, err)
	fs, err := iso9660.Read(b, fi.Size(), 0, 2048)
	require.NoError(t, err)
	ud, err := fs.ReadFile("user-data")
	require.NoError(t, err)
	return ud
}

// useAgeIdentity gives the agent an age identity (gitfleet age-keygen,
// before the agent starts) and returns hostYAML with its recipient as
// spec.ageRecipient.
func (f *fleetUnderTest) useAgeIdentity(t *testing.T, hostYAML string) string {
	t.Helper()
	key := filepath.Join(f.dir, "host-age.key")
	recipient := ageKeygen(t, key)
	cfg, err := os.ReadFile(f.agentCfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(f.agentCfg, append(cfg, []byte("ageIdentity: "+key+"\n")...), 0o600))
	return hostYAML + "  ageRecipient: " + recipient + "\n"
}

// hostRecipient is spec.ageRecipient of a Host file, or "".
func hostRecipient(hostYAML string) string {
	for _, l := range strings.Split(hostYAML, "\n") {
		if r, ok := strings.CutPrefix(strings.TrimSpace(l), "ageRecipient: "); ok {
			return r
		}
	}
	return ""
}

// sealVMFile encrypts a VM file's userData to recipient in place of it.
func sealVMFile(t *testing.T, vmFile, recipient string) string {
	t.Helper()
	vm, err := desired.DecodeVMFile("vm.yaml", []byte(vmFile))
	require.NoError(t, err)
	ct, err := sealed.Seal(recipient, vm.Metadata.Name, []byte(vm.Spec.CloudInit.UserData))
	require.NoError(t, err)
	out, err := desired.SetEncryptedUserData("vm.yaml", []byte(vmFile), desired.EncryptedUserData{Recipient: recipient, Ciphertext: ct})
	require.NoError(t, err)
	return string(out)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// TestEncryptedUserDataReachesOnlyTheGuest encrypts a VM's user-data to
// the host with gitfleet encrypt, pushes it, and runs the controller and
// the agent (QEMU, the tiny guest) as separate processes over HTTP. The
// guest runs exactly the plaintext, which the seed carries; the plaintext
// is on no branch and in no commit, in no log line of either process and
// in no metric. A VM whose ciphertext is for another key fails to create
// with both keys named. The agent restarted with another identity (the
// host's key changed) leaves the running VM running, the same QEMU, and
// says why in its lastError.
func TestEncryptedUserDataReachesOnlyTheGuest(t *testing.T) {
	f := newFleet(t)
	const secret = "S3CR3T-e2e-5d1c9a"
	const vm, stray = "vm-s", "vm-x"
	plain := "#!/bin/sh\necho " + secret + "\n"

	hostKey, otherKey := filepath.Join(f.dir, "age.key"), filepath.Join(f.dir, "other.key")
	recipient, otherRecipient := ageKeygen(t, hostKey), ageKeygen(t, otherKey)
	metricsAddr := freeAddr(t)
	cfg, err := os.ReadFile(f.agentCfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(f.agentCfg, append(cfg, []byte("ageIdentity: "+hostKey+"\nlisten: "+metricsAddr+"\n")...), 0o600))

	// The author writes the plaintext in the VM file and encrypts it in
	// place; only the encrypted file is pushed.
	hostYAML := hostFile + "  ageRecipient: " + recipient + "\n"
	vmYAML := strings.Replace(f.art.vmFile(vm, "running", nil, false), "#cloud-config\n      hostname: "+vm+"\n", "#!/bin/sh\n      echo "+secret+"\n", 1)
	require.Contains(t, vmYAML, secret)
	for p, c := range map[string]string{"hosts/e2e.yaml": hostYAML, "vms/" + vm + ".yaml": vmYAML} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(f.work, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(f.work, p), []byte(c), 0o644))
	}
	enc := exec.Command(binary, "encrypt", "--repo", f.work, filepath.Join(f.work, "vms", vm+".yaml"))
	out, err := enc.CombinedOutput()
	require.NoError(t, err, "%s", out)
	encrypted, err := os.ReadFile(filepath.Join(f.work, "vms", vm+".yaml"))
	require.NoError(t, err)
	require.NotContains(t, string(encrypted), secret)

	// A VM whose ciphertext is for another key under the Host's recipient
	// (a mislabelled file): validate cannot tell; the agent can.
	ct, err := sealed.Seal(otherRecipient, stray, []byte(plain))
	require.NoError(t, err)
	strayYAML := strings.Replace(f.art.vmFile(stray, "running", nil, false), "    userData: |\n      #cloud-config\n      hostname: "+stray+"\n",
		"    encryptedUserData:\n      recipient: "+recipient+"\n      ciphertext: |\n        "+strings.ReplaceAll(strings.TrimRight(ct, "\n"), "\n", "\n        ")+"\n", 1)
	f.push("vm-s with encrypted user-data", map[string]string{
		"hosts/e2e.yaml":         hostYAML,
		"vms/" + vm + ".yaml":    string(encrypted),
		"vms/" + stray + ".yaml": strayYAML,
	})

	f.startController()
	f.startAgent()
	f.waitFor("vm-s ready", func() (bool, string) {
		st := f.status()
		v := st.VM(vm)
		return v != nil && v.Phase == status.PhaseReady, vmState(st, vm)
	})
	f.waitFor("the guest ran exactly the encrypted script", func() (bool, string) {
		s := f.serial(vm)
		return strings.Contains(s, "tinyguest: probe "+secret), s
	})
	assert.Equal(t, plain, string(seedUserData(t, filepath.Join(f.vmDir(vm), qemu.SeedFile))), "the seed carries the plaintext byte for byte")
	f.waitFor("vm-x failed: encrypted to another key", func() (bool, string) {
		st := f.status()
		v := st.VM(stray)
		return v != nil && v.Phase == status.PhaseFailed && strings.Contains(v.LastError, agent.ErrUserDataSealed.Error()) &&
			strings.Contains(v.LastError, recipient), vmState(st, stray)
	})
	assert.Empty(t, f.guestPids(stray), "no QEMU for a VM whose user-data cannot be decrypted")

	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	require.NoError(t, err)
	metrics, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Contains(t, string(metrics), "gitfleet_", "metrics were served")

	// The host's key changes under the running VM.
	pids := f.guestPids(vm)
	require.Len(t, pids, 1)
	require.NoError(t, f.agent.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-f.agent.done:
	case <-time.After(time.Minute):
		t.Fatal("the agent did not stop on SIGTERM")
	}
	cfg, err = os.ReadFile(f.agentCfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(f.agentCfg, []byte(strings.Replace(string(cfg), "ageIdentity: "+hostKey, "ageIdentity: "+otherKey, 1)), 0o600))
	f.startAgent()
	f.waitFor("vm-s reports its user-data cannot be decrypted, and runs", func() (bool, string) {
		st := f.status()
		v := st.VM(vm)
		return v != nil && v.Phase == status.PhaseReady && strings.HasPrefix(v.LastError, agent.UserDataNotOpened), vmState(st, vm)
	})
	assert.Equal(t, pids, f.guestPids(vm), "the same QEMU runs: nothing restarted")
	assert.Contains(t, f.status().VM(vm).LastError, recipient)
	resp, err = http.Get("http://" + metricsAddr + "/metrics")
	require.NoError(t, err)
	more, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	metrics = append(metrics, more...)

	// Nowhere but in the guest and its seed.
	refs := gittest.Git(t, f.bare, "for-each-ref", "--format=%(refname)")
	for _, b := range []string{"refs/heads/main", "refs/heads/gitfleet/snapshots", "refs/heads/gitfleet/status"} {
		require.Contains(t, refs, b)
	}
	history := gittest.Git(t, f.bare, "log", "-p", "--all", "--format=%H %an %s%n%b")
	assert.NotContains(t, history, secret, "a branch's history holds the plaintext")
	assert.Contains(t, history, "BEGIN AGE ENCRYPTED FILE", "the history holds the ciphertext, so the test looked at it")
	assert.NotContains(t, string(metrics), secret, "a metric holds the plaintext")
	var logs []string
	for _, p := range []*proc{f.ctrl, f.agent} {
		logs = append(logs, p.log)
	}
	entries, _ := os.ReadDir(f.dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".log") && !slices.Contains(logs, filepath.Join(f.dir, e.Name())) {
			logs = append(logs, filepath.Join(f.dir, e.Name()))
		}
	}
	for _, l := range logs {
		b, err := os.ReadFile(l)
		require.NoError(t, err)
		require.NotEmpty(t, b, "%s is empty, so the test proves nothing", l)
		for i, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, secret) {
				t.Errorf("%s:%d holds the plaintext: %s", l, i+1, line)
			}
		}
	}
	t.Log(fmt.Sprintf("checked %d log files, %d bytes of metrics, %d bytes of history", len(logs), len(metrics), len(history)))
}
