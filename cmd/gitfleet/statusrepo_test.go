package main

import (
	"context"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// --status-repo: an agent's status written to the host branch of another
// repository reaches the controller (which copies it and writes its
// summary there, and the snapshots to --repo), and gitfleet status reads
// it there with the pending deletes from --repo.
func TestStatusRepository(t *testing.T) {
	dir, statusDir := cliFleet(t), gittest.NewBare(t)
	if code, out := runCLI(t, "controller", "--repo", dir, "--status-repo", statusDir, "--path", "fleet", "--once"); code != 0 {
		t.Fatal(out)
	}
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: statusDir})
	if err != nil {
		t.Fatal(err)
	}
	w := &status.Writer{Repo: repo, Host: "hv-a"}
	if _, err := w.Write(context.Background(), &status.Status{Host: "hv-a", Heartbeat: 3, LastSeenEpoch: 1,
		VMs: []status.VM{{Name: "web-01", Phase: status.PhaseReady, Power: "running"}}}); err != nil {
		t.Fatal(err)
	}
	gittest.Commit(t, dir, gittest.Edit{Remove: []string{"fleet/db-01.yaml"}, Message: "retire db-01"})
	if code, out := runCLI(t, "controller", "--repo", dir, "--status-repo", statusDir, "--path", "fleet", "--once"); code != 0 {
		t.Fatal(out)
	}
	if refs := gittest.Git(t, dir, "for-each-ref", "--format=%(refname)"); refs != "refs/heads/"+fleet.DefaultSnapshotsBranch+"\nrefs/heads/main" {
		t.Errorf("--repo holds %q, want main and the snapshots branch only", refs)
	}
	code, out := runCLI(t, "status", "--repo", dir, "--status-repo", statusDir)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{"hv-a", "web-01", "ready", "Pending deletes:", "db-01"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if code, _ := runCLI(t, "status", "--repo", dir); code != 1 {
		t.Errorf("status without --status-repo: exit %d, want 1 (no status branch in --repo)", code)
	}
}
