package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// actionsCheckout makes the working copy actions/checkout leaves for a
// pull_request event with fetch-depth: 0: a fresh repository with remote
// origin, every branch fetched as refs/remotes/origin/*, the pull request's
// head fetched as refs/remotes/pull/1/merge, and a detached HEAD there. No
// local branch exists, gitfleet/snapshots included.
func actionsCheckout(t *testing.T, bare, head string) string {
	t.Helper()
	work := filepath.Join(t.TempDir(), "work")
	gittest.Git(t, "", "init", "--quiet", work)
	gittest.Git(t, work, "remote", "add", "origin", bare)
	gittest.Git(t, work, "fetch", "--quiet", "--prune", "--no-recurse-submodules", "origin",
		"+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*", "+"+head+":refs/remotes/pull/1/merge")
	gittest.Git(t, work, "checkout", "--quiet", "--force", "refs/remotes/pull/1/merge")
	if out := gittest.Git(t, work, "for-each-ref", "refs/heads/"); strings.TrimSpace(out) != "" {
		t.Fatalf("the checkout has local branches:\n%s", out)
	}
	return work
}

// TestPlanInAPullRequestCheckout runs plan exactly as the shipped workflow
// does (--repo . in the checkout, base and head as hashes): the controller's
// ledger is read from origin/gitfleet/snapshots, so an un-delete shows as
// one, a broken base falls back to the applied commit, and a ledger that
// cannot be read is said, never planned over in silence.
func TestPlanInAPullRequestCheckout(t *testing.T) {
	plan := func(t *testing.T, work, base, head string) string {
		t.Helper()
		code, out := runCLI(t, "plan", "--repo", work, "--path", "fleet", "--base", base, "--head", head)
		if code != 0 {
			t.Fatalf("exit %d\n%s", code, out)
		}
		return out
	}
	t.Run("un-delete", func(t *testing.T) {
		dir := cliFleet(t)
		for _, edit := range []gittest.Edit{{}, {Remove: []string{"fleet/db-01.yaml"}}} {
			if len(edit.Remove) > 0 {
				gittest.Commit(t, dir, edit)
			}
			if code, out := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once"); code != 0 {
				t.Fatal(out)
			}
		}
		base := gittest.Rev(t, dir, "refs/heads/main")
		gittest.SetBranch(t, dir, "restore", base)
		head := gittest.Commit(t, dir, gittest.Edit{Branch: "restore", Write: map[string]string{"fleet/db-01.yaml": cliVM("db-01", "hv-a", "1")}})
		out := plan(t, actionsCheckout(t, dir, head), base, head)
		if !strings.Contains(out, "^ undelete VM db-01") || strings.Contains(out, "create VM db-01") {
			t.Fatalf("want an un-delete:\n%s", out)
		}
	})
	t.Run("broken base", func(t *testing.T) {
		dir := cliFleet(t)
		if code, out := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once"); code != 0 {
			t.Fatal(out)
		}
		applied := gittest.Rev(t, dir, "refs/heads/main")
		base := gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"fleet/web-01.yaml": cliVM("web-01", "hv-nowhere", "1")}})
		gittest.SetBranch(t, dir, "fix", base)
		head := gittest.Commit(t, dir, gittest.Edit{Branch: "fix", Write: map[string]string{"fleet/web-01.yaml": cliVM("web-01", "hv-a", "2")},
			Remove: []string{"fleet/db-01.yaml"}})
		out := plan(t, actionsCheckout(t, dir, head), base, head)
		for _, want := range []string{"planned against " + applied[:12] + ", the last commit the controller applied", "~ update VM web-01", "spec.vcpus: 1 -> 2"} {
			if !strings.Contains(out, want) {
				t.Errorf("plan lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "empty base") {
			t.Errorf("planned against an empty base:\n%s", out)
		}
	})
	t.Run("unreadable ledger", func(t *testing.T) {
		dir := cliFleet(t)
		if code, out := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once"); code != 0 {
			t.Fatal(out)
		}
		gittest.Commit(t, dir, gittest.Edit{Branch: fleet.DefaultSnapshotsBranch, Write: map[string]string{"ledger.yaml": "{not a ledger"}})
		base := gittest.Rev(t, dir, "refs/heads/main")
		gittest.SetBranch(t, dir, "change", base)
		head := gittest.Commit(t, dir, gittest.Edit{Branch: "change", Remove: []string{"fleet/db-01.yaml"}})
		out := plan(t, actionsCheckout(t, dir, head), base, head)
		if !strings.Contains(out, "ledger on gitfleet/snapshots cannot be read") || !strings.Contains(out, "- delete VM db-01") {
			t.Fatalf("want the plan with a warning about the ledger:\n%s", out)
		}
	})
}
