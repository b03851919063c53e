package gitsource_test

import (
	"context"
	"errors"
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
