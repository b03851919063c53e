package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

func baseFleet() map[string]string {
	return map[string]string{
		"hosts/hv-a.yaml": hostYAML("hv-a"),
		"hosts/hv-b.yaml": hostYAML("hv-b"),
		"vms/web-01.yaml": vmYAML("web-01", "hv-a", 2),
		"vms/db-01.yaml":  vmYAML("db-01", "hv-b", 2, "db-data"),
		"vols/db.yaml":    volumeYAML("db-data", "hv-b", 50),
		"README.md":       "# our fleet\n",
	}
}

func TestCreateAndEdit(t *testing.T) {
	e := newEnv(t, baseFleet())
	res := e.pass()
	if res.Rejected != nil {
		t.Fatalf("rejected: %v", res.Rejected)
	}
	if res.Published["hv-a"] != 1 || res.Published["hv-b"] != 1 {
		t.Fatalf("published = %v, want both hosts at epoch 1", res.Published)
	}
	a := e.snapshot("hv-a")
	if a.Epoch != 1 || a.VM("web-01") == nil || a.VM("web-01").Tombstoned || a.Source.Commit != desired.Hash(res.Head) || a.Source.Branch != "main" {
		t.Fatalf("hv-a snapshot = %+v", a)
	}
	if v := e.snapshot("hv-b").Volume("db-data"); v == nil || v.SizeGB != 50 {
		t.Fatalf("hv-b volume = %+v", v)
	}
	if l := e.ledger(); l.Applied == nil || l.Applied.Commit != desired.Hash(res.Head) || l.Hosts["hv-a"].Epoch != 1 {
		t.Fatalf("ledger = %+v", l)
	}
	readme := gittest.Show(t, e.dir, "refs/heads/"+DefaultStatusBranch, status.SummaryPath)
	if !strings.Contains(readme, "| hv-a |") || !strings.Contains(readme, desired.Hash(res.Head).Short()) {
		t.Errorf("summary lacks the host or the commit:\n%s", readme)
	}

	// Nothing changed: no new commit on either branch.
	tip := e.snapshotsTip()
	statusTip := gittest.Rev(t, e.dir, "refs/heads/"+DefaultStatusBranch)
	if res := e.pass(); res.Changed() || res.SummaryWritten {
		t.Fatalf("an idle pass wrote: %+v", res)
	}
	if e.snapshotsTip() != tip || gittest.Rev(t, e.dir, "refs/heads/"+DefaultStatusBranch) != statusTip {
		t.Fatal("an idle pass moved a branch")
	}

	// Edit: only the edited host gets a new epoch.
	old := a.VM("web-01").SpecHash
	e.commit(gittest.Edit{Write: map[string]string{"vms/web-01.yaml": vmYAML("web-01", "hv-a", 4)}, Message: "more cpus"})
	res = e.pass()
	if len(res.Published) != 1 || res.Published["hv-a"] != 2 {
		t.Fatalf("published = %v, want only hv-a at epoch 2", res.Published)
	}
	vm := e.snapshot("hv-a").VM("web-01")
	if vm.Spec.VCPUs != 4 || vm.SpecHash == old || vm.SpecHash != desired.SpecHash(vm.Spec) {
		t.Fatalf("edited VM = %+v", vm)
	}
	if e.snapshot("hv-b").Epoch != 1 {
		t.Fatal("an untouched host got a new epoch")
	}
}

func TestDeleteTombstoneAckFinalize(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	del := e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}, Author: "Ann Admin <ann@example.com>",
		Message: "retire web-01", Time: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)})
	res := e.pass()
	if len(res.Tombstoned) != 1 || res.Published["hv-a"] != 2 {
		t.Fatalf("result = %+v, want one tombstone published at epoch 2", res)
	}
	vm := e.snapshot("hv-a").VM("web-01")
	if vm == nil || !vm.Tombstoned || vm.Tombstone == nil {
		t.Fatalf("web-01 = %+v, want tombstoned", vm)
	}
	want := snapshots.Tombstone{Commit: desired.Hash(del), Author: "Ann Admin <ann@example.com>", Time: "2026-11-29T12:00:00Z", Epoch: 2}
	if *vm.Tombstone != want {
		t.Fatalf("tombstone = %+v, want %+v", *vm.Tombstone, want)
	}
	if vm.Spec.VCPUs != 2 || vm.Spec.Host != "hv-a" {
		t.Errorf("tombstone lost the last spec: %+v", vm.Spec)
	}
	readme := gittest.Show(t, e.dir, "refs/heads/"+DefaultStatusBranch, status.SummaryPath)
	if !strings.Contains(readme, "web-01") || !strings.Contains(readme, "Ann Admin") {
		t.Errorf("summary does not show the pending delete:\n%s", readme)
	}

	// A stale ack (an older incarnation, seen at epoch 1) is ignored.
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: 1, Destroyed: []string{"web-01"}})
	res = e.pass()
	if len(res.Finalized) != 0 || e.snapshot("hv-a").VM("web-01") == nil {
		t.Fatalf("a stale ack finalized: %+v", res)
	}

	// The fresh ack finalizes: the VM leaves the snapshot with a new epoch.
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 2, LastSeenEpoch: 2, Destroyed: []string{"web-01"}})
	res = e.pass()
	if len(res.Finalized) != 1 || res.Published["hv-a"] != 3 || res.Pending != 0 {
		t.Fatalf("result = %+v, want web-01 finalized at epoch 3", res)
	}
	if e.snapshot("hv-a").VM("web-01") != nil || len(e.ledger().Tombstones) != 0 {
		t.Fatal("finalized VM still in the snapshot or ledger")
	}
}

func TestVolumeTombstoneFinalizedOnPresentFalse(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	e.commit(gittest.Edit{Write: map[string]string{"vms/db-01.yaml": vmYAML("db-01", "hv-b", 2)}, Remove: []string{"vols/db.yaml"}})
	res := e.pass()
	v := e.snapshot("hv-b").Volume("db-data")
	if v == nil || !v.Tombstoned || v.SizeGB != 50 || v.Tombstone.Epoch != 2 {
		t.Fatalf("volume = %+v, result %+v", v, res)
	}
	// present: true is no ack.
	writeStatus(t, e.url, &status.Status{Host: "hv-b", Heartbeat: 1, LastSeenEpoch: 2,
		Volumes: []status.Volume{{Name: "db-data", Present: true, SizeGB: 50}}})
	if res := e.pass(); len(res.Finalized) != 0 {
		t.Fatalf("a present volume was finalized: %+v", res)
	}
	writeStatus(t, e.url, &status.Status{Host: "hv-b", Heartbeat: 2, LastSeenEpoch: 2,
		Volumes: []status.Volume{{Name: "db-data", Present: false}}})
	if res := e.pass(); len(res.Finalized) != 1 || e.snapshot("hv-b").Volume("db-data") != nil {
		t.Fatalf("absent volume not finalized: %+v", res)
	}
}

func TestUndelete(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}})
	e.pass()
	e.commit(gittest.Edit{Write: map[string]string{"vms/web-01-again.yaml": vmYAML("web-01", "hv-a", 2)}})
	res := e.pass()
	if len(res.Undeleted) != 1 || res.Pending != 0 {
		t.Fatalf("result = %+v, want web-01 un-deleted", res)
	}
	vm := e.snapshot("hv-a").VM("web-01")
	if vm == nil || vm.Tombstoned || vm.Tombstone != nil || e.snapshot("hv-a").Epoch != 3 {
		t.Fatalf("web-01 = %+v, want live again at epoch 3", vm)
	}
}

func TestRenameAndMoveFileIsNoDelete(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	tip := e.snapshotsTip()
	e.commit(gittest.Edit{Rename: map[string]string{"vms/web-01.yaml": "web/frontend/web-01.yml"}})
	res := e.pass()
	if len(res.Tombstoned) != 0 || res.Changed() {
		t.Fatalf("a rename changed the fleet: %+v", res)
	}
	if e.snapshot("hv-a").Epoch != 1 {
		t.Fatal("a rename bumped the epoch")
	}
	// Only the ledger's applied commit moved.
	if e.snapshotsTip() == tip || e.ledger().Applied.Commit != desired.Hash(res.Head) {
		t.Fatal("ledger does not record the applied commit")
	}
}

func TestHostMove(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	mv := e.commit(gittest.Edit{Write: map[string]string{"vms/web-01.yaml": vmYAML("web-01", "hv-b", 2)}, Message: "move web-01"})
	res := e.pass()
	if len(res.Tombstoned) != 1 || res.Published["hv-a"] != 2 || res.Published["hv-b"] != 2 {
		t.Fatalf("result = %+v", res)
	}
	old := e.snapshot("hv-a").VM("web-01")
	if old == nil || !old.Tombstoned || old.Tombstone.Commit != desired.Hash(mv) {
		t.Fatalf("old host's web-01 = %+v, want tombstoned by %s", old, mv)
	}
	if n := e.snapshot("hv-b").VM("web-01"); n == nil || n.Tombstoned {
		t.Fatalf("new host's web-01 = %+v", n)
	}
}

func TestMergeCommitAttribution(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	main := gittest.Rev(t, e.dir, "refs/heads/main")
	gittest.SetBranch(t, e.dir, "cleanup", main)
	e.commit(gittest.Edit{Branch: "cleanup", Remove: []string{"vms/web-01.yaml"}, Author: "Side Branch <side@example.com>"})
	e.commit(gittest.Edit{Write: map[string]string{"notes.txt": "unrelated"}})
	merge := gittest.Merge(t, e.dir, "main", "cleanup", "Merge cleanup")
	e.commit(gittest.Edit{Write: map[string]string{"notes.txt": "later"}, Author: "Later Person <later@example.com>"})
	res := e.pass()
	if len(res.Tombstoned) != 1 {
		t.Fatalf("result = %+v", res)
	}
	tb := e.snapshot("hv-a").VM("web-01").Tombstone
	if tb.Commit != desired.Hash(merge) || tb.Rewritten {
		t.Fatalf("tombstone = %+v, want the merge %s on the first-parent history", tb, merge)
	}
}

func TestDeleteAttributedAcrossSeveralCommits(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	del := e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}, Author: "Deleter <d@example.com>"})
	e.commit(gittest.Edit{Write: map[string]string{"vms/web-02.yaml": vmYAML("web-02", "hv-a", 1)}, Author: "Other <o@example.com>"})
	e.pass()
	tb := e.snapshot("hv-a").VM("web-01").Tombstone
	if tb.Commit != desired.Hash(del) || tb.Author != "Deleter <d@example.com>" {
		t.Fatalf("tombstone = %+v, want commit %s by Deleter", tb, del)
	}
}

func TestInvalidCommitKeepsLastGood(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	tip := e.snapshotsTip()
	a := e.snapshot("hv-a")
	bad := e.commit(gittest.Edit{Write: map[string]string{"vms/web-01.yaml": "apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata: {name: web-01}\nspec: {host: hv-a, vcpus: 0}\n"},
		Remove: []string{"vms/db-01.yaml"}})
	res := e.pass()
	if res.Rejected == nil || res.Head != bad {
		t.Fatalf("result = %+v, want %s rejected", res, bad)
	}
	if !strings.Contains(res.Rejected.Error(), "vms/web-01.yaml:") {
		t.Errorf("rejection %q does not name the file", res.Rejected)
	}
	if got := e.snapshot("hv-a"); got.Epoch != a.Epoch || e.snapshot("hv-b").VM("db-01").Tombstoned {
		t.Fatal("a rejected commit touched the snapshots")
	}
	l := e.ledger()
	if l.Rejected == nil || l.Rejected.Commit != desired.Hash(bad) || l.Applied.Commit == desired.Hash(bad) {
		t.Fatalf("ledger = %+v, want the rejection recorded", l)
	}
	readme := gittest.Show(t, e.dir, "refs/heads/"+DefaultStatusBranch, status.SummaryPath)
	if !strings.Contains(readme, "Last rejected commit") || !strings.Contains(readme, desired.Hash(bad).Short()) {
		t.Errorf("summary does not report the rejection:\n%s", readme)
	}
	if e.snapshotsTip() == tip {
		t.Error("the rejection was not recorded in the ledger")
	}
	if got := metricValue(t, e.c, "gitfleet_controller_rejected_commits_total"); got != 1 {
		t.Errorf("rejected commits metric = %v, want 1", got)
	}
	// A second pass over the same bad head writes nothing more.
	tip = e.snapshotsTip()
	e.pass()
	if e.snapshotsTip() != tip {
		t.Error("the same rejection was written twice")
	}

	// The fixing commit applies, including the delete it carried.
	e.commit(gittest.Edit{Write: map[string]string{"vms/web-01.yaml": vmYAML("web-01", "hv-a", 3)}})
	res = e.pass()
	if res.Rejected != nil || res.Published["hv-a"] != 2 || len(res.Tombstoned) != 1 {
		t.Fatalf("fix result = %+v", res)
	}
	if got := metricValue(t, e.c, "gitfleet_controller_rejected_commits_total"); got != 1 {
		t.Errorf("rejected commits metric = %v after two passes over one bad commit, want 1", got)
	}
	if l := e.ledger(); l.Rejected == nil || l.Rejected.Commit != desired.Hash(bad) || l.Rejected.Superseded != desired.Hash(res.Head) {
		t.Errorf("ledger rejection = %+v, want %s superseded by %s", l.Rejected, bad, res.Head)
	}
	readme = gittest.Show(t, e.dir, "refs/heads/"+DefaultStatusBranch, status.SummaryPath)
	if !strings.Contains(readme, "has been applied since") {
		t.Errorf("summary does not say the rejection was superseded:\n%s", readme)
	}
	if got := metricValue(t, e.c, "gitfleet_controller_tombstones_pending"); got != 1 {
		t.Errorf("pending metric = %v, want 1", got)
	}
	if got := metricValue(t, e.c, "gitfleet_controller_host_epoch", "host", "hv-a"); got != 2 {
		t.Errorf("hv-a epoch metric = %v, want 2", got)
	}
	if got := metricValue(t, e.c, "gitfleet_controller_passes_total", "result", "rejected"); got != 2 {
		t.Errorf("rejected passes = %v, want 2", got)
	}
}

// A desired branch that cannot be read is never an empty fleet, and never a
// rejected commit: a missing branch is refused, an unreachable remote is
// unreadable; neither is written to the ledger or counted as a rejection.
func TestFetchFailureKeepsLastGood(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	tip := e.snapshotsTip()

	t.Run("branch gone", func(t *testing.T) {
		main := gittest.Rev(t, e.dir, "refs/heads/main")
		gittest.DeleteBranch(t, e.dir, "main")
		defer gittest.SetBranch(t, e.dir, "main", main)
		res, err := e.c.Pass(context.Background())
		if !errors.Is(err, ErrRefused) || PassOutcome(res, err) != OutcomeRefused {
			t.Fatalf("err = %v: a missing branch must be refused", err)
		}
		if res.Rejected != nil || len(res.Tombstoned) != 0 || res.Changed() {
			t.Fatalf("result = %+v: a missing branch is never an empty fleet, nor a rejected commit", res)
		}
		if e.snapshot("hv-a").Epoch != 1 || e.snapshot("hv-a").VM("web-01").Tombstoned {
			t.Fatal("the snapshots changed")
		}
	})
	t.Run("remote unreachable", func(t *testing.T) {
		moved := e.dir + ".away"
		if err := os.Rename(e.dir, moved); err != nil {
			t.Fatal(err)
		}
		res, err := e.c.Pass(context.Background())
		if err := os.Rename(moved, e.dir); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(err, ErrUnreadable) || PassOutcome(res, err) != OutcomeUnreadable {
			t.Fatalf("err = %v: an unreachable remote must be unreadable", err)
		}
		if res.Rejected != nil || len(res.Tombstoned) != 0 || res.Changed() {
			t.Fatalf("result = %+v", res)
		}
	})
	res := e.pass()
	if res.Rejected != nil || len(res.Tombstoned) != 0 || e.snapshot("hv-a").Epoch != 1 {
		t.Fatalf("after recovery: %+v", res)
	}
	if e.snapshotsTip() != tip {
		t.Error("a git failure was written to the snapshots branch")
	}
	if l := e.ledger(); l.Rejected != nil {
		t.Errorf("ledger rejection = %+v: a git failure is not a rejected commit", l.Rejected)
	}
	if got := metricValue(t, e.c, "gitfleet_controller_rejected_commits_total"); got != 0 {
		t.Errorf("rejected commits = %v, want 0", got)
	}
	for outcome, want := range map[Outcome]float64{OutcomeRefused: 1, OutcomeUnreadable: 1, OutcomeRejected: 0} {
		if got := metricValue(t, e.c, "gitfleet_controller_passes_total", "result", string(outcome)); got != want {
			t.Errorf("%s passes = %v, want %v", outcome, got, want)
		}
	}
}

func TestAbandonedSweep(t *testing.T) {
	files := baseFleet()
	files["vms/web-02.yaml"] = vmYAML("web-02", "hv-b", 1)
	e := newEnv(t, files)
	e.pass()
	e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml", "vms/web-02.yaml"}})
	// Both hosts report once.
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: 1})
	writeStatus(t, e.url, &status.Status{Host: "hv-b", Heartbeat: 1, LastSeenEpoch: 1})
	if res := e.pass(); len(res.Tombstoned) != 2 {
		t.Fatalf("result = %+v", res)
	}
	// hv-b keeps reporting (online, but never acks); hv-a falls silent.
	hb := uint64(1)
	step := func(d time.Duration) PassResult {
		e.clock.Add(d)
		hb++
		writeStatus(t, e.url, &status.Status{Host: "hv-b", Heartbeat: hb, LastSeenEpoch: 2})
		return e.pass()
	}
	for i := 0; i < 14; i++ {
		if res := step(time.Minute); len(res.Swept) != 0 {
			t.Fatalf("swept before the abandon grace at minute %d: %+v", i+1, res)
		}
	}
	res := step(2 * time.Minute) // 16 minutes pending, hv-a silent for 16
	if len(res.Swept) != 1 || res.Swept[0] != "VM web-01@hv-a" {
		t.Fatalf("swept = %v, want only web-01 on the offline hv-a", res.Swept)
	}
	l := e.ledger()
	if len(l.Sweeps) != 1 || !strings.Contains(l.Sweeps[0].Reason, "offline") || len(l.Tombstones) != 2 {
		t.Fatalf("ledger sweeps = %+v tombstones = %+v", l.Sweeps, l.Tombstones)
	}
	for _, tb := range l.Tombstones {
		if swept := tb.SweptAt != nil; swept != (tb.Host == "hv-a") {
			t.Errorf("tombstone %s@%s swept = %v", tb.Name, tb.Host, swept)
		}
	}
	// Swept, not dropped: the tombstone stays delivered until the host
	// acks (TestSweptDeleteCompletesWhenTheHostReturns in agent).
	if vm := e.snapshot("hv-a").VM("web-01"); vm == nil || !vm.Tombstoned {
		t.Error("a swept tombstone left the snapshot before the host acked it")
	}
	if res := step(10 * time.Minute); len(res.Swept) != 0 {
		t.Fatalf("swept twice: %+v", res)
	}
	// The online host is never swept, however long.
	for i := 0; i < 5; i++ {
		if res := step(10 * time.Minute); len(res.Swept) != 0 {
			t.Fatalf("an online host was swept: %+v", res)
		}
	}
}

// A pending tombstone keeps passes from being skipped: when every host is
// silent and nothing else changes, the passing of time alone brings the
// abandoned sweep.
func TestSweepWhenOnlyTimePasses(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}})
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: 1})
	if res := e.pass(); len(res.Tombstoned) != 1 {
		t.Fatalf("result = %+v", res)
	}
	// hv-a falls silent: one pass sees it go offline, the next sees
	// nothing new.
	for _, d := range []time.Duration{4 * time.Minute, time.Minute} {
		e.clock.Add(d)
		if res := e.pass(); len(res.Swept) != 0 {
			t.Fatalf("swept before the abandon grace: %+v", res)
		}
	}
	e.clock.Add(20 * time.Minute)
	res := e.pass()
	if res.Skipped || len(res.Swept) != 1 || res.Swept[0] != "VM web-01@hv-a" {
		t.Fatalf("result = %+v, want web-01 swept on the offline hv-a", res)
	}
	e.pass() // reads the summary the sweep wrote
	if res := e.pass(); !res.Skipped {
		t.Fatalf("a pass with nothing pending and nothing new was not skipped: %+v", res)
	}
}

func TestRestartNeverSweepsAtOnce(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}})
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: 1})
	e.pass()
	// A long time later the controller restarts: the host may look stale by
	// any other clock, but this controller has not watched it yet.
	e.clock.Add(time.Hour)
	e.c = e.newController()
	if res := e.pass(); len(res.Swept) != 0 {
		t.Fatalf("a restarted controller swept at once: %+v", res)
	}
	e.clock.Add(2 * time.Minute)
	if res := e.pass(); len(res.Swept) != 0 {
		t.Fatalf("swept before offlineAfter: %+v", res)
	}
	e.clock.Add(2 * time.Minute)
	if res := e.pass(); len(res.Swept) != 1 {
		t.Fatalf("not swept after offlineAfter on a silent host: %+v", res)
	}
}

func TestFenceRecovery(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	old := e.snapshotsTip()
	top := e.publishEpochs(3)
	// The agent saw epoch top on a snapshots branch since restored from
	// an old copy, its ledger at epoch 1: the controller published top
	// itself, so it follows the agent's status back up.
	e.resetSnapshots(old)
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 9, LastSeenEpoch: top})
	res := e.pass()
	if res.FenceJumps["hv-a"] != top || res.Published["hv-a"] != top+1 {
		t.Fatalf("result = %+v, want hv-a jumped to %d and published at %d", res, top, top+1)
	}
	if s := e.snapshot("hv-a"); s.Epoch != top+1 {
		t.Fatalf("hv-a epoch = %d", s.Epoch)
	}
	if e.snapshot("hv-b").Epoch != 1 {
		t.Error("fence recovery touched another host")
	}
	if res := e.pass(); len(res.Published) != 0 {
		t.Fatalf("fence recovery repeats: %+v", res)
	}
}

// The snapshots branch is recreated from nothing and counts up to the
// very epoch the agent accepted, with other content: the agent is fenced
// at the ledger's own epoch, and the next pass publishes at the one after
// it, once.
func TestFenceRecoveryAtTheSameEpoch(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	epoch := e.snapshot("hv-a").Epoch
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 9, LastSeenEpoch: epoch, FenceViolation: true,
		SnapshotError: fmt.Sprintf("snapshot at epoch %d differs from the one accepted at that epoch", epoch)})
	res := e.pass()
	if res.Published["hv-a"] != epoch+1 {
		t.Fatalf("result = %+v, want hv-a published at %d", res, epoch+1)
	}
	if e.snapshot("hv-b").Epoch != 1 {
		t.Error("fence recovery touched another host")
	}
	if res := e.pass(); len(res.Published) != 0 {
		t.Fatalf("fence recovery repeats while the agent has not answered: %+v", res)
	}
}

func TestFenceRecoveryWhileRejected(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	old := e.snapshotsTip()
	top := e.publishEpochs(3)
	e.resetSnapshots(old)
	e.commit(gittest.Edit{Write: map[string]string{"vms/bad.yaml": "kind: nonsense\n"}})
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 9, LastSeenEpoch: top})
	if res := e.pass(); res.Rejected == nil || e.ledger().Hosts["hv-a"].Epoch != top {
		t.Fatalf("result = %+v, ledger epoch %d", res, e.ledger().Hosts["hv-a"].Epoch)
	}
	e.commit(gittest.Edit{Remove: []string{"vms/bad.yaml"}})
	if res := e.pass(); res.Published["hv-a"] != top+1 {
		t.Fatalf("result = %+v, want hv-a published at %d", res, top+1)
	}
}

func TestHostLeavesFleet(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml", "hosts/hv-a.yaml"}})
	res := e.pass()
	if s := e.snapshot("hv-a"); s == nil || !s.VM("web-01").Tombstoned {
		t.Fatalf("the host's file must stay while its delete is pending: %+v", res)
	}
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: 2, Destroyed: []string{"web-01"}})
	res = e.pass()
	if len(res.Removed) != 1 || e.snapshot("hv-a") != nil {
		t.Fatalf("result = %+v, want hv-a's file removed", res)
	}
	if e.ledger().Hosts["hv-a"].Epoch != 2 {
		t.Fatal("a removed host's epoch was forgotten (it must never be reused)")
	}
	// It comes back: the epoch continues.
	e.commit(gittest.Edit{Write: map[string]string{"hosts/hv-a.yaml": hostYAML("hv-a")}})
	if res := e.pass(); res.Published["hv-a"] != 3 {
		t.Fatalf("result = %+v, want hv-a at epoch 3", res)
	}
}

func TestTwoControllersRacing(t *testing.T) {
	e := newEnv(t, baseFleet())
	other := e.newController()
	for round := 0; round < 4; round++ {
		e.commit(gittest.Edit{Write: map[string]string{"vms/web-01.yaml": vmYAML("web-01", "hv-a", round+1)}})
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, c := range []*Controller{e.c, other} {
			wg.Add(1)
			go func(i int, c *Controller) {
				defer wg.Done()
				_, errs[i] = c.Pass(context.Background())
			}(i, c)
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if got := e.snapshot("hv-a").Epoch; got != uint64(round+1) {
			t.Fatalf("round %d: hv-a epoch %d, want %d (one epoch per change, never two)", round, got, round+1)
		}
	}
	// Every published version of hv-a's file carries a distinct epoch.
	log := gittest.Git(t, e.dir, "log", "--format=%H", "refs/heads/"+DefaultSnapshotsBranch, "--", snapshots.Path("hv-a"))
	seen := map[uint64]bool{}
	for _, h := range strings.Fields(log) {
		s, err := snapshots.ParseSnapshot([]byte(gittest.Show(t, e.dir, h, snapshots.Path("hv-a")) + "\n"))
		if err != nil {
			t.Fatal(err)
		}
		if seen[s.Epoch] {
			t.Fatalf("epoch %d published twice", s.Epoch)
		}
		seen[s.Epoch] = true
	}
}

func TestConcurrentStatusWriters(t *testing.T) {
	dir := gittest.NewBare(t)
	url := gittest.Serve(t, strings.TrimSuffix(dir, "/repo.git")) + "/repo.git"
	const writers = 8
	var wg sync.WaitGroup
	for i := 0; i < writers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			host := "hv-" + string(rune('a'+i))
			for hb := uint64(1); hb <= 3; hb++ {
				st := &status.Status{Host: host, Heartbeat: hb}
				writeStatus(t, url, st)
			}
		}(i)
	}
	wg.Wait()
	for i := 0; i < writers; i++ {
		host := "hv-" + string(rune('a'+i))
		branch := "refs/heads/" + status.HostBranch(host)
		if files := gittest.Files(t, dir, branch); len(files) != 1 || files[0] != status.Path(host) {
			t.Fatalf("%s holds %v, want its host's file alone", branch, files)
		}
		st, err := status.Parse(status.Path(host), []byte(gittest.Show(t, dir, branch, status.Path(host))+"\n"))
		if err != nil {
			t.Fatal(err)
		}
		if st.Heartbeat != 3 {
			t.Errorf("%s heartbeat %d, want 3 (a lost update)", host, st.Heartbeat)
		}
	}
}

func TestIdempotentAfterCrash(t *testing.T) {
	// A pass computes and publishes in one commit; a controller that died
	// before writing the summary, run again, converges with nothing new.
	e := newEnv(t, baseFleet())
	e.pass()
	e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}})
	e.pass()
	tip := e.snapshotsTip()
	e.c = e.newController()
	if res := e.pass(); res.Changed() || len(res.Tombstoned) != 0 || e.snapshotsTip() != tip {
		t.Fatalf("a fresh controller redid work: %+v", res)
	}
}

func TestSummaryRewrittenAtMostEveryInterval(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.c.cfg.SummaryInterval = time.Minute
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 40})
	e.pass()
	e.pass() // sees its own write
	statusTip := func() string { return gittest.Rev(t, e.dir, "refs/heads/"+DefaultStatusBranch) }
	summary := func() string { return gittest.Show(t, e.dir, "refs/heads/"+DefaultStatusBranch, status.SummaryPath) }
	// A heartbeat changes the summary; within the interval it waits.
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 41})
	tip := statusTip()
	e.clock.Add(10 * time.Second)
	if res := e.pass(); res.SummaryWritten || statusTip() != tip {
		t.Fatalf("summary rewritten within the interval: %+v", res)
	}
	// Nothing else changes, but the held-back summary is still written
	// once the interval has passed: the pass is not skipped.
	e.clock.Add(time.Minute)
	if res := e.pass(); !res.SummaryWritten || !strings.Contains(summary(), "| hv-a | online | 41 |") {
		t.Fatalf("held-back summary never written: %+v\n%s", res, summary())
	}
	tip = statusTip()
	// hv-a still online: nothing to show before the interval's refresh
	// (last-write.yaml, TestIdleFleetRefreshesLastWrite).
	e.clock.Add(30 * time.Second)
	if res := e.pass(); res.SummaryWritten || statusTip() != tip {
		t.Fatalf("an unchanged summary was rewritten: %+v", res)
	}
}

// TestIdleFleetHourAddsOnlySummaryRefreshes: an idle fleet (no change,
// heartbeats only) adds no commit to the status branch for an hour but
// at most one summary refresh per SummaryInterval (issue 15's idle-fleet
// figure), with the default interval and a heartbeat a minute. Each agent
// keeps its Writer, as a running agent does: its heartbeats alternate
// between two commits, and every host stays online.
func TestIdleFleetHourAddsOnlySummaryRefreshes(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.c.cfg.SummaryInterval = DefaultSummaryInterval
	e.pass()
	agents := map[string]*status.Writer{}
	for _, h := range []string{"hv-a", "hv-b"} {
		repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: e.url, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { repo.Close() })
		agents[h] = &status.Writer{Repo: repo, Host: h}
	}
	epochs := map[string]uint64{"hv-a": e.snapshot("hv-a").Epoch, "hv-b": e.snapshot("hv-b").Epoch} // idle: they stay
	beat := uint64(1)
	reused := 0
	heartbeats := func() {
		for h, w := range agents {
			out, err := w.Write(context.Background(), &status.Status{Host: h, Heartbeat: beat, LastSeenEpoch: epochs[h]})
			if err != nil {
				t.Fatal(err)
			}
			if out.Reused {
				reused++
			}
		}
		beat++
	}
	heartbeats()
	e.pass()
	e.pass() // sees its own writes
	start := gittest.Rev(t, e.dir, "refs/heads/"+DefaultStatusBranch)
	for minute := 1; minute <= 60; minute++ {
		e.clock.Add(time.Minute)
		heartbeats()
		e.pass()
	}
	n, err := strconv.Atoi(strings.TrimSpace(gittest.Git(t, e.dir, "rev-list", "--count", start+"..refs/heads/"+DefaultStatusBranch)))
	if err != nil {
		t.Fatal(err)
	}
	if max := int(time.Hour / DefaultSummaryInterval); n > max {
		t.Fatalf("an idle hour added %d commits to %s, want at most %d (one summary refresh per %s)", n, DefaultStatusBranch, max, DefaultSummaryInterval)
	}
	if n == 0 {
		t.Fatal("an idle hour never refreshed the summary: the heartbeat counters it shows are an hour old")
	}
	if reused < 100 {
		t.Fatalf("%d of 120 heartbeats pointed the branch back at a heartbeat commit, want all but the first ones", reused)
	}
	for h := range agents {
		if off, _ := e.c.live.offline(h, e.clock.Now()); off {
			t.Errorf("%s alternating its heartbeats is offline", h)
		}
	}
}

// TestSummaryRewrittenAtOnceBeyondHeartbeats: within SummaryInterval a
// change of anything but heartbeat counters (a VM's phase, a pending delete
// published, a finalized delete) is written by the pass that saw it.
func TestSummaryRewrittenAtOnceBeyondHeartbeats(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.c.cfg.SummaryInterval = time.Hour
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: 1,
		VMs: []status.VM{{Name: "web-01", Phase: status.PhaseCreating, Power: "running"}}})
	e.pass()
	summary := func() string { return gittest.Show(t, e.dir, "refs/heads/"+DefaultStatusBranch, status.SummaryPath) }
	steps := []struct {
		name  string
		do    func()
		wants string
	}{
		{"phase", func() {
			writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 2, LastSeenEpoch: 1,
				VMs: []status.VM{{Name: "web-01", Phase: status.PhaseReady, Power: "running"}}})
		}, "| web-01 | hv-a | ready | running |"},
		{"tombstone", func() {
			e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}, Author: "Ann Admin <ann@example.com>", Message: "retire web-01"})
		}, "| VM | web-01 | hv-a |"},
		{"finalized", func() {
			writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 3, LastSeenEpoch: e.snapshot("hv-a").Epoch, Destroyed: []string{"web-01"}})
		}, "## Pending deletes\n\nNone."},
	}
	for _, st := range steps {
		e.clock.Add(5 * time.Second)
		st.do()
		if res := e.pass(); !res.SummaryWritten || !strings.Contains(summary(), st.wants) {
			t.Fatalf("%s: summary not rewritten at once (want %q): %+v\n%s", st.name, st.wants, res, summary())
		}
		e.pass() // sees its own write
	}
	// The agent accepts the last epoch: written at once; then a heartbeat
	// alone waits for the interval.
	epoch := e.snapshot("hv-a").Epoch
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 4, LastSeenEpoch: epoch})
	e.clock.Add(5 * time.Second)
	if res := e.pass(); !res.SummaryWritten {
		t.Fatalf("the accepted epoch was not written at once: %+v\n%s", res, summary())
	}
	e.pass()
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 5, LastSeenEpoch: epoch})
	e.clock.Add(5 * time.Second)
	if res := e.pass(); res.SummaryWritten || strings.Contains(summary(), "| hv-a | online | 5 |") {
		t.Fatalf("a heartbeat-only change was written within the interval: %+v\n%s", res, summary())
	}
}

// TestTipRepositoryRenewed: the snapshots and status branches are read
// through a depth-1 repository opened afresh every hour, and a pass on the
// fresh one carries on from the ledger at the tip.
func TestTipRepositoryRenewed(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	old := e.c.tips
	e.clock.Add(2 * time.Hour)
	e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}})
	res := e.pass()
	if e.c.tips == old {
		t.Fatal("the tip repository was not opened afresh")
	}
	if len(res.Tombstoned) != 1 || res.Published["hv-a"] != 2 {
		t.Fatalf("pass on a fresh tip repository: %+v", res)
	}
}

// TestOverHTTP runs a delete through to its finalization against git's
// smart HTTP server (git http-backend), the transport of a real fleet.
func TestOverHTTP(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.url = gittest.Serve(t, strings.TrimSuffix(e.dir, "/repo.git")) + "/repo.git"
	e.c = e.newController()
	if res := e.pass(); res.Published["hv-a"] != 1 {
		t.Fatalf("first pass over HTTP: %+v", res)
	}
	e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}})
	if res := e.pass(); len(res.Tombstoned) != 1 {
		t.Fatalf("delete over HTTP: %+v", res)
	}
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: 2, Destroyed: []string{"web-01"}})
	if res := e.pass(); len(res.Finalized) != 1 || e.snapshot("hv-a").VM("web-01") != nil {
		t.Fatalf("ack over HTTP: %+v", res)
	}
}
