package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// `gitfleet status` lists what the controller refused as forged, as the
// status README does: a forged ledger record on the snapshots branch the
// controller would not act on, and the acks it did not take, in the table
// and in --format json.
func TestStatusShowsForgeries(t *testing.T) {
	dir := cliFleet(t)
	pass := func() {
		t.Helper()
		if code, out := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once"); code != 0 {
			t.Fatal(out)
		}
	}
	pass()
	ledger := func() *snapshots.Ledger {
		l, err := snapshots.ParseLedger([]byte(gittest.Show(t, dir, "refs/heads/gitfleet/snapshots", snapshots.LedgerPath) + "\n"))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	write := func(l *snapshots.Ledger) string {
		data, err := l.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return gittest.Commit(t, dir, gittest.Edit{Branch: "gitfleet/snapshots", Write: map[string]string{snapshots.LedgerPath: string(data)}, Message: "forged"})
	}
	// Someone who can push to the snapshots branch adds a VM as retained.
	l := ledger()
	spec := desired.VMSpec{Host: "hv-a", VCPUs: 1, MemoryMB: 128}
	l.Retained = append(l.Retained, &snapshots.RetainedRecord{Kind: desired.KindVM, Name: "evil", Host: "hv-a", Spec: &spec, From: l.Applied.Commit})
	forged := write(l)
	pass()
	if strings.Contains(gittest.Show(t, dir, "refs/heads/gitfleet/snapshots", snapshots.Path("hv-a")), "evil") {
		t.Fatal("the forged retained VM was published")
	}
	// An ack the controller did not take, as its ledger records it.
	l = ledger()
	l.ForgedAcks = []snapshots.ForgedAckRecord{{Ref: "VM db-01@hv-a", Commit: desired.Hash(strings.Repeat("ab", 20)), Reason: "not signed by the key the Host's spec.agentKey names"}}
	write(l)

	// Forgeries are shown, not failed on: the status branch and the
	// ledger were read, so the exit status is 0.
	code, out := runCLI(t, "status", "--repo", dir)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{
		"Forged acks", "VM db-01@hv-a", "abababababab", "not signed by the key",
		"Forged snapshots commits and ledger records", desired.Hash(forged).Short(), "retained VM evil@hv-a",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not say %q:\n%s", want, out)
		}
	}

	_, out = runCLI(t, "status", "--repo", dir, "--format", "json")
	var rep struct {
		ForgedAcks    []struct{ Ref, Commit, Reason string }
		ForgedCommits []struct{ Commit, Reason string }
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if len(rep.ForgedAcks) != 1 || rep.ForgedAcks[0].Ref != "VM db-01@hv-a" ||
		len(rep.ForgedCommits) != 1 || rep.ForgedCommits[0].Commit != forged || !strings.Contains(rep.ForgedCommits[0].Reason, "evil") {
		t.Errorf("json: %+v\n%s", rep, out)
	}
}

// A destroy ack the controller refused as forged is not shown as on its
// way to being finalized: the delete stays pending.
func TestStatusDoesNotCallAForgedAckFinalizing(t *testing.T) {
	rep := statusReport{Hosts: []*status.Status{{Host: "hv-a", Destroyed: []string{"db-01", "web-01"}}},
		ForgedAcks: []snapshots.ForgedAckRecord{{Ref: "VM db-01@hv-a", Reason: "not signed"}}}
	var b strings.Builder
	if err := writeHostsAndVMs(&b, rep); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(b.String(), "\n") {
		switch {
		case strings.HasPrefix(line, "db-01") && !strings.Contains(line, "not acted on"):
			t.Errorf("the forged ack's row does not say it was not acted on: %s", line)
		case strings.HasPrefix(line, "web-01") && !strings.Contains(line, "the controller finalizes"):
			t.Errorf("a genuine ack's row: %s", line)
		}
	}
	if !strings.Contains(b.String(), "db-01") || !strings.Contains(b.String(), "web-01") {
		t.Fatalf("rows missing:\n%s", b.String())
	}
}

// A host whose status commit is not signed by its Host's agentKey is
// marked so in the hosts table and on each of its VM rows, as in the
// status README: what it reports is unverified.
func TestStatusMarksAnUnsignedHostStatus(t *testing.T) {
	rep := statusReport{
		Hosts: []*status.Status{
			{Host: "hv-a", VMs: []status.VM{{Name: "web-01", Phase: status.PhaseReady, Power: "running"}}},
			{Host: "hv-b", VMs: []status.VM{{Name: "db-01", Phase: status.PhaseReady, Power: "running"}}},
		},
		Liveness: map[string]status.HostState{
			"hv-a": {Host: "hv-a", State: status.StateOnline, Unsigned: "not signed"},
			"hv-b": {Host: "hv-b", State: status.StateOnline},
		},
	}
	var b strings.Builder
	if err := writeHostsAndVMs(&b, rep); err != nil {
		t.Fatal(err)
	}
	var marked []string
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.Contains(line, status.UnsignedNote) {
			marked = append(marked, strings.Fields(line)[0])
		}
	}
	if strings.Join(marked, " ") != "hv-a web-01" {
		t.Errorf("rows marked unsigned: %v, want hv-a's host row and web-01:\n%s", marked, b.String())
	}
}

// A pending delete on a host whose status its agentKey did not sign takes
// nothing from that status: a forged status that drops the quarantine (or
// invents one) must not move the deadline shown, which says the host's
// progress is unknown.
func TestPendingDeleteOfAnUnsignedHostIsUnknown(t *testing.T) {
	at := time.Date(2026, 11, 30, 3, 5, 0, 0, time.UTC)
	rep := statusReport{
		Hosts: []*status.Status{{Host: "hv-a", Quarantined: []status.Quarantine{{Name: "web-01", DestroyAt: at}}}},
		Liveness: map[string]status.HostState{
			"hv-a": {Host: "hv-a", State: status.StateOnline, Unsigned: "the commit carries no signature"},
		},
		PendingDeletes: []pendingDelete{{Kind: "VM", Name: "web-01", Host: "hv-a"}},
	}
	destroyAt(&rep)
	p := rep.PendingDeletes[0]
	if p.DestroyAt != nil || !p.HostUnverified {
		t.Fatalf("pending delete %+v: want no destroy time from an unsigned status, and hostUnverified", p)
	}
	var b strings.Builder
	if err := writeStatusTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "unknown: the host's status is not signed by its agentKey") {
		t.Errorf("the deadline does not say the host's progress is unknown:\n%s", b.String())
	}
}
