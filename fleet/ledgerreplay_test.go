package fleet

import (
	"context"
	"errors"
	"strings"
	"time"

	"testing"

	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/trusttest"
)

// A forged merge whose first parent is an older signed commit (one whose
// ledger holds a tombstone of a VM undeleted since) and whose second
// parent is the newest signed commit replays the old ledger: the
// controller walks first parents to the old signed commit, and a running
// one, which wrote a newer signed ledger, acts on that one instead. The
// replay destroys nothing (the VM, desired again, stays live and untombstoned)
// and does not hold the host back: the agent's report of the epoch it
// accepted lifts the host above it (fence recovery), and the forged merge
// is reported.
func TestReplayedSignedLedgerThroughForgedMerge(t *testing.T) {
	e, key := newSigningEnv(t)
	e.commit(gittest.Edit{Remove: []string{"vms/db-01.yaml"}, Message: "retire db-01"})
	if res := e.pass(); len(res.Tombstoned) != 1 {
		t.Fatalf("tombstoned = %v", res.Tombstoned)
	}
	old := e.snapshotsTip()
	oldLedger := gittest.Show(t, e.dir, old, snapshots.LedgerPath)
	oldHost := gittest.Show(t, e.dir, old, snapshots.Path("hv-b"))
	e.commit(gittest.Edit{Write: map[string]string{"vms/db-01.yaml": vmYAML("db-01", "hv-b", 2, "db-data")}, Message: "keep db-01 after all"})
	e.pass()
	newest := e.snapshotsTip()
	accepted := e.snapshot("hv-b").Epoch
	if vm := e.snapshot("hv-b").VM("db-01"); vm == nil || vm.Tombstoned {
		t.Fatalf("db-01 = %+v after the undelete", vm)
	}
	writeStatus(t, e.url, &status.Status{Host: "hv-b", Heartbeat: 1, LastSeenEpoch: accepted})

	merge := e.commit(gittest.Edit{Branch: DefaultSnapshotsBranch, Parents: []string{old, newest}, Message: "forged merge",
		Write: map[string]string{snapshots.LedgerPath: oldLedger, snapshots.Path("hv-b"): oldHost}})
	res := e.pass()
	// A running controller knows a newer signed ledger than old's: it
	// acts on that one, and reports old (its ledger is older) and the
	// merge above it.
	if len(res.ForgedCommits) != 2 || res.ForgedCommits[0].Commit != old || res.ForgedCommits[1].Commit != merge ||
		res.ForgedCommits[1].Signed != newest || !strings.Contains(res.ForgedCommits[0].Reason, "older") {
		t.Fatalf("forged commits = %+v, want the old signed %s and the merge %s, above %s", res.ForgedCommits, old, merge, newest)
	}
	if !e.signedBy(key) {
		t.Fatal("the tip after the pass is not signed")
	}
	snap := e.snapshot("hv-b")
	if vm := snap.VM("db-01"); vm == nil || vm.Tombstoned {
		t.Fatalf("db-01 = %+v: the replayed tombstone of an undeleted VM was published", vm)
	}
	for _, tr := range e.ledger().Tombstones {
		if tr.Name == "db-01" {
			t.Fatalf("the ledger keeps the replayed tombstone %+v", tr)
		}
	}
	if snap.Epoch <= accepted {
		t.Errorf("hv-b published at epoch %d, not above the %d its agent accepted: it would refuse it", snap.Epoch, accepted)
	}
	if e.snapshot("hv-a").VM("web-01") == nil {
		t.Error("hv-a lost web-01")
	}
}

// A forged commit that renames a host file (git records a rename) is
// undone on both sides by the controller's signed commit, even when the
// desired state is rejected and the pass writes only the ledger: the old
// path has the signed content again and the new one is gone.
func TestForgedHostFileRenameRestored(t *testing.T) {
	e, key := newSigningEnv(t)
	genuine := gittest.Show(t, e.dir, e.snapshotsTip(), snapshots.Path("hv-b"))
	e.commit(gittest.Edit{Branch: DefaultSnapshotsBranch, Message: "forged rename",
		Rename: map[string]string{snapshots.Path("hv-b"): snapshots.Path("hv-z")}})
	e.commitBroken()
	res := e.pass()
	if res.Rejected == nil || len(res.ForgedCommits) != 1 {
		t.Fatalf("rejected %v, forged %+v", res.Rejected, res.ForgedCommits)
	}
	if !e.signedBy(key) {
		t.Fatal("the tip after the pass is not signed")
	}
	tip := e.snapshotsTip()
	if got := gittest.Show(t, e.dir, tip, snapshots.Path("hv-b")); got != genuine {
		t.Errorf("hosts/hv-b.yaml at the signed tip =\n%s\nwant\n%s", got, genuine)
	}
	for _, f := range gittest.Files(t, e.dir, tip) {
		if f == snapshots.Path("hv-z") {
			t.Errorf("the signed tip still holds the renamed %s", f)
		}
	}
}

// The status branch is anyone's to write, and the controller commits its
// summary on top of whatever tree it finds there. Were that commit signed
// with the snapshots key, someone who can push planted a ledger and a
// host file on gitfleet/status, waited for the controller's next summary
// commit, and pushed it to gitfleet/snapshots: a tip a controller key
// signed, whose ledger the controller acted on (it published the planted
// retained VM) and whose host file (a tombstone at a high epoch) agents
// accepted. The controller signs only its snapshots commits: the
// replayed status commit verifies for no one. The running controller
// falls back to the last signed commit it wrote and repairs over it; a
// restarted one, with no signed commit of its own, refuses to act on a
// branch with no signed commit (restore it from a backup).
func TestStatusCommitReplayedOnSnapshotsIsNotSigned(t *testing.T) {
	e, key := newSigningEnv(t)
	genuine := e.snapshotsTip()
	l := e.ledger()
	l.Retained = append(l.Retained, evilRetained(l.Applied.Commit))
	forgedLedger, err := l.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	forgedHost := "host: hv-a\nepoch: 99999\nvms: []\nvolumes: []\ntombstones: [{kind: VM, name: web-01, epoch: 99999}]\n"
	e.commit(gittest.Edit{Branch: DefaultStatusBranch, Message: "planted",
		Write: map[string]string{snapshots.LedgerPath: string(forgedLedger), snapshots.Path("hv-a"): forgedHost}})
	// A heartbeat changes the summary: the controller commits on top.
	writeStatus(t, e.url, &status.Status{Host: "hv-b", Heartbeat: 1, LastSeenEpoch: e.snapshot("hv-b").Epoch})
	e.clock.Add(time.Minute)
	e.pass()
	replayed := gittest.Rev(t, e.dir, "refs/heads/"+DefaultStatusBranch)
	if gittest.Show(t, e.dir, replayed, snapshots.LedgerPath) != strings.TrimSuffix(string(forgedLedger), "\n") {
		t.Fatal("the status tip does not hold the planted ledger")
	}
	gittest.SetBranch(t, e.dir, DefaultSnapshotsBranch, replayed)
	if e.signedBy(key) {
		t.Fatal("the controller's status commit is signed: agents accept its planted hosts/hv-a.yaml as a snapshot")
	}

	restarted, err := e.signingController(key, "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = restarted.Pass(context.Background())
	if !errors.Is(err, ErrUnsignedLedger) {
		t.Fatalf("restarted controller's pass over the replayed status commit: %v, want ErrUnsignedLedger", err)
	}
	if e.snapshotsTip() != replayed {
		t.Fatal("a refused pass wrote over the replayed commit")
	}
	live := func(after string) {
		t.Helper()
		if e.snapshot("hv-a").VM("evil") != nil {
			t.Fatalf("%s: the ledger planted on the status branch was acted on", after)
		}
		if vm := e.snapshot("hv-a").VM("web-01"); vm == nil || vm.Tombstoned {
			t.Fatalf("%s: web-01 = %+v, want it live", after, vm)
		}
		if !e.signedBy(key) {
			t.Fatalf("%s: the snapshots tip is not signed", after)
		}
	}
	// The running controller wrote genuine: it repairs over the replay.
	if res := e.pass(); len(res.ForgedCommits) == 0 {
		t.Fatal("the replayed commit is not reported")
	}
	live("repaired by the running controller")

	gittest.SetBranch(t, e.dir, DefaultSnapshotsBranch, genuine) // the backup
	e.c = restarted
	e.pass()
	live("restored from the backup")
}

// A Host naming a controller key (this controller's, or one of
// --controller-keys) as its agentKey is rejected: its agent signs status
// commits on a host branch whose tree anyone who can push chose, and each
// of them, pushed to the snapshots branch, would pass for a snapshots
// commit a controller wrote. The last good snapshots stay.
func TestAgentKeyThatIsAControllerKeyRejected(t *testing.T) {
	own := trusttest.NewSSHKey(t, "gitfleet-controller")
	other := trusttest.NewSSHKey(t, "gitfleet-controller-2")
	for name, agentKey := range map[string]string{"its own key": own.Public, "a listed controller key": other.Public} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, baseFleet())
			c, err := e.signingController(own, "", other)
			if err != nil {
				t.Fatal(err)
			}
			e.c = c
			e.pass()
			good := e.snapshot("hv-a")
			head := e.commit(gittest.Edit{Message: "hv-a signs", Write: map[string]string{
				"hosts/hv-a.yaml": hostYAML("hv-a") + "  agentKey: " + agentKey + "\n"}})
			res := e.pass()
			if res.Rejected == nil || !errors.Is(res.Rejected, ErrAgentKeyIsControllerKey) || !strings.Contains(res.Rejected.Error(), "hosts/hv-a.yaml") {
				t.Fatalf("rejected = %v, want %s rejected for ErrAgentKeyIsControllerKey naming hosts/hv-a.yaml", res.Rejected, head)
			}
			if got := e.snapshot("hv-a"); got.Epoch != good.Epoch || got.VM("web-01") == nil {
				t.Fatalf("hv-a = %+v, want the last good snapshot", got)
			}
		})
	}
}

// A forged commit that turns a host file into a directory, and another's
// into a symlink, is undone too when the pass writes only the ledger: the
// signed tip has each host file back as the signed commit had it.
func TestForgedHostPathKindsRestored(t *testing.T) {
	e, key := newSigningEnv(t)
	signed := e.snapshotsTip()
	e.commit(gittest.Edit{Branch: DefaultSnapshotsBranch, Message: "forged",
		Remove:  []string{snapshots.Path("hv-a"), snapshots.Path("hv-b")},
		Write:   map[string]string{snapshots.Path("hv-a") + "/x": "planted\n", snapshots.Path("hv-b"): "/etc/shadow"},
		Symlink: []string{snapshots.Path("hv-b")}})
	e.commitBroken()
	res := e.pass()
	if res.Rejected == nil || len(res.ForgedCommits) != 1 {
		t.Fatalf("rejected %v, forged %+v", res.Rejected, res.ForgedCommits)
	}
	if !e.signedBy(key) {
		t.Fatal("the tip after the pass is not the controller's signed commit")
	}
	tip := e.snapshotsTip()
	for _, h := range []string{"hv-a", "hv-b"} {
		if got, want := gittest.Show(t, e.dir, tip, snapshots.Path(h)), gittest.Show(t, e.dir, signed, snapshots.Path(h)); got != want {
			t.Errorf("%s at the signed tip =\n%s\nwant\n%s", snapshots.Path(h), got, want)
		}
	}
	if want, got := gittest.Git(t, e.dir, "ls-tree", "-r", signed), gittest.Git(t, e.dir, "ls-tree", "-r", tip); !strings.Contains(got, strings.Split(want, "\n")[0]) || strings.Contains(got, "120000") || strings.Contains(got, "/x") {
		t.Errorf("tree at the signed tip:\n%s\nwant the signed commit's modes and paths:\n%s", got, want)
	}
}

// Without a signing key, a directory planted at a host file's path on the
// snapshots branch is not what the controller computes: the next pass
// publishes the host file over it, and every other host too. Before,
// reading it failed the pass for the whole fleet, and writing over it
// failed the publish ("a directory is in the way"), for as long as it
// stayed.
func TestPlantedDirectoryAtAHostFileRepublished(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	epoch := e.snapshot("hv-a").Epoch
	e.commit(gittest.Edit{Branch: DefaultSnapshotsBranch, Message: "planted", Remove: []string{snapshots.Path("hv-a")},
		Write: map[string]string{snapshots.Path("hv-a") + "/planted": "x\n"}})
	e.commit(editWeb(3, nil))
	res := e.pass()
	if res.Published["hv-a"] == 0 || e.snapshot("hv-a").Epoch <= epoch || e.snapshot("hv-a").VM("web-01") == nil {
		t.Fatalf("published %v, hv-a %+v: want hv-a's file back above epoch %d", res.Published, e.snapshot("hv-a"), epoch)
	}
	if e.snapshot("hv-b").VM("db-01") == nil {
		t.Fatal("hv-b lost db-01")
	}
}

// A directory planted at a host's status path, on the status branch (the
// old layout's place) and on its host branch, does not stop the pass:
// every host is still published.
func TestPlantedDirectoryAtAStatusPath(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	for _, branch := range []string{DefaultStatusBranch, status.HostBranch("hv-a")} {
		e.commit(gittest.Edit{Branch: branch, Message: "planted", Write: map[string]string{status.Path("hv-a") + "/planted": "x\n"}})
	}
	e.commit(editWeb(3, nil))
	res := e.pass()
	if res.Published["hv-a"] == 0 {
		t.Fatalf("published %v: want hv-a's edit published", res.Published)
	}
}
