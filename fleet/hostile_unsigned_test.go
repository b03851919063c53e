package fleet

import (
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/trusttest"
	"github.com/gitfleet/gitfleet/trust"
)

// TestHostileRetiredHostUnsignedCopyIsMarked: hv-d names an agentKey,
// runs nothing, and its Host file is removed (retired with nothing
// delivered: it leaves the Hosts table and liveness.yaml). Then an
// unsigned status claiming a running VM is pushed to its branch. Whatever
// of it the status branch shows must be marked: the README's row of the
// claimed VM as unsigned, and its copy hosts/hv-d.yaml, which `gitfleet
// status` reads, by liveness.yaml not listing hv-d (status then notes on
// each of its VMs that the controller neither verifies nor acts on it:
// cmd/gitfleet TestHostileStatusRetiredUnsignedHost).
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
	// Whether the copy is there or not, nothing of it may show unmarked.
	copied := strings.Contains(e.statusBranchFile(status.Path("hv-d")), "claimed")
	live, err := status.ParseLiveness(status.LivenessPath, []byte(e.statusFile(status.LivenessPath)))
	if err != nil {
		t.Fatal(err)
	}
	if rec := e.ledger().Hosts["hv-d"]; rec != nil {
		t.Logf("ledger keeps hv-d: agentKey %v, snapshot %q", rec.AgentKey != "", rec.Hash)
	} else {
		t.Logf("ledger has no record of hv-d")
	}
	if row, listed := live["hv-d"]; copied && listed && row.Unsigned == "" {
		t.Fatalf("liveness.yaml lists hv-d unmarked, whose unsigned status (VM claimed, running) the status branch copies: %+v", row)
	}
	readme := e.summary()
	for _, line := range strings.Split(readme, "\n") {
		if strings.HasPrefix(line, "| claimed |") && !strings.Contains(line, status.UnsignedNote) {
			t.Fatalf("README shows what hv-d's unsigned status claims unmarked: %s\n%s", line, readme)
		}
	}
	if !strings.Contains(readme, "| claimed | hv-d |") {
		t.Fatalf("README does not list the claimed VM at all:\n%s", readme)
	}
}

// TestHostileUnsignedUnmanagedVMIsMarked: hv-a's Host names an agentKey;
// an unsigned status on its branch claims a VM the desired state does not
// have. Every README row that shows what that status claims must carry
// the unsigned mark; the "On hosts, not in the desired state" section
// lists the claimed VM as kept, unmarked.
func TestHostileUnsignedUnmanagedVMIsMarked(t *testing.T) {
	files, _, _ := agentKeyFleet(t)
	e := newEnv(t, files)
	res := e.pass()
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: res.Published["hv-a"],
		VMs: []status.VM{{Name: "claimed", Phase: status.PhaseReady, Power: "running"}}})
	e.pass()
	e.pass()
	readme := e.summary()
	rows := 0
	for _, line := range strings.Split(readme, "\n") {
		if !strings.HasPrefix(line, "| claimed |") {
			continue
		}
		rows++
		if !strings.Contains(line, "not signed") {
			t.Errorf("a row of hv-a's unsigned status is not marked unsigned: %s", line)
		}
	}
	if rows == 0 {
		t.Fatalf("the claimed VM is not shown at all:\n%s", readme)
	}
	if t.Failed() {
		t.Logf("README:\n%s", readme)
	}
}
