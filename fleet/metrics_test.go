package fleet

import (
	"context"
	"io"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// TestMetricsExposition serves the controller's registry as --listen does
// and reads the series a scraper sees.
func TestMetricsExposition(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}})
	e.pass()
	srv := httptest.NewServer(promhttp.HandlerFor(e.c.Registry(), promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`gitfleet_controller_passes_total{result="published"} 2`,
		`gitfleet_controller_tombstones_pending 1`,
		`gitfleet_controller_host_epoch{host="hv-a"} 2`,
		`gitfleet_controller_host_epoch{host="hv-b"} 1`,
		`gitfleet_controller_rejected_commits_total 0`,
		`gitfleet_controller_pass_seconds_count 2`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
}

// The controller times its git operations like the agent: fetches and
// pushes in gitfleet_controller_git_seconds, failures apart in
// gitfleet_controller_git_errors_total.
func TestMetricsTimeGitOperations(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	scrape := func() map[string]float64 {
		t.Helper()
		families, err := e.c.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				key := f.GetName()
				for _, l := range m.GetLabel() {
					key += "/" + l.GetValue()
				}
				switch {
				case m.Histogram != nil:
					got[key] = float64(m.Histogram.GetSampleCount())
				case m.Counter != nil:
					got[key] = m.Counter.GetValue()
				}
			}
		}
		return got
	}
	m := scrape()
	// One pass: the desired and status branches fetched, the snapshots
	// (and the status README) pushed.
	if m["gitfleet_controller_git_seconds/fetch"] < 2 || m["gitfleet_controller_git_seconds/push"] < 1 {
		t.Errorf("git operations not timed: %v", m)
	}
	if m["gitfleet_controller_git_errors_total/fetch"] != 0 || m["gitfleet_controller_git_errors_total/push"] != 0 {
		t.Errorf("errors counted for a pass that worked: %v", m)
	}

	// The repository goes away: the fetch fails and is counted.
	if err := os.Rename(e.dir, e.dir+".away"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Pass(context.Background()); err == nil {
		t.Fatal("a pass without its repository succeeded")
	}
	if got := scrape()["gitfleet_controller_git_errors_total/fetch"]; got != 1 {
		t.Errorf("fetch errors = %v after a failed fetch, want 1", got)
	}
}
