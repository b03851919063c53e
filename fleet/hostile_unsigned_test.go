package fleet

import (
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/gitsource/gittest"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/trust"
	"github.com/gitfleet/gitfleet/trust/trusttest"
)

// TestHostileRetiredHostUnsignedCopyIsMarked: hv-d names an agentKey,
// runs nothing, and its Host file is removed (retired with nothing
// delivered: it leaves the Hosts table and liveness.yaml). Then an
// unsigned status claiming a running VM is pushed to its branch. Whatever
// of it the status branch shows (its copy hosts/hv-d.yaml, read by
// `gitfleet status`) must be marked unsigned; liveness.yaml is where
// `gitfleet status` reads that mark.
func TestHostileRetiredHostUnsignedCopyIsMarked(t *testing.T) {
	key := trusttest.NewSSHKey(t, "gitfleet-agent@hv-d")
	signer, err := trust.LoadCommitSigner(key.Private)
	if err != nil {
		t.Fatal(err)
	}
	files := baseFleet()
	files["hosts/hv-d.yaml"] = hostYAML("hv-d") + "  agentKey: " + key.Public + "\n"
	e := newEnv(t, files)
	e.pass()
	writeSignedStatus(t, e.url, &status.Status{Host: "hv-d", Heartbeat: 1, LastSeenEpoch: e.snapshot("hv-d").Epoch}, signer)
	e.pass()
	e.commit(gittest.Edit{Remove: []string{"hosts/hv-d.yaml"}})
	e.pass()
	forged := &status.Status{Host: "hv-d", Heartbeat: 2, LastSeenEpoch: 1,
		VMs: []status.VM{{Name: "claimed", Phase: status.PhaseReady, Power: "running"}}}
	writeStatus(t, e.url, forged) // unsigned
	e.pass()
	e.pass()
	cp := e.statusBranchFile(status.Path("hv-d"))
	if !strings.Contains(cp, "claimed") {
		t.Skipf("the unsigned status is not copied to the status branch: nothing shown unmarked\n%s", cp)
	}
	live, err := status.ParseLiveness(status.LivenessPath, []byte(e.statusFile(status.LivenessPath)))
	if err != nil {
		t.Fatal(err)
	}
	if rec := e.ledger().Hosts["hv-d"]; rec != nil {
		t.Logf("ledger keeps hv-d: agentKey %v, snapshot %q", rec.AgentKey != "", rec.Hash)
	} else {
		t.Logf("ledger has no record of hv-d")
	}
	if live["hv-d"].Unsigned == "" {
		t.Fatalf("the status branch copies hv-d's unsigned status (VM claimed, running), and liveness.yaml does not mark it unsigned: %+v\nREADME:\n%s", live["hv-d"], e.summary())
	}
}
