package agent_test

import (
	"errors"

	"github.com/gitfleet/gitfleet/agent"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/gitfleet/gitfleet/agent/agenttest"
	"github.com/gitfleet/gitfleet/status"
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
