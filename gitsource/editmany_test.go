package gitsource_test

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// pushCounter serves a bare repository over http and counts the
// receive-pack runs (POST …/git-receive-pack); before, when set, runs
// before each one reaches git (its argument counts from 1).
type pushCounter struct {
	remote
	pushes atomic.Int32
	before func(n int32)
}

func servePushCounter(t *testing.T, configure ...string) *pushCounter {
	t.Helper()
	dir := gittest.NewBare(t)
	for _, kv := range configure {
		k, v, _ := strings.Cut(kv, "=")
		gittest.Git(t, dir, "config", k, v)
	}
	cr := &pushCounter{}
	base := gittest.ServeWith(t, filepath.Dir(dir), gittest.ServeOptions{Wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/git-receive-pack") {
				n := cr.pushes.Add(1)
				if cr.before != nil {
					cr.before(n)
				}
			}
			h.ServeHTTP(w, req)
		})
	}})
	cr.remote = remote{dir: dir, url: base + "/" + filepath.Base(dir)}
	return cr
}

// writeFile is an EditFunc writing path=content; runs counts its calls.
func writeFile(path, content string, runs *int) gitsource.EditFunc {
	return func(*gitsource.Commit, func(string) ([]byte, error)) (gitsource.Write, error) {
		*runs++
		return gitsource.Write{Files: map[string][]byte{path: []byte(content)}, Message: "write " + path}, nil
	}
}

// fetchedEdits are BranchEdits of snaps and status on the tips r just
// fetched.
func fetchedEdits(t *testing.T, r *gitsource.Repo, snaps, status gitsource.EditFunc) []gitsource.BranchEdit {
	t.Helper()
	ctx := context.Background()
	a, err := r.Fetch(ctx, "gitfleet/snapshots")
	require.NoError(t, err)
	b, err := r.Fetch(ctx, "gitfleet/status")
	require.NoError(t, err)
	return []gitsource.BranchEdit{
		{Branch: "gitfleet/snapshots", Tip: a, Known: true, Edit: snaps},
		{Branch: "gitfleet/status", Tip: b, Known: true, Edit: status},
	}
}

// seed gives the remote both branches.
func seed(t *testing.T, dir string) (snaps, status string) {
	snaps = gittest.Commit(t, dir, gittest.Edit{Branch: "gitfleet/snapshots", Write: map[string]string{"ledger": "0"}})
	status = gittest.Commit(t, dir, gittest.Edit{Branch: "gitfleet/status", Write: map[string]string{"summary": "0"}})
	return snaps, status
}

// Both branches move in one receive-pack, each commit on the tip it was
// given, over every transport; a branch with nothing to write keeps its
// tip and the other is pushed alone; new branches are created.
func TestEditManyOnePush(t *testing.T) {
	ctx := context.Background()
	cr := servePushCounter(t)
	oldSnaps, oldStatus := seed(t, cr.dir)
	r := open(t, gitsource.Options{URL: cr.url, Depth: 1})
	var runs int
	tips, err := r.EditMany(ctx, fetchedEdits(t, r, writeFile("ledger", "1", &runs), writeFile("summary", "1", &runs)))
	require.NoError(t, err)
	assert.EqualValues(t, 1, cr.pushes.Load(), "one receive-pack for both branches")
	assert.Equal(t, 2, runs)
	assert.Equal(t, []string{gittest.Rev(t, cr.dir, "gitfleet/snapshots"), gittest.Rev(t, cr.dir, "gitfleet/status")}, tips)
	assert.Equal(t, oldSnaps, gittest.Rev(t, cr.dir, "gitfleet/snapshots^"))
	assert.Equal(t, oldStatus, gittest.Rev(t, cr.dir, "gitfleet/status^"))
	assert.Equal(t, "1", gittest.Show(t, cr.dir, "gitfleet/snapshots", "ledger"))
	assert.Equal(t, "1", gittest.Show(t, cr.dir, "gitfleet/status", "summary"))

	// Nothing new on the snapshots: the status is pushed alone.
	tips2, err := r.EditMany(ctx, fetchedEdits(t, r, writeFile("ledger", "1", &runs), writeFile("summary", "2", &runs)))
	require.NoError(t, err)
	assert.Equal(t, tips[0], tips2[0])
	assert.Equal(t, gittest.Rev(t, cr.dir, "gitfleet/status"), tips2[1])
	assert.EqualValues(t, 2, cr.pushes.Load())

	eachTransport(t, func(t *testing.T, rm remote) {
		r := open(t, gitsource.Options{URL: rm.url})
		var runs int
		edits := []gitsource.BranchEdit{
			{Branch: "gitfleet/snapshots", Known: true, Edit: writeFile("ledger", "new", &runs)},
			{Branch: "gitfleet/status", Known: true, Edit: writeFile("summary", "new", &runs)},
		}
		tips, err := r.EditMany(ctx, edits)
		require.NoError(t, err)
		assert.Equal(t, []string{gittest.Rev(t, rm.dir, "gitfleet/snapshots"), gittest.Rev(t, rm.dir, "gitfleet/status")}, tips)
		assert.Equal(t, "new", gittest.Show(t, rm.dir, "gitfleet/status", "summary"))
	})
}

// A branch that moves between the push's advertisement and git's update
// (a concurrent writer) makes git refuse the whole atomic push: neither
// branch takes the first attempt's commit, and the retry fetches both,
// runs both edits again on the new tips and writes both in one push.
func TestEditManyLostRaceRefusesBoth(t *testing.T) {
	for _, moved := range []string{"gitfleet/snapshots", "gitfleet/status"} {
		t.Run(strings.TrimPrefix(moved, "gitfleet/"), func(t *testing.T) {
			ctx := context.Background()
			cr := servePushCounter(t)
			oldSnaps, oldStatus := seed(t, cr.dir)
			var foreign string
			cr.before = func(n int32) {
				if n == 1 {
					foreign = gittest.Commit(t, cr.dir, gittest.Edit{Branch: moved, Write: map[string]string{"foreign": "x"}})
				}
			}
			r := open(t, gitsource.Options{URL: cr.url})
			var runs int
			_, err := r.EditMany(ctx, fetchedEdits(t, r, writeFile("ledger", "1", &runs), writeFile("summary", "1", &runs)))
			require.NoError(t, err)
			assert.EqualValues(t, 2, cr.pushes.Load(), "the refused push and the retry")
			assert.Equal(t, 4, runs, "both edits ran again")
			// Each branch holds exactly one commit of ours, on the tip the
			// retry fetched.
			wantSnaps, wantStatus := oldSnaps, oldStatus
			if moved == "gitfleet/snapshots" {
				wantSnaps = foreign
			} else {
				wantStatus = foreign
			}
			assert.Equal(t, wantSnaps, gittest.Rev(t, cr.dir, "gitfleet/snapshots^"))
			assert.Equal(t, wantStatus, gittest.Rev(t, cr.dir, "gitfleet/status^"))
			assert.Equal(t, "x", gittest.Show(t, cr.dir, moved, "foreign"))
			assert.Equal(t, "1", gittest.Show(t, cr.dir, "gitfleet/snapshots", "ledger"))
			assert.Equal(t, "1", gittest.Show(t, cr.dir, "gitfleet/status", "summary"))
		})
	}
}

// A branch already moved when the push starts is refused before anything
// is sent, and the retry writes both.
func TestEditManyStaleTip(t *testing.T) {
	ctx := context.Background()
	cr := servePushCounter(t)
	seed(t, cr.dir)
	r := open(t, gitsource.Options{URL: cr.url})
	var runs int
	edits := fetchedEdits(t, r, writeFile("ledger", "1", &runs), writeFile("summary", "1", &runs))
	foreign := gittest.Commit(t, cr.dir, gittest.Edit{Branch: "gitfleet/status", Write: map[string]string{"foreign": "x"}})
	_, err := r.EditMany(ctx, edits)
	require.NoError(t, err)
	assert.EqualValues(t, 1, cr.pushes.Load(), "the stale attempt sent nothing")
	assert.Equal(t, foreign, gittest.Rev(t, cr.dir, "gitfleet/status^"))
}

// A remote that does not advertise atomic pushes gets one push per
// branch, and the Repo asks no more; a refusal of the second push is a
// lost race whose retry writes it.
func TestEditManyWithoutAtomic(t *testing.T) {
	ctx := context.Background()
	cr := servePushCounter(t, "receive.advertiseAtomic=false")
	oldSnaps, oldStatus := seed(t, cr.dir)
	r := open(t, gitsource.Options{URL: cr.url})
	var runs int
	_, err := r.EditMany(ctx, fetchedEdits(t, r, writeFile("ledger", "1", &runs), writeFile("summary", "1", &runs)))
	require.NoError(t, err)
	assert.EqualValues(t, 2, cr.pushes.Load(), "one push per branch")
	assert.Equal(t, oldSnaps, gittest.Rev(t, cr.dir, "gitfleet/snapshots^"))
	assert.Equal(t, oldStatus, gittest.Rev(t, cr.dir, "gitfleet/status^"))
	assert.Equal(t, "1", gittest.Show(t, cr.dir, "gitfleet/status", "summary"))

	cr.before = func(n int32) {
		if n == 4 { // the second branch's push of the next write
			gittest.Commit(t, cr.dir, gittest.Edit{Branch: "gitfleet/status", Write: map[string]string{"foreign": "x"}})
		}
	}
	_, err = r.EditMany(ctx, fetchedEdits(t, r, writeFile("ledger", "2", &runs), writeFile("summary", "2", &runs)))
	require.NoError(t, err)
	assert.EqualValues(t, 5, cr.pushes.Load(), "the snapshots, the refused status, the status again")
	assert.Equal(t, "2", gittest.Show(t, cr.dir, "gitfleet/snapshots", "ledger"))
	assert.Equal(t, "2", gittest.Show(t, cr.dir, "gitfleet/status", "summary"))
	assert.Equal(t, "x", gittest.Show(t, cr.dir, "gitfleet/status", "foreign"))
}
