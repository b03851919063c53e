package agent_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/trusttest"
	"github.com/gitfleet/gitfleet/trust"
)

// controllerKeys is an agent's controllerKeys: the public key lines given.
func controllerKeys(t *testing.T, lines ...string) *trust.Signers {
	t.Helper()
	keys, err := trust.ParseKeys("controllerKeys", lines)
	require.NoError(t, err)
	s, err := trust.New(keys, nil)
	require.NoError(t, err)
	return s
}

func commitSigner(t *testing.T, k trusttest.SSHKey) *trust.CommitSigner {
	t.Helper()
	s, err := trust.LoadCommitSigner(k.Private)
	require.NoError(t, err)
	return s
}

// signedController is a controller over bare that signs with key and
// trusts the snapshots commits of the public keys of others too (a key
// rotation).
func signedController(t *testing.T, bare string, clk *clock, key gitsource.CommitSigner, others ...string) *fleet.Controller {
	t.Helper()
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: bare, Logger: quietLog().WithField("test", t.Name())})
	require.NoError(t, err)
	keys, err := trust.ParseKeys("other controllers", others)
	require.NoError(t, err)
	ctl, err := fleet.New(fleet.Config{Repo: repo, Clock: clk.Now, SigningKey: key, ControllerKeys: keys, Logger: quietLog().WithField("test", t.Name())})
	require.NoError(t, err)
	t.Cleanup(func() { ctl.Close() })
	return ctl
}

// forge commits snap as the host's snapshot with git itself, signed with
// sign (nil: unsigned), as anyone who can push to the snapshots branch
// could.
func forge(t *testing.T, bare string, s *snapshots.Snapshot, sign *gittest.Signing) string {
	t.Helper()
	data, err := snapshots.MarshalSnapshot(s)
	require.NoError(t, err)
	return gittest.Commit(t, bare, gittest.Edit{Branch: agent.SnapshotsBranch, Message: "snapshots: epoch forged",
		Write: map[string]string{"hosts/" + s.Host + ".yaml": string(data)}, Sign: sign})
}

// With the controller stopped, a snapshot at a higher epoch that
// tombstones the host's VM, unsigned or signed by a key the agent does not
// trust, is refused like a fence violation: the VM keeps running through
// any tombstone grace, the epoch stays, the status and the metrics say
// why. The controller's next, signed snapshot is accepted; a new key
// listed beside the old one takes over (rotation).
func TestForgedSnapshotRefused(t *testing.T) {
	gittest.NeedGit(t)
	oldKey := trusttest.NewSSHKey(t, "gitfleet-controller-2025")
	newKey := trusttest.NewSSHKey(t, "gitfleet-controller-2026")
	eve := trusttest.NewSSHKey(t, "eve")
	bare := gittest.NewBare(t)
	gittest.Commit(t, bare, gittest.Edit{Branch: "main", Message: "the fleet", Write: map[string]string{
		"hosts/hv-a.yaml": hostFile(testHost), "vms/web-01.yaml": vmFile("web-01", testHost, ""),
	}})
	ctlClock := newClock()
	ctl := signedController(t, bare, ctlClock, commitSigner(t, oldKey))
	reg := prometheus.NewRegistry()
	m, err := agent.NewMetrics(reg)
	require.NoError(t, err)
	h := &hostAgent{t: t, url: bare, dir: t.TempDir(), prov: agenttest.New(), clock: newClock(),
		tune:           func(c *agent.EngineConfig) { c.TombstoneGrace = time.Minute; c.Metrics = m },
		controllerKeys: controllerKeys(t, oldKey.Public), metrics: m}
	h.start()

	res := mustPass(t, ctl)
	require.NoError(t, h.once())
	st := readStatus(t, bare)
	require.Len(t, st.VMs, 1)
	require.Equal(t, "ready", st.VMs[0].Phase)
	accepted := st.LastSeenEpoch
	require.Equal(t, res.Published[testHost], accepted)
	assert.Empty(t, st.SnapshotError)
	assert.Equal(t, 0.0, value(t, reg, "gitfleet_agent_snapshot_refusals_total", "reason", "signature"))

	// The controller is stopped from here on until it is needed.
	current := *tipSnapshot(t, bare)
	tombstoned := func(epoch uint64) *snapshots.Snapshot {
		f := current
		f.Epoch = epoch
		f.VMs = append([]snapshots.SnapshotVM(nil), current.VMs...)
		f.VMs[0].Tombstoned = true
		f.VMs[0].Tombstone = &snapshots.Tombstone{Commit: "0123456789abcdef0123456789abcdef01234567", Author: "Eve <eve@example.com>", Time: "2026-01-01T00:00:00Z", Epoch: epoch}
		return &f
	}
	for i, tc := range []struct {
		name  string
		sign  *gittest.Signing
		wants string
	}{
		{"unsigned", nil, "carries no signature"},
		{"signed by a key the agent does not trust", eve.Sign(), "not on the allowed-signers list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.prov.ResetCalls()
			forged := forge(t, bare, tombstoned(accepted+1+uint64(i)), tc.sign)
			for range 2 { // a tombstone grace passes between them
				require.NoError(t, h.once())
				h.clock.Add(2 * time.Minute)
			}
			st := readStatus(t, bare)
			assert.Equal(t, accepted, st.LastSeenEpoch, "the forged epoch is not accepted")
			assert.Contains(t, st.SnapshotError, "not signed by the controller")
			assert.Contains(t, st.SnapshotError, tc.wants)
			assert.Contains(t, st.SnapshotError, forged[:12], "the refusal names the commit")
			assert.Empty(t, st.Quarantined)
			assert.Empty(t, st.Destroyed)
			require.Len(t, st.VMs, 1)
			assert.Equal(t, "ready", st.VMs[0].Phase)
			assert.Empty(t, h.prov.Calls(agenttest.OpShutdown), "the VM keeps running")
			assert.Empty(t, h.prov.Calls(agenttest.OpDestroy))
			assert.Equal(t, 1, h.prov.RunningCount())
			assert.Equal(t, float64(i+1), value(t, reg, "gitfleet_agent_snapshot_refusals_total", "reason", "signature"), "counted once per refused commit")
		})
	}

	// A refusal is not a fence: the last accepted snapshot stays in force,
	// so a guest that crashes meanwhile is started again.
	t.Run("the last accepted snapshot stays in force", func(t *testing.T) {
		h.prov.ResetCalls()
		h.prov.Crash("web-01")
		require.Equal(t, 0, h.prov.RunningCount())
		require.NoError(t, h.once())
		st := readStatus(t, bare)
		assert.Contains(t, st.SnapshotError, "not signed by the controller", "the refusal stands")
		assert.Contains(t, st.SnapshotError, "the last accepted snapshot stays in force", "the status says what the host does meanwhile")
		assert.NotEmpty(t, h.prov.Calls(agenttest.OpBoot), "the crashed guest is booted again")
		assert.Equal(t, 1, h.prov.RunningCount())
		assert.Equal(t, accepted, st.LastSeenEpoch)
	})

	t.Run("the controller's next snapshot, signed, is accepted", func(t *testing.T) {
		res := mustPass(t, ctl)
		require.Contains(t, res.Published, testHost, "the forged file is not what the controller computes: it publishes again")
		readme := gittest.Show(t, bare, "refs/heads/"+status.Branch, "README.md")
		assert.Contains(t, readme, `online, snapshot refused\: not signed by the controller\: `, "the status README says the host refuses its snapshot")
		require.NoError(t, h.once())
		st := readStatus(t, bare)
		assert.Empty(t, st.SnapshotError)
		assert.Equal(t, res.Published[testHost], st.LastSeenEpoch)
		assert.Greater(t, st.LastSeenEpoch, accepted)
		require.Len(t, st.VMs, 1)
		assert.Equal(t, "ready", st.VMs[0].Phase)
		assert.Equal(t, 1, h.prov.RunningCount())
	})

	t.Run("rotation: old and new keys listed, the controller moves to the new one", func(t *testing.T) {
		h.eng.Close(context.Background())
		h.controllerKeys = controllerKeys(t, oldKey.Public, newKey.Public)
		h.start()
		ctl.Close()
		ctl = signedController(t, bare, ctlClock, commitSigner(t, newKey), oldKey.Public) // the ledger the old key signed stays trusted
		gittest.Commit(t, bare, gittest.Edit{Branch: "main", Message: "web-02",
			Write: map[string]string{"vms/web-02.yaml": vmFile("web-02", testHost, "")}})
		res := mustPass(t, ctl)
		require.Contains(t, res.Published, testHost)
		require.NoError(t, h.once())
		st := readStatus(t, bare)
		assert.Empty(t, st.SnapshotError)
		assert.Equal(t, res.Published[testHost], st.LastSeenEpoch, "signed by the new key: accepted")
		assert.Len(t, st.VMs, 2)

		// The old key retired from the agent's list: a snapshot signed
		// with it (a stale controller) is refused.
		h.eng.Close(context.Background())
		h.controllerKeys = controllerKeys(t, newKey.Public)
		h.start()
		stale := *tombstoned(res.Published[testHost] + 1)
		forge(t, bare, &stale, oldKey.Sign())
		require.NoError(t, h.once())
		st = readStatus(t, bare)
		assert.Contains(t, st.SnapshotError, "not signed by the controller")
		assert.Equal(t, res.Published[testHost], st.LastSeenEpoch)
		assert.Equal(t, 2, h.prov.RunningCount())
	})
}

// forgeStatus commits st as the host's status on its host branch with git
// itself, signed with sign (nil: unsigned), as anyone who can push there
// could.
func forgeStatus(t *testing.T, bare string, st *status.Status, sign *gittest.Signing) string {
	t.Helper()
	data, err := status.Marshal(st)
	require.NoError(t, err)
	return gittest.Commit(t, bare, gittest.Edit{Branch: status.HostBranch(st.Host), Message: "status: forged",
		Write: map[string]string{status.Path(st.Host): string(data)}, Sign: sign})
}

// A Host naming spec.agentKey acks deletes only through status commits
// signed by that key: a forged ack, unsigned or signed by another key,
// leaves the tombstone pending, is reported in the status README and the
// metrics, and the VM keeps running; the real agent's signed ack
// finalizes the delete.
func TestForgedAckLeavesTombstonePending(t *testing.T) {
	gittest.NeedGit(t)
	hostKey := trusttest.NewSSHKey(t, "gitfleet-agent@"+testHost)
	eve := trusttest.NewSSHKey(t, "eve")
	bare := gittest.NewBare(t)
	gittest.Commit(t, bare, gittest.Edit{Branch: "main", Message: "the fleet", Write: map[string]string{
		"hosts/hv-a.yaml": hostFile(testHost) + "  agentKey: " + hostKey.Public + "\n",
		"vms/web-01.yaml": vmFile("web-01", testHost, ""),
		"vms/old-01.yaml": vmFile("old-01", testHost, ""),
	}})
	ctl := signedController(t, bare, newClock(), nil)
	h := &hostAgent{t: t, url: bare, dir: t.TempDir(), prov: agenttest.New(), clock: newClock(),
		tune:       func(c *agent.EngineConfig) { c.TombstoneGrace = time.Minute },
		signingKey: commitSigner(t, hostKey)}
	h.start()
	mustPass(t, ctl)
	require.NoError(t, h.once())
	st := readStatus(t, bare)
	require.Len(t, st.VMs, 2)

	gittest.Commit(t, bare, gittest.Edit{Branch: "main", Remove: []string{"vms/old-01.yaml"}, Message: "retire old-01"})
	res := mustPass(t, ctl)
	require.Contains(t, res.Tombstoned, "VM old-01@"+testHost)
	epoch := res.Published[testHost]

	// The agent does not run from here until the forgeries are done.
	for i, tc := range []struct {
		name string
		sign *gittest.Signing
		want string
	}{
		{"unsigned", nil, "carries no signature"},
		{"signed by another key", eve.Sign(), "not on the allowed-signers list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forged := *st
			forged.Heartbeat += uint64(10 * (i + 1))
			forged.LastSeenEpoch = epoch
			forged.Destroyed = []string{"old-01"}
			commit := forgeStatus(t, bare, &forged, tc.sign)
			res := mustPass(t, ctl)
			assert.Empty(t, res.Finalized, "a forged ack finalizes nothing")
			assert.Equal(t, 1, res.Pending)
			require.Len(t, res.ForgedAcks, 1)
			assert.Equal(t, "VM old-01@"+testHost, res.ForgedAcks[0].Ref)
			assert.Equal(t, commit, res.ForgedAcks[0].Commit)
			assert.Contains(t, res.ForgedAcks[0].Reason, tc.want)
			assert.Contains(t, snapshotNames(tipSnapshot(t, bare)), "old-01", "still delivered as a tombstone")
			readme := gittest.Show(t, bare, "refs/heads/"+status.Branch, "README.md")
			assert.Contains(t, readme, "## Forged acks")
			assert.Contains(t, readme, `VM old-01\@`+testHost)
			assert.Contains(t, readme, commit[:12])
			assert.Equal(t, 1.0, value(t, ctl.Registry(), "gitfleet_controller_forged_acks"))
			assert.Empty(t, h.prov.Calls(agenttest.OpDestroy), "the VM was never destroyed")
		})
	}

	t.Run("the real agent's signed ack finalizes", func(t *testing.T) {
		require.NoError(t, h.once()) // quarantined
		h.clock.Add(2 * time.Minute)
		require.NoError(t, h.once()) // destroyed, acked with a signed commit
		assert.Equal(t, []string{"old-01"}, h.prov.Calls(agenttest.OpDestroy))
		tip := gittest.Rev(t, bare, "refs/heads/"+status.HostBranch(testHost))
		raw := gittest.Git(t, bare, "cat-file", "commit", tip)
		assert.Contains(t, raw, "gpgsig -----BEGIN SSH SIGNATURE-----", "the agent signs its status commits")
		res := mustPass(t, ctl)
		assert.Equal(t, []string{"VM old-01@" + testHost}, res.Finalized)
		assert.Empty(t, res.ForgedAcks)
		assert.Equal(t, 0.0, value(t, ctl.Registry(), "gitfleet_controller_forged_acks"))
		readme := gittest.Show(t, bare, "refs/heads/"+status.Branch, "README.md")
		assert.NotContains(t, readme, "## Forged acks")
	})
}
