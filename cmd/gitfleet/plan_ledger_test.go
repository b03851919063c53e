package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// Someone who can push the snapshots branch drops a pending delete from
// the ledger there. Without the controller's keys, plan shows re-adding
// the VM as a create and says the ledger it read is unverified; with
// --controller-keys it reads the ledger the controller signed (the VM is
// an un-delete, as the controller will treat it) and names the forged
// commit.
func TestPlanReadsTheSignedLedger(t *testing.T) {
	dir, key, signers, forged := signedFleetWithForgedLedger(t, func(l *snapshots.Ledger) { l.Tombstones = nil })

	gittest.SetBranch(t, dir, "restore", gittest.Rev(t, dir, "refs/heads/main"))
	gittest.Commit(t, dir, gittest.Edit{Branch: "restore", Write: map[string]string{"fleet/db-01.yaml": cliVM("db-01", "hv-a", "1")}})
	plan := []string{"plan", "--repo", dir, "--path", "fleet", "--base", "main", "--head", "restore"}

	code, out := runCLI(t, plan...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "+ create VM db-01", "the forged ledger, read unverified")
	require.Contains(t, out, "unverified")
	require.Contains(t, out, "--controller-keys")
	require.Equal(t, 1, strings.Count(out, "unverified"), "one line says so:\n%s", out)

	code, out = runCLI(t, append(plan, "--controller-keys", signers)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "^ undelete VM db-01", "the signed ledger's pending delete")
	require.Contains(t, out, desired.Hash(forged).Short(), "the forged commit is named")
	require.NotContains(t, out, "unverified")

	code, out = runCLI(t, append(plan, "--controller-keys", signers, "--format", "json")...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, desired.Hash(forged).Short())

	// A history of its own, no signed commit in it: planned without a
	// ledger, and said so.
	orphan := gittest.Commit(t, dir, gittest.Edit{Branch: "orphan", Parents: []string{}, Message: "forged",
		Write: map[string]string{snapshots.LedgerPath: gittest.Show(t, dir, forged, snapshots.LedgerPath)}})
	before := gittest.Rev(t, dir, "refs/heads/"+fleet.DefaultSnapshotsBranch)
	gittest.SetBranch(t, dir, fleet.DefaultSnapshotsBranch, orphan)
	code, out = runCLI(t, append(plan, "--controller-keys", signers)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "is signed by a controller key (1 unsigned commit ("+desired.Hash(orphan).Short()+"))")
	require.Contains(t, out, "planned without it")
	require.Contains(t, out, "+ create VM db-01")
	gittest.SetBranch(t, dir, fleet.DefaultSnapshotsBranch, before)

	// Signed tip: no warning.
	code, out = runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once", "--signing-key", key)
	require.Equal(t, 0, code, out)
	code, out = runCLI(t, append(plan, "--controller-keys", signers)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "^ undelete VM db-01")
	require.NotContains(t, out, "signed by a controller key", "a signed tip needs no warning:\n%s", out)
}

// signedFleetWithForgedLedger is cliFleet run by a controller that signs
// (keys from gitfleet keygen), which published db-01's delete, and then a
// forged, unsigned commit on the snapshots branch whose ledger is the
// controller's as forge changes it. It returns the repository, the
// controller's private key, the allowed-signers file of its public key
// and the forged commit.
func signedFleetWithForgedLedger(t *testing.T, forge func(*snapshots.Ledger)) (dir, key, signers, forged string) {
	t.Helper()
	gittest.NeedGit(t)
	keys := t.TempDir()
	key = filepath.Join(keys, "controller_ed25519")
	pub := keygenPublic(t, "--controller", "--out", key)
	signers = filepath.Join(keys, "controller_signers")
	require.NoError(t, os.WriteFile(signers, []byte("gitfleet-controller "+pub+"\n"), 0o644))

	dir = cliFleet(t)
	ctl := []string{"controller", "--repo", dir, "--path", "fleet", "--once", "--signing-key", key}
	code, out := runCLI(t, ctl...)
	require.Equal(t, 0, code, out)
	gittest.Commit(t, dir, gittest.Edit{Remove: []string{"fleet/db-01.yaml"}})
	code, out = runCLI(t, ctl...)
	require.Equal(t, 0, code, out)

	l, err := snapshots.ParseLedger([]byte(gittest.Show(t, dir, "refs/heads/"+fleet.DefaultSnapshotsBranch, snapshots.LedgerPath)))
	require.NoError(t, err)
	require.NotEmpty(t, l.Tombstones, "the controller published db-01's tombstone")
	forge(l)
	data, err := l.Marshal()
	require.NoError(t, err)
	forged = gittest.Commit(t, dir, gittest.Edit{Branch: fleet.DefaultSnapshotsBranch, Message: "forged",
		Write: map[string]string{snapshots.LedgerPath: string(data)}})
	return dir, key, signers, forged
}
