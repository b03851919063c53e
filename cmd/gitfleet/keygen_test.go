package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/trust"
)

// keygen writes a key pair the controller and the agent load, and prints
// the lines that go in each place: the printed public key is the one the
// private key signs with, and it validates as a Host's spec.agentKey and
// as an agent's controllerKeys entry.
func TestKeygen(t *testing.T) {
	dir := t.TempDir()
	defer syscall.Umask(syscall.Umask(0o077)) // as main sets it
	for _, tc := range []struct {
		name  string
		args  []string
		wants []string
	}{
		{"controller", []string{"--controller"}, []string{"GITFLEET_SIGNING_KEY=%d/signing-key", "LoadCredential=signing-key:", "controllerKeys:\n         - ssh-ed25519 ", "gitfleet-controller"}},
		{"agent", []string{"--host", "hv-a"}, []string{"signingKey: ", "agentKey: ssh-ed25519 ", "gitfleet-agent@hv-a", "Host object of hv-a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, tc.name+"_ed25519")
			code, text := runCLI(t, append([]string{"keygen", "--out", out}, tc.args...)...)
			require.Equal(t, 0, code, text)
			public := printedPublicKey(text)
			for _, want := range tc.wants {
				assert.Contains(t, text, want)
			}
			assert.Contains(t, text, out)

			fi, err := os.Stat(out)
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
			pub, err := os.ReadFile(out + ".pub")
			require.NoError(t, err)
			assert.Equal(t, public+"\n", string(pub))
			fi, err = os.Stat(out + ".pub")
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o644), fi.Mode().Perm(), "the public key is readable by all, whatever the process umask")

			signer, err := trust.LoadCommitSigner(out)
			require.NoError(t, err)
			assert.True(t, strings.HasPrefix(public, signer.AuthorizedKey()+" "), "the printed key is the private key's")
			_, err = desired.ParseAgentKey(public)
			assert.NoError(t, err, "valid as spec.agentKey")
			_, err = trust.ParseKeys("controllerKeys", []string{public})
			assert.NoError(t, err, "valid as a controllerKeys entry")

			code, text = runCLI(t, append([]string{"keygen", "--out", out}, tc.args...)...)
			assert.Equal(t, 1, code, "an existing key is never overwritten")
		})
	}
	for _, args := range [][]string{{"keygen"}, {"keygen", "--controller", "--host", "hv-a"}, {"keygen", "--host", "HV_A"}} {
		code, text := runCLI(t, args...)
		assert.Equal(t, 2, code, "%v: %s", args, text)
	}
}
