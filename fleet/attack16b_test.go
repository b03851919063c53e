package fleet

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/trusttest"
)

// The first start with a signing key adopts the unsigned ledger a person
// checked (the only file the procedure asks them to read). A host file
// planted beside it for a host the desired state does not have (one
// being set up, or one retired whose agent still runs) is signed with
// the controller's first commit and stays in every later one: an agent
// of that host would accept it as the controller's. Now every path of
// the adopted commit but the ledger and the files of the hosts the ledger
// knows is removed in that first signed commit.
func TestAttackAdoptionSignsAPlantedHostFile(t *testing.T) {
	key := trusttest.NewSSHKey(t, "gitfleet-controller")
	e := newEnv(t, baseFleet())
	e.pass() // unsigned, as before keys were configured
	planted := "host: hv-c\nepoch: 9\nvms: []\nvolumes: []\n"
	tip := e.commit(gittest.Edit{Branch: DefaultSnapshotsBranch, Message: "forged", Write: map[string]string{snapshots.Path("hv-c"): planted, "extra.yaml": "planted: true\n"}})

	c, err := e.signingController(key, tip)
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	e.pass()
	if !e.signedBy(key) {
		t.Fatal("the adopted ledger was not written over, signed")
	}
	for _, p := range []string{snapshots.Path("hv-c"), "extra.yaml"} {
		if out, err := exec.Command("git", "-C", e.dir, "cat-file", "-e", e.snapshotsTip()+":"+p).CombinedOutput(); err == nil {
			t.Errorf("the controller's signed commit holds the planted %s (%s)", p, out)
		}
	}
	for _, h := range []string{"hv-a", "hv-b"} {
		if e.snapshot(h) == nil {
			t.Errorf("%s's snapshot is gone", h)
		}
	}
}

// A running controller falls back to its last signed commit when a deep
// forgery hides every signed one from its walk, reading that commit from
// its copy of the snapshots branch. That copy is opened afresh every hour
// (at depth 1, holding the tip only): someone who pushes a deep forgery
// again and again is there when it renews, and the fallback finds its
// commit gone; every pass is then refused until a person comes.
func TestAttackDeepForgeryAcrossTheTipRenewal(t *testing.T) {
	e, key := newSigningEnv(t)
	e.forgeDeep(MaxLedgerWalk, false)
	e.pass() // repaired: the fallback
	if !e.signedBy(key) {
		t.Fatal("not repaired")
	}
	e.forgeDeep(MaxLedgerWalk, false)
	e.clock.Add(tipsRenewal + time.Minute)
	res, err := e.c.Pass(context.Background())
	if err != nil {
		t.Fatalf("pass after the tip repository was renewed: %v", err)
	}
	if !e.signedBy(key) || e.snapshot("hv-a").VM("web-01") == nil || e.snapshot("hv-a").VM("web-01").Tombstoned {
		t.Fatalf("not repaired: %+v", res)
	}
}
