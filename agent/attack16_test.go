package agent_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// An un-delete inside the grace, hidden from an online agent. A reviewed
// delete of x-01 and its volume is quarantined, then a reviewed un-delete
// is published ten seconds later, well inside the minute of grace.
// Someone who can push gitfleet/snapshots resets it to a controller-signed
// commit from before the un-delete, before the agent fetches, and the
// controller is stopped for a while. The agent never went offline; the
// latest reviewed intent keeps x-01 and its data. Before, the agent gave
// the quarantine its nonce at once and the controller confirmed it
// within the grace: the reset to that confirming commit destroyed both
// when the grace ran out. Now a nonce is given only once the grace has
// passed, so no confirmation exists while an un-delete can come in the
// grace: the reset shuts x-01 down and waits, and the controller, back,
// publishes the un-delete.
func TestAttackHiddenUndeleteAfterConfirmation(t *testing.T) {
	f := newSignedFleet(t, map[string]string{
		"hosts/hv-a.yaml":  hostFile(testHost),
		"vms/web-01.yaml":  vmFile("web-01", testHost, ""),
		"vms/x-01.yaml":    vmFile("x-01", testHost, ""),
		"volumes/x.yaml":   volumeFile("x-data", testHost, 1),
		"volumes/web.yaml": volumeFile("web-data", testHost, 1),
	})
	f.pass()
	require.Len(t, f.agentOnce().VMs, 2)
	f.pass()

	f.commit(gittest.Edit{Remove: []string{"vms/x-01.yaml", "volumes/x.yaml"}, Message: "retire x-01"})
	require.Contains(t, f.pass().Tombstoned, "VM x-01@"+testHost)
	st := f.agentOnce()
	quarantineOf(t, st.Quarantined, "x-01")
	quarantineOf(t, st.QuarantinedVolumes, "x-data")
	f.pass() // the controller confirms whatever the host reports
	replay := f.snapshotsTip()
	f.agentOnce()

	f.host.clock.Add(10 * time.Second)
	f.commit(gittest.Edit{Write: map[string]string{"vms/x-01.yaml": vmFile("x-01", testHost, ""), "volumes/x.yaml": volumeFile("x-data", testHost, 1)}, Message: "x-01 is needed after all"})
	require.Contains(t, f.pass().Undeleted, "VM x-01@"+testHost)

	// The controller stops; the branch is reset before the agent fetches.
	gittest.Git(t, f.bare, "update-ref", "refs/heads/"+agent.SnapshotsBranch, replay)
	for range 3 {
		f.host.clock.Add(2 * time.Minute)
		st = f.agentOnce()
	}
	assert.Empty(t, f.host.prov.Calls(agenttest.OpDestroy), "the latest reviewed intent keeps x-01")
	assert.Equal(t, 2, f.host.prov.DiskGB("x-01"))
	assert.True(t, st.Volume("x-data").Present, "and its volume")
	assert.True(t, quarantineOf(t, st.Quarantined, "x-01").AwaitsConfirmation())
	assert.True(t, quarantineOf(t, st.QuarantinedVolumes, "x-data").AwaitsConfirmation())

	// The controller is back: it acts on its own, newer ledger (x-01
	// live), reports the reset and publishes over it; it never confirms.
	res := f.pass()
	assert.Empty(t, res.Confirmed)
	require.NotEmpty(t, res.ForgedCommits)
	assert.Equal(t, replay, res.ForgedCommits[0].Commit)
	assert.False(t, tipSnapshot(t, f.bare).VM("x-01").Tombstoned)
	st = f.agentOnce()
	assert.Empty(t, st.Quarantined)
	assert.Empty(t, st.QuarantinedVolumes)
	assert.Empty(t, f.host.prov.Calls(agenttest.OpDestroy))
	assert.True(t, st.Volume("x-data").Present)
}

// The upgrade from the release that gave a quarantine its nonce at once:
// a nonce given inside the grace may already be confirmed by a signed
// commit from before an un-delete. The agent drops it at its first tick
// inside the grace, so that commit destroys nothing once the grace has
// passed; the fresh nonce the grace's end gives is the one that counts.
func TestAttackNonceGivenInsideTheGraceIsDropped(t *testing.T) {
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

	// What the earlier release wrote: nonces beside the fresh markers.
	early, earlyVol := strings.Repeat("a1", snapshots.ConfirmLen/2), strings.Repeat("b2", snapshots.ConfirmLen/2)
	f.host.eng.Close(context.Background())
	state := filepath.Join(f.host.dir, "state")
	recPath := filepath.Join(state, "vms", "old-01", "record.json")
	var rec map[string]any
	data, err := os.ReadFile(recPath)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &rec))
	rec["confirm"] = early
	data, err = json.Marshal(rec)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(recPath, data, 0o600))
	markerPath := filepath.Join(state, "volumes", "old-data.tombstone")
	marker, err := os.ReadFile(markerPath)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(markerPath, []byte(strings.TrimSpace(string(marker))+"\nconfirm "+earlyVol+"\n"), 0o600))
	f.host.start()

	st := f.agentOnce()
	assert.Empty(t, quarantineOf(t, st.Quarantined, "old-01").Confirm, "dropped inside the grace")
	assert.Empty(t, quarantineOf(t, st.QuarantinedVolumes, "old-data").Confirm)

	// A signed snapshot confirming the early nonces (what the controller
	// published for them) destroys nothing after the grace.
	snap := *tipSnapshot(t, f.bare)
	snap.Epoch++
	snap.VMs = append([]snapshots.SnapshotVM(nil), snap.VMs...)
	snap.Volumes = append([]snapshots.SnapshotVolume(nil), snap.Volumes...)
	for i := range snap.VMs {
		if snap.VMs[i].Name == "old-01" {
			tb := *snap.VMs[i].Tombstone
			tb.Confirm = early
			snap.VMs[i].Tombstone = &tb
		}
	}
	for i := range snap.Volumes {
		if snap.Volumes[i].Name == "old-data" {
			tb := *snap.Volumes[i].Tombstone
			tb.Confirm = earlyVol
			snap.Volumes[i].Tombstone = &tb
		}
	}
	forge(t, f.bare, &snap, f.key.Sign())
	f.host.clock.Add(2 * time.Minute)
	st = f.agentOnce()
	f.host.clock.Add(time.Minute)
	st = f.agentOnce()
	require.Equal(t, snap.Epoch, st.LastSeenEpoch, "the signed snapshot is accepted")
	assert.Empty(t, f.host.prov.Calls(agenttest.OpDestroy))
	assert.True(t, st.Volume("old-data").Present)
	vm := quarantineOf(t, st.Quarantined, "old-01")
	assert.True(t, snapshots.ValidConfirm(vm.Confirm))
	assert.NotEqual(t, early, vm.Confirm, "a fresh nonce at the grace's end")
	assert.NotEqual(t, earlyVol, quarantineOf(t, st.QuarantinedVolumes, "old-data").Confirm)
}
