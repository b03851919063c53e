package fleet

import (
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/trusttest"
	"github.com/gitfleet/gitfleet/trust"
)

// For a Host naming spec.agentKey, an ack read from the old layout's file
// on the status branch (which no agent signs) is not acted on, even when
// it is the only status there is; the agent's signed status on its own
// branch finalizes. A volume's ack is held to the same rule as a VM's.
func TestAckNeedsTheHostsSignature(t *testing.T) {
	key := trusttest.NewSSHKey(t, "gitfleet-agent@hv-a")
	signer, err := trust.LoadCommitSigner(key.Private)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"hosts/hv-a.yaml": hostYAML("hv-a") + "  agentKey: " + key.Public + "\n",
		"vms/web-01.yaml": vmYAML("web-01", "hv-a", 1),
		"vms/old-01.yaml": vmYAML("old-01", "hv-a", 1),
		"vols/tmp.yaml":   volumeYAML("scratch", "hv-a", 1),
	}
	e := newEnv(t, files)
	e.pass()
	res := func() PassResult {
		e.commit(gittest.Edit{Remove: []string{"vms/old-01.yaml", "vols/tmp.yaml"}, Message: "retire old-01 and scratch"})
		return e.pass()
	}()
	if len(res.Tombstoned) != 2 {
		t.Fatalf("tombstoned = %v", res.Tombstoned)
	}
	epoch := res.Published["hv-a"]
	acks := &status.Status{Host: "hv-a", Heartbeat: 5, LastSeenEpoch: epoch, Destroyed: []string{"old-01"},
		Volumes: []status.Volume{{Name: "scratch", Present: false}}}

	writeOldStatus(t, e.url, acks)
	res = e.pass()
	if len(res.Finalized) != 0 || res.Pending != 2 {
		t.Fatalf("finalized %v, pending %d: an unsigned old-layout ack was acted on", res.Finalized, res.Pending)
	}
	if len(res.ForgedAcks) != 2 {
		t.Fatalf("forged acks = %+v, want the VM's and the volume's", res.ForgedAcks)
	}
	for _, f := range res.ForgedAcks {
		if f.Commit != "" || !strings.Contains(f.Reason, "old layout") {
			t.Errorf("forged ack %+v: want no commit and the old layout named", f)
		}
	}
	if got := metricValue(t, e.c, "gitfleet_controller_forged_acks"); got != 2 {
		t.Errorf("gitfleet_controller_forged_acks = %v, want 2", got)
	}

	acks.Heartbeat++
	writeSignedStatus(t, e.url, acks, signer)
	res = e.pass()
	if len(res.Finalized) != 2 || res.Pending != 0 || len(res.ForgedAcks) != 0 {
		t.Fatalf("finalized %v, pending %d, forged %+v: the signed ack should finalize both", res.Finalized, res.Pending, res.ForgedAcks)
	}
}

// A host whose Host file was deleted with deletes still pending acks them
// only with a status signed by the last agentKey its Host named, which the
// ledger keeps for it.
func TestAckOfDepartedHostNeedsItsLastAgentKey(t *testing.T) {
	files, key, signer := agentKeyFleet(t)
	e := newEnv(t, files)
	e.pass()
	if got := e.ledger().Hosts["hv-a"].AgentKey; got != key.Public {
		t.Fatalf("ledger agentKey of hv-a = %q, want the Host's", got)
	}
	e.commit(gittest.Edit{Remove: []string{"hosts/hv-a.yaml", "vms/web-01.yaml"}, Message: "retire hv-a"})
	res := e.pass()
	if len(res.Tombstoned) != 1 {
		t.Fatalf("tombstoned = %v, want web-01", res.Tombstoned)
	}
	if got := e.ledger().Hosts["hv-a"].AgentKey; got != key.Public {
		t.Fatalf("ledger agentKey of the departed hv-a = %q, want it kept", got)
	}
	acks := &status.Status{Host: "hv-a", Heartbeat: 5, LastSeenEpoch: res.Published["hv-a"], Destroyed: []string{"web-01"}}

	writeStatus(t, e.url, acks) // on its own branch, unsigned
	res = e.pass()
	if len(res.Finalized) != 0 || res.Pending != 1 || len(res.ForgedAcks) != 1 {
		t.Fatalf("finalized %v, pending %d, forged %+v: an unsigned ack of a departed host was acted on", res.Finalized, res.Pending, res.ForgedAcks)
	}

	acks.Heartbeat++
	writeSignedStatus(t, e.url, acks, signer)
	res = e.pass()
	if len(res.Finalized) != 1 || res.Pending != 0 || len(res.ForgedAcks) != 0 {
		t.Fatalf("finalized %v, pending %d, forged %+v: the signed ack should finalize", res.Finalized, res.Pending, res.ForgedAcks)
	}
}

// The first pass of a controller that has just started checks a departed
// host's acks against the agentKey the ledger kept, as every later pass
// does: it authenticates statuses before it has read any ledger, and an
// unsigned ack there was taken as a Host without agentKey.
func TestAckOfDepartedHostAfterRestart(t *testing.T) {
	key := trusttest.NewSSHKey(t, "gitfleet-agent@hv-a")
	files := baseFleet()
	files["hosts/hv-a.yaml"] = hostYAML("hv-a") + "  agentKey: " + key.Public + "\n"
	e := newEnv(t, files)
	e.pass()
	e.commit(gittest.Edit{Remove: []string{"hosts/hv-a.yaml", "vms/web-01.yaml"}, Message: "retire hv-a"})
	res := e.pass()
	if len(res.Tombstoned) != 1 {
		t.Fatalf("tombstoned = %v, want web-01", res.Tombstoned)
	}
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 5, LastSeenEpoch: res.Published["hv-a"], Destroyed: []string{"web-01"}})

	e.c = e.newController() // restarted
	res = e.pass()
	if len(res.Finalized) != 0 || res.Pending != 1 || len(res.ForgedAcks) != 1 {
		t.Fatalf("finalized %v, pending %d, forged %+v: the restarted controller acted on an unsigned ack of a departed host", res.Finalized, res.Pending, res.ForgedAcks)
	}
}

// agentKeyFleet is baseFleet with hv-a's Host naming a new agent key in
// spec.agentKey: the files, the key and its signer (the host's agent).
func agentKeyFleet(t *testing.T) (map[string]string, trusttest.SSHKey, *trust.CommitSigner) {
	t.Helper()
	key := trusttest.NewSSHKey(t, "gitfleet-agent@hv-a")
	signer, err := trust.LoadCommitSigner(key.Private)
	if err != nil {
		t.Fatal(err)
	}
	files := baseFleet()
	files["hosts/hv-a.yaml"] = hostYAML("hv-a") + "  agentKey: " + key.Public + "\n"
	return files, key, signer
}
