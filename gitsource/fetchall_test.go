package gitsource_test

import (
	"context"
	"errors"
	"fmt"
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

// countingServer serves a fresh bare repository over git http-backend and
// counts the upload-pack runs (POST git-upload-pack) and the upload-pack
// ref advertisements (GET info/refs?service=git-upload-pack) it answers.
type countingServer struct {
	dir, url string
	uploads  atomic.Int64
	adverts  atomic.Int64
}

func serveCounting(t *testing.T) *countingServer {
	s := &countingServer{dir: gittest.NewBare(t)}
	base := gittest.ServeWith(t, filepath.Dir(s.dir), gittest.ServeOptions{Wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/git-upload-pack") {
				s.uploads.Add(1)
			}
			if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/info/refs") && r.URL.Query().Get("service") == "git-upload-pack" {
				s.adverts.Add(1)
			}
			h.ServeHTTP(w, r)
		})
	}})
	s.url = base + "/" + filepath.Base(s.dir)
	return s
}

// hostBranches writes n branches gitfleet/hosts/hv-I, each with its own
// status file, and returns branch → tip.
func hostBranches(t *testing.T, dir string, n int) map[string]string {
	t.Helper()
	tips := map[string]string{}
	for i := 0; i < n; i++ {
		b := fmt.Sprintf("gitfleet/hosts/hv-%d", i)
		tips[b] = gittest.Commit(t, dir, gittest.Edit{Branch: b, Write: map[string]string{fmt.Sprintf("hosts/hv-%d.yaml", i): fmt.Sprint(i)}})
	}
	return tips
}

// FetchAll fetches exact branches and every branch under a prefix with one
// upload-pack; a branch the remote lacks is left out, not an error, and the
// others still arrive whole.
func TestFetchAllOneUploadPack(t *testing.T) {
	ctx := context.Background()
	s := serveCounting(t)
	want := hostBranches(t, s.dir, 3)
	want["main"] = gittest.Commit(t, s.dir, gittest.Edit{Write: map[string]string{"a": "a"}})
	want["gitfleet/status"] = gittest.Commit(t, s.dir, gittest.Edit{Branch: "gitfleet/status", Write: map[string]string{"README.md": "x"}})
	r := open(t, gitsource.Options{URL: s.url, Depth: 1})

	tips, err := r.FetchAll(ctx, []string{"main", "gitfleet/status"}, []string{"gitfleet/hosts/"})
	require.NoError(t, err)
	assert.Equal(t, want, tips)
	assert.Equal(t, int64(1), s.uploads.Load(), "one upload-pack for every branch")
	for i := 0; i < 3; i++ {
		data, err := r.ReadFile(tips[fmt.Sprintf("gitfleet/hosts/hv-%d", i)], fmt.Sprintf("hosts/hv-%d.yaml", i))
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprint(i), string(data))
	}

	// A missing branch is absent from the answer; the rest still arrive.
	next := gittest.Commit(t, s.dir, gittest.Edit{Write: map[string]string{"a": "b"}})
	tips, err = r.FetchAll(ctx, []string{"main", "gitfleet/snapshots"}, []string{"gitfleet/hosts/"})
	require.NoError(t, err)
	_, found := tips["gitfleet/snapshots"]
	assert.False(t, found, "a branch the remote lacks is not in the answer")
	assert.Equal(t, next, tips["main"])
	assert.Len(t, tips, 4)

	// Nothing new: no upload-pack at all.
	before := s.uploads.Load()
	_, err = r.FetchAll(ctx, []string{"main"}, []string{"gitfleet/hosts/"})
	require.NoError(t, err)
	assert.Equal(t, before, s.uploads.Load(), "an up-to-date fetch sends no upload-pack")

	_, err = r.Fetch(ctx, "gitfleet/snapshots")
	assert.ErrorIs(t, err, gitsource.ErrBranchNotFound, "Fetch of one missing branch still says so")
	_, err = r.FetchAll(ctx, nil, []string{"gitfleet/hosts"})
	assert.Error(t, err, "a prefix must end in /")
}

// TestFetchPrefixDamageRepaired: after each kind of damage to a shallow
// cache holding host branches (the controller's tips) — the tracking ref
// of one host branch broken (empty, garbage, a missing object, a
// directory), a pack truncated or deleted, the refs or config gone — the
// next Open and FetchPrefix succeed and return every branch's remote tip,
// readable whole. (The repair is Fetch's, whose full-history case
// TestCacheDamageRepaired covers.) A blob found missing by a read is
// fetched again by the next FetchPrefix, as for Fetch.
func TestFetchPrefixDamageRepaired(t *testing.T) {
	ctx := context.Background()
	for _, d := range cacheDamagesOf("refs/remotes/origin/gitfleet/hosts/hv-1") {
		t.Run(d.name, func(t *testing.T) {
			rm := gittest.NewBare(t)
			hostBranches(t, rm, 3)
			cache := filepath.Join(t.TempDir(), "cache")
			opts := gitsource.Options{URL: rm, CacheDir: cache, Depth: 1}
			r := open(t, opts)
			_, err := r.FetchPrefix(ctx, "gitfleet/hosts/")
			require.NoError(t, err)
			require.NoError(t, r.Close())
			want := hostBranches(t, rm, 3) // every branch moves on

			d.damage(t, cache)

			r, err = gitsource.Open(ctx, opts)
			require.NoError(t, err, "open a damaged cache")
			defer r.Close()
			tips, err := r.FetchPrefix(ctx, "gitfleet/hosts/")
			require.NoError(t, err, "fetch into a damaged cache")
			assert.Equal(t, want, tips)
			for i := 0; i < 3; i++ {
				tip, path := tips[fmt.Sprintf("gitfleet/hosts/hv-%d", i)], fmt.Sprintf("hosts/hv-%d.yaml", i)
				data, err := r.ReadFile(tip, path)
				if errors.Is(err, gitsource.ErrObjectMissing) {
					// A blob the remote did not send again (the cache
					// claimed it) sat in the damaged pack: the read
					// records it, and the next fetch repairs it, as a
					// pass's next fetch would.
					_, err = r.FetchPrefix(ctx, "gitfleet/hosts/")
					require.NoError(t, err, "the fetch after a read found an object missing")
					data, err = r.ReadFile(tip, path)
				}
				require.NoError(t, err)
				assert.Equal(t, fmt.Sprint(i), string(data))
			}
		})
	}
}

// A host branch whose tip is replaced (an agent's heartbeat-only write
// replaces its tip, not fast-forward) between a fetch's ref advertisement
// and its request over http — two requests of stateless git
// http-backend, each with its own upload-pack — makes the remote refuse
// the old tip ("not our ref": no longer reachable). At 1,000 hosts a
// branch is replaced several times a second, so FetchAll asks again (a
// new advertisement) instead of failing the pass, and returns the tip
// the remote has now.
func TestFetchAllTipReplacedMidFetch(t *testing.T) {
	ctx := context.Background()
	dir := gittest.NewBare(t)
	hosts := hostBranches(t, dir, 2)
	var replace atomic.Bool
	var replaced atomic.Int64
	var next string
	base := gittest.ServeWith(t, filepath.Dir(dir), gittest.ServeOptions{Wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/git-upload-pack") && replace.CompareAndSwap(true, false) {
				// After the advertisement, before the request: the tip the
				// client wants is no longer reachable.
				parent := gittest.Git(t, dir, "rev-parse", hosts["gitfleet/hosts/hv-1"]+"^")
				next = gittest.Commit(t, dir, gittest.Edit{Branch: "gitfleet/hosts/hv-1", Parents: []string{parent},
					Write: map[string]string{"hosts/hv-1.yaml": "replaced"}})
				replaced.Add(1)
			}
			h.ServeHTTP(w, r)
		})
	}})
	r := open(t, gitsource.Options{URL: base + "/" + filepath.Base(dir), Depth: 1})
	_, err := r.FetchAll(ctx, nil, []string{"gitfleet/hosts/"})
	require.NoError(t, err)

	hosts["gitfleet/hosts/hv-1"] = gittest.Commit(t, dir, gittest.Edit{Branch: "gitfleet/hosts/hv-1", Write: map[string]string{"hosts/hv-1.yaml": "heartbeat"}})
	replace.Store(true)
	tips, err := r.FetchAll(ctx, nil, []string{"gitfleet/hosts/"})
	require.NoError(t, err, "a tip replaced during the fetch is fetched again")
	require.Equal(t, int64(1), replaced.Load(), "the tip was replaced during the fetch")
	assert.Equal(t, next, tips["gitfleet/hosts/hv-1"])
	data, err := r.ReadFile(next, "hosts/hv-1.yaml")
	require.NoError(t, err)
	assert.Equal(t, "replaced", string(data))
}
