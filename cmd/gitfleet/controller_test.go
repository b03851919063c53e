package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

const cliSHA = "64a7b8b7a4ad44f1d2c1e6b8a1c8f1e0c4b1a2d3e4f5a6b7c8d9e0f1a2b3c4d5"

func cliVM(name, host, vcpus string) string {
	return "apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata: {name: " + name + "}\nspec:\n  host: " + host +
		"\n  vcpus: " + vcpus + "\n  memoryMB: 512\n  diskGB: 2\n  image: {url: https://example.com/d.qcow2, sha256: " + cliSHA + "}\n"
}

func cliFleet(t *testing.T) string {
	t.Helper()
	dir := gittest.NewBare(t)
	gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{
		"fleet/hv-a.yaml":   testHost,
		"fleet/web-01.yaml": cliVM("web-01", "hv-a", "1"),
		"fleet/db-01.yaml":  cliVM("db-01", "hv-a", "1"),
		"README.md":         "# fleet\n",
	}})
	return dir
}

func TestControllerOnce(t *testing.T) {
	dir := cliFleet(t)
	if code, _ := runCLI(t, "controller", "--once"); code != 2 {
		t.Fatalf("no --repo: exit %d, want 2", code)
	}
	code, out := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once")
	if code != 0 || !strings.Contains(out, "1 snapshot(s) published") {
		t.Fatalf("exit %d, output %q", code, out)
	}
	snap, err := snapshots.ParseSnapshot([]byte(gittest.Show(t, dir, "refs/heads/"+fleet.DefaultSnapshotsBranch, "hosts/hv-a.yaml") + "\n"))
	if err != nil || len(snap.VMs) != 2 || snap.Epoch != 1 {
		t.Fatalf("snapshot %+v, %v", snap, err)
	}
	// Nothing to do is a success too.
	if code, _ := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once"); code != 0 {
		t.Fatalf("idle pass: exit %d", code)
	}
	// A rejected commit exits 1 and leaves the snapshot as it was.
	gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"fleet/web-01.yaml": cliVM("web-01", "hv-nowhere", "1")}})
	if code, _ := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once"); code != 1 {
		t.Fatalf("rejected commit: exit %d, want 1", code)
	}
	if got := gittest.Show(t, dir, "refs/heads/"+fleet.DefaultSnapshotsBranch, "hosts/hv-a.yaml"); !strings.Contains(got, "epoch: 1") {
		t.Fatalf("snapshot changed after a rejected commit:\n%s", got)
	}
}

// runCLIStderr is runCLI returning standard error too, where run prints
// a failing command's error.
func runCLIStderr(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	saved := os.Stderr
	os.Stderr = f
	code, out := runCLI(t, args...)
	os.Stderr = saved
	data, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return code, out, string(data)
}

func TestControllerRefusesBadConfiguration(t *testing.T) {
	dir := cliFleet(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"snapshots on the desired branch", []string{"--snapshots-branch", "main"}, "snapshots branch and the desired branch"},
		{"status on the snapshots branch", []string{"--status-branch", fleet.DefaultSnapshotsBranch}, "snapshots branch and the status branch"},
		{"path outside the repository", []string{"--path", "../fleet"}, "leaves the repository"},
		{"absolute path", []string{"--path", "/fleet"}, "absolute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, out := runCLIStderr(t, append([]string{"controller", "--repo", dir, "--once"}, tc.args...)...)
			if code != 2 || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, output %q; want 2 saying %q", code, out, tc.want)
			}
		})
	}
	if got := gittest.Git(t, dir, "for-each-ref", "--format=%(refname)"); strings.TrimSpace(got) != "refs/heads/main" {
		t.Fatalf("a refused controller wrote branches: %s", got)
	}
}

// "./fleet/" is "fleet"; a controller on another branch than the ledger's
// exits 1 naming both; a deleted desired branch says it is missing.
func TestControllerPathBranchAndMissingBranch(t *testing.T) {
	dir := cliFleet(t)
	if code, out := runCLI(t, "controller", "--repo", dir, "--path", "./fleet/", "--once"); code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	if code, out := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once"); code != 0 || !strings.Contains(out, "0 snapshot(s) published") {
		t.Fatalf("--path fleet after ./fleet/: exit %d: %s", code, out)
	}
	tip := gittest.Rev(t, dir, "refs/heads/"+fleet.DefaultSnapshotsBranch)
	gittest.Git(t, dir, "branch", "other", "main")
	code, _, out := runCLIStderr(t, "controller", "--repo", dir, "--path", "fleet", "--branch", "other", "--once")
	if code != 1 || !strings.Contains(out, `branch "main"`) || !strings.Contains(out, `branch "other"`) {
		t.Fatalf("other branch: exit %d, output %q", code, out)
	}
	if gittest.Rev(t, dir, "refs/heads/"+fleet.DefaultSnapshotsBranch) != tip {
		t.Fatal("a refused controller published")
	}
	gittest.DeleteBranch(t, dir, "main")
	code, _, out = runCLIStderr(t, "controller", "--repo", dir, "--path", "fleet", "--once")
	if code != 1 || !strings.Contains(out, `the desired branch "main" is missing`) || strings.Contains(out, "desired state at  rejected") {
		t.Fatalf("missing branch: exit %d, output %q", code, out)
	}
}

// A pull request fixing a broken main gets a plan and exit 0: against the
// last applied commit when the controller has one, else against an empty
// base, with a warning at the top either way. A broken head still exits 1.
func TestPlanWithBaseThatDoesNotValidate(t *testing.T) {
	for _, withController := range []bool{true, false} {
		t.Run(map[bool]string{true: "applied commit", false: "empty base"}[withController], func(t *testing.T) {
			dir := cliFleet(t)
			if withController {
				if code, out := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once"); code != 0 {
					t.Fatalf("controller: exit %d: %s", code, out)
				}
			}
			gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"fleet/web-01.yaml": cliVM("web-01", "hv-nowhere", "1")}})
			gittest.SetBranch(t, dir, "fix", gittest.Rev(t, dir, "refs/heads/main"))
			gittest.Commit(t, dir, gittest.Edit{Branch: "fix", Write: map[string]string{"fleet/web-01.yaml": cliVM("web-01", "hv-a", "2")},
				Remove: []string{"fleet/db-01.yaml"}})
			code, out := runCLI(t, "plan", "--repo", dir, "--path", "fleet", "--base", "main", "--head", "fix")
			if code != 0 {
				t.Fatalf("exit %d, want 0 (head is valid)\n%s", code, out)
			}
			lines := strings.Split(out, "\n")
			if len(lines) < 3 || !strings.HasPrefix(lines[2], "! base main does not validate (1 error)") {
				t.Fatalf("no warning at the top:\n%s", out)
			}
			want := []string{"planned against an empty base", "+ create Host hv-a", "+ create VM web-01"}
			if withController {
				want = []string{"the last commit the controller applied", "~ update VM web-01", "spec.vcpus: 1 -> 2", "- delete VM db-01"}
			}
			for _, w := range want {
				if !strings.Contains(out, w) {
					t.Errorf("plan lacks %q:\n%s", w, out)
				}
			}
			gittest.Commit(t, dir, gittest.Edit{Branch: "fix", Write: map[string]string{"fleet/db-02.yaml": cliVM("db-02", "hv-gone", "1")}})
			if code, out := runCLI(t, "plan", "--repo", dir, "--path", "fleet", "--base", "main", "--head", "fix"); code != 1 {
				t.Fatalf("broken head: exit %d, want 1\n%s", code, out)
			}
		})
	}
}

func TestPlanCommand(t *testing.T) {
	dir := cliFleet(t)
	base := gittest.Rev(t, dir, "refs/heads/main")
	gittest.SetBranch(t, dir, "change", base)
	gittest.Commit(t, dir, gittest.Edit{Branch: "change", Remove: []string{"fleet/db-01.yaml"},
		Write: map[string]string{"fleet/web-01.yaml": cliVM("web-01", "hv-a", "2")}})

	code, out := runCLI(t, "plan", "--repo", dir, "--path", "fleet", "--base", "main", "--head", "change")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	for _, want := range []string{"- delete VM db-01", "root disk is destroyed", "~ update VM web-01", "spec.vcpus: 1 -> 2"} {
		if !strings.Contains(out, want) {
			t.Errorf("text plan lacks %q:\n%s", want, out)
		}
	}
	// A short hash works as a revision; markdown is the PR comment.
	code, out = runCLI(t, "plan", "--repo", "file://"+dir, "--path", "fleet", "--base", base[:10], "--head", "change", "--format", "markdown")
	if code != 0 || !strings.Contains(out, "### gitfleet plan") || !strings.Contains(out, "**delete** VM `db-01`") {
		t.Fatalf("exit %d, markdown:\n%s", code, out)
	}
	code, out = runCLI(t, "plan", "--repo", dir, "--path", "fleet", "--base", "main", "--head", "change", "--format", "json")
	var p desired.Plan
	if code != 0 || json.Unmarshal([]byte(out), &p) != nil || len(p.Hosts) != 1 || len(p.Hosts[0].Changes) != 2 {
		t.Fatalf("exit %d, json:\n%s", code, out)
	}

	// A working copy, as a CI checkout gives: hashes on no local branch.
	work := filepath.Join(t.TempDir(), "work")
	gittest.Git(t, "", "clone", "--quiet", dir, work)
	head := gittest.Rev(t, dir, "refs/heads/change")
	code, out = runCLI(t, "plan", "--repo", work, "--path", "fleet", "--base", base, "--head", head)
	if code != 0 || !strings.Contains(out, "- delete VM db-01") {
		t.Fatalf("plan in a working copy: exit %d\n%s", code, out)
	}
	// In a local repository, git revision expressions.
	for _, revs := range [][2]string{{"HEAD", "origin/change"}, {"origin/change~1", "origin/change"}, {"main", "origin/change"}} {
		code, out = runCLI(t, "plan", "--repo", work, "--path", "fleet", "--base", revs[0], "--head", revs[1])
		if code != 0 || !strings.Contains(out, "- delete VM db-01") || !strings.Contains(out, revs[1]+" ("+head[:12]+")") {
			t.Fatalf("plan --base %s --head %s: exit %d\n%s", revs[0], revs[1], code, out)
		}
	}
	code, _, stderr := runCLIStderr(t, "plan", "--repo", work, "--path", "fleet", "--base", "HEAD~9", "--head", "HEAD")
	if code != 1 || strings.Count(stderr, "HEAD~9") != 1 || strings.Count(stderr, work) != 1 || !strings.Contains(stderr, "--base") {
		t.Fatalf("unknown --base HEAD~9: exit %d, want 1 with one clear line:\n%s", code, stderr)
	}

	// Validation errors: printed, exit 1.
	gittest.Commit(t, dir, gittest.Edit{Branch: "change", Write: map[string]string{"fleet/web-01.yaml": cliVM("web-01", "hv-a", "0")}})
	code, out = runCLI(t, "plan", "--repo", dir, "--path", "fleet", "--base", "main", "--head", "change")
	if code != 1 || !strings.Contains(out, "fleet/web-01.yaml:") {
		t.Fatalf("exit %d, want 1 with the error:\n%s", code, out)
	}
	if code, _ := runCLI(t, "plan", "--repo", dir, "--base", "main", "--head", "no-such-branch"); code != 1 {
		t.Fatalf("unknown head: exit %d, want 1", code)
	}
	if code, _ := runCLI(t, "plan", "--repo", dir, "--base", "main"); code != 2 {
		t.Fatalf("missing --head: exit %d, want 2", code)
	}
}

func TestPlanShowsUndelete(t *testing.T) {
	dir := cliFleet(t)
	if code, out := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once"); code != 0 {
		t.Fatal(out)
	}
	gittest.Commit(t, dir, gittest.Edit{Remove: []string{"fleet/db-01.yaml"}})
	if code, out := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once"); code != 0 {
		t.Fatal(out)
	}
	main := gittest.Rev(t, dir, "refs/heads/main")
	gittest.SetBranch(t, dir, "restore", main)
	gittest.Commit(t, dir, gittest.Edit{Branch: "restore", Write: map[string]string{"fleet/db-01.yaml": cliVM("db-01", "hv-a", "1")}})
	code, out := runCLI(t, "plan", "--repo", dir, "--path", "fleet", "--base", "main", "--head", "restore")
	if code != 0 || !strings.Contains(out, "^ undelete VM db-01") {
		t.Fatalf("exit %d, want an un-delete:\n%s", code, out)
	}
}

// plan reads the ledger of the snapshots branch it is given: the pending
// delete published on another branch shows as an un-delete only with
// --snapshots-branch naming it.
func TestPlanReadsTheSnapshotsBranchItIsGiven(t *testing.T) {
	dir := cliFleet(t)
	ctl := []string{"controller", "--repo", dir, "--path", "fleet", "--once", "--snapshots-branch", "fleet/snaps", "--status-branch", "fleet/status"}
	if code, out := runCLI(t, ctl...); code != 0 {
		t.Fatal(out)
	}
	gittest.Commit(t, dir, gittest.Edit{Remove: []string{"fleet/db-01.yaml"}})
	if code, out := runCLI(t, ctl...); code != 0 {
		t.Fatal(out)
	}
	gittest.SetBranch(t, dir, "restore", gittest.Rev(t, dir, "refs/heads/main"))
	gittest.Commit(t, dir, gittest.Edit{Branch: "restore", Write: map[string]string{"fleet/db-01.yaml": cliVM("db-01", "hv-a", "1")}})
	plan := []string{"plan", "--repo", dir, "--path", "fleet", "--base", "main", "--head", "restore"}
	if code, out := runCLI(t, plan...); code != 0 || !strings.Contains(out, "+ create VM db-01") {
		t.Fatalf("default snapshots branch: exit %d, want a create:\n%s", code, out)
	}
	if code, out := runCLI(t, append(plan, "--snapshots-branch", "fleet/snaps")...); code != 0 || !strings.Contains(out, "^ undelete VM db-01") {
		t.Fatalf("--snapshots-branch fleet/snaps: exit %d, want an un-delete:\n%s", code, out)
	}
}

func TestStatusCommand(t *testing.T) {
	dir := cliFleet(t)
	// No status branch: said so, exit 1, never "no host has reported".
	code, out, stderr := runCLIStderr(t, "status", "--repo", dir)
	if code != 1 || strings.Contains(out, "No host has reported yet") || !strings.Contains(stderr, "has no branch gitfleet/status") {
		t.Fatalf("no status branch: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
	// The controller publishes, then deletes db-01: a pending delete.
	if code, out := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once"); code != 0 {
		t.Fatal(out)
	}
	del := gittest.Commit(t, dir, gittest.Edit{Remove: []string{"fleet/db-01.yaml"}, Author: "Ann Admin <ann@example.com>",
		Time: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)})
	if code, out := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once"); code != 0 {
		t.Fatal(out)
	}
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: dir})
	if err != nil {
		t.Fatal(err)
	}
	since := time.Date(2026, 11, 29, 12, 5, 0, 0, time.UTC)
	data, _ := status.Marshal(&status.Status{Host: "hv-a", Heartbeat: 4, LastSeenEpoch: 2, Agent: status.AgentInfo{Accel: "tcg"},
		VMs: []status.VM{
			{Name: "web-01", Phase: status.PhaseReady, Power: "running", SSH: "127.0.0.1:2201"},
			// As an earlier agent reported a stopped VM: the table hides the stale address.
			{Name: "idle-01", Phase: status.PhaseStopped, Power: "stopped", IP: "10.0.2.15", SSH: "127.0.0.1:36261"},
		},
		Quarantined: []status.Quarantine{{Name: "db-01", Since: since}},
		Destroyed:   []string{"gone-01"},
		Vanished:    []status.Vanished{{Name: "lost-01", Since: since, Power: "running", Reason: "absent"}},
	})
	if _, err := repo.Update(context.Background(), fleet.DefaultStatusBranch, func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
		return map[string][]byte{"hosts/hv-a.yaml": data, "hosts/hv-b.yaml": []byte("not: [valid")}, "status", nil
	}); err != nil {
		t.Fatal(err)
	}
	code, out = runCLI(t, "status", "--repo", dir)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{"hv-a", "tcg", "web-01", "ready", "ssh 127.0.0.1:2201", "hv-b", "unreadable",
		"hv-a  quarantined  stopped", "shut down since 2026-11-29T12:05:00Z",
		"gone-01", "destroy acked",
		"lost-01", "vanished", "never destroyed",
		"Pending deletes:", "VM    db-01  hv-a  " + del[:12] + "  Ann Admin <ann@example.com>  2026-11-29T12:00:00Z"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "idle-01") && (strings.Contains(line, "10.0.2.15") || strings.Contains(line, "36261")) {
			t.Errorf("a stopped VM shows an address: %s", line)
		}
	}
	code, out = runCLI(t, "status", "--repo", dir, "--format", "json")
	var rep statusReport
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || len(rep.Hosts) != 1 || rep.Hosts[0].Heartbeat != 4 || rep.Unreadable["hv-b"] == "" ||
		len(rep.Hosts[0].Quarantined) != 1 || len(rep.PendingDeletes) != 1 || rep.PendingDeletes[0].Commit != del || rep.PendingDeletes[0].Author != "Ann Admin <ann@example.com>" {
		t.Fatalf("exit %d, json:\n%s", code, out)
	}

	// A clone has the status branch only as origin/gitfleet/status: the
	// error points at the fleet's remote.
	work := filepath.Join(t.TempDir(), "work")
	gittest.Git(t, "", "clone", "--quiet", dir, work)
	code, out, stderr = runCLIStderr(t, "status", "--repo", work)
	if code != 1 || strings.Contains(out, "No host has reported yet") || !strings.Contains(stderr, "origin/gitfleet/status") || !strings.Contains(stderr, "--repo "+dir) {
		t.Fatalf("status in a clone: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
	// As a person types it, in the clone.
	t.Chdir(work)
	code, _, stderr = runCLIStderr(t, "status", "--repo", ".")
	if code != 1 || !strings.Contains(stderr, work+" has no branch gitfleet/status") || !strings.Contains(stderr, "--repo "+dir) {
		t.Fatalf("status --repo . in a clone: exit %d\nstderr:\n%s", code, stderr)
	}
	// A clone made with a token in its remote's URL is pointed at the URL
	// without it, which a person can paste, never at "***".
	gittest.Git(t, work, "remote", "set-url", "origin", "https://git:tok-123@git.example.com/org/fleet.git")
	code, _, stderr = runCLIStderr(t, "status", "--repo", ".")
	if code != 1 || !strings.Contains(stderr, "--repo https://git.example.com/org/fleet.git (its credentials in GITFLEET_TOKEN, not in the URL)") ||
		strings.Contains(stderr, "tok-123") {
		t.Fatalf("status --repo . in a clone with a token in its remote: exit %d\nstderr:\n%s", code, stderr)
	}
}

// TestControllerOnceAgainstAStalledRemote: `controller --once` against a
// remote that accepts and never answers exits 1 as unreadable, bounded by
// --git-timeout (it printed how long it took), and writes nothing.
func TestControllerOnceAgainstAStalledRemote(t *testing.T) {
	root := t.TempDir()
	bare := filepath.Join(root, "fleet.git")
	gittest.Git(t, "", "init", "--quiet", "--bare", "--initial-branch=main", bare)
	gittest.Commit(t, bare, gittest.Edit{Write: map[string]string{"hosts/hv-a.yaml": "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec: {capacity: {vcpus: 1, memoryMB: 512}}\n"}})
	srv := gittest.ServeFaulty(t, root)
	srv.Set(gittest.Stall, 0)
	for name, url := range map[string]string{"file": "file://" + bare, "http": srv.HTTPURL + "/fleet.git"} {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			code, _, stderr := runCLIStderr(t, "controller", "--repo", url, "--once", "--git-timeout", "2s", "--cache-dir", filepath.Join(t.TempDir(), "cache"))
			t.Logf("controller --once --git-timeout 2s against a stalled %s remote: exit %d after %v", name, code, time.Since(start).Round(time.Millisecond))
			if code != 1 || !strings.Contains(stderr, "unreadable") || !strings.Contains(stderr, "timed out after 2s") || strings.Contains(stderr, "rejected") {
				t.Errorf("exit %d, stderr:\n%s\nwant exit 1, unreadable, timed out after 2s", code, stderr)
			}
		})
	}
	if got := gittest.Git(t, bare, "branch", "--list", "gitfleet/*"); got != "" {
		t.Errorf("branches written: %s", got)
	}
}

// A remote that starts to stall partway through a pass costs the pass one
// git timeout, never one per step: the pass ends at the first operation
// that times out. The server answers its first n requests and stalls every
// later one until its client leaves; for every n, at most one request of a
// --once run stalls, and nothing stalled is ever followed by a write.
func TestControllerOnceStopsAtTheFirstStall(t *testing.T) {
	root := t.TempDir()
	bare := filepath.Join(root, "fleet.git")
	gittest.Git(t, "", "init", "--quiet", "--bare", "--initial-branch=main", bare)
	gittest.Commit(t, bare, gittest.Edit{Write: map[string]string{"hosts/hv-a.yaml": "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec: {capacity: {vcpus: 1, memoryMB: 512}}\n"}})
	gittest.Git(t, bare, "config", "http.receivepack", "true") // anonymous pushes, as the controller's
	var answer, stalled atomic.Int64
	done := make(chan struct{})
	url := gittest.ServeWith(t, root, gittest.ServeOptions{Wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if answer.Add(-1) < 0 {
				stalled.Add(1)
				select { // until the client leaves, or the test ends
				case <-r.Context().Done():
				case <-done:
				}
				return
			}
			h.ServeHTTP(w, r)
		})
	}}) + "/fleet.git"
	t.Cleanup(func() { close(done) }) // before the server's own cleanup closes it
	for n := int64(0); n <= 12; n++ {
		answer.Store(n)
		stalled.Store(0)
		start := time.Now()
		// 3 s: long enough that an answered request never times out on
		// a loaded machine (1 s did, at a load of 16), short enough for
		// the seven runs that do stall.
		code, _, stderr := runCLIStderr(t, "controller", "--repo", url, "--once", "--git-timeout", "3s", "--cache-dir", filepath.Join(t.TempDir(), "cache"))
		t.Logf("stall after %d requests: exit %d after %v, %d request(s) stalled", n, code, time.Since(start).Round(time.Millisecond), stalled.Load())
		if s := stalled.Load(); s > 1 {
			t.Errorf("stall after %d requests: %d requests waited for the timeout, want at most 1:\n%s", n, s, stderr)
		}
		if stalled.Load() == 1 && (code != 1 || !strings.Contains(stderr, "unreadable")) {
			t.Errorf("stall after %d requests: exit %d, want 1 and unreadable:\n%s", n, code, stderr)
		}
		if stalled.Load() == 0 && code != 0 {
			t.Errorf("stall after %d requests, none reached: exit %d, want 0:\n%s", n, code, stderr)
		}
	}
}

// A malformed variable is a usage error naming it and the flag it stands
// in for; it was silently ignored before. The flag, when given, wins and
// the variable is not read.
func TestControllerRefusesMalformedEnvironment(t *testing.T) {
	dir := cliFleet(t)
	t.Setenv("GITFLEET_GIT_TIMEOUT", "5x")
	code, _, stderr := runCLIStderr(t, "controller", "--repo", dir, "--path", "fleet", "--once")
	if code != 2 || !strings.Contains(stderr, `GITFLEET_GIT_TIMEOUT="5x": invalid duration`) || !strings.Contains(stderr, "--git-timeout") {
		t.Fatalf("exit %d, stderr %q; want 2 naming the variable and the flag", code, stderr)
	}
	if got := gittest.Git(t, dir, "for-each-ref", "--format=%(refname)"); strings.TrimSpace(got) != "refs/heads/main" {
		t.Fatalf("a refused controller wrote branches: %s", got)
	}
	if code, out := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--git-timeout", "30s", "--once"); code != 0 {
		t.Fatalf("with --git-timeout: exit %d: %s", code, out)
	}

	// A malformed URL is named, without the token it holds.
	t.Setenv("GITFLEET_REPO", "https://oauth2:glpat-SeCrEt-42@git.example.com/fleet%zz")
	code, _, stderr = runCLIStderr(t, "status")
	if code != 2 || !strings.Contains(stderr, `GITFLEET_REPO="https://git.example.com/`) || !strings.Contains(stderr, "invalid URL") {
		t.Fatalf("exit %d, stderr %q; want 2 naming the variable", code, stderr)
	}
	if strings.Contains(stderr, "SeCrEt") {
		t.Errorf("the error shows the token: %s", stderr)
	}
}
