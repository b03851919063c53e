package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// `gitfleet status` shows the controller's failing passes (controller.yaml
// on the status branch) and the ledger's last rejected commit, each on a
// line of its own, and both in --format json.
func TestStatusShowsFailingPassesApartFromRejections(t *testing.T) {
	dir := cliFleet(t)
	if code, out := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once"); code != 0 {
		t.Fatal(out)
	}
	bad := gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"fleet/web-02.yaml": "kind: VM\nnot: valid\n"}})
	if code, out := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once"); code != 1 {
		t.Fatalf("invalid commit: exit %d, want 1:\n%s", code, out)
	}
	since := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)
	rec, err := status.MarshalPassFailure(&status.PassFailure{Outcome: status.FailureUnreadable, Since: since,
		Reason: "git failed: read the desired state: fetch main: git operation timed out after 1m0s"})
	if err != nil {
		t.Fatal(err)
	}
	gittest.Commit(t, dir, gittest.Edit{Branch: "gitfleet/status", Write: map[string]string{status.ControllerPath: string(rec)}})

	code, out := runCLI(t, "status", "--repo", dir)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{
		"Controller: every pass unreadable: git failed, since 2026-11-30T14:00:00Z; the last good snapshots stay: git failed: read the desired state: fetch main: git operation timed out after 1m0s",
		"Last rejected commit: " + bad[:12] + " at ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not say %q:\n%s", want, out)
		}
	}
	code, out = runCLI(t, "status", "--repo", dir, "--format", "json")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	var rep struct {
		LastRejected      struct{ Commit, Reason string } `json:"lastRejected"`
		ControllerFailing struct{ Outcome string }        `json:"controllerFailing"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.LastRejected.Commit != bad || rep.LastRejected.Reason == "" || rep.ControllerFailing.Outcome != "unreadable" {
		t.Errorf("json: %+v\n%s", rep, out)
	}
}
