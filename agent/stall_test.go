package agent_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// stalledRun is an agent's Run against a remote that accepts and never
// answers, timed: when Ready came, the gaps between watchdog pings, and
// how long Run took to return once cancelled.
type stalledRun struct {
	ready    time.Duration // from Run's start
	maxGap   time.Duration // longest gap between Alive calls
	pings    int
	stop     time.Duration // from cancel to Run's return
	rebooted bool          // the crashed VM was booted again during the stall
}

// runStalled accepts a snapshot with one VM over transport ("http" or
// "file"), stalls the remote, crashes the VM, and runs the agent for
// about runFor with tick interval tick and a git timeout far longer than
// the test, so a git operation is in flight all along; stopTimeout is the
// agent's (0: the default).
func runStalled(t testing.TB, transport string, tick, runFor, stopTimeout time.Duration) stalledRun {
	root := t.TempDir()
	bare := filepath.Join(root, "fleet.git")
	gittest.Git(t, "", "init", "--quiet", "--bare", "--initial-branch=main", bare)
	gittest.Git(t, bare, "config", "http.receivepack", "true")
	srv := gittest.ServeFaulty(t, root)
	url := map[string]string{"http": srv.HTTPURL + "/fleet.git", "file": "file://" + bare}[transport]
	h := newHostAgent(t, url, newClock(), nil)
	publish(t, bare, snap(1, vm("web-01")))
	require.NoError(t, h.once())
	boots := len(h.prov.Calls(agenttest.OpBoot))

	srv.Set(gittest.Stall, 0)
	h.prov.Crash("web-01")
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: url, CacheDir: filepath.Join(h.dir, "git"),
		Depth: 1, Timeout: time.Hour, Logger: quietLog().WithField("test", t.Name())})
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		res   stalledRun
		last  time.Time
		start = time.Now()
	)
	ag, err := agent.New(agent.Config{Host: testHost, Repo: repo, Engine: h.eng, Store: mustStore(t, h.dir),
		Version: "test", Log: quietLog(), TickInterval: tick, PollInterval: tick, StepTimeout: time.Hour, StopTimeout: stopTimeout,
		Ready: func() { res.ready = time.Since(start) },
		Alive: func() {
			mu.Lock()
			defer mu.Unlock()
			now := time.Now()
			if !last.IsZero() && now.Sub(last) > res.maxGap {
				res.maxGap = now.Sub(last)
			}
			last = now
			res.pings++
		}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ag.Run(ctx) }()
	time.Sleep(runFor)
	res.rebooted = len(h.prov.Calls(agenttest.OpBoot)) > boots
	stopAt := time.Now()
	cancel() // SIGTERM, with a fetch or a status write stalled in flight
	require.NoError(t, <-done)
	res.stop = time.Since(stopAt)
	mu.Lock()
	defer mu.Unlock()
	return res
}

// TestAgentReconcilesWhileGitStalls: with the remote stalled (a git
// operation in flight the whole time), the agent is ready at once, keeps
// ticking and pinging the watchdog, boots again a VM that crashed (from the
// last accepted snapshot), and stops when asked.
func TestAgentReconcilesWhileGitStalls(t *testing.T) {
	for _, transport := range []string{"http", "file"} {
		t.Run(transport, func(t *testing.T) {
			res := runStalled(t, transport, 100*time.Millisecond, 2*time.Second, 2*time.Second)
			assert.True(t, res.rebooted, "the crashed VM is booted again while git stalls")
			assert.Greater(t, res.pings, 2, "the reconcile loop kept ticking")
			t.Logf("%s stalled: ready after %v, %d watchdog pings, longest gap %v, stopped %v after cancel",
				transport, res.ready.Round(time.Millisecond), res.pings, res.maxGap.Round(time.Millisecond), res.stop.Round(time.Millisecond))
		})
	}
}

// BenchmarkAgentStalledRemote prints the figures of an agent whose remote
// stalls, with the default tick interval: READY after start (target ≤ 5 s),
// the longest watchdog gap (target ≤ tick + 1 s) and the time from SIGTERM
// to exit with a git operation in flight (target ≤ 15 s).
//
//	go test ./agent -run '^$' -bench AgentStalledRemote -benchtime 1x
func BenchmarkAgentStalledRemote(b *testing.B) {
	for _, transport := range []string{"http", "file"} {
		b.Run(transport, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				res := runStalled(b, transport, agent.DefaultTickInterval, 3*agent.DefaultTickInterval, 0)
				b.ReportMetric(res.ready.Seconds(), "ready-s")
				b.ReportMetric(res.maxGap.Seconds(), "max-watchdog-gap-s")
				b.ReportMetric(res.stop.Seconds(), "sigterm-exit-s")
			}
		})
	}
}
