package agent_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
)

// netRecorder is the in-memory backend with host networking: it records
// what the engine asks of the host's networks.
type netRecorder struct {
	*agenttest.Provisioner
	mu      sync.Mutex
	nets    map[string]desired.Network
	members []agent.NetworkMember
	inUse   map[string]bool
	calls   int
}

var _ agent.NetworkReconciler = (*netRecorder)(nil)

func (r *netRecorder) ReconcileNetworks(_ context.Context, nets map[string]desired.Network, members []agent.NetworkMember, inUse map[string]bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nets, r.members, r.inUse, r.calls = maps.Clone(nets), slices.Clone(members), maps.Clone(inUse), r.calls+1
	return nil
}

func (r *netRecorder) last() (map[string]desired.Network, map[string]bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nets, r.inUse, r.calls
}

func withNetworks(s *snapshots.Snapshot, nets map[string]desired.Network) *snapshots.Snapshot {
	s.HostSpec.Networks = nets
	return s
}

func TestTheHostsNetworksReachTheProvisionerAndTheVMsNIC(t *testing.T) {
	var rec *netRecorder
	f := newFixture(t, func(c *agent.EngineConfig) {
		rec = &netRecorder{Provisioner: c.Provisioner.(*agenttest.Provisioner)}
		c.Provisioner = rec
	})
	lab := desired.Network{NAT: &desired.NAT{CIDR: "10.77.0.0/24"}}
	nets := map[string]desired.Network{"lan": {Bridge: "br0"}, "lab": lab}

	f.step(withNetworks(snap(1, vm("db-01", network("lab")), vm("web-01")), nets))
	got, _, _ := rec.last()
	assert.Equal(t, nets, got, "the host's networks")
	rec.mu.Lock()
	assert.Equal(t, []agent.NetworkMember{{VM: "db-01", Network: "lab"}}, rec.members, "the VMs the snapshot puts on a network, before they boot")
	rec.mu.Unlock()
	m, ok := f.prov.BootedWith("db-01")
	require.True(t, ok)
	assert.Equal(t, map[string]desired.Network{"lab": lab}, m.Networks, "db-01 booted without its network's definition")
	m, _ = f.prov.BootedWith("web-01")
	assert.Nil(t, m.Networks, "a VM without a network got one")

	// The next tick knows db-01's record names lab.
	f.step(nil)
	_, inUse, _ := rec.last()
	assert.Equal(t, map[string]bool{"lab": true}, inUse)

	// The host spec drops lab while db-01, tombstoned, still has its
	// record: lab stays in use until the VM is destroyed.
	gone := tombstoned(vm("db-01", network("lab")))
	f.step(withNetworks(snap(2, gone, vm("web-01")), map[string]desired.Network{"lan": {Bridge: "br0"}}))
	got, inUse, _ = rec.last()
	assert.NotContains(t, got, "lab")
	assert.True(t, inUse["lab"], "a network a VM record names must be kept")
}

func TestAnUnreadableRecordKeepsEveryNetwork(t *testing.T) {
	var rec *netRecorder
	f := newFixture(t, func(c *agent.EngineConfig) {
		rec = &netRecorder{Provisioner: c.Provisioner.(*agenttest.Provisioner)}
		c.Provisioner = rec
	})
	f.step(snap(1, vm("db-01", network("lab"))))
	f.eng.Close(context.Background())
	require.NoError(t, os.WriteFile(f.store.RecordPath("db-01"), []byte("{not json"), 0o600))
	f.start()
	f.step(nil)
	_, inUse, calls := rec.last()
	require.Positive(t, calls)
	assert.Nil(t, inUse, "with a record unreadable, what VMs use is unknown")
}

// errBridgeMissing is what a backend returns for a VM whose bridge network
// names a bridge the host does not have (the QEMU backend: hostnet's
// ErrBridgeMissing marked as agent.ErrNetworkMissing).
var errBridgeMissing = fmt.Errorf("network lan: bridge br0 does not exist on this host: %w", agent.ErrNetworkMissing)

// A VM on a bridge that does not exist yet waits for it, like a VM whose
// volume is missing: no create attempt spent however many ticks pass,
// status says what it waits for, and it comes up at the first tick after
// the bridge appears.
func TestAVMWaitsForItsMissingBridge(t *testing.T) {
	f := newFixture(t)
	nets := map[string]desired.Network{"lan": {Bridge: "br0"}}
	s := withNetworks(snap(1, vm("web-01", network("lan"))), nets)
	f.prov.FailAlways(agenttest.OpBoot, errBridgeMissing)
	for i := 0; i < agent.DefaultMaxAttempts+2; i++ {
		r := row(t, f.step(s), "web-01")
		assert.Equal(t, status.PhaseCreating, r.Phase, "tick %d", i)
		assert.Equal(t, "boot: network lan: bridge br0 does not exist on this host: "+agent.ErrNetworkMissing.Error(), r.LastError)
	}
	rec := f.record("web-01")
	assert.Zero(t, rec.Attempts, "waiting spends no attempt")
	assert.False(t, rec.Failed)

	f.prov.FailAlways(agenttest.OpBoot, nil) // the admin made br0
	r := row(t, f.step(s), "web-01")
	assert.Equal(t, status.PhaseReady, r.Phase)
	assert.Empty(t, r.LastError)
}

// An edit onto a bridge that does not exist yet never stops the running
// VM, spends no attempt, and is applied once the bridge appears.
func TestAnEditOntoAMissingBridgeWaitsWithTheVMRunning(t *testing.T) {
	f := newFixture(t)
	nets := map[string]desired.Network{"lan": {Bridge: "br0"}}
	f.step(withNetworks(snap(1, vm("web-01")), nets))
	f.prov.ResetCalls()
	moved := withNetworks(snap(2, vm("web-01", network("lan"))), nets)
	f.prov.FailAlways(agenttest.OpStage, errBridgeMissing)
	for i := 0; i < agent.DefaultMaxAttempts+2; i++ {
		r := row(t, f.step(moved), "web-01")
		assert.Equal(t, status.PhaseReady, r.Phase, "the VM runs on")
		assert.Contains(t, r.LastError, "bridge br0 does not exist on this host")
		assert.NotContains(t, r.LastError, "given up")
	}
	assert.Empty(t, f.prov.Calls(agenttest.OpShutdown), "stopped for a network it cannot join")
	assert.Zero(t, f.record("web-01").Attempts)

	f.prov.FailAlways(agenttest.OpStage, nil)
	r := row(t, f.step(moved), "web-01")
	assert.Equal(t, moved.VMs[0].SpecHash, r.SpecHash, "applied once the bridge is there")
	assert.Empty(t, r.LastError)
}

// A VM whose adopted disk is not staged on its host yet (the branch was
// merged before gitfleet import --stage ran there) waits for it, as for a
// missing bridge: no attempt spent, and it comes up at the first tick
// after the disk is staged.
func TestAnAdoptedVMWaitsForItsStagedDisk(t *testing.T) {
	f := newFixture(t)
	s := snap(1, vm("web-01", func(s *desired.VMSpec) { s.Image, s.RootDisk = nil, &desired.RootDisk{Adopt: true} }))
	notStaged := fmt.Errorf("/var/lib/gitfleet/adopt/web-01/root.qcow2: %w", agent.ErrDiskNotStaged)
	f.prov.FailAlways(agenttest.OpRootDisk, notStaged)
	for i := 0; i < agent.DefaultMaxAttempts+2; i++ {
		r := row(t, f.step(s), "web-01")
		assert.Equal(t, status.PhaseCreating, r.Phase, "tick %d", i)
		assert.Contains(t, r.LastError, agent.ErrDiskNotStaged.Error())
	}
	rec := f.record("web-01")
	assert.Zero(t, rec.Attempts, "waiting spends no attempt")
	assert.False(t, rec.Failed)

	f.prov.FailAlways(agenttest.OpRootDisk, nil) // staged
	r := row(t, f.step(s), "web-01")
	assert.Equal(t, status.PhaseReady, r.Phase)
	assert.Empty(t, r.LastError)
}
