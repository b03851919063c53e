package fleet

import (
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// The status branch and the host branches in a repository of their own
// (Config.StatusURL), both repositories behind git http-backend: the
// agents write there, the controller reads their statuses, verifies
// their signatures, finalizes a signed ack and writes its summary and
// copies there, and the desired state's repository gets only its
// snapshots branch: no host branch, no status branch, ever.
func TestStatusInItsOwnRepository(t *testing.T) {
	files, _, signer := agentKeyFleet(t)
	files["vms/old-01.yaml"] = vmYAML("old-01", "hv-a", 1)
	e := newEnv(t, files)
	statusDir := gittest.NewBare(t)
	base := gittest.Serve(t, strings.TrimSuffix(e.dir, "/repo.git"))
	statusBase := gittest.Serve(t, strings.TrimSuffix(statusDir, "/repo.git"))
	e.url = base + "/repo.git"
	statusURL := statusBase + "/repo.git"
	c, err := New(Config{URL: e.url, StatusURL: statusURL, Clock: e.clock.Now, Logger: quietLogger(), SummaryInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	epoch := e.pass().Published["hv-a"]
	st := &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: epoch, VMs: []status.VM{{Name: "old-01", Phase: status.PhaseReady}}}
	writeSignedStatus(t, statusURL, st, signer)
	e.pass()
	if got := gittest.Show(t, statusDir, "refs/heads/"+DefaultStatusBranch, status.Path("hv-a")); !strings.Contains(got, "old-01") {
		t.Fatalf("the status repository's copy of hv-a: %s", got)
	}

	e.commit(gittest.Edit{Remove: []string{"vms/old-01.yaml"}, Message: "retire old-01"})
	tomb := e.pass().Published["hv-a"]
	if tomb == 0 {
		t.Fatal("old-01's tombstone was not published")
	}
	st.Heartbeat, st.LastSeenEpoch, st.VMs, st.Destroyed = 2, tomb, nil, []string{"old-01"}
	writeSignedStatus(t, statusURL, st, signer)
	res := e.pass()
	if len(res.Finalized) != 1 || res.Finalized[0] != "VM old-01@hv-a" || len(res.ForgedAcks) != 0 {
		t.Fatalf("finalized %v, forged %+v: the signed ack in the status repository should finalize old-01", res.Finalized, res.ForgedAcks)
	}
	if off, _ := e.c.live.offline("hv-a", e.clock.Now()); off {
		t.Error("hv-a writing to the status repository is offline")
	}
	if readme := gittest.Show(t, statusDir, "refs/heads/"+DefaultStatusBranch, status.SummaryPath); !strings.Contains(readme, "hv-a") {
		t.Errorf("the status repository's README.md does not list hv-a:\n%s", readme)
	}
	refs := gittest.Git(t, e.dir, "for-each-ref", "--format=%(refname)")
	if refs != "refs/heads/"+DefaultSnapshotsBranch+"\nrefs/heads/main" {
		t.Errorf("the desired state's repository holds %q, want main and the snapshots branch only", refs)
	}
	if gittest.Git(t, statusDir, "for-each-ref", "--format=%(refname)", "refs/heads/"+DefaultSnapshotsBranch) != "" {
		t.Error("the snapshots branch was written to the status repository")
	}
}
