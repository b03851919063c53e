package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// The first start with --signing-key over a snapshots branch written
// unsigned is refused with the flag that adopts it named, with the tip's
// hash; with that flag naming the tip (not a prefix, not bare) it
// publishes, signed; a controller with a new key publishes over it only
// with the old key in --controller-keys.
func TestControllerLedgerTrustFlags(t *testing.T) {
	gittest.NeedGit(t)
	keys := t.TempDir()
	oldKey, newKey := filepath.Join(keys, "old_ed25519"), filepath.Join(keys, "new_ed25519")
	oldPub := keygenPublic(t, "--controller", "--out", oldKey)
	keygenPublic(t, "--controller", "--out", newKey)
	dir := cliFleet(t)
	run := func(args ...string) (int, string) {
		t.Helper()
		code, out, errOut := runCLIStderr(t, append([]string{"controller", "--repo", dir, "--path", "fleet", "--once"}, args...)...)
		return code, out + errOut
	}
	code, out := run()
	require.Equal(t, 0, code, out)

	tip := gittest.Rev(t, dir, "refs/heads/gitfleet/snapshots")
	code, out = run("--signing-key", oldKey)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "--trust-unsigned-ledger-once="+tip, "the refusal names the flag with the tip to copy")
	require.Contains(t, out, "refused")

	code, out = run("--signing-key", oldKey, "--trust-unsigned-ledger-once")
	require.Equal(t, 2, code, "the flag takes the checked commit: %s", out)
	code, out = run("--signing-key", oldKey, "--trust-unsigned-ledger-once="+tip[:12])
	require.Equal(t, 2, code, "a prefix is not a checked commit: %s", out)
	require.Contains(t, out, "full hash")

	code, out = run("--signing-key", oldKey, "--trust-unsigned-ledger-once="+tip)
	require.Equal(t, 0, code, out)

	gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"README.md": "# fleet, rotated\n"}})
	code, out = run("--signing-key", newKey)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "no snapshots commit signed by a controller key")

	signers := filepath.Join(keys, "controller_signers")
	require.NoError(t, os.WriteFile(signers, []byte("old-controller "+oldPub+"\n"), 0o644))
	code, out = run("--signing-key", newKey, "--controller-keys", signers)
	require.Equal(t, 0, code, out)
	require.True(t, strings.Contains(out, "applied"), out)

	code, out = run("--controller-keys", signers)
	require.Equal(t, 2, code, "controller keys without a signing key: %s", out)
}
