package main

import (
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

func writeAgentConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent.yaml")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

func TestAgentOnceReconcilesAndWritesStatus(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	spec := agenttest.Spec("hv-a")
	snap := &snapshots.Snapshot{Host: "hv-a", Epoch: 1,
		VMs:     []snapshots.SnapshotVM{{Name: "web-01", SpecHash: desired.SpecHash(spec), Spec: spec}},
		Volumes: []snapshots.SnapshotVolume{}}
	data, err := snapshots.MarshalSnapshot(snap)
	require.NoError(t, err)
	gittest.Commit(t, bare, gittest.Edit{Branch: "gitfleet/snapshots", Write: map[string]string{"hosts/hv-a.yaml": string(data)}})

	state := filepath.Join(t.TempDir(), "state")
	cfg := writeAgentConfig(t, "repo: {url: "+bare+"}\nhost: hv-a\nstateDir: "+state+
		"\nbackend: memory\nintervals: {heartbeat: 30s}\ngraces: {tombstone: 1m}\nlogLevel: warn\n")
	code, _ := runCLI(t, "agent", "--config", cfg, "--once")
	require.Equal(t, 0, code)

	out, err := exec.Command("git", "--git-dir", bare, "show", status.HostBranch("hv-a")+":"+status.Path("hv-a")).Output()
	require.NoError(t, err)
	st, err := status.Parse("hosts/hv-a.yaml", out)
	require.NoError(t, err)
	require.Len(t, st.VMs, 1)
	assert.Equal(t, status.PhaseReady, st.VMs[0].Phase)
	assert.Equal(t, uint64(1), st.LastSeenEpoch)
	fi, err := os.Stat(state)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm())

	t.Run("a second run finds the first run's VMs", func(t *testing.T) {
		code, _ := runCLI(t, "agent", "--config", cfg, "--once")
		require.Equal(t, 0, code)
		out, err := exec.Command("git", "--git-dir", bare, "show", status.HostBranch("hv-a")+":"+status.Path("hv-a")).Output()
		require.NoError(t, err)
		st, err := status.Parse("hosts/hv-a.yaml", out)
		require.NoError(t, err)
		require.Len(t, st.VMs, 1)
		assert.Equal(t, status.PhaseReady, st.VMs[0].Phase, "the memory backend kept web-01 running across processes")
		assert.Empty(t, st.VMs[0].LastError)
	})

	t.Run("flags override the file", func(t *testing.T) {
		code, _ := runCLI(t, "agent", "--config", cfg, "--host", "hv-b", "--state-dir", filepath.Join(t.TempDir(), "s"), "--once")
		require.Equal(t, 0, code)
		_, err := exec.Command("git", "--git-dir", bare, "show", status.HostBranch("hv-b")+":"+status.Path("hv-b")).Output()
		assert.NoError(t, err, "hv-b reported as itself")
	})
}

func TestAgentRejectsBadInvocations(t *testing.T) {
	cases := []struct {
		name   string
		config string
		args   []string
		code   int
	}{
		{name: "no host", config: "repo: {url: /nowhere}\n", code: 2},
		{name: "no repository", config: "host: hv-a\n", code: 2},
		{name: "unknown field", config: "repo: {url: /x}\nhost: hv-a\nhots: typo\n", code: 1},
		{name: "bad duration", config: "repo: {url: /x}\nhost: hv-a\nintervals: {tick: soon}\n", code: 1},
		{name: "unknown backend", config: "repo: {url: /x}\nhost: hv-a\nbackend: xen\n", code: 1},
		{name: "missing config file", args: []string{"--config", "/does/not/exist.yaml"}, code: 1},
		{name: "stray argument", config: "repo: {url: /x}\nhost: hv-a\n", args: []string{"extra"}, code: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GITFLEET_REPO", "")
			t.Setenv("GITFLEET_HOST", "")
			args := []string{"agent", "--once", "--state-dir", t.TempDir()}
			if tc.config != "" {
				args = append(args, "--config", writeAgentConfig(t, tc.config))
			}
			args = append(args, tc.args...)
			code, _ := runCLI(t, args...)
			assert.Equal(t, tc.code, code, strings.Join(args, " "))
		})
	}
}

func TestAgentConfigErrorsNameFileLineAndField(t *testing.T) {
	cases := []struct {
		name, config string
		want         []string
	}{
		{"unknown field in a section", "repo: {url: /x}\nhost: hv-a\ngraces:\n  vanish: 1h\n  tombstom: 5m\n",
			[]string{"agent.yaml:5:3: graces.tombstom: unknown field \"tombstom\"", "did you mean \"tombstone\"?"}},
		{"unknown field at the top", "repo: {url: /x}\nhots: hv-a\n",
			[]string{"agent.yaml:2:1: hots: unknown field \"hots\""}},
		{"unknown field two levels down", "repo:\n  url: /x\n  auth: {tokenFiel: /t}\n",
			[]string{"agent.yaml:3:10: repo.auth.tokenFiel: unknown field \"tokenFiel\""}},
		{"bad duration", "repo: {url: /x}\nhost: hv-a\nintervals: {tick: soon}\n",
			[]string{"agent.yaml:3:19: intervals.tick: \"soon\" is not a duration"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := writeAgentConfig(t, tc.config)
			code, _, stderr := runCLIStderr(t, "agent", "--once", "--state-dir", t.TempDir(), "--config", cfg)
			assert.Equal(t, 1, code)
			for _, w := range tc.want {
				assert.Contains(t, stderr, w)
			}
			assert.NotContains(t, stderr, "struct")
			assert.NotContains(t, stderr, "main.")
		})
	}
}

func TestAgentRefusesAHostThatIsNotADNSLabel(t *testing.T) {
	t.Setenv("GITFLEET_HOST", "")
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"flag", []string{"--host", "../README", "--repo", "/nowhere"}, 2, `--host: host "../README" is not a DNS label`},
		{"flag with a dot", []string{"--host", "hv-a.example.com", "--repo", "/nowhere"}, 2, `host "hv-a.example.com" is not a DNS label`},
		{"config", []string{"--config", writeAgentConfig(t, "repo: {url: /nowhere}\nhost: HV_A\n")}, 1, `host "HV_A" is not a DNS label`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			args := append([]string{"agent", "--once", "--state-dir", state}, tc.args...)
			code, _, stderr := runCLIStderr(t, args...)
			assert.Equal(t, tc.code, code)
			assert.Contains(t, stderr, tc.want)
			assert.NotContains(t, stderr, "committer")
			_, err := os.Stat(state)
			assert.ErrorIs(t, err, os.ErrNotExist, "refused before anything was made")
		})
	}
}

func TestAgentExitsZeroOnSIGTERM(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	cfg := writeAgentConfig(t, "repo: {url: "+bare+"}\nhost: hv-a\nstateDir: "+filepath.Join(t.TempDir(), "state")+
		"\nbackend: memory\nlogLevel: error\n")
	done := make(chan int, 1)
	go func() {
		code, _ := runCLI(t, "agent", "--config", cfg)
		done <- code
	}()
	// The first status on the branch means the loop runs, its signal handler
	// installed before it started.
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := exec.Command("git", "--git-dir", bare, "rev-parse", "--verify", "-q", status.HostBranch("hv-a")).Output(); err == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "the agent never wrote its status")
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGTERM))
	assert.Equal(t, 0, <-done)
}

// TestAgentServesMetricsAndHealthz: with listen set, the running agent
// serves its Prometheus metrics and a health check on that address, and
// stops serving when it exits.
func TestAgentServesMetricsAndHealthz(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	spec := agenttest.Spec("hv-a")
	snap := &snapshots.Snapshot{Host: "hv-a", Epoch: 4,
		VMs: []snapshots.SnapshotVM{{Name: "web-01", SpecHash: desired.SpecHash(spec), Spec: spec}}, Volumes: []snapshots.SnapshotVolume{}}
	data, err := snapshots.MarshalSnapshot(snap)
	require.NoError(t, err)
	gittest.Commit(t, bare, gittest.Edit{Branch: "gitfleet/snapshots", Write: map[string]string{"hosts/hv-a.yaml": string(data)}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	cfg := writeAgentConfig(t, "repo: {url: "+bare+"}\nhost: hv-a\nstateDir: "+filepath.Join(t.TempDir(), "state")+
		"\nbackend: memory\nlogLevel: error\nlisten: "+addr+"\n")
	done := make(chan int, 1)
	go func() {
		code, _ := runCLI(t, "agent", "--config", cfg)
		done <- code
	}()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		code, body := get("/metrics")
		if code == http.StatusOK && strings.Contains(body, `gitfleet_agent_vms{phase="ready"} 1`) {
			assert.Contains(t, body, "gitfleet_agent_snapshot_epoch 4")
			break
		}
		require.True(t, time.Now().Before(deadline), "no ready VM in /metrics: %d %s", code, body)
		time.Sleep(50 * time.Millisecond)
	}
	code, body := get("/healthz")
	assert.Equal(t, http.StatusOK, code, body)
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGTERM))
	assert.Equal(t, 0, <-done)
	code, _ = get("/healthz")
	assert.Zero(t, code, "the listener closes with the agent")
}

// TestAgentGitTimeoutFromConfig: gitTimeout bounds each git operation of
// the agent: `agent --once` against a remote that accepts and never
// answers fails with a timeout instead of hanging.
func TestAgentGitTimeoutFromConfig(t *testing.T) {
	root := t.TempDir()
	bare := filepath.Join(root, "fleet.git")
	gittest.Git(t, "", "init", "--quiet", "--bare", "--initial-branch=main", bare)
	srv := gittest.ServeFaulty(t, root)
	srv.Set(gittest.Stall, 0)
	cfg := writeAgentConfig(t, "repo: {url: file://"+bare+"}\nhost: hv-a\nstateDir: "+filepath.Join(t.TempDir(), "state")+
		"\nbackend: memory\ngitTimeout: 1s\nlogLevel: error\n")
	code, _, stderr := runCLIStderr(t, "agent", "--config", cfg, "--once")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "timed out after 1s")
}
