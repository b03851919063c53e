package agent_test

import (
	"context"
	"maps"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/agenttest"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
)

// netRecorder is the in-memory backend with host networking: it records
// what the engine asks of the host's networks.
type netRecorder struct {
	*agenttest.Provisioner
	mu    sync.Mutex
	nets  map[string]desired.Network
	inUse map[string]bool
	calls int
}

var _ agent.NetworkReconciler = (*netRecorder)(nil)

func (r *netRecorder) ReconcileNetworks(_ context.Context, nets map[string]desired.Network, inUse map[string]bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nets, r.inUse, r.calls = maps.Clone(nets), maps.Clone(inUse), r.calls+1
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
	m, ok := f.prov.BootedWith("db-01")
	require.True(t, ok)
	require.NotNil(t, m.Network, "db-01 booted without its network's definition")
	assert.Equal(t, lab, *m.Network)
	m, _ = f.prov.BootedWith("web-01")
	assert.Nil(t, m.Network, "a VM without a network got one")

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
