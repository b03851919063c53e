package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// hostAgent is one host's agent over a real bare repository: the state
// directory, the in-memory backend and a clock survive restarts.
type hostAgent struct {
	t     testing.TB
	url   string
	dir   string
	prov  *agenttest.Provisioner
	clock *clock
	tune  func(*agent.EngineConfig)
	// appendStatus is agent.Config.AppendStatus.
	appendStatus bool
	// controllerKeys, signingKey and metrics are agent.Config's.
	controllerKeys agent.CommitVerifier
	signingKey     gitsource.CommitSigner
	metrics        *agent.Metrics

	eng *agent.Engine
	ag  *agent.Agent
}

func quietLog() *logrus.Logger { return logTo(io.Discard) }

// logTo is a logger writing its lines (info and up) to w.
func logTo(w io.Writer) *logrus.Logger {
	l := logrus.New()
	l.SetOutput(w)
	return l
}

func newHostAgent(t testing.TB, url string, clk *clock, tune func(*agent.EngineConfig)) *hostAgent {
	h := &hostAgent{t: t, url: url, dir: t.TempDir(), prov: agenttest.New(), clock: clk, tune: tune}
	h.start()
	return h
}

func (h *hostAgent) start() {
	t := h.t
	t.Helper()
	store, err := agent.OpenStore(filepath.Join(h.dir, "state"))
	require.NoError(t, err)
	repo, err := gitsource.Open(context.Background(), gitsource.Options{
		URL: h.url, CacheDir: filepath.Join(h.dir, "git"), Depth: 1, Logger: quietLog().WithField("test", t.Name()),
	})
	require.NoError(t, err)
	cfg := agent.EngineConfig{Host: testHost, Store: store, Provisioner: h.prov, BootID: func() string { return "boot-1" },
		Now: h.clock.Now, Log: quietLog()}
	if h.tune != nil {
		h.tune(&cfg)
	}
	h.eng, err = agent.NewEngine(cfg)
	require.NoError(t, err)
	// BootID, Now and Log come from the engine, so the agent's own log lines
	// go where a test's tune sends the engine's.
	h.ag, err = agent.New(agent.Config{Host: testHost, Repo: repo, Engine: h.eng, Store: store, Version: "test", AppendStatus: h.appendStatus,
		ControllerKeys: h.controllerKeys, SigningKey: h.signingKey, Metrics: h.metrics})
	require.NoError(t, err)
	eng := h.eng
	t.Cleanup(func() { eng.Close(context.Background()) })
}

func (h *hostAgent) restart() {
	h.eng.Close(context.Background())
	h.start()
}

func (h *hostAgent) once() error {
	return h.ag.Once(context.Background())
}

// publish commits snap as the host's snapshot, as the controller would.
func publish(t testing.TB, bare string, s *snapshots.Snapshot) string {
	t.Helper()
	data, err := snapshots.MarshalSnapshot(s)
	require.NoError(t, err)
	return gittest.Commit(t, bare, gittest.Edit{Branch: agent.SnapshotsBranch, Write: map[string]string{"hosts/" + s.Host + ".yaml": string(data)}})
}

// readStatus reads the host's status from its host branch; nil when none.
func readStatus(t *testing.T, bare string) *status.Status {
	t.Helper()
	out, err := gitShow(bare, status.HostBranch(testHost)+":"+status.Path(testHost))
	if err != nil {
		return nil
	}
	st, err := status.Parse("hosts/"+testHost+".yaml", out)
	require.NoError(t, err)
	return st
}

func statusTip(t *testing.T, bare string) string {
	t.Helper()
	return gittest.Git(t, bare, "rev-parse", status.HostBranch(testHost))
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

// It says why, once per snapshots tip: an agent whose host name matches no
// Host object is otherwise silent.
func TestAgentWithoutASnapshotDoesNothingButReport(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	var logs bytes.Buffer
	h := newHostAgent(t, bare, newClock(), func(c *agent.EngineConfig) { c.Log = logTo(&logs) })
	require.NoError(t, h.once())
	assert.Contains(t, logs.String(), "no snapshot for host "+testHost+": branch gitfleet/snapshots does not exist yet")
	assert.Empty(t, h.prov.AllCalls())
	st := readStatus(t, bare)
	require.NotNil(t, st, "the status is written for liveness")
	assert.Empty(t, st.VMs)
	assert.Zero(t, st.LastSeenEpoch)

	// A snapshots branch without this host's file is still "no snapshot".
	logs.Reset()
	publish(t, bare, &snapshots.Snapshot{Host: "hv-b", Epoch: 1})
	require.NoError(t, h.once())
	assert.Empty(t, h.prov.AllCalls())
	assert.Contains(t, logs.String(), "has no hosts/"+testHost+".yaml; is the controller running, and does the desired state have a Host object named exactly")
	logs.Reset()
	require.NoError(t, h.once())
	assert.NotContains(t, logs.String(), "no snapshot for host", "said once per snapshots tip")
}

func TestAgentMakesThePublishedVMsAndReportsThem(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	h := newHostAgent(t, bare, newClock(), nil)
	s := withVolumes(snap(1, vm("web-01", volumes("data"))), vol("data", 1))
	s.Source = snapshots.SnapshotSource{Commit: "abc", Branch: "main"}
	publish(t, bare, s)
	require.NoError(t, h.once())

	st := readStatus(t, bare)
	require.NotNil(t, st)
	assert.Equal(t, testHost, st.Host)
	assert.Equal(t, uint64(1), st.LastSeenEpoch)
	assert.Equal(t, status.AgentInfo{Version: "test", BootID: "boot-1", Accel: "none"}, st.Agent)
	require.Len(t, st.VMs, 1)
	assert.Equal(t, status.PhaseReady, st.VMs[0].Phase)
	assert.Equal(t, "10.77.1.2", st.VMs[0].IP)
	assert.Equal(t, []status.Volume{{Name: "data", Present: true, SizeGB: 1}}, st.Volumes)
	assert.Equal(t, uint64(1), st.Heartbeat)
}

// The agent writes its own branch, gitfleet/hosts/<host>, whose history
// grows with events: heartbeats move the branch between two heartbeat-only
// commits (the second replaced the first; from the third on they
// alternate, heartbeats 2 and 3), a change is kept. With appendStatus
// every heartbeat is a commit.
func TestAgentStatusHistoryGrowsWithEvents(t *testing.T) {
	for _, appendStatus := range []bool{false, true} {
		t.Run(fmt.Sprintf("appendStatus=%v", appendStatus), func(t *testing.T) {
			gittest.NeedGit(t)
			bare := gittest.NewBare(t)
			clk := newClock()
			h := &hostAgent{t: t, url: bare, dir: t.TempDir(), prov: agenttest.New(), clock: clk, appendStatus: appendStatus}
			h.start()
			publish(t, bare, snap(1, vm("web-01")))
			require.NoError(t, h.once())
			for i := 0; i < 4; i++ {
				clk.Add(61 * time.Second)
				require.NoError(t, h.once())
			}
			if appendStatus {
				assert.Equal(t, uint64(5), readStatus(t, bare).Heartbeat)
			} else {
				assert.Equal(t, uint64(3), readStatus(t, bare).Heartbeat, "the fifth write points the branch back at heartbeat 3")
			}
			commits := gittest.Git(t, bare, "rev-list", "--count", status.HostBranch(testHost))
			if appendStatus {
				assert.Equal(t, "5", commits, "every write appended")
			} else {
				assert.Equal(t, "2", commits, "the first write, and one heartbeat commit replaced since")
			}
			h.prov.Crash("web-01")
			h.prov.FailAlways(agenttest.OpBoot, errTransient)
			require.NoError(t, h.once())
			clk.Add(61 * time.Second)
			require.NoError(t, h.once())
			failed := gittest.Git(t, bare, "log", "--format=%s", "-1", status.HostBranch(testHost)+"^")
			assert.Equal(t, "status: "+testHost+" heartbeat 6", failed, "the failure stays in history under the next heartbeat")
			assert.Contains(t, gittest.Show(t, bare, status.HostBranch(testHost)+"^", status.Path(testHost)), "phase: failed")
			_, err := gitShow(bare, agent.StatusBranch+":"+status.Path(testHost))
			assert.Error(t, err, "the agent does not write the shared status branch")
		})
	}
}

func TestAgentWritesStatusOnlyOnChangeOrHeartbeat(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	clk := newClock()
	h := newHostAgent(t, bare, clk, nil)
	publish(t, bare, snap(1, vm("web-01")))
	require.NoError(t, h.once())
	tip := statusTip(t, bare)

	clk.Add(30 * time.Second)
	require.NoError(t, h.once())
	assert.Equal(t, tip, statusTip(t, bare), "nothing changed, heartbeat not due: no commit")

	clk.Add(31 * time.Second)
	require.NoError(t, h.once())
	assert.NotEqual(t, tip, statusTip(t, bare), "the heartbeat is due")
	assert.Equal(t, uint64(2), readStatus(t, bare).Heartbeat)

	tip = statusTip(t, bare)
	h.prov.Crash("web-01")
	h.prov.FailAlways(agenttest.OpBoot, errTransient)
	require.NoError(t, h.once())
	assert.NotEqual(t, tip, statusTip(t, bare), "a changed status is written at once")
	assert.Equal(t, status.PhaseFailed, readStatus(t, bare).VMs[0].Phase)

	t.Run("the heartbeat counter survives restarts and a lost state file", func(t *testing.T) {
		h.restart()
		clk.Add(time.Minute)
		require.NoError(t, h.once())
		assert.Equal(t, uint64(4), readStatus(t, bare).Heartbeat)
		require.NoError(t, os.Remove(filepath.Join(h.dir, "state", "heartbeat")))
		h.restart()
		clk.Add(time.Minute)
		require.NoError(t, h.once())
		assert.Equal(t, uint64(5), readStatus(t, bare).Heartbeat, "never below the branch's")
	})
}

func TestAgentRefusesASnapshotThatDoesNotParse(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	h := newHostAgent(t, bare, newClock(), nil)
	publish(t, bare, snap(1, vm("web-01")))
	require.NoError(t, h.once())

	gittest.Commit(t, bare, gittest.Edit{Branch: agent.SnapshotsBranch, Write: map[string]string{"hosts/hv-a.yaml": "host: hv-a\nepoch: 2\nvms: [{name: web-01, bogus: 1}]\n"}})
	h.prov.Crash("web-01")
	h.prov.ResetCalls()
	require.NoError(t, h.once(), "a refused snapshot is reported in status, not a failed step")
	st := readStatus(t, bare)
	assert.Contains(t, st.SnapshotError, "snapshot refused")
	assert.Contains(t, st.SnapshotError, "hosts/hv-a.yaml")
	assert.Equal(t, uint64(1), st.LastSeenEpoch)
	require.Len(t, st.VMs, 1, "never read as an empty desired state")
	assert.Equal(t, status.PhaseReady, st.VMs[0].Phase, "the last accepted snapshot is still reconciled")
	assert.Empty(t, h.prov.Calls(agenttest.OpShutdown))

	publish(t, bare, snap(3, vm("web-01")))
	require.NoError(t, h.once())
	st = readStatus(t, bare)
	assert.Empty(t, st.SnapshotError)
	assert.Equal(t, uint64(3), st.LastSeenEpoch)
}

// A hand edit of the snapshots branch that keeps the epoch (a VM removed,
// another tombstoned) is refused and reported; the host keeps both VMs.
func TestAgentRefusesAHandEditAtTheSameEpoch(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	clk := newClock()
	h := newHostAgent(t, bare, clk, nil)
	publish(t, bare, snap(6, vm("web-01"), vm("db-01")))
	require.NoError(t, h.once())
	h.prov.ResetCalls()

	publish(t, bare, snap(6, tombstoned(vm("db-01"))))
	require.NoError(t, h.once(), "a fenced snapshot is reported in status, not a failed step")
	clk.Add(24 * time.Hour)
	h.restart()
	require.NoError(t, h.once())
	st := readStatus(t, bare)
	assert.True(t, st.FenceViolation)
	assert.Contains(t, st.SnapshotError, "differs from the one accepted")
	assert.Equal(t, uint64(6), st.LastSeenEpoch)
	assert.Empty(t, h.prov.AllCalls(), "nothing shut down, nothing destroyed")
	assert.Len(t, st.VMs, 2)
	assert.Empty(t, st.Quarantined)
	assert.Empty(t, st.Destroyed)

	publish(t, bare, snap(7, vm("web-01"), vm("db-01")))
	require.NoError(t, h.once())
	st = readStatus(t, bare)
	assert.False(t, st.FenceViolation)
	assert.Empty(t, st.SnapshotError)
	assert.Equal(t, uint64(7), st.LastSeenEpoch)
}

// A repository restored from a backup that lacks a VM publishes a higher
// epoch without it and without a tombstone: the VM is reported, shut down
// after the vanish grace and kept, never destroyed.
func TestAgentKeepsAVMARestoredRepositoryForgot(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	clk := newClock()
	h := newHostAgent(t, bare, clk, nil)
	publish(t, bare, snap(7, vm("web-01"), vm("db-01")))
	require.NoError(t, h.once())

	publish(t, bare, snap(8, vm("db-01")))
	require.NoError(t, h.once())
	st := readStatus(t, bare)
	require.Len(t, st.Vanished, 1)
	assert.Equal(t, "web-01", st.Vanished[0].Name)
	assert.Equal(t, clk.Now(), st.Vanished[0].Since)
	assert.False(t, st.Vanished[0].Quarantined)
	assert.True(t, h.prov.Running("web-01"), "left as it is")

	clk.Add(7 * 24 * time.Hour)
	h.restart()
	require.NoError(t, h.once())
	st = readStatus(t, bare)
	require.Len(t, st.Vanished, 1)
	assert.True(t, st.Vanished[0].Quarantined)
	assert.Contains(t, st.Vanished[0].Reason, "only a tombstone deletes it")
	assert.False(t, h.prov.Running("web-01"))
	assert.Empty(t, h.prov.Calls(agenttest.OpDestroy))
	assert.Empty(t, st.Destroyed)
}

func TestAgentKeepsConvergingWhileGitIsUnreachable(t *testing.T) {
	gittest.NeedGit(t)
	root := t.TempDir()
	bare := gittest.NewBare(t)
	require.NoError(t, os.Rename(bare, filepath.Join(root, "fleet.git")))
	url := gittest.Serve(t, root) + "/fleet.git"
	bare = filepath.Join(root, "fleet.git")
	h := newHostAgent(t, url, newClock(), nil)
	publish(t, bare, snap(1, vm("web-01"), vm("web-02")))
	require.NoError(t, h.once())

	require.NoError(t, os.Rename(bare, bare+".away")) // the server answers 404 now
	h.restart()
	h.prov.Reboot()
	err := h.once()
	require.Error(t, err, "the status cannot be written")
	assert.ElementsMatch(t, []string{"web-01", "web-02", "web-01", "web-02"}, h.prov.Calls(agenttest.OpBoot), "the lost VMs are booted again from the snapshot on disk")
	assert.Equal(t, 2, h.prov.RunningCount())

	require.NoError(t, os.Rename(bare+".away", bare))
	require.NoError(t, h.once())
	assert.Len(t, readStatus(t, bare).VMs, 2)
}

func TestAgentRunStopsWithoutTouchingVMs(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	h := newHostAgent(t, bare, newClock(), nil)
	publish(t, bare, snap(1, vm("web-01")))
	require.NoError(t, h.once())
	h.prov.ResetCalls()
	h.prov.Crash("web-01")

	ctx, cancel := context.WithCancel(context.Background())
	ticked := make(chan struct{}, 1)
	ag, err := agent.New(agent.Config{Host: testHost, Repo: mustOpen(t, bare), Engine: h.eng, Store: mustStore(t, h.dir),
		Version: "test", Now: h.clock.Now, Log: quietLog(), TickInterval: time.Hour,
		Alive: func() {
			select {
			case ticked <- struct{}{}:
			default:
			}
		}})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- ag.Run(ctx) }()
	<-ticked // the first tick ran (the watchdog ping follows every tick)
	cancel() // SIGTERM
	require.NoError(t, <-done)
	assert.Empty(t, h.prov.Calls(agenttest.OpShutdown), "stopping the agent stops no VM")
	assert.Empty(t, h.prov.Calls(agenttest.OpDestroy))
	st := readStatus(t, bare)
	require.Len(t, st.VMs, 1)
	assert.Equal(t, status.PhaseReady, st.VMs[0].Phase, "the tick under way finished and its status was written")
}

func mustOpen(t testing.TB, url string) *gitsource.Repo {
	t.Helper()
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: url, Depth: 1, Logger: quietLog().WithField("test", t.Name())})
	require.NoError(t, err)
	return repo
}

func mustStore(t testing.TB, dir string) *agent.Store {
	t.Helper()
	st, err := agent.OpenStore(filepath.Join(dir, "state"))
	require.NoError(t, err)
	return st
}

func gitShow(bare, rev string) ([]byte, error) {
	cmd := exec.Command("git", "--git-dir", bare, "show", rev)
	return cmd.Output()
}

func TestSecretsStayOutOfStatusAndLogs(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	const userData, key = "#cloud-config\npassword: hunter2-user-data\n", "ssh-ed25519 AAAAC3NzaSECRETKEY"
	var logs bytes.Buffer
	log := logTo(&logs)
	log.SetLevel(logrus.DebugLevel)
	h := newHostAgent(t, bare, newClock(), func(c *agent.EngineConfig) { c.Log = log }) // the agent's log too
	secret := vm("web-01", func(s *desired.VMSpec) {
		s.CloudInit = &desired.CloudInit{UserData: userData, SSHAuthorizedKeys: []string{key}}
	})
	h.prov.FailOnce(agenttest.OpBoot, errTransient) // an error path logs too
	publish(t, bare, snap(1, secret))
	require.NoError(t, h.once())
	require.NoError(t, h.once())
	raw, err := gitShow(bare, status.HostBranch(testHost)+":"+status.Path(testHost))
	require.NoError(t, err)
	require.Contains(t, string(raw), "web-01")
	require.NotEmpty(t, logs.String())
	for _, s := range []string{"hunter2", "SECRETKEY"} {
		assert.NotContains(t, string(raw), s, "status")
		assert.NotContains(t, logs.String(), s, "logs")
	}
}

func TestAgentRunReactsToANewSnapshotAtOnce(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	h := newHostAgent(t, bare, newClock(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	ag, err := agent.New(agent.Config{Host: testHost, Repo: mustOpen(t, bare), Engine: h.eng, Store: mustStore(t, h.dir),
		Version: "test", Log: quietLog(), TickInterval: time.Hour, PollInterval: time.Hour, Heartbeat: time.Hour,
		Ready: func() { close(ready) }})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- ag.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	<-ready

	// Ticks and polls are an hour apart: only the local repository's
	// change notification and the workers' change signal can bring the VM
	// to ready in the status.
	publish(t, bare, snap(1, vm("web-01")))
	deadline := time.Now().Add(time.Minute)
	for {
		if st := readStatus(t, bare); st != nil && len(st.VMs) == 1 && st.VMs[0].Phase == status.PhaseReady {
			break
		}
		require.True(t, time.Now().Before(deadline), "the new snapshot was not acted on")
		time.Sleep(50 * time.Millisecond)
	}
	assert.Equal(t, []string{"web-01"}, h.prov.Calls(agenttest.OpBoot))
}

// A snapshot file over snapshots.MaxSnapshotBytes is refused by its size
// before it is read, like a snapshot that does not parse.
func TestSourceRefusesAHugeSnapshotUnread(t *testing.T) {
	if testing.Short() {
		t.Skip("commits a 65 MB file; skipped with -short")
	}
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	huge := "host: hv-a\nepoch: 1\n#" + string(bytes.Repeat([]byte("x"), snapshots.MaxSnapshotBytes)) + "\n"
	gittest.Commit(t, bare, gittest.Edit{Branch: agent.SnapshotsBranch, Write: map[string]string{"hosts/hv-a.yaml": huge}})
	_, _, err := agent.NewSource(mustOpen(t, bare), "hv-a", "").Fetch(context.Background())
	require.ErrorIs(t, err, agent.ErrSnapshotInvalid)
	assert.ErrorIs(t, err, gitsource.ErrFileTooLarge)
}

// With StatusRepo the agent reads its snapshot from the fleet repository
// and writes its status to its host branch in the status repository: the
// fleet repository gets no host branch.
func TestAgentWritesStatusToTheStatusRepository(t *testing.T) {
	gittest.NeedGit(t)
	bare, statusBare := gittest.NewBare(t), gittest.NewBare(t)
	h := newHostAgent(t, bare, newClock(), nil)
	publish(t, bare, snap(1, vm("web-01")))
	ag, err := agent.New(agent.Config{Host: testHost, Repo: mustOpen(t, bare), StatusRepo: mustOpen(t, statusBare), Engine: h.eng,
		Store: mustStore(t, h.dir), Version: "test", Now: h.clock.Now, Log: quietLog()})
	require.NoError(t, err)
	require.NoError(t, ag.Once(context.Background()))
	st := readStatus(t, statusBare)
	require.NotNil(t, st, "no status on the status repository's host branch")
	require.Len(t, st.VMs, 1)
	assert.Equal(t, uint64(1), st.LastSeenEpoch, "the snapshot was read from the fleet repository")
	assert.Nil(t, readStatus(t, bare), "a host branch was written to the fleet repository")
}
