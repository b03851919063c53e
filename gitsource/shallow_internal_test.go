package gitsource

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// TestShallowCacheOfManyBranches: a depth-1 cache of many host branches
// lists one shallow commit per branch, which is no growth (it is not
// cloned afresh on every fetch, as it was when 512 shallow commits alone
// counted); once the list outgrows the branches it is cloned afresh, and
// every branch comes back in one upload-pack, not one fetch per branch.
func TestShallowCacheOfManyBranches(t *testing.T) {
	defer func(s, g int) { maxShallow, growth = s, g }(maxShallow, growth)
	maxShallow, growth = 5, 4
	ctx := context.Background()
	dir := gittest.NewBare(t)
	var uploads atomic.Int64
	base := gittest.ServeWith(t, filepath.Dir(dir), gittest.ServeOptions{Wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/git-upload-pack") {
				uploads.Add(1)
			}
			h.ServeHTTP(w, r)
		})
	}})
	const hosts = 20
	write := func(round int) map[string]string {
		want := map[string]string{}
		for i := 0; i < hosts; i++ {
			b := fmt.Sprintf("gitfleet/hosts/hv-%d", i)
			// The host's name in its file keeps the branches' commits
			// apart (the same tree, parent and time would be one commit).
			want[b] = gittest.Commit(t, dir, gittest.Edit{Branch: b, Write: map[string]string{"s": fmt.Sprint(round), "h": b}})
		}
		return want
	}
	r := mustOpen(t, Options{URL: base + "/" + filepath.Base(dir), Depth: 1})
	// Each tip has a parent, so that a depth-1 fetch lists it as shallow
	// (a root commit is no shallow boundary).
	write(-1)
	want := write(0)
	tips, err := r.FetchPrefix(ctx, "gitfleet/hosts/")
	require.NoError(t, err)
	require.Equal(t, want, tips)
	st := r.st

	// One branch moves: 21 shallow commits for 20 branches is no growth.
	want["gitfleet/hosts/hv-0"] = gittest.Commit(t, dir, gittest.Edit{Branch: "gitfleet/hosts/hv-0", Write: map[string]string{"s": "again"}})
	tips, err = r.FetchPrefix(ctx, "gitfleet/hosts/")
	require.NoError(t, err)
	require.Equal(t, want, tips)
	require.Same(t, st, r.st, "a fetch of many branches does not clone the cache afresh")

	// Every branch moves, and growth is lowered to 1: more shallow
	// commits than branches is past it; the fresh clone fetches all
	// branches back at once.
	growth = 1
	want = write(1)
	before := uploads.Load()
	tips, err = r.FetchPrefix(ctx, "gitfleet/hosts/")
	require.NoError(t, err)
	require.Equal(t, want, tips)
	assert.NotSame(t, st, r.st, "a shallow list past growth is cloned afresh")
	assert.LessOrEqual(t, uploads.Load()-before, int64(3), "the fetch, one refetch of all %d branches, and at most one more", hosts)
	r.mu.Lock()
	sh, err := r.st.Shallow()
	r.mu.Unlock()
	require.NoError(t, err)
	assert.LessOrEqual(t, len(sh), hosts, "the fresh clone lists one shallow commit per branch")
	for b, tip := range tips {
		data, err := r.ReadFile(tip, "s")
		require.NoError(t, err, b)
		assert.Equal(t, "1", string(data))
	}
}
