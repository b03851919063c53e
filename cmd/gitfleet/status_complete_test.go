package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// `gitfleet status` shows what the status README shows: the applied commit,
// objects retained after a history rewrite, pending deletes with the time
// the host destroys them, quarantined and vanished VMs and a suspended
// host, in the table and in --format json.
func TestStatusShowsEverythingTheSummaryShows(t *testing.T) {
	dir := cliFleet(t)
	// The controller keeps its clone between runs, as a daemon does: the
	// commit a force-push drops stays there to justify what it retains.
	cache := t.TempDir()
	pass := func() {
		t.Helper()
		if code, out := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--cache-dir", cache, "--once"); code != 0 {
			t.Fatal(out)
		}
	}
	pass()
	first := gittest.Git(t, dir, "rev-parse", "main")
	gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"README.md": "# fleet, again\n"}})
	pass()
	// A force-push that drops web-01: kept, not deleted.
	gittest.Commit(t, dir, gittest.Edit{Parents: []string{first}, Remove: []string{"fleet/web-01.yaml"}})
	pass()
	// A pull request that restores web-01's file plans it as desired
	// again, not as a create: plan reads the ledger's retained objects.
	restore := gittest.Commit(t, dir, gittest.Edit{Branch: "restore", Parents: []string{gittest.Git(t, dir, "rev-parse", "main")},
		Write: map[string]string{"fleet/web-01.yaml": cliVM("web-01", "hv-a", "1")}})
	if code, out := runCLI(t, "plan", "--repo", dir, "--base", "main", "--head", restore); code != 0 ||
		!strings.Contains(out, desired.RetainedRestoreWarning) || strings.Contains(out, "create VM web-01") {
		t.Errorf("plan of a restored retained VM: exit %d\n%s", code, out)
	}
	// A reviewed delete of db-01: pending until the host destroys it.
	applied := gittest.Commit(t, dir, gittest.Edit{Remove: []string{"fleet/db-01.yaml"}})
	pass()
	forged := `host: hv-a
agent: {version: "1", bootID: b, accel: tcg}
heartbeat: 3
observedAt: 2026-11-30T15:00:00Z
lastSeenEpoch: 3
fenceViolation: false
vms:
  - {name: web-01, phase: ready, power: running, ip: 10.77.0.5, ssh: "10.77.0.5:22", lastError: "", specHash: ""}
quarantined:
  - {name: db-01, since: 2026-11-30T15:00:00Z, destroyAt: 2026-11-30T15:05:00Z}
destroyed: []
vanished:
  - {name: x-01, since: 2026-11-30T14:00:00Z, power: running, quarantined: false, reason: absent}
volumes: []
suspended: {epoch: 3, reason: kernel upgrade}
`
	// hv-z's status outlived its Host object (or it never had one).
	gone := strings.NewReplacer("host: hv-a", "host: hv-z", "web-01", "old-01", "db-01", "old-02", "x-01", "old-03").Replace(forged)
	gittest.Commit(t, dir, gittest.Edit{Branch: "gitfleet/status", Write: map[string]string{"hosts/hv-a.yaml": forged, "hosts/hv-z.yaml": gone}})
	pass() // judges hv-a, which has reported now: online; lists no hv-z

	code, out := runCLI(t, "status", "--repo", dir)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{
		"Desired state: main at " + applied[:12] + " (applied).",
		"suspended since epoch 3, acts on nothing: kernel upgrade",
		"web-01  hv-a  ready",
		"10.77.0.5 ssh 10.77.0.5:22",
		"pending delete: shut down since 2026-11-30T15:00:00Z, destroyed at 2026-11-30T15:05:00Z (tombstone grace 5m0s)",
		"x-01", "vanished",
		"host destroys it at 2026-11-30T15:05:00Z",
		"Kept after a history rewrite",
		"host suspended: changes wait",
		"hv-z  not in the fleet: no Host object, nothing delivered to it",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not say %q:\n%s", want, out)
		}
	}
	lines := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && (f[0] == "HOST" || f[0] == "hv-a") {
			lines[f[0]] = f
		}
	}
	if h, a := strings.Join(lines["HOST"], " "), strings.Join(lines["hv-a"], " "); !strings.HasPrefix(h, "HOST STATE HEARTBEAT EPOCH ACCEL AGENT VMS") ||
		!strings.HasPrefix(a, "hv-a online 3 3 tcg 1 1") {
		t.Errorf("hosts table: %q / %q", h, a)
	}
	if !strings.Contains(out[strings.Index(out, "Kept after a history rewrite"):], "VM    web-01") {
		t.Errorf("the retained VM is not listed:\n%s", out)
	}

	code, out = runCLI(t, "status", "--repo", dir, "--format", "json")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	var rep struct {
		Applied        struct{ Commit, Branch string }
		Retained       []struct{ Kind, Name, Host, Commit string }
		PendingDeletes []struct{ Name, DestroyAt string }
		Hosts          []struct {
			Suspended struct{ Reason string }
		}
		Liveness map[string]struct{ State string }
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Applied.Commit != applied || len(rep.Retained) != 1 || rep.Retained[0].Name != "web-01" ||
		len(rep.PendingDeletes) != 1 || rep.PendingDeletes[0].DestroyAt != "2026-11-30T15:05:00Z" ||
		len(rep.Hosts) != 2 || rep.Hosts[0].Suspended.Reason != "kernel upgrade" || rep.Liveness["hv-a"].State != "online" {
		t.Errorf("json: %+v\n%s", rep, out)
	}
}
