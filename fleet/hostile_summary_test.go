package fleet

import (
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/gitsource/gittest"
	"github.com/gitfleet/gitfleet/status"
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
	if s := e.summary(); contains(s, "carries no signature") == signed {
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

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
