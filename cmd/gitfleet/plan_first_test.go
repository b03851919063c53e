package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// The first commit of a fleet repository has nothing before it and no
// controller has published yet (no snapshots branch): plan with git's
// null id or the empty tree as --base plans against an empty fleet and
// says so; HEAD~1 of the first commit says what to use instead.
func TestPlanOfAFirstCommit(t *testing.T) {
	dir := cliFleet(t)
	for _, base := range []string{nullCommit, emptyTree} {
		code, out := runCLI(t, "plan", "--repo", dir, "--path", "fleet", "--base", base, "--head", "main")
		if code != 0 {
			t.Fatalf("--base %s: exit %d\n%s", base, code, out)
		}
		for _, want := range []string{"Plan (empty) -> main", "is empty (a first commit: nothing before it): every object of head shows as a create",
			"+ create Host hv-a", "+ create VM web-01", "+ create VM db-01"} {
			if !strings.Contains(out, want) {
				t.Errorf("--base %s: plan lacks %q:\n%s", base, want, out)
			}
		}
	}
	code, out := runCLI(t, "plan", "--repo", dir, "--path", "fleet", "--base", nullCommit, "--head", "main", "--format", "json")
	var p desired.Plan
	if code != 0 || json.Unmarshal([]byte(out), &p) != nil || p.Base != "(empty)" || len(p.Hosts) != 1 || len(p.Hosts[0].Changes) != 3 {
		t.Fatalf("exit %d, json:\n%s", code, out)
	}

	code, _, stderr := runCLIStderr(t, "plan", "--repo", dir, "--path", "fleet", "--base", "main~1", "--head", "main")
	if code != 1 || !strings.Contains(stderr, "for the first commit of a repository, plan with --base "+nullCommit) {
		t.Fatalf("--base main~1 of a first commit: exit %d\n%s", code, stderr)
	}
}

// A name defined twice is reported at the file the change added, not at
// whichever path sorts later, relative to the base when no controller
// has applied anything.
func TestPlanReportsADuplicateAtTheAddedFile(t *testing.T) {
	dir := gittest.NewBare(t)
	gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{
		"fleet/hv-a.yaml":   testHost,
		"fleet/zz-web.yaml": cliVM("web-01", "hv-a", "1"),
	}})
	base := gittest.Rev(t, dir, "refs/heads/main")
	gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"fleet/aa-copy.yaml": cliVM("web-01", "hv-a", "1")}})
	code, out := runCLI(t, "plan", "--repo", dir, "--path", "fleet", "--base", base, "--head", "main")
	want := `fleet/aa-copy.yaml:3:18: metadata.name: VM "web-01" is also defined in fleet/zz-web.yaml:3:18, defined before this change; names are unique per kind`
	if code != 1 || !strings.Contains(out, want) {
		t.Fatalf("exit %d; want 1 and %q in:\n%s", code, want, out)
	}
}
