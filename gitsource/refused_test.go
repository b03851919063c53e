package gitsource_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// TestPushRefusedCarriesTheRemotesMessage: a pre-receive hook that
// declines a push (what a git host's branch protection does) makes the
// write an ErrPushRefused whose text carries what the hook printed, over
// each transport; a hook that says nothing leaves git's own reason, and
// nothing the hook printed past the bound is kept.
func TestPushRefusedCarriesTheRemotesMessage(t *testing.T) {
	eachTransport(t, func(t *testing.T, rm remote) {
		gittest.Commit(t, rm.dir, gittest.Edit{Branch: "main", Write: map[string]string{"a.yaml": "a\n"}})
		r := open(t, gitsource.Options{URL: rm.url, CacheDir: t.TempDir()})
		ctx := context.Background()

		gittest.Hook(t, rm.dir, "pre-receive", `echo "GL-HOOK-ERR: branch main is protected: status writers may not push here" >&2; exit 1`)
		_, err := r.Update(ctx, "main", setFile("b.yaml", "b\n"))
		require.Error(t, err)
		require.True(t, errors.Is(err, gitsource.ErrPushRefused), "%v", err)
		require.Contains(t, err.Error(), "pre-receive hook declined")
		require.Contains(t, err.Error(), "the remote says: GL-HOOK-ERR: branch main is protected: status writers may not push here")

		gittest.Hook(t, rm.dir, "pre-receive", `exit 1`)
		_, err = r.Update(ctx, "main", setFile("b.yaml", "b\n"))
		require.True(t, errors.Is(err, gitsource.ErrPushRefused), "%v", err)
		require.NotContains(t, err.Error(), "the remote says")

		gittest.Hook(t, rm.dir, "pre-receive", `i=0; while [ $i -lt 500 ]; do echo "line $i of a long refusal"; i=$((i+1)); done; exit 1`)
		_, err = r.Update(ctx, "main", setFile("b.yaml", "b\n"))
		require.True(t, errors.Is(err, gitsource.ErrPushRefused), "%v", err)
		require.Contains(t, err.Error(), "line 0 of a long refusal / line 1 of")
		require.Less(t, len(err.Error()), 2*1024+512, "the remote's message is bounded")
		require.True(t, strings.HasSuffix(err.Error(), "…"), "a cut message says so: %v", err)

		gittest.Hook(t, rm.dir, "pre-receive", `exit 0`)
		_, err = r.Update(ctx, "main", setFile("b.yaml", "b\n"))
		require.NoError(t, err)
	})
}
