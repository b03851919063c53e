package gitsource_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/gitsource/gittest"
)

func TestResolve(t *testing.T) {
	ctx := context.Background()
	eachTransport(t, func(t *testing.T, rm remote) {
		c1 := gittest.Commit(t, rm.dir, gittest.Edit{Write: map[string]string{"a": "1"}})
		c2 := gittest.Commit(t, rm.dir, gittest.Edit{Write: map[string]string{"a": "2"}})
		gittest.SetBranch(t, rm.dir, "feature", c1)
		f1 := gittest.Commit(t, rm.dir, gittest.Edit{Branch: "feature", Write: map[string]string{"f": "1"}})
		r := open(t, gitsource.Options{URL: rm.url})
		for _, tc := range []struct {
			rev, want string
		}{
			{"main", c2},
			{"feature", f1},
			{c1, c1},
			{f1[:10], f1},
		} {
			t.Run(tc.rev, func(t *testing.T) {
				got, err := r.Resolve(ctx, tc.rev)
				require.NoError(t, err)
				assert.Equal(t, tc.want, got)
				_, err = r.Tree(got, "")
				assert.NoError(t, err, "the resolved commit is in the cache")
			})
		}
		for _, rev := range []string{"nope", "0000000000000000000000000000000000000001", "deadbeef", "HEAD~1"} {
			t.Run("unknown "+rev, func(t *testing.T) {
				_, err := r.Resolve(ctx, rev)
				assert.ErrorIs(t, err, gitsource.ErrUnknownRevision)
			})
		}
	})
}
