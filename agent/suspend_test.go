package agent_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

func suspended(s *snapshots.Snapshot, reason string) *snapshots.Snapshot {
	s.HostSpec.Suspend, s.HostSpec.SuspendReason = true, reason
	return s
}

// A Host spec with suspend: true stops every action on the host — create,
// boot, stop, destroy, volume — while the guests keep running and the
// status says so; the snapshot that resumes it is acted on in full.
func TestSuspendedHostActsOnNothing(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	clk := newClock()
	// The provisioner also reconciles networks and collects images, so
	// that a suspension leaving them alone is seen.
	var watch netsAndImages
	h := newHostAgent(t, bare, clk, func(c *agent.EngineConfig) {
		c.TombstoneGrace = time.Minute
		watch = netsAndImages{
			netRecorder: &netRecorder{Provisioner: c.Provisioner.(*agenttest.Provisioner)},
			images:      &collecting{Provisioner: c.Provisioner.(*agenttest.Provisioner)},
		}
		c.Provisioner = watch
	})
	publish(t, bare, withVolumes(snap(1, vm("web-01"), vm("db-01", volumes("data")), vm("old-01"), vm("gone-01")), vol("data", 1)))
	require.NoError(t, h.once())
	// gone-01 is deleted and shut down (quarantined) before the suspension.
	publish(t, bare, withVolumes(snap(2, vm("web-01"), vm("db-01", volumes("data")), vm("old-01"), tombstoned(vm("gone-01"))), vol("data", 1)))
	require.NoError(t, h.once())
	require.Equal(t, 3, h.prov.RunningCount())
	h.prov.ResetCalls()
	_, _, netCalls := watch.last()
	require.NotZero(t, netCalls, "networks are reconciled while not suspended")
	imageCalls := len(watch.images.calls())
	require.NotZero(t, imageCalls, "images are collected while not suspended")

	// Suspended, with a delete, an edit, a create, a new volume and a
	// guest that crashed: nothing is done about any of them.
	h.prov.Crash("db-01")
	publish(t, bare, suspended(withVolumes(snap(3,
		vm("web-01", memoryMB(2048)), vm("db-01", volumes("data")), tombstoned(vm("old-01")), vm("new-01"), tombstoned(vm("gone-01"))),
		vol("data", 1), vol("logs", 1)), "kernel upgrade"))
	require.NoError(t, h.once())
	clk.Add(time.Hour) // past the tombstone grace
	require.NoError(t, h.once())
	assert.Empty(t, h.prov.AllCalls(), "a suspended host acts on nothing")
	_, _, n := watch.last()
	assert.Equal(t, netCalls, n, "no network is reconciled while suspended")
	assert.Len(t, watch.images.calls(), imageCalls, "no image is collected while suspended")
	assert.True(t, h.prov.Running("web-01"))
	assert.True(t, h.prov.Running("old-01"), "a tombstone waits while the host is suspended")
	_, err := os.Stat(mustStore(t, h.dir).VolumePath("logs"))
	assert.True(t, os.IsNotExist(err), "no volume is created while suspended: %v", err)

	st := readStatus(t, bare)
	require.NotNil(t, st)
	assert.Equal(t, &status.Suspension{Epoch: 3, Reason: "kernel upgrade"}, st.Suspended)
	assert.Equal(t, uint64(3), st.LastSeenEpoch, "the suspending snapshot is accepted")
	require.Len(t, st.Quarantined, 1)
	assert.True(t, st.Quarantined[0].DestroyAt.IsZero(), "no destroy time is promised while suspended")
	phases := map[string]status.VM{}
	for _, v := range st.VMs {
		phases[v.Name] = v
	}
	assert.Equal(t, status.PhaseReady, phases["web-01"].Phase)
	assert.Equal(t, status.PhasePending, phases["new-01"].Phase)
	assert.Equal(t, status.PhaseStopped, phases["db-01"].Phase, "the crashed guest is shown as it is")
	assert.Contains(t, phases["db-01"].Message, "suspended")
	assert.Empty(t, st.Destroyed)

	// Resumed: everything that waited happens.
	publish(t, bare, withVolumes(snap(4,
		vm("web-01", memoryMB(2048)), vm("db-01", volumes("data")), tombstoned(vm("old-01")), vm("new-01"), tombstoned(vm("gone-01"))),
		vol("data", 1), vol("logs", 1)))
	require.NoError(t, h.once())
	clk.Add(time.Hour)
	require.NoError(t, h.once())
	require.NoError(t, h.once())
	st = readStatus(t, bare)
	assert.Nil(t, st.Suspended)
	assert.ElementsMatch(t, []string{"db-01", "new-01", "web-01"}, h.prov.Calls(agenttest.OpBoot))
	assert.ElementsMatch(t, []string{"old-01", "gone-01"}, h.prov.Calls(agenttest.OpDestroy))
	_, err = os.Stat(mustStore(t, h.dir).VolumePath("logs"))
	assert.NoError(t, err)
}

// ReconcileNow runs a fetch and a tick at once: a crashed guest is booted
// again although the tick and poll intervals are an hour.
func TestReconcileNowRunsAPassAtOnce(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	h := newHostAgent(t, bare, newClock(), nil)
	publish(t, bare, snap(1, vm("web-01")))
	require.NoError(t, h.once())
	h.prov.ResetCalls()

	ctx, cancel := context.WithCancel(context.Background())
	ticked := make(chan struct{}, 1)
	ag, err := agent.New(agent.Config{Host: testHost, Repo: mustOpen(t, bare), Engine: h.eng, Store: mustStore(t, h.dir),
		Version: "test", Log: quietLog(), TickInterval: time.Hour, PollInterval: time.Hour, Heartbeat: time.Hour,
		Alive: func() {
			select {
			case ticked <- struct{}{}:
			default:
			}
		}})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- ag.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	<-ticked // Run's first tick
	require.NoError(t, h.eng.Settle(ctx))
	h.prov.Crash("web-01")

	ag.ReconcileNow()
	<-ticked
	require.NoError(t, h.eng.Settle(ctx))
	assert.Equal(t, []string{"web-01"}, h.prov.Calls(agenttest.OpBoot), "the crashed guest is booted by the requested pass")
}

// netsAndImages is a provisioner that records its network reconciles and
// its image collections.
type netsAndImages struct {
	*netRecorder
	images *collecting
}

func (n netsAndImages) CollectImages(ctx context.Context, vms []agent.Machine, grace time.Duration) (agent.ImageCollection, error) {
	return n.images.CollectImages(ctx, vms, grace)
}
