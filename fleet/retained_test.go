package fleet

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// A VM kept after a history rewrite still holds its volumes: a commit adding
// a VM that attaches one of them on the same host is rejected like any
// invalid commit, and the last good snapshots stay.
func TestRetainedVolumeClaimRejected(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	// The rewrite drops db-01 but keeps its volume db-data.
	orphan := e.commit(gittest.Edit{Branch: "orphan", Message: "Initial", Write: map[string]string{
		"hosts/hv-a.yaml": hostYAML("hv-a"), "hosts/hv-b.yaml": hostYAML("hv-b"),
		"vms/web-01.yaml": vmYAML("web-01", "hv-a", 2),
		"vols/db.yaml":    volumeYAML("db-data", "hv-b", 50)}})
	gittest.SetBranch(t, e.dir, "main", orphan)
	if res := e.pass(); res.Rejected != nil || len(res.Retained) != 1 || res.Retained[0] != "VM db-01@hv-b" {
		t.Fatalf("rewrite: %+v, want db-01 retained", res)
	}
	before := e.snapshot("hv-b")
	applied := e.ledger().Applied.Commit

	claim := e.commit(gittest.Edit{Write: map[string]string{"vms/web-09.yaml": vmYAML("web-09", "hv-b", 1, "db-data")}})
	res := e.pass()
	if !errors.Is(res.Rejected, ErrRetainedVolume) {
		t.Fatalf("rejected = %v, want ErrRetainedVolume", res.Rejected)
	}
	for _, want := range []string{"VM web-09", "vms/web-09.yaml", "volume db-data", "host hv-b", "VM db-01",
		"kept after a history rewrite at " + desired.Hash(orphan).Short() + "; restore its file or re-add and delete it first"} {
		if !strings.Contains(res.Rejected.Error(), want) {
			t.Errorf("rejection %q lacks %q", res.Rejected, want)
		}
	}
	if len(res.Published) != 0 {
		t.Errorf("a rejected commit published %v", res.Published)
	}
	after := e.snapshot("hv-b")
	if after.Epoch != before.Epoch || after.VM("web-09") != nil || after.VM("db-01") == nil || after.VM("db-01").Tombstoned {
		t.Fatalf("hv-b after the rejected commit = %+v, want the last good snapshot", after)
	}
	l := e.ledger()
	if l.Rejected == nil || l.Rejected.Commit != desired.Hash(claim) || !strings.Contains(l.Rejected.Reason, "volume db-data") {
		t.Fatalf("ledger rejection = %+v, want commit %s", l.Rejected, claim)
	}
	if l.Applied.Commit != applied || len(l.Retained) != 1 {
		t.Fatalf("ledger applied %s retained %+v, want %s and db-01 still retained", l.Applied.Commit, l.Retained, applied)
	}
	// Still rejected at the next pass: nothing is skipped into silence.
	if res := e.pass(); !errors.Is(res.Rejected, ErrRetainedVolume) {
		t.Fatalf("second pass rejected = %v, want ErrRetainedVolume", res.Rejected)
	}

	// Restoring db-01's file (it leaves the retained list) and attaching
	// the volume to it only is accepted again.
	fixed := e.commit(gittest.Edit{Remove: []string{"vms/web-09.yaml"},
		Write: map[string]string{"vms/db-01.yaml": vmYAML("db-01", "hv-b", 2, "db-data")}})
	res = e.pass()
	if res.Rejected != nil || len(res.Unretained) != 1 || res.RetainedTotal != 0 {
		t.Fatalf("fix: %+v, want accepted, db-01 unretained", res)
	}
	if l := e.ledger(); l.Rejected == nil || l.Rejected.Superseded != desired.Hash(fixed) {
		t.Fatalf("ledger rejection = %+v, want superseded by %s", l.Rejected, fixed)
	}
}

// A rewrite that drops a VM and, in the same commit, gives its volume to a
// new VM is rejected: nothing is retained and the new VM is not published.
func TestRewriteClaimingDroppedVolumeRejected(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	before := e.snapshot("hv-b")
	orphan := e.commit(gittest.Edit{Branch: "orphan", Message: "Initial", Write: map[string]string{
		"hosts/hv-a.yaml": hostYAML("hv-a"), "hosts/hv-b.yaml": hostYAML("hv-b"),
		"vms/web-01.yaml": vmYAML("web-01", "hv-a", 2),
		"vms/web-09.yaml": vmYAML("web-09", "hv-b", 1, "db-data"),
		"vols/db.yaml":    volumeYAML("db-data", "hv-b", 50)}})
	gittest.SetBranch(t, e.dir, "main", orphan)
	res := e.pass()
	if !errors.Is(res.Rejected, ErrRetainedVolume) || !strings.Contains(res.Rejected.Error(), "VM db-01") {
		t.Fatalf("rejected = %v, want ErrRetainedVolume naming db-01", res.Rejected)
	}
	if len(res.Retained) != 0 || len(res.Published) != 0 {
		t.Fatalf("result = %+v, want nothing retained or published", res)
	}
	if after := e.snapshot("hv-b"); after.Epoch != before.Epoch || after.VM("web-09") != nil {
		t.Fatalf("hv-b = %+v, want the last good snapshot", after)
	}
	if l := e.ledger(); len(l.Retained) != 0 || l.Rejected == nil || l.Rejected.Commit != desired.Hash(orphan) {
		t.Fatalf("ledger retained %+v rejected %+v", l.Retained, l.Rejected)
	}
}

// When the host's file is missing from the snapshots tip at a rewrite, a VM
// to retain has no last spec: the pass refuses to publish, naming the VM,
// instead of publishing the host without it.
func TestRetainWithoutLastSpecRefuses(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	e.commit(gittest.Edit{Branch: DefaultSnapshotsBranch, Remove: []string{snapshots.Path("hv-b")}})
	tip := e.snapshotsTip()
	orphan := e.commit(gittest.Edit{Branch: "orphan", Message: "Initial", Write: map[string]string{
		"hosts/hv-a.yaml": hostYAML("hv-a"), "hosts/hv-b.yaml": hostYAML("hv-b"),
		"vms/web-01.yaml": vmYAML("web-01", "hv-a", 2),
		"vols/db.yaml":    volumeYAML("db-data", "hv-b", 50)}})
	gittest.SetBranch(t, e.dir, "main", orphan)
	_, err := e.c.Pass(context.Background())
	if !errors.Is(err, ErrNoLastSpec) {
		t.Fatalf("pass error = %v, want ErrNoLastSpec", err)
	}
	for _, want := range []string{"VM db-01", "host hv-b", snapshots.Path("hv-b")} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if got := e.snapshotsTip(); got != tip {
		t.Fatalf("snapshots tip moved to %s, want nothing written", got)
	}

	// Restoring db-01 on the desired branch lets the pass through; the
	// missing file is published again with db-01 in it.
	e.commit(gittest.Edit{Write: map[string]string{"vms/db-01.yaml": vmYAML("db-01", "hv-b", 2, "db-data")}})
	res := e.pass()
	if res.Rejected != nil || len(res.Retained) != 0 {
		t.Fatalf("after restore: %+v", res)
	}
	if vm := e.snapshot("hv-b").VM("db-01"); vm == nil || vm.Tombstoned || vm.Spec.VCPUs != 2 {
		t.Fatalf("db-01 on hv-b = %+v, want live with its spec", vm)
	}
}
