package fleet

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/gitfleet/gitfleet/gitsource"
)

// health is what Healthz reads without the pass lock (a pass holds it for
// as long as git takes): when Run started, when the last pass ended
// (Unix nanoseconds of the controller's clock, 0 before the first) and
// the longest Run may wait before it starts the next one.
type health struct {
	started  atomic.Int64
	lastPass atomic.Int64
	maxWait  atomic.Int64
}

// healthLimit is how long the pass loop may go without ending a pass
// before Healthz calls it stuck: three waits between passes (the
// interval, or its back-off after failures) and two git timeouts, the
// most a pass waits on git before it fails.
func (c *Controller) healthLimit() time.Duration {
	git := c.cfg.GitTimeout
	if git <= 0 {
		git = gitsource.DefaultTimeout
	}
	return 3*time.Duration(c.health.maxWait.Load()) + 2*git
}

// Healthz answers a health check of the controller (GET /healthz on its
// --listen address): 200 "ok" while Run has ended a pass, of any outcome,
// within healthLimit (three intervals, or back-offs, and two git
// timeouts: 2 min 45 s by default), 503 with the reason otherwise. A
// failing git or a rejected commit does not make the controller
// unhealthy — the passes go on, and the metrics and the status README say
// why they fail; a wedged pass loop does. Before Run starts it answers
// 200 "ok (starting)".
func (c *Controller) Healthz(w http.ResponseWriter, _ *http.Request) {
	code, msg := c.healthAt(c.clock())
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	fmt.Fprintln(w, msg)
}

// healthAt is Healthz's answer at now.
func (c *Controller) healthAt(now time.Time) (int, string) {
	limit := c.healthLimit()
	started, last := c.health.started.Load(), c.health.lastPass.Load()
	switch {
	case started == 0:
		return http.StatusOK, "ok (starting)"
	case last == 0:
		if since := now.Sub(time.Unix(0, started)); since > limit {
			return http.StatusServiceUnavailable, fmt.Sprintf("no pass ended since the start %s ago (limit %s)", since.Round(time.Second), limit)
		}
		return http.StatusOK, "ok (starting)"
	}
	if since := now.Sub(time.Unix(0, last)); since > limit {
		return http.StatusServiceUnavailable, fmt.Sprintf("the last pass ended %s ago (limit %s): the pass loop is stuck", since.Round(time.Second), limit)
	}
	return http.StatusOK, "ok"
}
