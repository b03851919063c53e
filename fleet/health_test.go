package fleet

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The controller's /healthz follows its pass loop: "ok (starting)" before
// Run, "ok" once Run has ended a pass, and 503 naming the stuck loop when
// no pass has ended within the limit (three waits and two git timeouts),
// whatever the passes' outcomes.
func TestControllerHealthz(t *testing.T) {
	e := newEnv(t, baseFleet())
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		e.c.Healthz(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get(); code != http.StatusOK || !strings.Contains(body, "starting") {
		t.Fatalf("before Run: %d %q", code, body)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.c.Run(ctx, time.Hour) }()
	for e.c.health.lastPass.Load() == 0 {
		select {
		case err := <-done:
			t.Fatalf("Run returned before a pass ended: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	<-done
	if code, body := get(); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("after a pass: %d %q", code, body)
	}

	limit := e.c.healthLimit()
	git := e.c.cfg.GitTimeout
	if git <= 0 {
		git = time.Minute
	}
	// Run waits at most OfflineAfter/6 (the liveness's look gap), not the
	// hour asked for.
	// A pass that failed (git slow on a loaded machine) backs the wait
	// off; the limit follows the wait Run last chose.
	interval := min(time.Hour, e.c.cfg.OfflineAfter/6)
	wait := backoff(interval, e.c.failures)
	if want := 3*(wait+wait/2) + 2*git; limit != want {
		t.Errorf("limit %s, want %s (interval %s, %d failed passes)", limit, want, interval, e.c.failures)
	}
	e.clock.Add(limit + time.Second)
	code, body := get()
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "the pass loop is stuck") {
		t.Fatalf("past the limit: %d %q", code, body)
	}
}
