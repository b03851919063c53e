package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// lastWrite is last-write.yaml on the status branch, parsed.
func (e *env) lastWrite() status.LastWrite {
	e.t.Helper()
	w, err := status.ParseLastWrite(status.LastWritePath, []byte(e.statusFile(status.LastWritePath)))
	if err != nil {
		e.t.Fatal(err)
	}
	return w
}

// A fleet where nothing changes — no heartbeat either — still has its
// status branch written once per SummaryInterval, each write saying when:
// `gitfleet status` tells a running controller's view from a stopped
// one's. Within the interval nothing is written (issue 15's idle fleet).
func TestIdleFleetRefreshesLastWrite(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.c.cfg.SummaryInterval = DefaultSummaryInterval
	start := e.clock.Now()
	e.pass()
	e.pass() // sees its own writes
	if w := e.lastWrite(); !w.At.Equal(start) || w.Refresh() != DefaultSummaryInterval {
		t.Fatalf("last-write.yaml = %+v, want at %s, refresh %s", w, start, DefaultSummaryInterval)
	}
	statusTip := func() string { return gittest.Rev(t, e.dir, "refs/heads/"+DefaultStatusBranch) }
	tip := statusTip()
	for i := 0; i < 9; i++ {
		e.clock.Add(time.Minute)
		if res := e.pass(); res.SummaryWritten || statusTip() != tip {
			t.Fatalf("minute %d: the status branch was written with nothing changed", i+1)
		}
	}
	e.clock.Add(time.Minute)
	if res := e.pass(); !res.SummaryWritten || statusTip() == tip {
		t.Fatal("no write after SummaryInterval of nothing changed: a reader cannot tell this controller runs")
	}
	if w := e.lastWrite(); !w.At.Equal(e.clock.Now()) || w.Stale(e.clock.Now()) {
		t.Fatalf("last-write.yaml = %+v, want at %s, not stale", w, e.clock.Now())
	}
	// The README, which people browse, says the same time and when it
	// goes stale.
	readme := e.statusFile(status.SummaryPath)
	for _, want := range []string{"Written at " + e.clock.Now().UTC().Format(time.RFC3339) + ".", "at least every 10m0s", "older than 30m0s"} {
		if !strings.Contains(readme, want) {
			t.Errorf("README does not say %q:\n%s", want, readme)
		}
	}
	if w := e.lastWrite(); !w.Stale(e.clock.Now().Add(status.StaleRefreshes*DefaultSummaryInterval + time.Second)) {
		t.Fatalf("last-write.yaml = %+v: not stale %d intervals later", w, status.StaleRefreshes)
	}
}

// A controller whose passes keep failing the same way writes nothing new,
// but still refreshes last-write.yaml once per SummaryInterval: it is
// failing, not stopped, and `gitfleet status` must not call it stale.
func TestFailingControllerRefreshesLastWrite(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.c.cfg.SummaryInterval = DefaultSummaryInterval
	e.pass()
	gittest.DeleteBranch(t, e.dir, "main")
	if _, err := e.c.Pass(context.Background()); err == nil {
		t.Fatal("a pass without the desired branch did not fail")
	}
	statusTip := func() string { return gittest.Rev(t, e.dir, "refs/heads/"+DefaultStatusBranch) }
	tip := statusTip()
	e.clock.Add(time.Minute)
	if _, err := e.c.Pass(context.Background()); err == nil || statusTip() != tip {
		t.Fatalf("the same failure a minute later: %v, status branch moved %v", err, statusTip() != tip)
	}
	e.clock.Add(DefaultSummaryInterval)
	if _, err := e.c.Pass(context.Background()); err == nil {
		t.Fatal("the pass did not fail")
	}
	if w := e.lastWrite(); !w.At.Equal(e.clock.Now()) {
		t.Fatalf("last-write.yaml = %+v, want refreshed at %s", w, e.clock.Now())
	}
	if e.statusFile(status.ControllerPath) == "" {
		t.Fatal("the refresh dropped the failure's record")
	}
}
