package fleet

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/trusttest"
)

// A status pushed to the branch of a host whose Host names spec.agentKey,
// not signed by that key, is shown but not acted on: its acks finalize
// nothing, and its lastSeenEpoch moves no epoch either. Before, the
// fence recovery followed it: one unsigned status just under
// snapshots.MaxAcceptedEpoch jumped the host's epoch to the bound, and
// every later change of that host was held for good (the ledger stayed
// at the bound after the real agent wrote its status again), however
// well the controller could tell the status was forged; one above the
// bound held the host for as long as it stayed. The host's real,
// signed status is followed as before.
func TestAttackUnsignedStatusMovesNoEpoch(t *testing.T) {
	files, _, signer := agentKeyFleet(t)
	e := newEnv(t, files)
	epoch := e.pass().Published["hv-a"]
	writeSignedStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: epoch}, signer)
	e.pass()

	for i, seen := range []uint64{snapshots.MaxAcceptedEpoch - 1, snapshots.MaxAcceptedEpoch + 1} {
		writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: uint64(10 + i), LastSeenEpoch: seen})
		res := e.pass()
		if len(res.Held) != 0 || res.Published["hv-a"] != 0 {
			t.Fatalf("forged lastSeenEpoch %d: held %v, published %v: an unsigned status moved hv-a's epoch", seen, res.Held, res.Published)
		}
		if got := e.ledger().Hosts["hv-a"].Epoch; got != epoch {
			t.Fatalf("forged lastSeenEpoch %d: the ledger followed it to %d", seen, got)
		}
	}
	// The real agent writes again; hv-a's changes publish as before.
	writeSignedStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 20, LastSeenEpoch: epoch}, signer)
	e.commit(gittest.Edit{Write: map[string]string{"vms/web-01.yaml": vmYAML("web-01", "hv-a", 5)}})
	res := e.pass()
	if res.Published["hv-a"] != epoch+1 || len(res.Held) != 0 {
		t.Fatalf("hv-a's change: published %v, held %v", res.Published, res.Held)
	}

	// A signed status above the ledger (the snapshots branch restored
	// from an old copy) is followed, as the fence recovery says.
	writeSignedStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 21, LastSeenEpoch: epoch + 40}, signer)
	e.commit(gittest.Edit{Write: map[string]string{"vms/web-01.yaml": vmYAML("web-01", "hv-a", 6)}})
	if res := e.pass(); res.Published["hv-a"] != epoch+41 {
		t.Fatalf("signed status above the ledger: published %v, want hv-a at %d", res.Published, epoch+41)
	}
}

// A status of a host whose Host names spec.agentKey, pushed unsigned by
// someone else, says web-01 is ready. The controller knows the status is
// not signed by the key (it refuses its acks), yet the status README shows
// its phases as the host's, with nothing saying they are unverified. Now
// the host line and each of its VM rows say so.
func TestAttackUnsignedStatusShownAsTheHosts(t *testing.T) {
	files, _, signer := agentKeyFleet(t)
	e := newEnv(t, files)
	epoch := e.pass().Published["hv-a"]
	writeSignedStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: epoch,
		VMs: []status.VM{{Name: "web-01", Phase: status.PhaseFailed, LastError: "boot: qemu exited"}}}, signer)
	e.pass()
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 2, LastSeenEpoch: epoch,
		VMs: []status.VM{{Name: "web-01", Phase: status.PhaseReady}}})
	e.pass()
	readme := gittest.Show(t, e.dir, "refs/heads/"+DefaultStatusBranch, status.SummaryPath)
	if strings.Count(readme, "status not signed by the Host") != 2 { // the host line, web-01's row
		t.Fatalf("README shows an unsigned status of hv-a as its own:\n%s", readme)
	}
	// So does liveness.yaml, which `gitfleet status` reads.
	live, err := status.ParseLiveness(status.LivenessPath, []byte(gittest.Show(t, e.dir, "refs/heads/"+DefaultStatusBranch, status.LivenessPath)+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(live["hv-a"].Unsigned, "no signature") {
		t.Fatalf("liveness.yaml of hv-a: %+v, want why its status is unsigned", live["hv-a"])
	}
}

// A force-push of main never deletes: what the rewritten head lacks is
// retained. Someone who can push the snapshots branch then resets it to
// an older controller-signed commit, whose applied commit is an ancestor
// of the rewritten head: the controller read that genuine, old ledger,
// found the retained VM absent since, and tombstoned it, attributed to
// the unreviewed commit the force-push brought. Now a running controller
// sees that the signed ledger is older than the last one it wrote (a
// host's epoch is lower) and acts on its own. A restarted one has no
// such memory: still open.
func TestAttackRolledBackLedgerTurnsARewriteIntoADelete(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restarted=%v", restart), func(t *testing.T) {
			if restart {
				t.Skip("open: a controller started after the snapshots branch was reset to an older signed commit acts on that ledger, and tombstones what a later force-push of main dropped (retained)")
			}
			key := trusttest.NewSSHKey(t, "gitfleet-controller")
			files := baseFleet()
			files["vms/x-01.yaml"] = vmYAML("x-01", "hv-a", 2)
			e := newEnv(t, files)
			c, err := e.signingController(key, "")
			if err != nil {
				t.Fatal(err)
			}
			e.c = c
			e.pass()
			c1 := gittest.Rev(t, e.dir, "refs/heads/main")
			old := e.snapshotsTip() // signed, applied c1

			e.commit(gittest.Edit{Write: map[string]string{"vms/y-01.yaml": vmYAML("y-01", "hv-a", 2)}, Message: "add y-01"})
			e.pass()
			// A person rewrites main: back to c1, then an unreviewed
			// commit that also drops x-01.
			gittest.Git(t, e.dir, "update-ref", "refs/heads/main", c1)
			e.commit(gittest.Edit{Remove: []string{"vms/x-01.yaml"}, Message: "history surgery"})
			res := e.pass()
			if !containsStr(res.Retained, "x-01") {
				t.Fatalf("retained %v: the rewrite's drop of x-01 is not retained", res.Retained)
			}

			gittest.Git(t, e.dir, "update-ref", "refs/heads/"+DefaultSnapshotsBranch, old)
			if restart {
				if e.c, err = e.signingController(key, ""); err != nil {
					t.Fatal(err)
				}
			}
			res = e.pass()
			if len(res.Tombstoned) != 0 {
				t.Fatalf("tombstoned %v after the snapshots branch was reset to an old signed commit: a force-push deleted", res.Tombstoned)
			}
			if vm := e.snapshot("hv-a").VM("x-01"); vm == nil || vm.Tombstoned {
				t.Fatalf("x-01 in hv-a's snapshot: %+v", vm)
			}
			if len(res.ForgedCommits) != 1 || res.ForgedCommits[0].Commit != old || !e.signedBy(key) {
				t.Fatalf("forged %+v: want the reset to %s reported and repaired", res.ForgedCommits, old)
			}
		})
	}
}

func containsStr(list []string, sub string) bool {
	for _, s := range list {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// The nonce of a pending delete is taken only from its own host's
// status: another host's status reporting that quarantine (with the
// nonce read from the real host's status, at an epoch above the
// tombstone's) confirms nothing.
func TestAttackNonceFromAnotherHostConfirmsNothing(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}, Message: "retire web-01"})
	epoch := e.pass().Published["hv-a"]
	nonce := strings.Repeat("c3", snapshots.ConfirmLen/2)
	writeStatus(t, e.url, &status.Status{Host: "hv-b", Heartbeat: 3, LastSeenEpoch: epoch + 5,
		Quarantined: []status.Quarantine{{Name: "web-01", Confirm: nonce}}})
	res := e.pass()
	if len(res.Confirmed) != 0 {
		t.Fatalf("confirmed %v from hv-b's status", res.Confirmed)
	}
	if tb := e.snapshot("hv-a").VM("web-01").Tombstone; tb == nil || tb.Confirm != "" {
		t.Fatalf("web-01's tombstone on hv-a: %+v", tb)
	}
	// Its own host's status confirms it.
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 3, LastSeenEpoch: epoch,
		Quarantined: []status.Quarantine{{Name: "web-01", Confirm: nonce}}})
	if res := e.pass(); len(res.Confirmed) != 1 {
		t.Fatalf("confirmed %v from hv-a's own status", res.Confirmed)
	}
}

// A head the controller rejects confirms nothing, although the host
// reports its nonce: the rejected commit may bring the VM back (here it
// does, beside a file that does not parse), and the last good desired
// state is no statement of the latest reviewed intent. A valid head that
// still deletes it confirms.
func TestAttackRejectedHeadConfirmsNothing(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}, Message: "retire web-01"})
	epoch := e.pass().Published["hv-a"]
	e.commit(gittest.Edit{Write: map[string]string{"vms/web-01.yaml": vmYAML("web-01", "hv-a", 2),
		"vms/bad.yaml": "kind: VM\nmetadata: {name: bad\n"}, Message: "web-01 back, and a broken file"})
	nonce := strings.Repeat("d4", snapshots.ConfirmLen/2)
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 3, LastSeenEpoch: epoch,
		Quarantined: []status.Quarantine{{Name: "web-01", Confirm: nonce}}})
	res := e.pass()
	if res.Rejected == nil || len(res.Confirmed) != 0 {
		t.Fatalf("rejected %v, confirmed %v: a rejected head confirmed a delete", res.Rejected, res.Confirmed)
	}
	if tb := e.snapshot("hv-a").VM("web-01").Tombstone; tb == nil || tb.Confirm != "" {
		t.Fatalf("web-01's tombstone on hv-a: %+v", tb)
	}
	e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml", "vms/bad.yaml"}, Message: "web-01 goes after all"})
	if res := e.pass(); len(res.Confirmed) != 1 {
		t.Fatalf("confirmed %v once the head is valid", res.Confirmed)
	}
}

// The agent of hv-a, whose Host names spec.agentKey, stopped. Someone who
// can push its branch writes an unsigned status every minute. The
// controller refuses that status's acks, yet counts each write as the
// host's heartbeat: hv-a stays online in the README, its VMs read as
// they were, and a delete pending on it is never swept. Now such a
// status is no heartbeat: hv-a goes offline.
func TestAttackUnsignedStatusKeepsADeadHostOnline(t *testing.T) {
	files, _, signer := agentKeyFleet(t)
	e := newEnv(t, files)
	epoch := e.pass().Published["hv-a"]
	writeSignedStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: epoch}, signer)
	e.pass()
	for i := range 10 { // the real agent is gone; the forger writes on
		e.clock.Add(time.Minute)
		writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: uint64(2 + i), LastSeenEpoch: epoch})
		e.pass()
	}
	if off, _ := e.c.live.offline("hv-a", e.clock.Now()); !off {
		t.Fatal("hv-a is online on unsigned statuses alone, ten minutes after its agent stopped")
	}
}

// The agent of hv-a, whose Host names spec.agentKey, stopped. Someone who
// can push its branch but holds no key moves it, every minute, between
// two commits the agent signed before (one its branch no longer holds):
// each move changes the status file, which kept the host online for ever
// and its deletes never swept. A signed status is a heartbeat only with a
// number above every one seen signed, so hv-a goes offline as if nobody
// moved its branch. Moving it back to an older signed commit hides an ack
// for as long as it stays there, nothing more: the delete stays pending
// (never finalized on what the replayed commit lacks) and the agent's
// next write finalizes it.
func TestAttackReplayedSignedStatusKeepsADeadHostOnline(t *testing.T) {
	files, _, signer := agentKeyFleet(t)
	e := newEnv(t, files)
	epoch := e.pass().Published["hv-a"]
	branch := status.HostBranch("hv-a")
	st := &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: epoch, VMs: []status.VM{{Name: "web-01", Phase: status.PhaseReady}}}
	writeSignedStatus(t, e.url, st, signer)
	st.Heartbeat = 2
	writeSignedStatus(t, e.url, st, signer)
	old := gittest.Rev(t, e.dir, branch)
	st.Heartbeat = 3
	writeSignedStatus(t, e.url, st, signer)
	last := gittest.Rev(t, e.dir, branch)
	e.pass()
	for i := range 10 { // the real agent is gone; the forger replays
		e.clock.Add(time.Minute)
		gittest.SetBranch(t, e.dir, branch, []string{old, last}[i%2])
		e.pass()
	}
	if off, _ := e.c.live.offline("hv-a", e.clock.Now()); !off {
		t.Fatal("hv-a is online on replayed signed statuses alone, ten minutes after its agent stopped")
	}

	// The agent is back and acks a delete; the forger hides the ack.
	e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}, Message: "retire web-01"})
	st.Heartbeat, st.VMs = 10, nil
	tomb := e.pass().Published["hv-a"]
	st.LastSeenEpoch, st.Destroyed = tomb, []string{"web-01"}
	writeSignedStatus(t, e.url, st, signer)
	gittest.SetBranch(t, e.dir, branch, last)
	if res := e.pass(); len(res.Finalized) != 0 {
		t.Fatalf("finalized %v on a replayed status without the ack", res.Finalized)
	}
	st.Heartbeat = 11
	writeSignedStatus(t, e.url, st, signer)
	if res := e.pass(); len(res.Finalized) != 1 || res.Finalized[0] != "VM web-01@hv-a" {
		t.Fatalf("finalized %v at the agent's next write, want web-01", res.Finalized)
	}
	if off, _ := e.c.live.offline("hv-a", e.clock.Now()); off {
		t.Fatal("hv-a writing again is offline")
	}
}
