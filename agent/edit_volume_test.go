package agent_test

import (
	"errors"
	"os"
	"path/filepath"

	"testing"

	"github.com/gitfleet/gitfleet/agent"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
)

// An edit that adds a volume this host does not hold never stops the
// running VM: the volume is checked before the shutdown, as artifacts are.
func TestAnEditToAMissingVolumeKeepsTheRunningVM(t *testing.T) {
	f := newFixture(t)
	good := vm("web-01")
	f.step(snap(1, good))
	f.prov.ResetCalls()
	bad := vm("web-01", volumes("data")) // the snapshot carries no volume "data"
	r := row(t, f.step(snap(2, bad)), "web-01")
	assert.Empty(t, f.prov.Calls(agenttest.OpShutdown), "the running VM was stopped for an edit that cannot boot")
	assert.Equal(t, 1, f.prov.RunningCount())
	assert.Equal(t, status.PhaseReady, r.Phase, "the VM runs on")
	assert.Equal(t, good.SpecHash, r.SpecHash, "on its previous spec")
	assert.Contains(t, r.LastError, "volume")
	assert.Contains(t, r.LastError, "keeps its previous spec")
}

// An edit that failed for good, reverted, then asked for again is not
// silently dropped: status says why the VM still runs its previous spec.
func TestAFailedEditRevertedAndAskedAgainIsNotSilent(t *testing.T) {
	f := newFixture(t)
	good := vm("web-01")
	f.step(snap(1, good))
	f.prov.FailAlways(agenttest.OpStage, agent.Permanent(errors.New("fetch kernel: sha256 mismatch")))
	bad := vm("web-01", vcpus(4))
	r := row(t, f.step(snap(2, bad)), "web-01")
	assert.Contains(t, r.LastError, "sha256 mismatch")
	r = row(t, f.step(snap(3, good)), "web-01")
	assert.Empty(t, r.LastError, "reverted: nothing pending")
	r = row(t, f.step(snap(4, bad)), "web-01")
	assert.Equal(t, good.SpecHash, r.SpecHash)
	assert.NotEmpty(t, r.LastError, "the edit is not applied, and status must say so")
}

// An edit onto a volume whose link points at nothing waits as a create
// does: the VM runs on, no attempt is spent however many ticks pass, and
// the edit applies once the link's target is there.
func TestAnEditOntoADanglingVolumeLinkWaits(t *testing.T) {
	f := newFixture(t)
	good := vm("web-01")
	f.step(withVolumes(snap(1, good), vol("data", 1)))
	require.NoError(t, os.Remove(f.store.VolumePath("data")))
	target := filepath.Join(f.dir, "elsewhere", "data.img")
	require.NoError(t, os.Symlink(target, f.store.VolumePath("data")))
	edit := withVolumes(snap(2, vm("web-01", volumes("data"))), vol("data", 1))
	for i := 0; i < 5; i++ {
		r := row(t, f.step(edit), "web-01")
		assert.Equal(t, status.PhaseReady, r.Phase, "the VM runs on")
		assert.Contains(t, r.LastError, "keeps its previous spec")
	}
	assert.Zero(t, f.record("web-01").Attempts, "no attempt spent while the link points at nothing")
	assert.False(t, f.record("web-01").Failed)

	require.NoError(t, os.MkdirAll(filepath.Dir(target), 0o700))
	require.NoError(t, os.WriteFile(target, nil, 0o600))
	require.NoError(t, os.Truncate(target, 1<<30))
	r := row(t, f.step(edit), "web-01")
	assert.Equal(t, status.PhaseReady, r.Phase, r.LastError)
	assert.Empty(t, r.LastError, "the edit applied")
}
