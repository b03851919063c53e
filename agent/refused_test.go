package agent_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/internal/syncbuf"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// refusingHook is a pre-receive hook that declines every update of a
// host branch with a message of its own, as a git host's branch
// protection does; other branches pass.
const refusingHook = `while read old new ref; do
  case "$ref" in refs/heads/gitfleet/hosts/*)
    echo "GL-HOOK-ERR: $ref is protected: pushes by deploy keys are disabled (ticket OPS-1234)" >&2; exit 1;;
  esac
done
exit 0`

// A remote that refuses the status writes (a real pre-receive hook behind
// git http-backend) is named with its own message in the agent's log, in
// gitfleet_agent_status_write_refused and in /healthz (503, since the
// first refused write); the engine keeps reconciling, and once the
// remote takes a write again all three say so.
func TestAgentShowsARefusedStatusWriteWithTheRemotesMessage(t *testing.T) {
	gittest.NeedGit(t)
	root := t.TempDir()
	bare := filepath.Join(root, "fleet.git")
	require.NoError(t, os.Rename(gittest.NewBare(t), bare))
	url := gittest.Serve(t, root) + "/fleet.git"
	reg := prometheus.NewRegistry()
	m, err := agent.NewMetrics(reg)
	require.NoError(t, err)
	var logs syncbuf.Buffer
	clk := newClock()
	store := mustStore(t, t.TempDir())
	eng, err := agent.NewEngine(agent.EngineConfig{Host: testHost, Store: store, Provisioner: agenttest.New(), Metrics: m, Now: clk.Now, Log: logTo(&logs)})
	require.NoError(t, err)
	t.Cleanup(func() { eng.Close(context.Background()) })
	ag, err := agent.New(agent.Config{Host: testHost, Repo: mustOpen(t, url), Engine: eng, Store: store, Metrics: m, Heartbeat: time.Nanosecond})
	require.NoError(t, err)
	health := func() (int, string) {
		rec := httptest.NewRecorder()
		ag.Healthz(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	const said = "GL-HOOK-ERR: refs/heads/gitfleet/hosts/hv-a is protected: pushes by deploy keys are disabled (ticket OPS-1234)"

	publish(t, bare, snap(1, vm("web-01")))
	require.NoError(t, ag.Once(context.Background()))
	refusedAt := clk.Now()
	gittest.Hook(t, bare, "pre-receive", refusingHook)
	publish(t, bare, snap(2, vm("web-01"), vm("web-02")))
	err = ag.Once(context.Background())
	require.Error(t, err)
	assert.True(t, errors.Is(err, gitsource.ErrPushRefused), "%v", err)

	assert.Contains(t, logs.String(), "the remote refuses this host's status writes")
	assert.Contains(t, logs.String(), said, "the log carries the remote's own message")
	assert.Equal(t, 1.0, refusedMetric(t, reg, said))
	code, body := health()
	assert.Equal(t, http.StatusServiceUnavailable, code, body)
	assert.Contains(t, body, said)
	assert.Contains(t, body, "since "+refusedAt.UTC().Format(time.RFC3339))
	assert.Equal(t, 2.0, value(t, reg, "gitfleet_agent_vms", "phase", "ready"), "the engine acted on the new snapshot all the same")

	clk.Add(time.Minute)
	_ = ag.Once(context.Background())
	_, body = health()
	assert.Contains(t, body, "since "+refusedAt.UTC().Format(time.RFC3339), "the refusal counts from its first write")
	assert.Equal(t, 1, strings.Count(logs.String(), "the remote refuses this host's status writes"), "logged once while the message stays the same")

	require.NoError(t, os.Remove(filepath.Join(bare, "hooks", "pre-receive")))
	require.NoError(t, ag.Once(context.Background()))
	code, body = health()
	assert.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, -1.0, refusedMetric(t, reg, said), "no series while the remote takes the writes")
	assert.Contains(t, logs.String(), "the remote takes the status writes again")
}

// refusedMetric is gitfleet_agent_status_write_refused for a refusal
// whose error label contains said; -1 when there is none.
func refusedMetric(t *testing.T, reg *prometheus.Registry, said string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "gitfleet_agent_status_write_refused" {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, lp := range s.GetLabel() {
				if lp.GetName() == "error" && strings.Contains(lp.GetValue(), said) {
					return s.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}
