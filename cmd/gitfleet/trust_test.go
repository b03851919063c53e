package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/trusttest"
)

// plan shows the controller's guards before merge: the mass-delete guard
// with the trailer a change needs, and a head whose signature the
// controller would refuse; the trailer and a signed head clear them.
func TestPlanShowsTheControllersGuards(t *testing.T) {
	dir := cliFleet(t)
	base := gittest.Rev(t, dir, "refs/heads/main")
	gittest.SetBranch(t, dir, "pr", base)
	head := gittest.Commit(t, dir, gittest.Edit{Branch: "pr", Remove: []string{"fleet/web-01.yaml", "fleet/db-01.yaml"}, Message: "retire both"})
	plan := func(args ...string) string {
		t.Helper()
		code, out := runCLI(t, append([]string{"plan", "--repo", dir, "--path", "fleet", "--base", base}, args...)...)
		if code != 0 {
			t.Fatalf("exit %d\n%s", code, out)
		}
		return out
	}
	out := plan("--head", head)
	if !strings.Contains(out, "Controller guards") || !strings.Contains(out, `"Gitfleet-Allow-Deletes: 2"`) || !strings.Contains(out, "2 of host hv-a's 2 VMs") {
		t.Fatalf("want the mass-delete guard and its trailer:\n%s", out)
	}
	if md := plan("--head", head, "--format", "markdown"); !strings.Contains(md, "**Controller guards**") {
		t.Fatalf("markdown lacks the guards:\n%s", md)
	}

	ann := trusttest.NewSSHKey(t, "ann")
	allowed := filepath.Join(t.TempDir(), "allowed_signers")
	if err := os.WriteFile(allowed, []byte(ann.AllowedSigner("ann@example.com")), 0o644); err != nil {
		t.Fatal(err)
	}
	withTrailer := gittest.Commit(t, dir, gittest.Edit{Branch: "pr", Message: "retire both\n\nGitfleet-Allow-Deletes: 2\n", Sign: ann.Sign()})
	out = plan("--head", withTrailer, "--verify-signatures", "head", "--allowed-signers", allowed)
	if strings.Contains(out, "Controller guards") {
		t.Fatalf("a signed head with the trailer trips no guard:\n%s", out)
	}
	if !strings.Contains(out, `mass delete: the change newly tombstones 2 object(s) (2 of host hv-a's 2 VMs, more than 25%), let through by the trailer "Gitfleet-Allow-Deletes: 2"`) {
		t.Fatalf("the plan says the trailer lets the mass delete through:\n%s", out)
	}
	if md := plan("--head", withTrailer, "--format", "markdown"); !strings.Contains(md, "let through by the trailer") {
		t.Fatalf("markdown lacks the trailer at work:\n%s", md)
	}
	out = plan("--head", withTrailer, "--verify-signatures", "every", "--allowed-signers", allowed)
	if !strings.Contains(out, "Controller guards") || !strings.Contains(out, "carries no signature") || !strings.Contains(out, head[:12]) {
		t.Fatalf("every mode names the unsigned commit below the head:\n%s", out)
	}
	if code, out := runCLI(t, "plan", "--repo", dir, "--base", base, "--head", head, "--verify-signatures", "head"); code != 2 {
		t.Fatalf("a mode without signers: exit %d\n%s", code, out)
	}
}

// gitfleet controller --verify-signatures rejects an unsigned head (exit 1,
// the reason naming the commit) and applies a signed one.
func TestControllerVerifiesSignatures(t *testing.T) {
	dir := cliFleet(t)
	ann := trusttest.NewSSHKey(t, "ann")
	allowed := filepath.Join(t.TempDir(), "allowed_signers")
	if err := os.WriteFile(allowed, []byte(ann.AllowedSigner("ann@example.com")), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"controller", "--repo", dir, "--path", "fleet", "--once", "--verify-signatures", "head", "--allowed-signers", allowed}
	head := gittest.Rev(t, dir, "refs/heads/main")
	code, out := runCLI(t, args...)
	if code != 1 {
		t.Fatalf("unsigned head: exit %d\n%s", code, out)
	}
	ledger := gittest.Show(t, dir, "refs/heads/gitfleet/snapshots", "ledger.yaml")
	if !strings.Contains(ledger, "carries no signature") || !strings.Contains(ledger, head) {
		t.Fatalf("the ledger should record the rejection:\n%s", ledger)
	}
	gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"fleet/web-01.yaml": cliVM("web-01", "hv-a", "1"), "README.md": "# signed\n"}, Sign: ann.Sign()})
	if code, out := runCLI(t, args...); code != 0 {
		t.Fatalf("signed head: exit %d\n%s", code, out)
	}
}
