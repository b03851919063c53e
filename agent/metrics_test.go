package agent_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// value reads one sample of a gathered metric family; -1 when absent.
func value(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return -1
}

// The engine's metrics: VMs by phase, the epoch and the fence come from its
// report at scrape time; passes and create attempts are counted as they
// happen; an image collection sets the cache's size.
func TestEngineMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := agent.NewMetrics(reg)
	require.NoError(t, err)
	p := &collecting{Provisioner: agenttest.New()}
	f := newFixture(t, func(c *agent.EngineConfig) { c.Provisioner = p; c.Metrics = m })
	p.FailOnce(agenttest.OpBoot, assert.AnError)
	f.step(snap(3, vm("web-01"), vm("db-01", stopped)))
	f.step(nil)

	assert.Equal(t, 1.0, value(t, reg, "gitfleet_agent_vms", "phase", "ready"))
	assert.Equal(t, 1.0, value(t, reg, "gitfleet_agent_vms", "phase", "stopped"))
	assert.Equal(t, 0.0, value(t, reg, "gitfleet_agent_vms", "phase", "failed"), "every phase is exported, zero included")
	assert.Equal(t, 3.0, value(t, reg, "gitfleet_agent_snapshot_epoch"))
	assert.Equal(t, 0.0, value(t, reg, "gitfleet_agent_fence_violation"))
	assert.Equal(t, 0.0, value(t, reg, "gitfleet_agent_suspended"))
	assert.Equal(t, 2.0, value(t, reg, "gitfleet_agent_create_attempts_total", "result", "ok"))
	assert.Equal(t, 1.0, value(t, reg, "gitfleet_agent_create_attempts_total", "result", "failed"))
	assert.GreaterOrEqual(t, value(t, reg, "gitfleet_agent_vm_pass_seconds"), 3.0)
	assert.Equal(t, float64(1<<30), value(t, reg, "gitfleet_agent_image_cache_bytes"), "the size the last collection kept")
	assert.Equal(t, 1.0, value(t, reg, "gitfleet_agent_image_cache_removed_total"))

	// An edit that fails for good is not a create attempt.
	p.FailAlways(agenttest.OpStage, agent.Permanent(errors.New("fetch kernel: sha256 mismatch")))
	assert.Contains(t, row(t, f.step(snap(4, vm("web-01", vcpus(4)), vm("db-01", stopped))), "web-01").LastError, "edit to spec")
	assert.Equal(t, 1.0, value(t, reg, "gitfleet_agent_create_attempts_total", "result", "failed"), "the failed edit counted as a create")
	p.FailAlways(agenttest.OpStage, nil)

	f.step(suspended(snap(5, vm("web-01"), vm("db-01", stopped)), "maintenance"))
	assert.Equal(t, 1.0, value(t, reg, "gitfleet_agent_suspended"), "a suspended host says so")

	f.step(snap(2, vm("web-01")))
	assert.Equal(t, 1.0, value(t, reg, "gitfleet_agent_fence_violation"), "an older epoch fences the host")
	assert.Equal(t, 0.0, value(t, reg, "gitfleet_agent_vms_quarantined"))
	assert.Equal(t, 0.0, value(t, reg, "gitfleet_agent_vms_vanished"))
}

// The agent times git fetches and pushes and counts their failures; a
// snapshot that fetched but does not parse is no git failure.
func TestAgentGitMetrics(t *testing.T) {
	gittest.NeedGit(t)
	root := t.TempDir()
	bare := gittest.NewBare(t)
	require.NoError(t, os.Rename(bare, filepath.Join(root, "fleet.git")))
	bare = filepath.Join(root, "fleet.git")
	url := gittest.Serve(t, root) + "/fleet.git"
	reg := prometheus.NewRegistry()
	m, err := agent.NewMetrics(reg)
	require.NoError(t, err)
	store := mustStore(t, t.TempDir())
	eng, err := agent.NewEngine(agent.EngineConfig{Host: testHost, Store: store, Provisioner: agenttest.New(), Metrics: m, Log: quietLog()})
	require.NoError(t, err)
	t.Cleanup(func() { eng.Close(context.Background()) })
	// A heartbeat due at every step: each Once pushes its status.
	ag, err := agent.New(agent.Config{Host: testHost, Repo: mustOpen(t, url), Engine: eng, Store: store, Metrics: m, Heartbeat: time.Nanosecond})
	require.NoError(t, err)

	publish(t, bare, snap(1, vm("web-01")))
	require.NoError(t, ag.Once(context.Background()))
	assert.Equal(t, 1.0, value(t, reg, "gitfleet_agent_git_seconds", "op", "fetch"))
	assert.Equal(t, 1.0, value(t, reg, "gitfleet_agent_git_seconds", "op", "push"))
	assert.Equal(t, 0.0, value(t, reg, "gitfleet_agent_git_errors_total", "op", "push"))
	assert.Equal(t, 0.0, value(t, reg, "gitfleet_agent_git_errors_total", "op", "fetch"))

	gittest.Commit(t, bare, gittest.Edit{Branch: agent.SnapshotsBranch, Write: map[string]string{"hosts/" + testHost + ".yaml": "not: [a snapshot"}})
	_ = ag.Once(context.Background())
	assert.Equal(t, 0.0, value(t, reg, "gitfleet_agent_git_errors_total", "op", "fetch"), "a bad snapshot is not a git failure")

	require.NoError(t, os.Rename(bare, bare+".away"))
	assert.Error(t, ag.Once(context.Background()))
	assert.Equal(t, 1.0, value(t, reg, "gitfleet_agent_git_errors_total", "op", "fetch"))
	assert.Equal(t, 1.0, value(t, reg, "gitfleet_agent_git_errors_total", "op", "push"))
	assert.Equal(t, 1.0, value(t, reg, "gitfleet_agent_vms", "phase", "ready"), "the engine runs on")
}

// /healthz is 200 while ticks finish and 503 once the reconcile loop has
// finished none for three tick intervals.
func TestAgentHealthz(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	reg := prometheus.NewRegistry()
	m, err := agent.NewMetrics(reg)
	require.NoError(t, err)
	clk := newClock()
	store := mustStore(t, t.TempDir())
	eng, err := agent.NewEngine(agent.EngineConfig{Host: testHost, Store: store, Provisioner: agenttest.New(), Metrics: m, Now: clk.Now, Log: quietLog()})
	require.NoError(t, err)
	t.Cleanup(func() { eng.Close(context.Background()) })
	ag, err := agent.New(agent.Config{Host: testHost, Repo: mustOpen(t, bare), Engine: eng, Store: store, Metrics: m, TickInterval: 10 * time.Second})
	require.NoError(t, err)
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		ag.Healthz(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	code, body := get()
	assert.Equal(t, http.StatusOK, code, body)
	require.NoError(t, ag.Once(context.Background()))
	clk.Add(29 * time.Second)
	code, body = get()
	assert.Equal(t, http.StatusOK, code, body)
	clk.Add(2 * time.Second)
	code, body = get()
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "the reconcile loop is stuck")
}

// A VM with a backup policy on a backend that cannot read its disks: the
// backup fails, and the gauges an alert reads say so.
func TestBackupMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := agent.NewMetrics(reg)
	require.NoError(t, err)
	f := newFixture(t, func(c *agent.EngineConfig) { c.Metrics = m })
	backed := func(s *desired.VMSpec) {
		s.Backup = &desired.BackupPolicy{Repository: "nas", Schedule: "every 1h", Keep: desired.BackupKeep{Last: 1}}
	}
	f.step(snap(1, vm("web-01", backed)))
	f.step(nil)
	deadline := time.Now().Add(30 * time.Second)
	for value(t, reg, "gitfleet_agent_backup_failing", "vm", "web-01") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the backup never failed: %+v", row(t, f.eng.Report(), "web-01").Backup)
		}
		time.Sleep(20 * time.Millisecond)
	}
	assert.Equal(t, 0.0, value(t, reg, "gitfleet_agent_backup_last_success_timestamp_seconds", "vm", "web-01"))
	b := row(t, f.eng.Report(), "web-01").Backup
	require.NotNil(t, b)
	assert.Contains(t, b.LastError, agent.ErrBackupUnsupported.Error())
	assert.Equal(t, "ready", row(t, f.eng.Report(), "web-01").Phase, "the VM is untouched")
}
