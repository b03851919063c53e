package fleet

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

func (e *env) summary() string {
	e.t.Helper()
	return gittest.Show(e.t, e.dir, "refs/heads/"+DefaultStatusBranch, status.SummaryPath)
}

// A reset to an older commit (a force-push) drops web-02 from the desired
// state: it is kept, never tombstoned, until a reviewed delete.
func TestForcePushToOlderCommitRetains(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	first := gittest.Rev(t, e.dir, "refs/heads/main")
	e.commit(gittest.Edit{Write: map[string]string{"vms/web-02.yaml": vmYAML("web-02", "hv-a", 1)}})
	e.pass()
	gittest.SetBranch(t, e.dir, "main", first)
	res := e.pass()
	if res.Rejected != nil || len(res.Tombstoned) != 0 || len(res.Retained) != 1 || res.Retained[0] != "VM web-02@hv-a" {
		t.Fatalf("result = %+v, want web-02 retained, nothing tombstoned", res)
	}
	vm := e.snapshot("hv-a").VM("web-02")
	if vm == nil || vm.Tombstoned || vm.Tombstone != nil || vm.Spec.VCPUs != 1 || vm.SpecHash != desired.SpecHash(vm.Spec) {
		t.Fatalf("web-02 in the snapshot = %+v, want live with its last spec", vm)
	}
	if res.Published["hv-a"] != 0 {
		t.Errorf("retaining an unchanged VM published a new epoch: %v", res.Published)
	}
	l := e.ledger()
	if len(l.Retained) != 1 || l.Retained[0].Commit != desired.Hash(first) || l.Retained[0].Since.IsZero() ||
		l.Retained[0].Spec == nil || l.Retained[0].Spec.VCPUs != 1 || len(l.Tombstones) != 0 {
		t.Fatalf("ledger retained = %+v, tombstones %+v", l.Retained, l.Tombstones)
	}
	if got := metricValue(t, e.c, "gitfleet_controller_retained"); got != 1 {
		t.Errorf("gitfleet_controller_retained = %v, want 1", got)
	}
	if want := "kept after a history rewrite at `" + desired.Hash(first).Short() + "`: restore the file, or re-add and delete it in a reviewed commit"; !strings.Contains(e.summary(), want) {
		t.Errorf("summary lacks %q:\n%s", want, e.summary())
	}

	// A fast-forward commit without web-02 is no delete of it.
	e.commit(gittest.Edit{Write: map[string]string{"vms/web-03.yaml": vmYAML("web-03", "hv-a", 1)}})
	res = e.pass()
	if len(res.Tombstoned) != 0 || res.RetainedTotal != 1 {
		t.Fatalf("a later commit tombstoned a retained object: %+v", res)
	}
	if vm := e.snapshot("hv-a").VM("web-02"); vm == nil || vm.Tombstoned || e.snapshot("hv-a").VM("web-03") == nil {
		t.Fatalf("after a fast-forward: web-02 = %+v, web-03 created? snapshot %+v", vm, e.snapshot("hv-a"))
	}

	// Re-adding the file: it leaves the retained list and is desired again.
	e.commit(gittest.Edit{Write: map[string]string{"vms/web-02.yaml": vmYAML("web-02", "hv-a", 1)}})
	res = e.pass()
	if len(res.Unretained) != 1 || res.RetainedTotal != 0 || len(e.ledger().Retained) != 0 {
		t.Fatalf("re-added: %+v, ledger retained %+v", res, e.ledger().Retained)
	}
	if got := metricValue(t, e.c, "gitfleet_controller_retained"); got != 0 {
		t.Errorf("gitfleet_controller_retained = %v, want 0", got)
	}
	// And a reviewed delete deletes it.
	del := e.commit(gittest.Edit{Remove: []string{"vms/web-02.yaml"}, Message: "retire web-02"})
	res = e.pass()
	if len(res.Tombstoned) != 1 {
		t.Fatalf("reviewed delete: %+v", res)
	}
	if tb := e.snapshot("hv-a").VM("web-02").Tombstone; tb == nil || tb.Commit != desired.Hash(del) || tb.Rewritten {
		t.Fatalf("tombstone = %+v, want commit %s", tb, del)
	}
}

// A force-push of an unrelated history holding only a README costs
// nothing: every object is kept with its last spec, hosts keep their files,
// and a delete reviewed before the rewrite stays pending.
func TestForcePushUnrelatedHistoryKeepsEverything(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	del := e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}, Message: "retire web-01"})
	if res := e.pass(); len(res.Tombstoned) != 1 {
		t.Fatalf("reviewed delete: %+v", res)
	}
	// The unrelated history keeps hv-a only: hv-b leaves the fleet with it.
	orphan := e.commit(gittest.Edit{Branch: "orphan", Write: map[string]string{"README.md": "# Initial commit\n",
		"hosts/hv-a.yaml": hostYAML("hv-a")}, Message: "Initial commit"})
	gittest.SetBranch(t, e.dir, "main", orphan)
	res := e.pass()
	if res.Rejected != nil || len(res.Tombstoned) != 0 || len(res.Finalized) != 0 || len(res.Removed) != 0 {
		t.Fatalf("result = %+v, want nothing tombstoned or removed", res)
	}
	if want := []string{"VM db-01@hv-b", "Volume db-data@hv-b"}; strings.Join(res.Retained, ",") != strings.Join(want, ",") {
		t.Fatalf("retained = %v, want %v", res.Retained, want)
	}
	b := e.snapshot("hv-b")
	if vm := b.VM("db-01"); vm == nil || vm.Tombstoned || vm.Spec.VCPUs != 2 || len(vm.Spec.Volumes) != 1 {
		t.Fatalf("db-01 = %+v, want kept live with its last spec", vm)
	}
	if v := b.Volume("db-data"); v == nil || v.Tombstoned || v.SizeGB != 50 {
		t.Fatalf("db-data = %+v, want kept live at 50 GB", v)
	}
	if b.HostSpec.Capacity.VCPUs != 32 {
		t.Errorf("hv-b lost its host spec: %+v", b.HostSpec)
	}
	if vm := e.snapshot("hv-a").VM("web-01"); vm == nil || !vm.Tombstoned || vm.Tombstone.Commit != desired.Hash(del) {
		t.Fatalf("the pending reviewed delete of web-01 = %+v, want still pending from %s", vm, del)
	}
	// Stable: another pass changes nothing.
	if res := e.pass(); res.Changed() || len(res.Retained) != 0 || len(res.Tombstoned) != 0 {
		t.Fatalf("second pass after the rewrite: %+v", res)
	}
}

// A VM a host runs that neither the desired state nor the ledger knows (a
// repository restored from a backup that lacks it) is listed as kept.
func TestSummaryListsVMsOnHostNotDesired(t *testing.T) {
	files := baseFleet()
	delete(files, "vms/web-01.yaml")
	e := newEnv(t, files)
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 3, LastSeenEpoch: 7,
		VMs: []status.VM{{Name: "web-01", Phase: "ready", Power: "running"}}})
	writeStatus(t, e.url, &status.Status{Host: "hv-b", Heartbeat: 3, LastSeenEpoch: 7,
		VMs:      []status.VM{{Name: "db-01", Phase: "ready", Power: "running"}},
		Vanished: []status.Vanished{{Name: "old-01", Power: "stopped", Quarantined: true}}})
	res := e.pass()
	if len(res.Tombstoned) != 0 {
		t.Fatalf("a fresh ledger tombstoned: %+v", res)
	}
	sum := e.summary()
	if !strings.Contains(sum, "| web-01 | hv-a | ready | on host, not in the desired state: kept |") {
		t.Errorf("summary does not list web-01 as kept:\n%s", sum)
	}
	if !strings.Contains(sum, "| old-01 | hv-b | vanished, shut down | on host, not in the desired state: kept |") {
		t.Errorf("summary does not list the vanished old-01 as kept:\n%s", sum)
	}
	if strings.Contains(sum, "| db-01 | hv-b | ready | on host, not in the desired state") {
		t.Errorf("summary lists a desired VM as not desired:\n%s", sum)
	}
}

// A hand edit of the snapshots branch (same epoch, a VM removed) and a
// hand-removed host file are published again with a new epoch.
func TestHandEditedSnapshotRepublished(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	e.pass() // sees the summary the first one wrote
	if res := e.pass(); !res.Skipped {
		t.Fatalf("an idle pass was not skipped: %+v", res)
	}
	a := e.snapshot("hv-a")
	a.VMs = nil
	data, err := snapshots.MarshalSnapshot(a)
	if err != nil {
		t.Fatal(err)
	}
	e.commit(gittest.Edit{Branch: DefaultSnapshotsBranch, Write: map[string]string{snapshots.Path("hv-a"): string(data)},
		Remove: []string{snapshots.Path("hv-b")}, Message: "hand edit"})
	res := e.pass()
	if res.Published["hv-a"] != 2 || res.Published["hv-b"] != 2 || strings.Join(res.Repaired, ",") != "hv-a,hv-b" {
		t.Fatalf("result = %+v, want hv-a and hv-b repaired at epoch 2", res)
	}
	if vm := e.snapshot("hv-a").VM("web-01"); vm == nil || vm.Tombstoned {
		t.Fatalf("web-01 not restored: %+v", e.snapshot("hv-a"))
	}
	if s := e.snapshot("hv-b"); s == nil || s.VM("db-01") == nil {
		t.Fatalf("hv-b not restored: %+v", s)
	}
	if res := e.pass(); res.Changed() {
		t.Fatalf("repair repeats: %+v", res)
	}
}

// newEnvUnder is newEnv with baseFleet kept under fleet/ in the repository
// and the controller reading it through Config.Path path.
func newEnvUnder(t testing.TB, path string) *env {
	t.Helper()
	files := map[string]string{}
	for p, c := range baseFleet() {
		files["fleet/"+p] = c
	}
	e := newEnv(t, nil)
	e.commit(gittest.Edit{Write: files, Message: "initial fleet"})
	c, err := New(Config{URL: e.url, Path: path, Clock: e.clock.Now, Logger: quietLogger(), SummaryInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	return e
}

// A controller on another branch or path than the ledger's refuses to
// publish, and says which.
func TestLedgerOfAnotherBranchOrPathRefused(t *testing.T) {
	e := newEnvUnder(t, "fleet")
	e.pass()
	gittest.Git(t, e.dir, "branch", "other", "main")
	tip := e.snapshotsTip()
	for _, tc := range []struct {
		name         string
		cfg          Config
		want1, want2 string
	}{
		{"branch", Config{Branch: "other", Path: "./fleet/"}, `branch "main"`, `branch "other"`},
		{"path", Config{}, "(the repository root)", `path "fleet"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.URL, cfg.Clock, cfg.Logger, cfg.SummaryInterval = e.url, e.clock.Now, quietLogger(), -1
			c, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Pass(context.Background())
			if !errors.Is(err, ErrLedgerMismatch) || !strings.Contains(err.Error(), tc.want1) || !strings.Contains(err.Error(), tc.want2) {
				t.Fatalf("error = %v, want ErrLedgerMismatch naming %s and %s", err, tc.want1, tc.want2)
			}
			if e.snapshotsTip() != tip {
				t.Fatal("a refused pass moved the snapshots branch")
			}
		})
	}
}

func TestNewRefusesOverlappingBranchesAndBadPaths(t *testing.T) {
	dir := gittest.NewBare(t)
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"snapshots on main", Config{SnapshotsBranch: "main"}, "snapshots branch and the desired branch"},
		{"status on main", Config{StatusBranch: "refs/heads/main"}, "status branch and the desired branch"},
		{"snapshots is status", Config{SnapshotsBranch: "x", StatusBranch: "x"}, "snapshots branch and the status branch"},
		{"status on a host branch", Config{StatusBranch: "gitfleet/hosts/hv-a"}, "where each host's agent writes"},
		{"absolute path", Config{Path: "/fleet"}, "absolute"},
		{"path climbs out", Config{Path: "fleet/../../x"}, "leaves the repository"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.URL, cfg.Logger = dir, quietLogger()
			_, err := New(cfg)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want ErrConfig saying %q", err, tc.want)
			}
		})
	}
}

func TestCleanPath(t *testing.T) {
	for in, want := range map[string]string{"": "", ".": "", "./": "", "fleet": "fleet", "./fleet": "fleet",
		"fleet/": "fleet", "./fleet/": "fleet", "a//b/": "a/b", "a/../b": "b"} {
		got, err := CleanPath(in)
		if err != nil || got != want {
			t.Errorf("CleanPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// --path ./fleet attributes a delete to the commit that made it, as
// --path fleet does.
func TestDotSlashPathAttributesDeletes(t *testing.T) {
	e := newEnvUnder(t, "./fleet")
	e.pass()
	del := e.commit(gittest.Edit{Remove: []string{"fleet/vms/web-01.yaml"}, Message: "retire web-01"})
	e.commit(gittest.Edit{Write: map[string]string{"notes.txt": "unrelated\n"}})
	if res := e.pass(); len(res.Tombstoned) != 1 {
		t.Fatalf("result = %+v", res)
	}
	if tb := e.snapshot("hv-a").VM("web-01").Tombstone; tb.Commit != desired.Hash(del) {
		t.Fatalf("tombstone commit = %s, want the deleting commit %s", tb.Commit, del)
	}
}

// A status claiming an epoch beyond the highest an agent accepts (the
// top of uint64, 2^53, or just above snapshots.MaxAcceptedEpoch) is never
// followed, round to epoch 0 or otherwise. Signed by the Host's agentKey
// (the agent's own state is corrupt), that host alone is held, and every
// other host still publishes; unsigned, it is not followed at all (no
// controller published such an epoch: docs/DESIGN.md, "Epoch bounds"),
// and the host publishes. A signed status just at the bound is a legal
// jump.
func TestEpochJumpBeyondBoundHoldsOnlyThatHost(t *testing.T) {
	files, _, signer := agentKeyFleet(t)
	e := newEnv(t, files)
	e.pass()
	for i, seen := range []uint64{math.MaxUint64, MaxEpoch, snapshots.MaxAcceptedEpoch + 1} {
		writeSignedStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: uint64(i + 1), LastSeenEpoch: seen}, signer)
		e.commit(gittest.Edit{Write: map[string]string{"vms/db-01.yaml": vmYAML("db-01", "hv-b", 3+i, "db-data")}})
		res := e.pass()
		why := res.Held["hv-a"]
		if !strings.Contains(why, ErrEpochBound.Error()) || !strings.Contains(why, status.Path("hv-a")) {
			t.Fatalf("lastSeenEpoch %d: held = %v, want hv-a held naming its status", seen, res.Held)
		}
		if _, ok := res.Published["hv-b"]; !ok {
			t.Fatalf("lastSeenEpoch %d: hv-b was not published (%v): one host's status blocked the fleet", seen, res.Published)
		}
		if got := e.snapshot("hv-a").Epoch; got != 1 {
			t.Fatalf("hv-a at epoch %d, want it left at 1", got)
		}
		if l := e.ledger(); l.Hosts["hv-a"].Epoch != 1 {
			t.Fatalf("ledger followed the status to %d", l.Hosts["hv-a"].Epoch)
		}
		if got := metricValue(t, e.c, "gitfleet_controller_hosts_held"); got != 1 {
			t.Fatalf("gitfleet_controller_hosts_held = %v", got)
		}
	}
	plain := newEnv(t, baseFleet())
	plain.pass()
	writeStatus(t, plain.url, &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: math.MaxUint64})
	plain.commit(gittest.Edit{Write: map[string]string{"vms/web-01.yaml": vmYAML("web-01", "hv-a", 5)}})
	if res := plain.pass(); len(res.Held) != 0 || res.Published["hv-a"] != 2 || res.EpochsNotFollowed["hv-a"] == "" {
		t.Fatalf("an unsigned status beyond the bound: %+v", res)
	}

	writeSignedStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 9, LastSeenEpoch: snapshots.MaxAcceptedEpoch - 1}, signer)
	if res := e.pass(); res.Published["hv-a"] != snapshots.MaxAcceptedEpoch || len(res.Held) != 0 {
		t.Fatalf("result = %+v", res)
	}
	// Now at the bound: the next change of hv-a is held, hv-b's is not.
	e.commit(gittest.Edit{Write: map[string]string{"vms/web-01.yaml": vmYAML("web-01", "hv-a", 5),
		"vms/db-01.yaml": vmYAML("db-01", "hv-b", 9, "db-data")}})
	res := e.pass()
	if !strings.Contains(res.Held["hv-a"], "the next epoch would be") || res.Published["hv-b"] == 0 {
		t.Fatalf("result = %+v", res)
	}
}

// A deleted desired branch says so: the pass is refused with the branch
// named, nothing is written (the ledger records no rejected commit: there is
// no commit), and no VM is lost.
func TestMissingDesiredBranchSaysSo(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	tip := e.snapshotsTip()
	gittest.DeleteBranch(t, e.dir, "main")
	res, err := e.c.Pass(context.Background())
	want := `the desired branch "main" is missing`
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want a refusal saying %q", err, want)
	}
	if res.Rejected != nil {
		t.Fatalf("rejected = %v: no commit was read, so none is rejected", res.Rejected)
	}
	if e.snapshotsTip() != tip {
		t.Error("a refused pass wrote to the snapshots branch")
	}
	if l := e.ledger(); l.Rejected != nil {
		t.Fatalf("ledger rejection = %+v", l.Rejected)
	}
	if e.snapshot("hv-a").VM("web-01") == nil {
		t.Fatal("a missing branch cost a VM")
	}
}

// A rewrite that moves a VM to another host keeps it on the old host (no
// reviewed delete) and creates it on the new one; moving it back in a
// reviewed commit makes it desired again.
func TestRewriteThatMovesAVMKeepsTheOldOne(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	moved := e.commit(gittest.Edit{Branch: "rewrite", Write: func() map[string]string {
		f := baseFleet()
		f["vms/web-01.yaml"] = vmYAML("web-01", "hv-b", 2)
		return f
	}(), Message: "unrelated history"})
	gittest.SetBranch(t, e.dir, "main", moved)
	res := e.pass()
	if len(res.Tombstoned) != 0 || strings.Join(res.Retained, ",") != "VM web-01@hv-a" {
		t.Fatalf("result = %+v, want web-01 kept on hv-a", res)
	}
	if vm := e.snapshot("hv-a").VM("web-01"); vm == nil || vm.Tombstoned {
		t.Fatalf("web-01 on hv-a = %+v", vm)
	}
	if vm := e.snapshot("hv-b").VM("web-01"); vm == nil || vm.Tombstoned || vm.Spec.Host != "hv-b" {
		t.Fatalf("web-01 on hv-b = %+v", vm)
	}
	e.commit(gittest.Edit{Write: map[string]string{"vms/web-01.yaml": vmYAML("web-01", "hv-a", 2)}, Message: "back to hv-a"})
	res = e.pass()
	if strings.Join(res.Unretained, ",") != "VM web-01@hv-a" || len(res.Tombstoned) != 1 || res.Tombstoned[0] != "VM web-01@hv-b" {
		t.Fatalf("result = %+v, want web-01 desired on hv-a again and its hv-b copy tombstoned by the reviewed move", res)
	}
}
