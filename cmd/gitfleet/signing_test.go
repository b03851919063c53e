package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// keygenPublic runs gitfleet keygen with args and returns the public key
// it printed.
func keygenPublic(t *testing.T, args ...string) string {
	t.Helper()
	code, out := runCLI(t, append([]string{"keygen"}, args...)...)
	require.Equal(t, 0, code, out)
	return printedPublicKey(out)
}

// printedPublicKey is the key on the first line keygen and age-keygen
// print ("Public key: KEY").
func printedPublicKey(out string) string {
	return strings.TrimSpace(strings.TrimPrefix(strings.SplitN(out, "\n", 2)[0], "Public key:"))
}

// hostStatus reads hv-a's status from its host branch of bare.
func hostStatus(t *testing.T, bare string) *status.Status {
	t.Helper()
	out, err := exec.Command("git", "--git-dir", bare, "show", status.HostBranch("hv-a")+":"+status.Path("hv-a")).Output()
	require.NoError(t, err)
	st, err := status.Parse("hosts/hv-a.yaml", out)
	require.NoError(t, err)
	return st
}

// The keys keygen makes, set up as it says, work end to end through the
// commands: the controller's snapshots verify with git itself (its status commits are unsigned), an agent
// listing the controller's key accepts them and signs its status, and an
// agent listing another key refuses them and says so.
func TestSigningKeysThroughTheCommands(t *testing.T) {
	gittest.NeedGit(t)
	keys := t.TempDir()
	ctlKey, agentKey := filepath.Join(keys, "controller_ed25519"), filepath.Join(keys, "agent_ed25519")
	ctlPub := keygenPublic(t, "--controller", "--out", ctlKey)
	agentPub := keygenPublic(t, "--host", "hv-a", "--out", agentKey)

	bare := gittest.NewBare(t)
	gittest.Commit(t, bare, gittest.Edit{Branch: "main", Message: "the fleet", Write: map[string]string{
		"hosts/hv-a.yaml": "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec:\n  agentKey: " + agentPub + "\n",
		"vms/web-01.yaml": testVM("web-01", "1"),
	}})
	code, out := runCLI(t, "controller", "--repo", bare, "--once", "--signing-key", ctlKey)
	require.Equal(t, 0, code, out)

	signers := filepath.Join(keys, "controller_signers")
	require.NoError(t, os.WriteFile(signers, []byte("gitfleet-controller "+ctlPub+"\n"), 0o644))
	verify := exec.Command("git", "-c", "gpg.ssh.allowedSignersFile="+signers, "verify-commit", "refs/heads/gitfleet/snapshots")
	verify.Dir = bare
	verify.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	msg, err := verify.CombinedOutput()
	require.NoError(t, err, "git verify-commit gitfleet/snapshots: %s", msg)
	assert.Contains(t, string(msg), `Good "git" signature for gitfleet-controller`)
	// The status branch's tree is anyone's: its commits carry no
	// controller signature that could pass for a snapshots commit's.
	assert.NotContains(t, gittest.Git(t, bare, "cat-file", "commit", "refs/heads/gitfleet/status"), "gpgsig")

	state := filepath.Join(t.TempDir(), "state")
	agentConfig := func(controllerKey string) string {
		return writeAgentConfig(t, "repo: {url: "+bare+"}\nhost: hv-a\nstateDir: "+state+"\nbackend: memory\nlogLevel: error\n"+
			"controllerKeys: ['"+controllerKey+"']\nsigningKey: "+agentKey+"\n")
	}
	code, out = runCLI(t, "agent", "--config", agentConfig(ctlPub), "--once")
	require.Equal(t, 0, code, out)
	st := hostStatus(t, bare)
	assert.Empty(t, st.SnapshotError)
	require.Len(t, st.VMs, 1)
	assert.Equal(t, status.PhaseReady, st.VMs[0].Phase)
	raw := gittest.Git(t, bare, "cat-file", "commit", "refs/heads/"+status.HostBranch("hv-a"))
	assert.Contains(t, raw, "gpgsig -----BEGIN SSH SIGNATURE-----", "the agent signs its status")

	t.Run("an agent that trusts another key refuses the snapshot", func(t *testing.T) {
		otherPub := keygenPublic(t, "--controller", "--out", filepath.Join(keys, "other_ed25519"))
		code, out := runCLI(t, "agent", "--config", agentConfig(otherPub), "--once")
		require.Equal(t, 0, code, out)
		st := hostStatus(t, bare)
		assert.Contains(t, st.SnapshotError, "not signed by the controller")
		require.Len(t, st.VMs, 1, "the VM of the last accepted snapshot keeps running")
		assert.Equal(t, status.PhaseReady, st.VMs[0].Phase)
	})

	// The host branch's tree is anyone's: a commit the agent signs there
	// with a key agents take for the controller's would pass, pushed to
	// gitfleet/snapshots, for a snapshots commit over a planted ledger.
	t.Run("an agent signing with a controller key does not start", func(t *testing.T) {
		code, out, stderr := runCLIStderr(t, "agent", "--config", agentConfig(agentPub), "--once")
		assert.NotEqual(t, 0, code, out)
		assert.Contains(t, stderr, "signingKey")
		assert.Contains(t, stderr, "is one of controllerKeys")
	})
}
