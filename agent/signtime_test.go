package agent_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/trusttest"
	"github.com/gitfleet/gitfleet/trust"
)

// An agent judges a controller key's valid-before (its controllerKeysFile)
// at the time it first saw the snapshots commit, never at the commit date
// its signer wrote: a retired key's snapshot dated before the bound, first
// seen after it, is refused as expired. A snapshot it accepted while the
// key was valid stays accepted after the bound, after a restart too (the
// store keeps when it was first seen); an agent without that record
// (another state directory) judges it afresh and refuses it.
func TestRetiredControllerKeyJudgedWhenFirstSeen(t *testing.T) {
	gittest.NeedGit(t)
	old := trusttest.NewSSHKey(t, "gitfleet-controller-old")
	start := time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)
	bound := start.Add(time.Hour)
	list, err := trust.ParseAllowedSigners("controller_signers", []byte(fmt.Sprintf("old valid-before=%q %s\n", bound.Format("20060102150405")+"Z", old.Public)))
	require.NoError(t, err)
	keys, err := trust.New(list, nil)
	require.NoError(t, err)
	bare := gittest.NewBare(t)
	publish := func(epoch uint64, date time.Time) string {
		data, err := snapshots.MarshalSnapshot(&snapshots.Snapshot{Host: testHost, Epoch: epoch})
		require.NoError(t, err)
		return gittest.Commit(t, bare, gittest.Edit{Branch: agent.SnapshotsBranch, Message: fmt.Sprintf("snapshots: epoch %d", epoch), Time: date,
			Write: map[string]string{"hosts/" + testHost + ".yaml": string(data)}, Sign: old.Sign()})
	}
	source := func(store *agent.Store, at time.Time) *agent.Source {
		repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: bare, Depth: 1, Logger: quietLog().WithField("test", t.Name())})
		require.NoError(t, err)
		return agent.NewSource(repo, testHost, "").Verified(keys, store, func() time.Time { return at })
	}
	store, err := agent.OpenStore(t.TempDir())
	require.NoError(t, err)

	first := publish(1, start)
	snap, tip, err := source(store, start.Add(time.Minute)).Fetch(context.Background())
	require.NoError(t, err, "a snapshot first seen while its key is valid")
	require.Equal(t, first, tip)
	require.EqualValues(t, 1, snap.Epoch)

	// Restarted after the bound: the same tip, first seen before it.
	_, _, err = source(store, bound.Add(time.Hour)).Fetch(context.Background())
	require.NoError(t, err, "the accepted tip after the key's bound, after a restart")
	other, err := agent.OpenStore(t.TempDir())
	require.NoError(t, err)
	_, _, err = source(other, bound.Add(time.Hour)).Fetch(context.Background())
	require.ErrorIs(t, err, agent.ErrSnapshotSignature, "an agent that never saw the tip before the bound")

	// A retired key's snapshot dated back three days, first seen now.
	backdated := publish(2, start.Add(-72*time.Hour))
	_, tip, err = source(store, bound.Add(2*time.Hour)).Fetch(context.Background())
	require.Equal(t, backdated, tip)
	require.ErrorIs(t, err, agent.ErrSnapshotSignature)
	require.ErrorIs(t, err, trust.ErrKeyExpired)
	assert.Contains(t, err.Error(), "expired")
	assert.Contains(t, err.Error(), "first seen")
}
