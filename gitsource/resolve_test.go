package gitsource_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/gitsource/gittest"
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
