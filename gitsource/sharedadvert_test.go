package gitsource_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// TestSharedAdvertisement: two caches of one remote (the controller's
// desired branch cache and its tip cache) fetch under one Advertisement,
// as a pass does. The first fetch records the remote's ref advertisement;
// the second runs no upload-pack session at all (no ref advertisement, no
// pack) when every branch it asks for is at the tip it tracks, and fetches
// as before when one moved, appeared or was deleted. An advertisement of
// another remote, or none, never skips a fetch.
func TestSharedAdvertisement(t *testing.T) {
	s := serveCounting(t)
	hosts := hostBranches(t, s.dir, 3)
	main := gittest.Commit(t, s.dir, gittest.Edit{Write: map[string]string{"a": "1"}})
	snaps := gittest.Commit(t, s.dir, gittest.Edit{Branch: "gitfleet/snapshots", Write: map[string]string{"ledger.yaml": "x"}})
	desiredRepo := open(t, gitsource.Options{URL: s.url})
	tipsRepo := open(t, gitsource.Options{URL: s.url, Depth: 1})

	// pass fetches main, then the tips, under one new advertisement, and
	// returns the tips and the upload-pack sessions it cost (ref
	// advertisements served).
	pass := func(ctx context.Context) (string, map[string]string, int64) {
		t.Helper()
		before := s.adverts.Load()
		ctx = gitsource.WithAdvertisement(ctx, &gitsource.Advertisement{})
		head, err := desiredRepo.Fetch(ctx, "main")
		require.NoError(t, err)
		tips, err := tipsRepo.FetchAll(ctx, []string{"gitfleet/snapshots", "gitfleet/status"}, []string{"gitfleet/hosts/"})
		require.NoError(t, err)
		return head, tips, s.adverts.Load() - before
	}
	want := func() map[string]string {
		w := map[string]string{"gitfleet/snapshots": snaps}
		for b, tip := range hosts {
			w[b] = tip
		}
		return w
	}
	ctx := context.Background()

	head, tips, sessions := pass(ctx)
	assert.Equal(t, main, head)
	assert.Equal(t, want(), tips, "an empty tip cache fetches everything")
	assert.Equal(t, int64(2), sessions, "the first pass fetches into both caches")

	main = gittest.Commit(t, s.dir, gittest.Edit{Write: map[string]string{"a": "2"}})
	head, tips, sessions = pass(ctx)
	assert.Equal(t, main, head)
	assert.Equal(t, want(), tips)
	assert.Equal(t, int64(1), sessions, "tips unchanged in the advertisement: no session for them")

	hosts["gitfleet/hosts/hv-1"] = gittest.Commit(t, s.dir, gittest.Edit{Branch: "gitfleet/hosts/hv-1", Write: map[string]string{"hosts/hv-1.yaml": "moved"}})
	_, tips, sessions = pass(ctx)
	assert.Equal(t, want(), tips, "a moved host branch is fetched")
	assert.Equal(t, int64(2), sessions)
	data, err := tipsRepo.ReadFile(tips["gitfleet/hosts/hv-1"], "hosts/hv-1.yaml")
	require.NoError(t, err)
	assert.Equal(t, "moved", string(data))

	gittest.Git(t, s.dir, "branch", "-D", "gitfleet/hosts/hv-2")
	delete(hosts, "gitfleet/hosts/hv-2")
	_, tips, sessions = pass(ctx)
	assert.Equal(t, want(), tips, "a deleted host branch leaves the answer")
	assert.Equal(t, int64(2), sessions)

	hosts["gitfleet/hosts/hv-9"] = gittest.Commit(t, s.dir, gittest.Edit{Branch: "gitfleet/hosts/hv-9", Write: map[string]string{"hosts/hv-9.yaml": "new"}})
	_, tips, sessions = pass(ctx)
	assert.Equal(t, want(), tips, "a new host branch is fetched")
	assert.Equal(t, int64(2), sessions)

	status := gittest.Commit(t, s.dir, gittest.Edit{Branch: "gitfleet/status", Write: map[string]string{"README.md": "x"}})
	_, tips, sessions = pass(ctx)
	w := want()
	w["gitfleet/status"] = status
	assert.Equal(t, w, tips, "an exact branch that appeared is fetched")
	assert.Equal(t, int64(2), sessions)

	_, tips, sessions = pass(ctx)
	assert.Equal(t, w, tips)
	assert.Equal(t, int64(1), sessions, "nothing moved: one session in all")

	// Without an advertisement, or with one of another remote, the tip
	// cache asks the remote itself.
	before := s.adverts.Load()
	tips, err = tipsRepo.FetchAll(ctx, []string{"gitfleet/snapshots", "gitfleet/status"}, []string{"gitfleet/hosts/"})
	require.NoError(t, err)
	assert.Equal(t, w, tips)
	assert.Equal(t, int64(1), s.adverts.Load()-before, "no advertisement: the fetch reads its own")

	other := serveCounting(t)
	gittest.Commit(t, other.dir, gittest.Edit{Write: map[string]string{"a": "other"}})
	otherRepo := open(t, gitsource.Options{URL: other.url})
	actx := gitsource.WithAdvertisement(ctx, &gitsource.Advertisement{})
	_, err = otherRepo.Fetch(actx, "main")
	require.NoError(t, err)
	before = s.adverts.Load()
	_, err = tipsRepo.FetchAll(actx, []string{"gitfleet/snapshots", "gitfleet/status"}, []string{"gitfleet/hosts/"})
	require.NoError(t, err)
	assert.Equal(t, int64(1), s.adverts.Load()-before, "another remote's advertisement is not this one's")
}
