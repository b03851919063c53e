package fleet

import (
	"os/exec"
	"testing"

	"github.com/gitfleet/gitfleet/gitsource/gittest"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/trust/trusttest"
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
