package fleet

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gitfleet/gitfleet/gitsource/gittest"
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
