package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// statusBranchFile is path on the status branch, "" when absent.
func (e *env) statusBranchFile(path string) string {
	for _, f := range gittest.Files(e.t, e.dir, "refs/heads/"+DefaultStatusBranch) {
		if f == path {
			return gittest.Show(e.t, e.dir, "refs/heads/"+DefaultStatusBranch, path)
		}
	}
	return ""
}

// The controller alone writes the status branch: it copies each host
// branch's status there at once when it says something new (an ack, a
// phase), holds a heartbeat-only change back for SummaryInterval, and an
// ack read from the host branch finalizes the delete in the same pass.
func TestStatusCopiedFromHostBranches(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.c.cfg.SummaryInterval = 10 * time.Minute
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: 1,
		VMs: []status.VM{{Name: "web-01", Phase: status.PhaseReady, Power: "running"}}})
	res := e.pass()
	if !res.SummaryWritten || !strings.Contains(e.statusBranchFile(status.Path("hv-a")), "phase: ready") {
		t.Fatalf("the first status was not copied: %+v", res)
	}
	e.pass()
	statusTip := func() string { return gittest.Rev(t, e.dir, "refs/heads/"+DefaultStatusBranch) }
	tip := statusTip()
	for hb := uint64(2); hb <= 5; hb++ {
		e.clock.Add(time.Minute)
		writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: hb, LastSeenEpoch: 1,
			VMs: []status.VM{{Name: "web-01", Phase: status.PhaseReady, Power: "running"}}})
		if res := e.pass(); res.SummaryWritten || statusTip() != tip {
			t.Fatalf("heartbeat %d: a heartbeat alone was written within the interval: %+v", hb, res)
		}
	}
	if off, _ := e.c.live.offline("hv-a", e.clock.Now()); off {
		t.Fatal("hv-a heartbeats on its branch but reads offline")
	}
	e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}})
	e.pass()
	epoch := e.snapshot("hv-a").Epoch
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 6, LastSeenEpoch: epoch, Destroyed: []string{"web-01"}})
	e.clock.Add(time.Minute)
	res = e.pass()
	if len(res.Finalized) != 1 || !res.SummaryWritten {
		t.Fatalf("the ack on the host branch: %+v, want finalized and the status branch written", res)
	}
	if got := e.statusBranchFile(status.Path("hv-a")); !strings.Contains(got, "- web-01") || !strings.Contains(got, "heartbeat: 6") {
		t.Errorf("the ack was not copied at once:\n%s", got)
	}
	// Past the interval a lagging heartbeat is written once.
	e.pass()
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 7, LastSeenEpoch: epoch, Destroyed: []string{"web-01"}})
	e.clock.Add(11 * time.Minute)
	if res := e.pass(); !res.SummaryWritten || !strings.Contains(e.statusBranchFile(status.Path("hv-a")), "heartbeat: 7") {
		t.Fatalf("a heartbeat held past the interval was not written: %+v", res)
	}
}

// Migration: a host whose agent still writes the shared status branch (the
// old layout) is read from there, ack and liveness alike; once its agent
// writes its own branch, that branch is read and copied over the old file.
func TestStatusOldLayoutReadUntilHostBranch(t *testing.T) {
	e := newEnv(t, baseFleet())
	writeOldStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 10, LastSeenEpoch: 1})
	e.pass()
	e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}})
	e.pass()
	epoch := e.snapshot("hv-a").Epoch
	writeOldStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 11, LastSeenEpoch: epoch, Destroyed: []string{"web-01"}})
	if res := e.pass(); len(res.Finalized) != 1 {
		t.Fatalf("an ack in the old layout was not read: %+v", res)
	}
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 12, LastSeenEpoch: epoch, SnapshotError: "from the host branch"})
	e.pass()
	if got := e.statusBranchFile(status.Path("hv-a")); !strings.Contains(got, "from the host branch") {
		t.Fatalf("the host branch did not replace the old file:\n%s", got)
	}
	// An old agent's late write is overruled by the host branch.
	writeOldStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 13, LastSeenEpoch: epoch, SnapshotError: "late old agent"})
	e.pass()
	if got := e.statusBranchFile(status.Path("hv-a")); !strings.Contains(got, "from the host branch") {
		t.Fatalf("an old-layout write overruled the host branch:\n%s", got)
	}
}

// A host branch speaks for its host only: another host's file on it is
// not read, and a branch one level deeper is no host's.
func TestHostBranchSpeaksForItsHostOnly(t *testing.T) {
	e := newEnv(t, baseFleet())
	forged, err := status.Marshal(&status.Status{Host: "hv-b", Heartbeat: 1, LastSeenEpoch: 1, Destroyed: []string{"db-01"}})
	if err != nil {
		t.Fatal(err)
	}
	gittest.Commit(t, e.dir, gittest.Edit{Branch: status.HostBranch("hv-a"), Write: map[string]string{status.Path("hv-b"): string(forged)}})
	gittest.Commit(t, e.dir, gittest.Edit{Branch: status.HostBranchPrefix + "hv-b/x", Write: map[string]string{status.Path("hv-b"): string(forged)}})
	e.pass()
	if got := e.statusBranchFile(status.Path("hv-b")); got != "" {
		t.Fatalf("a forged file was copied:\n%s", got)
	}
	_, reps, _, _, err := e.c.readStatuses(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, rep := range reps {
		if rep.Host == "hv-b" {
			t.Fatalf("hv-b's status was read from another branch: %+v", rep)
		}
	}
}

// A host branch whose status file is over the size limit is never copied,
// so it must not count as a copy lagging with news: the other hosts'
// heartbeats stay held back for the interval as before.
func TestOversizedHostStatusHoldsNoHeartbeatBack(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.c.cfg.SummaryInterval = 10 * time.Minute
	gittest.Commit(t, e.dir, gittest.Edit{Branch: status.HostBranch("hv-b"),
		Write: map[string]string{status.Path("hv-b"): strings.Repeat("#", status.MaxFileBytes+1)}})
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: 1})
	e.pass()
	e.pass()
	tip := gittest.Rev(t, e.dir, "refs/heads/"+DefaultStatusBranch)
	for hb := uint64(2); hb <= 4; hb++ {
		e.clock.Add(time.Minute)
		writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: hb, LastSeenEpoch: 1})
		if res := e.pass(); res.SummaryWritten || gittest.Rev(t, e.dir, "refs/heads/"+DefaultStatusBranch) != tip {
			t.Fatalf("heartbeat %d was written within the interval because of hv-b's oversized file: %+v", hb, res)
		}
	}
}
