package gitsource

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// A local repository's branches read from its files are the ones git
// upload-pack advertises: loose refs, packed ones, both (loose wins),
// never a lock file of a ref being written; a branch the files lack is
// left to git.
func TestLocalBranchesAreWhatGitAdvertises(t *testing.T) {
	gittest.NeedGit(t)
	ctx := context.Background()
	dir := gittest.NewBare(t)
	c1 := gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"a": "1"}})
	for _, b := range []string{"gitfleet/hosts/hv-a", "gitfleet/hosts/hv-b", "gitfleet/status"} {
		gittest.SetBranch(t, dir, b, c1)
	}
	log := logrus.New()
	log.SetOutput(os.Stderr)
	r, err := Open(ctx, Options{URL: dir, Logger: logrus.NewEntry(log)})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	same := func(what string) {
		t.Helper()
		remote, err := r.remotePrefixDigest(ctx, "gitfleet/hosts/")
		if err != nil {
			t.Fatal(err)
		}
		local, ok := localBranches(dir, "gitfleet/hosts/", false)
		if !ok || prefixDigest(local, "gitfleet/hosts/") != remote {
			t.Errorf("%s: host branches from the files %v (found %v) differ from git's advertisement", what, local, ok)
		}
		head, err := r.RemoteHead(ctx, "main")
		if err != nil {
			t.Fatal(err)
		}
		if tips, ok := localBranches(dir, "main", true); !ok || tips["main"] != head || len(tips) != 1 {
			t.Errorf("%s: main from the files %v (found %v), git says %s", what, tips, ok, head)
		}
	}
	same("loose refs")
	gittest.Git(t, dir, "pack-refs", "--all")
	same("packed refs")
	c2 := gittest.Commit(t, dir, gittest.Edit{Branch: "gitfleet/hosts/hv-a", Write: map[string]string{"a": "2"}})
	same("one loose ref over a packed one")
	if tips, _ := localBranches(dir, "gitfleet/hosts/", false); tips["gitfleet/hosts/hv-a"] != c2 {
		t.Errorf("hv-a read as %s, want the loose ref's %s", tips["gitfleet/hosts/hv-a"], c2)
	}
	lock := filepath.Join(dir, "refs", "heads", "gitfleet", "hosts", "hv-c.lock")
	if err := os.WriteFile(lock, []byte(c2+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	same("a lock file beside them")
	if _, ok := localBranches(dir, "gitfleet/snapshots", true); ok {
		t.Error("a branch the repository lacks was found in its files")
	}
}
