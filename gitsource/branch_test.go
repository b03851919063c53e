package gitsource_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// TestCreateBranch: the new branch's one commit sits on base's tip with
// base's files and the new one; base does not move; a second create of
// the same branch is ErrBranchExists and leaves it as it was; a missing
// base is ErrBranchNotFound.
func TestCreateBranch(t *testing.T) {
	gittest.NeedGit(t)
	eachTransport(t, func(t *testing.T, rm remote) {
		ctx := context.Background()
		base := gittest.Commit(t, rm.dir, gittest.Edit{Branch: "main", Write: map[string]string{"hosts/hv-a.yaml": "host\n"}, Message: "host"})
		r := open(t, gitsource.Options{URL: rm.url})
		tip, err := r.CreateBranch(ctx, "import/web-01", "main", setFile("vms/web-01.yaml", "vm\n"))
		require.NoError(t, err)
		assert.Equal(t, tip, gittest.Rev(t, rm.dir, "import/web-01"))
		assert.Equal(t, base, gittest.Rev(t, rm.dir, "import/web-01~1"))
		assert.Equal(t, base, gittest.Rev(t, rm.dir, "main"), "base moved")
		assert.Equal(t, []string{"hosts/hv-a.yaml", "vms/web-01.yaml"}, gittest.Files(t, rm.dir, "import/web-01"))

		_, err = r.CreateBranch(ctx, "import/web-01", "main", setFile("vms/web-01.yaml", "other\n"))
		assert.True(t, errors.Is(err, gitsource.ErrBranchExists), "second create: %v", err)
		assert.Equal(t, tip, gittest.Rev(t, rm.dir, "import/web-01"))

		_, err = r.CreateBranch(ctx, "import/web-02", "nope", setFile("vms/web-02.yaml", "vm\n"))
		assert.True(t, errors.Is(err, gitsource.ErrBranchNotFound), "missing base: %v", err)
	})
}
