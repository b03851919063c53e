package agent_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/trusttest"
)

// signedFleet is a fleet repository with a controller that signs its
// snapshots and one host's agent that verifies them (controllerKeys),
// each with its own clock; the agent's tombstone grace is a minute and
// its log and metrics are kept.
type signedFleet struct {
	t       *testing.T
	bare    string
	key     trusttest.SSHKey
	ctl     *fleet.Controller
	host    *hostAgent
	logs    *bytes.Buffer
	metrics *prometheus.Registry
}

func newSignedFleet(t *testing.T, files map[string]string) *signedFleet {
	gittest.NeedGit(t)
	f := &signedFleet{t: t, bare: gittest.NewBare(t), key: trusttest.NewSSHKey(t, "gitfleet-controller"),
		logs: &bytes.Buffer{}, metrics: prometheus.NewRegistry()}
	gittest.Commit(t, f.bare, gittest.Edit{Branch: "main", Write: files, Message: "the fleet"})
	f.ctl = signedController(t, f.bare, newClock(), commitSigner(t, f.key))
	m, err := agent.NewMetrics(f.metrics)
	require.NoError(t, err)
	f.host = &hostAgent{t: t, url: f.bare, dir: t.TempDir(), prov: agenttest.New(), clock: newClock(),
		tune: func(c *agent.EngineConfig) {
			c.TombstoneGrace = time.Minute
			c.Metrics = m
			c.Log = logTo(f.logs)
		},
		controllerKeys: controllerKeys(t, f.key.Public), metrics: m}
	f.host.start()
	return f
}

func (f *signedFleet) pass() fleet.PassResult {
	f.t.Helper()
	return mustPass(f.t, f.ctl)
}

func (f *signedFleet) agentOnce() *status.Status {
	f.t.Helper()
	require.NoError(f.t, f.host.once())
	st := readStatus(f.t, f.bare)
	require.NotNil(f.t, st)
	return st
}

func (f *signedFleet) commit(e gittest.Edit) {
	f.t.Helper()
	e.Branch = "main"
	gittest.Commit(f.t, f.bare, e)
}

func (f *signedFleet) snapshotsTip() string {
	return gittest.Rev(f.t, f.bare, "refs/heads/"+agent.SnapshotsBranch)
}

// quarantineOf is the row of name in qs, which must be there.
func quarantineOf(t *testing.T, qs []status.Quarantine, name string) status.Quarantine {
	t.Helper()
	for _, q := range qs {
		if q.Name == name {
			return q
		}
	}
	require.Failf(t, "not quarantined", "%s is not in %v", name, qs)
	return status.Quarantine{}
}

// The replay of issue 16: someone who can push gitfleet/snapshots (not
// main) resets it to an older, genuine, controller-signed commit C1 that
// tombstones x-01, although a later reviewed commit brought x-01 back
// and the controller published that as C2. The agent, offline across C1
// and C2, comes back while the controller is stopped: it accepts C1
// (signed, its epoch above the agent's) and shuts x-01 down, but never
// destroys it however long the grace has passed, since C1 cannot carry
// the nonce of a quarantine made after it (given only once its grace has
// passed); it says it waits for the controller's confirmation. When the controller runs again it publishes
// the un-delete and x-01 comes back with its disk.
func TestReplayedSignedTombstoneNeverDestroys(t *testing.T) {
	f := newSignedFleet(t, map[string]string{
		"hosts/hv-a.yaml": hostFile(testHost),
		"vms/web-01.yaml": vmFile("web-01", testHost, ""),
		"vms/x-01.yaml":   vmFile("x-01", testHost, ""),
	})
	f.pass()
	st := f.agentOnce()
	require.Len(t, st.VMs, 2)
	f.pass()

	// The agent is offline from here. A reviewed delete of x-01 (C1),
	// then a reviewed un-delete (C2), both published and signed.
	f.commit(gittest.Edit{Remove: []string{"vms/x-01.yaml"}, Message: "retire x-01"})
	require.Contains(t, f.pass().Tombstoned, "VM x-01@"+testHost)
	c1 := f.snapshotsTip()
	require.True(t, tipSnapshot(t, f.bare).VM("x-01").Tombstoned)
	f.commit(gittest.Edit{Write: map[string]string{"vms/x-01.yaml": vmFile("x-01", testHost, "")}, Message: "x-01 is needed after all"})
	require.Contains(t, f.pass().Undeleted, "VM x-01@"+testHost)

	// The controller is stopped; the branch is reset to C1.
	gittest.Git(t, f.bare, "update-ref", "refs/heads/"+agent.SnapshotsBranch, c1)
	st = f.agentOnce()
	require.Empty(t, st.SnapshotError, "C1 is genuine: accepted")
	q := quarantineOf(t, st.Quarantined, "x-01")
	assert.Empty(t, q.Confirm, "no nonce inside the grace")
	assert.False(t, q.AwaitsConfirmation())
	require.Equal(t, []string{"x-01"}, f.host.prov.Calls(agenttest.OpShutdown), "shut down: quarantined")

	for range 3 { // the grace passes, and passes again
		f.host.clock.Add(2 * time.Minute)
		st = f.agentOnce()
	}
	assert.Empty(t, f.host.prov.Calls(agenttest.OpDestroy), "never destroyed without the controller's confirmation")
	assert.Empty(t, st.Destroyed)
	assert.Equal(t, 2, f.host.prov.DiskGB("x-01"), "its disk is intact")
	q = quarantineOf(t, st.Quarantined, "x-01")
	assert.True(t, snapshots.ValidConfirm(q.Confirm), "the grace has passed: the quarantine has a nonce: %q", q.Confirm)
	assert.False(t, q.Confirmed)
	assert.True(t, q.AwaitsConfirmation())
	assert.Contains(t, status.QuarantineNote(q), "waiting for the controller to confirm the delete")
	assert.Equal(t, 1.0, value(t, f.metrics, "gitfleet_agent_deletes_awaiting_confirmation", "kind", "vm"))
	assert.Equal(t, 1, strings.Count(f.logs.String(), "waiting for the controller to confirm the delete"), "logged once:\n%s", f.logs.String())

	// The controller comes back: C1's ledger is genuine but older than
	// the one it wrote last, so it acts on its own (x-01 live) and
	// reports the reset; nothing is confirmed.
	res := f.pass()
	require.NotEmpty(t, res.ForgedCommits)
	assert.Equal(t, c1, res.ForgedCommits[0].Commit, "the reset to C1 is reported")
	assert.Empty(t, res.Confirmed)
	require.Contains(t, res.Published, testHost)
	assert.False(t, tipSnapshot(t, f.bare).VM("x-01").Tombstoned)
	readme := gittest.Show(t, f.bare, "refs/heads/"+status.Branch, status.SummaryPath)
	assert.Contains(t, readme, "1 quarantined, waiting for the controller to confirm the delete", "the host line says so")
	st = f.agentOnce()
	assert.Empty(t, st.Quarantined, "the quarantine clears")
	require.Len(t, st.VMs, 2)
	for _, vm := range st.VMs {
		assert.Equal(t, status.PhaseReady, vm.Phase, vm.Name)
	}
	assert.Empty(t, f.host.prov.Calls(agenttest.OpDestroy))
	assert.Equal(t, 2, f.host.prov.DiskGB("x-01"))
	assert.Equal(t, 0.0, value(t, f.metrics, "gitfleet_agent_deletes_awaiting_confirmation", "kind", "vm"))
}

// A reviewed delete on an agent that verifies snapshots: the VM and the
// volume are quarantined, given nonces once the grace has passed, the
// controller publishes them in the tombstones, the agent destroys both,
// and the acks finalize the deletes.
func TestConfirmedDeleteDestroysAfterTheGrace(t *testing.T) {
	f := newSignedFleet(t, map[string]string{
		"hosts/hv-a.yaml":     hostFile(testHost),
		"vms/web-01.yaml":     vmFile("web-01", testHost, ""),
		"vms/old-01.yaml":     vmFile("old-01", testHost, ""),
		"volumes/old.yaml":    volumeFile("old-data", testHost, 1),
		"volumes/keep.yaml":   volumeFile("keep-data", testHost, 1),
		"volumes/unused.yaml": volumeFile("spare", testHost, 1),
	})
	f.pass()
	require.Len(t, f.agentOnce().VMs, 2)
	f.pass()

	f.commit(gittest.Edit{Remove: []string{"vms/old-01.yaml", "volumes/old.yaml"}, Message: "retire old-01 and its data"})
	res := f.pass()
	require.ElementsMatch(t, []string{"VM old-01@" + testHost, "Volume old-data@" + testHost}, res.Tombstoned)
	st := f.agentOnce()
	vm := quarantineOf(t, st.Quarantined, "old-01")
	vol := quarantineOf(t, st.QuarantinedVolumes, "old-data")
	assert.Empty(t, vm.Confirm, "no nonce inside the grace")
	assert.Empty(t, vol.Confirm)
	assert.False(t, vm.AwaitsConfirmation())
	assert.False(t, vol.DestroyAt.IsZero())
	res = f.pass()
	assert.Empty(t, res.Confirmed, "nothing to confirm inside the grace")
	assert.NotContains(t, res.Published, testHost)

	f.host.clock.Add(2 * time.Minute)
	st = f.agentOnce()
	assert.Empty(t, f.host.prov.Calls(agenttest.OpDestroy), "the grace has passed, not yet confirmed")
	vm = quarantineOf(t, st.Quarantined, "old-01")
	vol = quarantineOf(t, st.QuarantinedVolumes, "old-data")
	require.True(t, snapshots.ValidConfirm(vm.Confirm))
	require.True(t, snapshots.ValidConfirm(vol.Confirm))
	assert.NotEqual(t, vm.Confirm, vol.Confirm)
	assert.True(t, vm.AwaitsConfirmation())
	assert.True(t, vol.AwaitsConfirmation())

	t.Run("the controller confirms", func(t *testing.T) {
		res := f.pass()
		assert.ElementsMatch(t, []string{"VM old-01@" + testHost, "Volume old-data@" + testHost}, res.Confirmed)
		require.Contains(t, res.Published, testHost, "a confirmation is a content change: a new epoch")
		snap := tipSnapshot(t, f.bare)
		assert.Equal(t, vm.Confirm, snap.VM("old-01").Tombstone.Confirm)
		assert.Equal(t, vol.Confirm, snap.Volume("old-data").Tombstone.Confirm)
		assert.Empty(t, f.pass().Published, "confirmed once: the next pass publishes nothing")
	})

	t.Run("destroyed, and the acks finalize", func(t *testing.T) {
		st := f.agentOnce()
		assert.Equal(t, []string{"old-01"}, f.host.prov.Calls(agenttest.OpDestroy))
		assert.Equal(t, []string{"old-01"}, st.Destroyed)
		assert.Empty(t, st.Quarantined)
		assert.Empty(t, st.QuarantinedVolumes)
		assert.Equal(t, &status.Volume{Name: "old-data", Present: false}, st.Volume("old-data"))
		res := f.pass()
		assert.ElementsMatch(t, []string{"VM old-01@" + testHost, "Volume old-data@" + testHost}, res.Finalized)
		snap := tipSnapshot(t, f.bare)
		assert.Nil(t, snap.VM("old-01"))
		assert.Nil(t, snap.Volume("old-data"))
		assert.NotContains(t, f.logs.String(), "waiting for the controller to confirm", "confirmed at the first round trip: the delete never waited")
	})
}

// The nonce, given once the grace has passed, is kept on disk with the
// quarantine marker: an agent restart reports the same one. An un-delete clears it; the next delete gets a new
// one, and a snapshot carrying the old nonce (a controller-signed commit
// from the first delete) does not destroy; the controller's confirmation
// of the new nonce does.
func TestConfirmNonceSurvivesRestartAndIsNewPerQuarantine(t *testing.T) {
	f := newSignedFleet(t, map[string]string{
		"hosts/hv-a.yaml":  hostFile(testHost),
		"vms/web-01.yaml":  vmFile("web-01", testHost, ""),
		"vms/old-01.yaml":  vmFile("old-01", testHost, ""),
		"volumes/old.yaml": volumeFile("old-data", testHost, 1),
	})
	f.pass()
	f.agentOnce()
	f.pass()
	f.commit(gittest.Edit{Remove: []string{"vms/old-01.yaml", "volumes/old.yaml"}, Message: "retire old-01"})
	f.pass()
	f.agentOnce()
	f.host.clock.Add(2 * time.Minute) // the grace passes: nonces
	st := f.agentOnce()
	first := quarantineOf(t, st.Quarantined, "old-01").Confirm
	firstVol := quarantineOf(t, st.QuarantinedVolumes, "old-data").Confirm
	require.True(t, snapshots.ValidConfirm(first))
	require.True(t, snapshots.ValidConfirm(firstVol))

	f.host.restart()
	st = f.agentOnce()
	assert.Equal(t, first, quarantineOf(t, st.Quarantined, "old-01").Confirm, "the restart keeps the VM's nonce")
	assert.Equal(t, firstVol, quarantineOf(t, st.QuarantinedVolumes, "old-data").Confirm, "and the volume's")

	require.ElementsMatch(t, []string{"VM old-01@" + testHost, "Volume old-data@" + testHost}, f.pass().Confirmed)
	confirmed := *tipSnapshot(t, f.bare)

	// Un-deleted before the agent saw the confirmation.
	f.commit(gittest.Edit{Write: map[string]string{"vms/old-01.yaml": vmFile("old-01", testHost, ""), "volumes/old.yaml": volumeFile("old-data", testHost, 1)}, Message: "keep old-01"})
	f.pass()
	st = f.agentOnce()
	assert.Empty(t, st.Quarantined)
	assert.Empty(t, st.QuarantinedVolumes)
	require.Len(t, st.VMs, 2)

	// Deleted again: a new quarantine, a new nonce.
	f.commit(gittest.Edit{Remove: []string{"vms/old-01.yaml", "volumes/old.yaml"}, Message: "retire old-01 again"})
	f.pass()
	f.agentOnce()
	f.host.clock.Add(2 * time.Minute)
	st = f.agentOnce()
	second := quarantineOf(t, st.Quarantined, "old-01").Confirm
	secondVol := quarantineOf(t, st.QuarantinedVolumes, "old-data").Confirm
	require.True(t, snapshots.ValidConfirm(second))
	assert.NotEqual(t, first, second, "a new quarantine gets a new nonce")
	assert.NotEqual(t, firstVol, secondVol)

	// The first delete's confirmation, signed by the controller's key, at
	// an epoch the agent accepts: the old nonces destroy nothing.
	stale := *tipSnapshot(t, f.bare)
	stale.Epoch++
	stale.VMs = append([]snapshots.SnapshotVM(nil), stale.VMs...)
	stale.Volumes = append([]snapshots.SnapshotVolume(nil), stale.Volumes...)
	for i := range stale.VMs {
		if stale.VMs[i].Name == "old-01" {
			tb := *confirmed.VM("old-01").Tombstone
			stale.VMs[i].Tombstone = &tb
		}
	}
	for i := range stale.Volumes {
		if stale.Volumes[i].Name == "old-data" {
			tb := *confirmed.Volume("old-data").Tombstone
			stale.Volumes[i].Tombstone = &tb
		}
	}
	require.Equal(t, first, stale.VM("old-01").Tombstone.Confirm)
	forge(t, f.bare, &stale, f.key.Sign())
	f.host.clock.Add(2 * time.Minute)
	st = f.agentOnce()
	require.Empty(t, st.SnapshotError)
	require.Equal(t, stale.Epoch, st.LastSeenEpoch, "the signed snapshot is accepted")
	assert.Empty(t, f.host.prov.Calls(agenttest.OpDestroy), "an old confirmation does not destroy")
	assert.Equal(t, 2, f.host.prov.DiskGB("old-01"))
	assert.True(t, quarantineOf(t, st.Quarantined, "old-01").AwaitsConfirmation())
	assert.True(t, quarantineOf(t, st.QuarantinedVolumes, "old-data").AwaitsConfirmation())
	assert.Equal(t, 1.0, value(t, f.metrics, "gitfleet_agent_deletes_awaiting_confirmation", "kind", "volume"))

	// The controller confirms the new quarantine: destroyed.
	res := f.pass()
	assert.ElementsMatch(t, []string{"VM old-01@" + testHost, "Volume old-data@" + testHost}, res.Confirmed)
	assert.Equal(t, second, tipSnapshot(t, f.bare).VM("old-01").Tombstone.Confirm)
	st = f.agentOnce()
	assert.Equal(t, []string{"old-01"}, f.host.prov.Calls(agenttest.OpDestroy))
	assert.Equal(t, []string{"old-01"}, st.Destroyed)
	assert.False(t, st.Volume("old-data").Present)
	assert.ElementsMatch(t, []string{"VM old-01@" + testHost, "Volume old-data@" + testHost}, f.pass().Finalized)
}

// A status is input anyone who can push the host's branch may forge. One
// that reports a quarantine nonce for a VM or a volume without a pending
// delete, for a pending delete from an epoch before the tombstone's, or a
// nonce of the wrong shape, has the controller confirm nothing: no
// tombstone gets a nonce and no epoch is published.
func TestForgedQuarantineConfirmsNothing(t *testing.T) {
	f := newSignedFleet(t, map[string]string{
		"hosts/hv-a.yaml":  hostFile(testHost),
		"vms/web-01.yaml":  vmFile("web-01", testHost, ""),
		"vms/old-01.yaml":  vmFile("old-01", testHost, ""),
		"volumes/vol.yaml": volumeFile("web-data", testHost, 1),
	})
	f.pass()
	st := f.agentOnce()
	f.pass()
	f.commit(gittest.Edit{Remove: []string{"vms/old-01.yaml"}, Message: "retire old-01"})
	tombEpoch := f.pass().Published[testHost]
	before := gittest.Show(t, f.bare, "refs/heads/"+agent.SnapshotsBranch, snapshots.Path(testHost))
	nonce := strings.Repeat("ab", snapshots.ConfirmLen/2)
	since := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)

	for i, tc := range []struct {
		name   string
		forged func(st *status.Status)
	}{
		{"a live VM", func(st *status.Status) {
			st.LastSeenEpoch = tombEpoch
			st.Quarantined = []status.Quarantine{{Name: "web-01", Since: since, Confirm: nonce}}
		}},
		{"a VM the fleet never had", func(st *status.Status) {
			st.LastSeenEpoch = tombEpoch
			st.Quarantined = []status.Quarantine{{Name: "ghost-01", Since: since, Confirm: nonce}}
		}},
		{"a live volume", func(st *status.Status) {
			st.LastSeenEpoch = tombEpoch
			st.QuarantinedVolumes = []status.Quarantine{{Name: "web-data", Since: since, Confirm: nonce}}
		}},
		{"the pending delete's VM listed as a volume", func(st *status.Status) {
			st.LastSeenEpoch = tombEpoch
			st.QuarantinedVolumes = []status.Quarantine{{Name: "old-01", Since: since, Confirm: nonce}}
		}},
		{"the pending delete, from before its epoch", func(st *status.Status) {
			st.LastSeenEpoch = tombEpoch - 1
			st.Quarantined = []status.Quarantine{{Name: "old-01", Since: since, Confirm: nonce}}
		}},
		{"the pending delete, with a nonce of the wrong shape", func(st *status.Status) {
			st.LastSeenEpoch = tombEpoch
			st.Quarantined = []status.Quarantine{{Name: "old-01", Since: since, Confirm: strings.Repeat("x", 1000)}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forged := *st
			forged.Heartbeat += uint64(10 * (i + 1))
			tc.forged(&forged)
			forgeStatus(t, f.bare, &forged, nil)
			res := f.pass()
			assert.Empty(t, res.Confirmed)
			assert.NotContains(t, res.Published, testHost, "no new epoch")
			assert.Equal(t, before, gittest.Show(t, f.bare, "refs/heads/"+agent.SnapshotsBranch, snapshots.Path(testHost)))
			assert.NotContains(t, gittest.Show(t, f.bare, "refs/heads/"+agent.SnapshotsBranch, snapshots.LedgerPath), `"confirm"`)
		})
	}
}

// A quarantine begun before the agent required confirmation (it had no
// controllerKeys yet, or ran an earlier release) gets its nonce at the
// first tick after its grace (unchanged) has passed: it is destroyed once
// the controller has confirmed, not before.
func TestQuarantineFromBeforeConfirmationGetsANonce(t *testing.T) {
	f := newSignedFleet(t, map[string]string{
		"hosts/hv-a.yaml":  hostFile(testHost),
		"vms/web-01.yaml":  vmFile("web-01", testHost, ""),
		"vms/old-01.yaml":  vmFile("old-01", testHost, ""),
		"volumes/old.yaml": volumeFile("old-data", testHost, 1),
	})
	keys := f.host.controllerKeys
	f.host.eng.Close(context.Background())
	f.host.controllerKeys = nil // no verification, no confirmation
	f.host.start()
	f.pass()
	f.agentOnce()
	f.commit(gittest.Edit{Remove: []string{"vms/old-01.yaml", "volumes/old.yaml"}, Message: "retire old-01"})
	f.pass()
	st := f.agentOnce()
	before := quarantineOf(t, st.Quarantined, "old-01")
	beforeVol := quarantineOf(t, st.QuarantinedVolumes, "old-data")
	assert.Empty(t, before.Confirm, "an agent that does not verify snapshots reports no nonce")
	assert.Empty(t, beforeVol.Confirm)
	f.pass()

	f.host.eng.Close(context.Background())
	f.host.controllerKeys = keys
	f.host.start()
	st = f.agentOnce()
	assert.Empty(t, quarantineOf(t, st.Quarantined, "old-01").Confirm, "no nonce inside the grace")

	f.host.clock.Add(2 * time.Minute)
	st = f.agentOnce()
	vm := quarantineOf(t, st.Quarantined, "old-01")
	vol := quarantineOf(t, st.QuarantinedVolumes, "old-data")
	require.True(t, snapshots.ValidConfirm(vm.Confirm), "given a nonce: %q", vm.Confirm)
	require.True(t, snapshots.ValidConfirm(vol.Confirm), "given a nonce: %q", vol.Confirm)
	assert.Equal(t, before.Since, vm.Since, "the grace is unchanged")
	assert.Equal(t, beforeVol.Since, vol.Since)
	assert.Empty(t, f.host.prov.Calls(agenttest.OpDestroy), "not confirmed yet")
	assert.True(t, st.Volume("old-data").Present)
	require.ElementsMatch(t, []string{"VM old-01@" + testHost, "Volume old-data@" + testHost}, f.pass().Confirmed)
	st = f.agentOnce()
	assert.Equal(t, []string{"old-01"}, f.host.prov.Calls(agenttest.OpDestroy))
	assert.False(t, st.Volume("old-data").Present)
}
