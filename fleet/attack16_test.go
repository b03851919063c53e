package fleet

import (
	"testing"

	"github.com/gitfleet/gitfleet/gitsource/gittest"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/trust"
	"github.com/gitfleet/gitfleet/trust/trusttest"
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
	key := trusttest.NewSSHKey(t, "gitfleet-agent@hv-a")
	signer, err := trust.LoadCommitSigner(key.Private)
	if err != nil {
		t.Fatal(err)
	}
	files := baseFleet()
	files["hosts/hv-a.yaml"] = hostYAML("hv-a") + "  agentKey: " + key.Public + "\n"
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
