package agent_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

const fleetImage = "64a7b8b7a4ad44f1d2c1e6b8a1c8f1e0c4b1a2d3e4f5a6b7c8d9e0f1a2b3c4d5"

func hostFile(name string) string {
	return fmt.Sprintf("apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: %s}\nspec:\n  capacity: {vcpus: 8, memoryMB: 8192}\n", name)
}

func vmFile(name, host string, extra string) string {
	return fmt.Sprintf(`apiVersion: gitfleet.dev/v1alpha1
kind: VM
metadata: {name: %s}
spec:
  host: %s
  vcpus: 1
  memoryMB: 512
  diskGB: 2
  image: {url: "https://images.example/debian.qcow2", sha256: %s}
%s`, name, host, fleetImage, extra)
}

func volumeFile(name, host string, size int) string {
	return fmt.Sprintf("apiVersion: gitfleet.dev/v1alpha1\nkind: Volume\nmetadata: {name: %s}\nspec: {host: %s, sizeGB: %d}\n", name, host, size)
}

// fleetEnv is a fleet repository with the controller and one host's agent
// over it, each with its own clock.
type fleetEnv struct {
	t         *testing.T
	bare      string
	ctrl      *fleet.Controller
	ctrlClock *clock
	host      *hostAgent
}

func newFleetEnv(t *testing.T, files map[string]string) *fleetEnv {
	gittest.NeedGit(t)
	e := &fleetEnv{t: t, bare: gittest.NewBare(t), ctrlClock: newClock()}
	gittest.Commit(t, e.bare, gittest.Edit{Branch: "main", Write: files, Message: "the fleet"})
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: e.bare, Logger: quietLog().WithField("test", t.Name())})
	require.NoError(t, err)
	e.ctrl, err = fleet.New(fleet.Config{Repo: repo, Clock: e.ctrlClock.Now, Logger: quietLog().WithField("test", t.Name())})
	require.NoError(t, err)
	e.host = newHostAgent(t, e.bare, newClock(), func(c *agent.EngineConfig) { c.TombstoneGrace = time.Minute })
	return e
}

func (e *fleetEnv) pass() fleet.PassResult {
	e.t.Helper()
	return mustPass(e.t, e.ctrl)
}

// mustPass runs one pass of ctl, which must neither fail nor reject the
// desired state.
func mustPass(t *testing.T, ctl *fleet.Controller) fleet.PassResult {
	t.Helper()
	res, err := ctl.Pass(context.Background())
	require.NoError(t, err)
	require.NoError(t, res.Rejected)
	return res
}

func (e *fleetEnv) agentOnce() *status.Status {
	e.t.Helper()
	require.NoError(e.t, e.host.once())
	st := readStatus(e.t, e.bare)
	require.NotNil(e.t, st)
	return st
}

func (e *fleetEnv) snapshot() *snapshots.Snapshot {
	e.t.Helper()
	return tipSnapshot(e.t, e.bare)
}

// tipSnapshot is testHost's snapshot at the tip of bare's snapshots branch.
func tipSnapshot(t *testing.T, bare string) *snapshots.Snapshot {
	t.Helper()
	s, err := snapshots.ParseSnapshot([]byte(gittest.Show(t, bare, "refs/heads/"+agent.SnapshotsBranch, "hosts/"+testHost+".yaml") + "\n"))
	require.NoError(t, err)
	return s
}

func snapshotNames(s *snapshots.Snapshot) []string {
	var out []string
	for _, v := range s.VMs {
		out = append(out, v.Name)
	}
	return out
}

func TestAgentAndControllerTogether(t *testing.T) {
	e := newFleetEnv(t, map[string]string{
		"hosts/hv-a.yaml":   hostFile(testHost),
		"vms/web-01.yaml":   vmFile("web-01", testHost, "  volumes: [web-01-data]\n"),
		"vms/old-01.yaml":   vmFile("old-01", testHost, ""),
		"volumes/data.yaml": volumeFile("web-01-data", testHost, 1),
		"volumes/tmp.yaml":  volumeFile("scratch", testHost, 1),
	})

	t.Run("a pushed VM shows ready in status", func(t *testing.T) {
		res := e.pass()
		require.Contains(t, res.Published, testHost)
		st := e.agentOnce()
		require.Len(t, st.VMs, 2)
		for _, v := range st.VMs {
			assert.Equal(t, status.PhaseReady, v.Phase, v.Name)
			assert.NotEmpty(t, v.IP, v.Name)
		}
		assert.ElementsMatch(t, []status.Volume{{Name: "web-01-data", Present: true, SizeGB: 1}, {Name: "scratch", Present: true, SizeGB: 1}}, st.Volumes)
		assert.Equal(t, res.Published[testHost], st.LastSeenEpoch)
	})

	t.Run("a deleted volume is kept through its grace, then reclaimed and finalized", func(t *testing.T) {
		gittest.Commit(t, e.bare, gittest.Edit{Branch: "main", Remove: []string{"volumes/tmp.yaml"}, Message: "drop scratch"})
		e.pass()
		st := e.agentOnce()
		assert.Contains(t, st.Volumes, status.Volume{Name: "scratch", Present: true, SizeGB: 1})
		e.pass()
		e.host.clock.Add(2 * time.Minute)
		st = e.agentOnce()
		assert.Contains(t, st.Volumes, status.Volume{Name: "scratch", Present: false})
		res := e.pass()
		assert.Contains(t, res.Finalized, "Volume scratch@"+testHost)
		for _, v := range e.snapshot().Volumes {
			assert.NotEqual(t, "scratch", v.Name, "finalized: it leaves the snapshot")
		}
		st = e.agentOnce()
		assert.Equal(t, []status.Volume{{Name: "web-01-data", Present: true, SizeGB: 1}}, st.Volumes)
		assert.Empty(t, st.Orphans)
	})

	t.Run("a deleted file goes quarantined, destroyed, acked, finalized", func(t *testing.T) {
		gittest.Commit(t, e.bare, gittest.Edit{Branch: "main", Remove: []string{"vms/old-01.yaml"}, Message: "retire old-01"})
		res := e.pass()
		require.Contains(t, res.Tombstoned, "VM old-01@"+testHost)

		st := e.agentOnce()
		require.Len(t, st.Quarantined, 1)
		assert.Equal(t, "old-01", st.Quarantined[0].Name)
		assert.Equal(t, []string{"old-01"}, e.host.prov.Calls(agenttest.OpShutdown))
		assert.Empty(t, st.Destroyed)

		e.pass() // nothing to finalize yet
		assert.Contains(t, snapshotNames(e.snapshot()), "old-01")

		e.host.clock.Add(2 * time.Minute)
		st = e.agentOnce()
		assert.Equal(t, []string{"old-01"}, st.Destroyed)
		assert.Equal(t, []string{"old-01"}, e.host.prov.Calls(agenttest.OpDestroy))

		res = e.pass()
		assert.Contains(t, res.Finalized, "VM old-01@"+testHost)
		assert.Equal(t, []string{"web-01"}, snapshotNames(e.snapshot()), "finalized: it leaves the snapshot")

		st = e.agentOnce()
		assert.Empty(t, st.Destroyed, "the ack stops once the name left the snapshot")
		assert.Empty(t, st.Quarantined)
	})

	t.Run("an agent restart keeps every VM", func(t *testing.T) {
		e.host.prov.ResetCalls()
		e.host.restart()
		st := e.agentOnce()
		assert.Empty(t, e.host.prov.AllCalls())
		require.Len(t, st.VMs, 1)
		assert.Equal(t, status.PhaseReady, st.VMs[0].Phase)
	})

	t.Run("with git unreachable the VMs keep running and converging", func(t *testing.T) {
		require.NoError(t, os.Rename(e.bare, e.bare+".away"))
		e.host.prov.Crash("web-01")
		require.Error(t, e.host.once(), "no status can be written")
		assert.Equal(t, 1, e.host.prov.RunningCount(), "booted again from the snapshot on disk")
		require.NoError(t, os.Rename(e.bare+".away", e.bare))
		st := e.agentOnce()
		assert.Equal(t, status.PhaseReady, st.VMs[0].Phase)
	})

	t.Run("a restored older snapshots branch is fenced and the controller recovers", func(t *testing.T) {
		old := gittest.Rev(t, e.bare, "refs/heads/"+agent.SnapshotsBranch+"~1")
		before := e.snapshot().Epoch
		gittest.SetBranch(t, e.bare, agent.SnapshotsBranch, old) // a restore from an old copy
		e.host.prov.ResetCalls()

		st := e.agentOnce()
		assert.True(t, st.FenceViolation)
		assert.Equal(t, before, st.LastSeenEpoch)
		assert.Empty(t, e.host.prov.AllCalls(), "a fenced agent acts on nothing")

		res := e.pass()
		assert.Contains(t, res.FenceJumps, testHost)
		assert.Greater(t, e.snapshot().Epoch, before)

		st = e.agentOnce()
		assert.False(t, st.FenceViolation)
		assert.Equal(t, e.snapshot().Epoch, st.LastSeenEpoch)
		assert.Empty(t, e.host.prov.Calls(agenttest.OpDestroy))
		require.Len(t, st.VMs, 1)
		assert.Equal(t, status.PhaseReady, st.VMs[0].Phase)
	})
}

// A delete the controller swept while its host was offline still
// completes when the host comes back: the tombstone stays delivered
// (marked swept) until the host acks, so the returning agent quarantines
// and destroys the VM after its grace, as for any delete, and the
// controller then finalizes it. Nobody has to step in, and the VM is never
// reported vanished.
func TestSweptDeleteCompletesWhenTheHostReturns(t *testing.T) {
	e := newFleetEnv(t, map[string]string{
		"hosts/hv-a.yaml": hostFile(testHost),
		"vms/web-01.yaml": vmFile("web-01", testHost, ""),
		"vms/old-01.yaml": vmFile("old-01", testHost, ""),
	})
	e.pass()
	require.Len(t, e.agentOnce().VMs, 2)
	e.pass() // sees the host's status

	// The host goes silent; meanwhile old-01 is deleted by review.
	gittest.Commit(t, e.bare, gittest.Edit{Branch: "main", Remove: []string{"vms/old-01.yaml"}, Message: "retire old-01"})
	require.Contains(t, e.pass().Tombstoned, "VM old-01@"+testHost)
	e.ctrlClock.Add(5 * time.Minute)
	require.Empty(t, e.pass().Swept, "not before the abandon grace")
	e.ctrlClock.Add(12 * time.Minute)
	res := e.pass()
	require.Equal(t, []string{"VM old-01@" + testHost}, res.Swept)

	// Swept, and still delivered: the ledger and the summary show it.
	old := e.snapshot().VM("old-01")
	require.NotNil(t, old, "the swept tombstone stays in the host's snapshot")
	assert.True(t, old.Tombstoned)
	ledger, err := snapshots.ParseLedger([]byte(gittest.Show(t, e.bare, "refs/heads/"+agent.SnapshotsBranch, snapshots.LedgerPath)))
	require.NoError(t, err)
	require.Len(t, ledger.Tombstones, 1)
	assert.NotNil(t, ledger.Tombstones[0].SweptAt)
	assert.Contains(t, gittest.Show(t, e.bare, "refs/heads/"+agent.StatusBranch, status.SummaryPath), "swept while the host was offline")

	// The host comes back: a normal delete, quarantine then destroy.
	st := e.agentOnce()
	assert.Empty(t, st.Vanished, "a swept delete is no VM dropped without a tombstone")
	require.Len(t, st.Quarantined, 1)
	assert.Equal(t, "old-01", st.Quarantined[0].Name)
	e.pass()
	e.host.clock.Add(2 * time.Minute)
	st = e.agentOnce()
	assert.Equal(t, []string{"old-01"}, st.Destroyed)
	assert.Equal(t, []string{"old-01"}, e.host.prov.Calls(agenttest.OpDestroy))
	res = e.pass()
	assert.Contains(t, res.Finalized, "VM old-01@"+testHost)
	assert.Equal(t, []string{"web-01"}, snapshotNames(e.snapshot()), "finalized: it leaves the snapshot")
	st = e.agentOnce()
	assert.Empty(t, st.Destroyed)
	assert.Empty(t, st.Vanished)
	assert.Empty(t, st.Quarantined)
}
