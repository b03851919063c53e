package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// `gitfleet status` says when a host waits for the controller to confirm a
// delete: in the quarantined VM's note, the pending delete's deadline and
// the JSON's awaitingConfirmation; once the controller has published the
// host's nonce in the tombstone, the pending delete carries it and waits
// for nothing.
func TestStatusShowsDeletesAwaitingConfirmation(t *testing.T) {
	dir := cliFleet(t)
	pass := func() {
		t.Helper()
		if code, out := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once"); code != 0 {
			t.Fatal(out)
		}
	}
	pass()
	gittest.Commit(t, dir, gittest.Edit{Remove: []string{"fleet/db-01.yaml"}})
	pass() // the tombstone, published at epoch 2
	nonce := strings.Repeat("5a", 16)
	hostStatus := func(lastSeen string) string {
		return `host: hv-a
agent: {version: "1", bootID: b, accel: tcg}
heartbeat: ` + lastSeen + `
observedAt: 2026-11-30T15:00:00Z
lastSeenEpoch: ` + lastSeen + `
fenceViolation: false
vms:
  - {name: web-01, phase: ready, power: running, lastError: "", specHash: ""}
quarantined:
  - {name: db-01, since: 2026-11-30T15:00:00Z, destroyAt: 2026-11-30T15:05:00Z, confirm: ` + nonce + `}
destroyed: []
volumes: []
`
	}
	type report struct {
		PendingDeletes []struct {
			Name, Confirm        string
			AwaitingConfirmation bool
		}
	}
	read := func() (string, report) {
		t.Helper()
		code, out := runCLI(t, "status", "--repo", dir)
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		code, js := runCLI(t, "status", "--repo", dir, "--format", "json")
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, js)
		}
		var rep report
		if err := json.Unmarshal([]byte(js), &rep); err != nil || len(rep.PendingDeletes) != 1 {
			t.Fatalf("json: %v\n%s", err, js)
		}
		return out, rep
	}

	// A status from before the tombstone's epoch confirms nothing: the
	// host waits.
	gittest.Commit(t, dir, gittest.Edit{Branch: "gitfleet/hosts/hv-a", Write: map[string]string{"hosts/hv-a.yaml": hostStatus("1")}})
	pass()
	out, rep := read()
	for _, want := range []string{"waiting for the controller to confirm the delete (nonce 5a5a5a5a)", "the host waits for the controller to confirm the delete"} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not say %q:\n%s", want, out)
		}
	}
	if p := rep.PendingDeletes[0]; !p.AwaitingConfirmation || p.Confirm != "" {
		t.Errorf("pending delete before the confirmation: %+v", p)
	}

	// The host has seen the tombstone's epoch: the controller confirms.
	gittest.Commit(t, dir, gittest.Edit{Branch: "gitfleet/hosts/hv-a", Write: map[string]string{"hosts/hv-a.yaml": hostStatus("2")}})
	pass()
	out, rep = read()
	if p := rep.PendingDeletes[0]; p.AwaitingConfirmation || p.Confirm != nonce {
		t.Errorf("pending delete after the confirmation: %+v", p)
	}
	if strings.Contains(out, "the host waits for the controller to confirm the delete") {
		t.Errorf("a confirmed delete still waits:\n%s", out)
	}
}
