package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// TestHostileIdleUnsignedHostWritesOncePerInterval: an idle fleet whose
// one agentKey host keeps heartbeating with unsigned status commits (an
// agent not yet given its key, or a forger) changes nothing but
// heartbeats. The summary's Unsigned note names the status commit, new
// with each heartbeat, so the summary differs in more than heartbeats
// and every pass writes the status branch: the idle bound (one status
// commit per SummaryInterval) does not hold.
func TestHostileIdleUnsignedHostWritesOncePerInterval(t *testing.T) {
	// The same fleet with signed heartbeats holds the bound.
	t.Run("signed", func(t *testing.T) { idleHeartbeats(t, true) })
	t.Run("unsigned", func(t *testing.T) { idleHeartbeats(t, false) })
}

func idleHeartbeats(t *testing.T, signed bool) {
	files, _, key := agentKeyFleet(t)
	var signer gitsource.CommitSigner
	if signed {
		signer = key
	}
	e := newEnv(t, files)
	e.c.cfg.SummaryInterval = DefaultSummaryInterval
	res := e.pass()
	st := &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: res.Published["hv-a"]}
	writeSignedStatus(t, e.url, st, signer)
	e.pass()
	e.pass()
	statusTip := func() string { return gittest.Rev(t, e.dir, "refs/heads/"+DefaultStatusBranch) }
	if s := e.summary(); strings.Contains(s, "carries no signature") == signed {
		t.Fatalf("README marks hv-a unsigned %v, want %v:\n%s", !signed, !signed, s)
	}
	writes := 0
	tip := statusTip()
	for i := 0; i < 9; i++ {
		e.clock.Add(time.Minute)
		st.Heartbeat++
		writeSignedStatus(t, e.url, st, signer)
		e.pass()
		if now := statusTip(); now != tip {
			writes++
			tip = now
		}
	}
	if writes > 1 {
		t.Fatalf("%d status commits in 9 minutes of an idle fleet (heartbeats only), want at most 1 per %s", writes, DefaultSummaryInterval)
	}
}

// TestHostileFailingRefreshKeepsStaleHostsUnderAFreshTime: passes fail
// (the desired branch is gone) while hv-a falls silent. The failing
// controller refreshes the status branch once per SummaryInterval with
// the last good summary: the README then says "Written at <now>", which
// its intro offers as the mark of the controller's current view, above a
// Hosts table that still shows hv-a online 20 minutes after its last
// heartbeat (OfflineAfter is 3 minutes). It must say that table is the
// view of the last pass that succeeded, and when that was.
func TestHostileFailingRefreshKeepsStaleHostsUnderAFreshTime(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.c.cfg.SummaryInterval = DefaultSummaryInterval
	e.pass()
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: 1})
	e.pass()
	if s := e.summary(); !strings.Contains(s, "| hv-a | online |") {
		t.Fatalf("hv-a not online:\n%s", s)
	}
	gittest.DeleteBranch(t, e.dir, "main")
	for i := 0; i < 2; i++ {
		e.clock.Add(DefaultSummaryInterval)
		if _, err := e.c.Pass(context.Background()); err == nil {
			t.Fatal("a pass without the desired branch did not fail")
		}
	}
	s := e.summary()
	if !strings.Contains(s, "Written at "+e.clock.Now().UTC().Format(time.RFC3339)+".") {
		t.Fatalf("the README was not refreshed:\n%s", s)
	}
	lastGood := e.clock.Now().Add(-2 * DefaultSummaryInterval).UTC().Format(time.RFC3339)
	if strings.Contains(s, "| hv-a | online |") && !strings.Contains(s, "Hosts, VMs and deletes below are as of "+lastGood+", the last pass that succeeded") {
		t.Fatalf("README written at %s (fresh) shows hv-a online, silent since %s, without saying it is the view of %s:\n%s",
			e.clock.Now().UTC().Format(time.RFC3339), lastGood, lastGood, s)
	}
}
