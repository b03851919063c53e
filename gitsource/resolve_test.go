package gitsource_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

func TestResolve(t *testing.T) {
	dir := gittest.NewBare(t)
	first := gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"a.yaml": "a: 1\n"}})
	second := gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"a.yaml": "a: 2\n"}})
	gittest.SetBranch(t, dir, "feature", first)
	side := gittest.Commit(t, dir, gittest.Edit{Branch: "feature", Write: map[string]string{"b.yaml": "b: 1\n"}})
	// A pull request's head lives on no branch.
	gittest.SetBranch(t, dir, "tmp", first)
	pr := gittest.Commit(t, dir, gittest.Edit{Branch: "tmp", Write: map[string]string{"c.yaml": "c: 1\n"}})
	gittest.Git(t, dir, "update-ref", "refs/pull/7/head", pr)
	gittest.DeleteBranch(t, dir, "tmp")
	ctx := context.Background()
	for _, tc := range []struct {
		rev, want string
	}{
		{"main", second},
		{"feature", side},
		{first, first},
		{second[:8], second},
		{side[:12], side}, // only on another branch: every branch is fetched
		{pr, pr},
	} {
		t.Run(tc.rev, func(t *testing.T) {
			repo, err := gitsource.Open(ctx, gitsource.Options{URL: dir})
			if err != nil {
				t.Fatal(err)
			}
			got, err := repo.Resolve(ctx, tc.rev)
			if err != nil || got != tc.want {
				t.Fatalf("Resolve(%q) = %q, %v; want %q", tc.rev, got, err, tc.want)
			}
			if _, err := repo.ReadFile(got, "a.yaml"); err != nil {
				t.Errorf("the resolved commit is not readable: %v", err)
			}
		})
	}
	repo, err := gitsource.Open(ctx, gitsource.Options{URL: dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, rev := range []string{"no-such-branch", "deadbeef", "HEAD~1"} {
		if _, err := repo.Resolve(ctx, rev); !errors.Is(err, gitsource.ErrUnknownRevision) {
			t.Errorf("Resolve(%q) error = %v, want ErrUnknownRevision", rev, err)
		}
	}
}

// TestResolveExprInALocalClone: a local repository answers git revision
// expressions (HEAD~1, main~1, origin/main, tags, short hashes) given by
// path or file:// URL, and the commit becomes readable.
func TestResolveExprInALocalClone(t *testing.T) {
	bare := gittest.NewBare(t)
	first := gittest.Commit(t, bare, gittest.Edit{Write: map[string]string{"a.yaml": "a: 1\n"}})
	second := gittest.Commit(t, bare, gittest.Edit{Write: map[string]string{"a.yaml": "a: 2\n"}})
	clone := filepath.Join(t.TempDir(), "clone")
	gittest.Git(t, "", "clone", "-q", bare, clone)
	gittest.Git(t, clone, "tag", "v1", first)
	// A local commit the remote-tracking branch does not have.
	gittest.Git(t, clone, "-c", "user.name=T", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "local")
	local := gittest.Git(t, clone, "rev-parse", "HEAD")
	ctx := context.Background()
	for _, tc := range []struct{ rev, want string }{
		{"HEAD", local},
		{"HEAD~1", second},
		{"HEAD~2", first},
		{"main~1", second},
		{"origin/main", second},
		{"origin/main~1", first},
		{"v1", first},
		{local[:7], local},
		{"main", local},
	} {
		for _, at := range []string{clone, "file://" + clone} {
			t.Run(tc.rev+"@"+filepath.Base(at), func(t *testing.T) {
				repo, err := gitsource.Open(ctx, gitsource.Options{URL: at})
				if err != nil {
					t.Fatal(err)
				}
				got, err := repo.ResolveExpr(ctx, tc.rev)
				if err != nil || got != tc.want {
					t.Fatalf("ResolveExpr(%q) = %q, %v; want %q", tc.rev, got, err, tc.want)
				}
				if _, err := repo.ReadFile(got, "a.yaml"); err != nil {
					t.Errorf("the resolved commit is not readable: %v", err)
				}
			})
		}
	}
	repo, err := gitsource.Open(ctx, gitsource.Options{URL: clone})
	if err != nil {
		t.Fatal(err)
	}
	_, err = repo.ResolveExpr(ctx, "HEAD~9")
	if !errors.Is(err, gitsource.ErrUnknownRevision) {
		t.Fatalf("ResolveExpr(HEAD~9) error = %v, want ErrUnknownRevision", err)
	}
	if msg := err.Error(); strings.Count(msg, clone) != 1 || strings.Count(msg, "HEAD~9") != 1 {
		t.Errorf("the error repeats itself or lacks the repository: %s", msg)
	}
}

// ResolveTracking reads a branch a local clone has only as a remote-tracking
// copy: origin's when there is one, the only remote's otherwise, and an
// error naming the copies when several remotes have one and none is origin.
func TestResolveTrackingReadsTheRemoteTrackingCopy(t *testing.T) {
	ctx := context.Background()
	bare := gittest.NewBare(t)
	tip := gittest.Commit(t, bare, gittest.Edit{Branch: "gitfleet/snapshots", Write: map[string]string{"ledger.yaml": "{}\n"}})
	other := gittest.NewBare(t)
	otherTip := gittest.Commit(t, other, gittest.Edit{Branch: "gitfleet/snapshots", Write: map[string]string{"ledger.yaml": "{\"x\": 1}\n"}})

	clone := func(t *testing.T, remotes map[string]string) string {
		work := filepath.Join(t.TempDir(), "work")
		gittest.Git(t, "", "init", "--quiet", work)
		for name, url := range remotes {
			gittest.Git(t, work, "remote", "add", name, url)
			gittest.Git(t, work, "fetch", "--quiet", name)
		}
		return work
	}
	resolve := func(t *testing.T, dir string) (string, string, error) {
		repo, err := gitsource.Open(ctx, gitsource.Options{URL: dir})
		require.NoError(t, err)
		return repo.ResolveTracking(ctx, "gitfleet/snapshots")
	}

	got, ref, err := resolve(t, bare)
	require.NoError(t, err)
	assert.Equal(t, tip, got)
	assert.Equal(t, "refs/heads/gitfleet/snapshots", ref, "the branch itself when the remote has it")

	got, ref, err = resolve(t, clone(t, map[string]string{"origin": bare, "mirror": other}))
	require.NoError(t, err)
	assert.Equal(t, tip, got)
	assert.Equal(t, "refs/remotes/origin/gitfleet/snapshots", ref, "origin's copy first")

	got, ref, err = resolve(t, clone(t, map[string]string{"upstream": other}))
	require.NoError(t, err)
	assert.Equal(t, otherTip, got)
	assert.Equal(t, "refs/remotes/upstream/gitfleet/snapshots", ref, "the only remote's copy")

	_, _, err = resolve(t, clone(t, map[string]string{"a": bare, "b": other}))
	assert.ErrorIs(t, err, gitsource.ErrBranchNotFound)
	assert.ErrorContains(t, err, "refs/remotes/a/gitfleet/snapshots, refs/remotes/b/gitfleet/snapshots")

	_, _, err = resolve(t, clone(t, nil))
	assert.ErrorIs(t, err, gitsource.ErrBranchNotFound, "no copy at all")
}
