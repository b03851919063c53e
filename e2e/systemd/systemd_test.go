package systemd

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/e2etest"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/nspawn"
)

// The systemd tests run the shipped units, unchanged, under real systemd:
// a Debian 12 root filesystem booted with systemd-nspawn (systemd as PID
// 1, a network namespace holding only a loopback device), the freshly
// built binary installed in it as README's install steps say. The fleet's
// git server is the test's own (git http-backend), listening inside the
// container's network namespace, so the agent and the controller use
// plain http URLs and the container reaches nothing else.
//
// One drop-in changes the agent's unit for the test: WatchdogSec=10s
// (shipped: 60s), so a wedged agent is caught in seconds. Every other
// setting — Type=notify, NotifyAccess, Restart, KillMode, TimeoutStopSec,
// the sandboxing — is the shipped one.

// sdWatchdog is the agent's WatchdogSec in the test's drop-in.
const sdWatchdog = "10s"

// sdUnits are the shipped unit files the test installs.
var sdUnits = []string{"gitfleet-agent.service", "gitfleet-controller.service"}

// sdMachine is a booted container with gitfleet installed in it.
type sdMachine struct {
	t       *testing.T
	m       *nspawn.Machine
	console string
}

// bootSystemd builds (or finds cached) the root filesystem, boots it,
// serves the fleet's bare repository inside the container on
// 127.0.0.1, installs the binary, the shipped units and the configs, and
// returns the container and the fleet (whose url is the one the
// container uses). agentConfig is the agent's configuration file apart
// from repo.url and host, which are set here.
func bootSystemd(t *testing.T, agentConfig string) (*sdMachine, *fleet) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	if why := nspawn.Missing(); why != "" {
		t.Skipf("booting systemd in a container needs %s", why)
	}
	buildCtx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	rootfs, err := nspawn.BuildRootfs(buildCtx, nspawn.TestCacheDir())
	cancel()
	require.NoError(t, err)

	dir := t.TempDir()
	install := filepath.Join(dir, "install")
	require.NoError(t, os.Mkdir(install, 0o755))
	copyFile(t, binary, filepath.Join(install, "gitfleet"))
	for _, unit := range sdUnits {
		copyFile(t, filepath.Join("..", "..", "examples", "systemd", unit), filepath.Join(install, unit))
	}
	require.NoError(t, os.WriteFile(filepath.Join(install, "watchdog.conf"),
		[]byte("[Service]\nWatchdogSec="+sdWatchdog+"\n"), 0o644))

	s := &sdMachine{t: t, console: filepath.Join(dir, "console.log")}
	console, err := os.Create(s.console)
	require.NoError(t, err)
	t.Cleanup(func() { console.Close() })
	s.m, err = nspawn.Boot(context.Background(), nspawn.Config{
		Rootfs:  rootfs,
		Binds:   []nspawn.Bind{{Host: install, Container: "/mnt/gitfleet", ReadOnly: true}},
		Console: console,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			for _, unit := range sdUnits {
				out, err := s.m.Exec(context.Background(), "journalctl", "--no-pager", "-o", "short-monotonic", "-n", "60", "-u", unit)
				t.Logf("=== journal of %s (%v):\n%s", unit, err, out)
			}
			b, _ := os.ReadFile(s.console)
			t.Logf("=== container console (last 4 KB):\n%s", tail(b, 4<<10))
			b, _ = os.ReadFile(filepath.Join(dir, "http-backend.log"))
			t.Logf("=== git http-backend's errors (last 4 KB):\n%s", tail(b, 4<<10))
		}
		assert.NoError(t, s.m.Close())
	})

	// The fleet: a bare repository on the host, served by git http-backend
	// from this process on the container's loopback.
	f := &fleet{t: t, bare: gittest.NewBare(t)}
	l, err := s.m.Listen("127.0.0.1:0")
	require.NoError(t, err)
	gitBin, err := exec.LookPath("git")
	require.NoError(t, err)
	// git's complaints (a lost ref-lock race between the controller and
	// the agent, say) go to a log file, shown when the test fails.
	gitLog, err := os.Create(filepath.Join(dir, "http-backend.log"))
	require.NoError(t, err)
	t.Cleanup(func() { gitLog.Close() })
	backend := &cgi.Handler{
		Path: gitBin, Args: []string{"http-backend"},
		Env: []string{"GIT_PROJECT_ROOT=" + filepath.Dir(f.bare), "GIT_HTTP_EXPORT_ALL=1",
			"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"},
		Stderr: gitLog,
	}
	// While f.stall is set, every request hangs until its client leaves.
	f.stalled = make(chan struct{}, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.stall.Load() {
			select {
			case f.stalled <- struct{}{}:
			default:
			}
			<-r.Context().Done()
			return
		}
		backend.ServeHTTP(w, r)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	f.url = "http://" + l.Addr().String() + "/" + filepath.Base(f.bare)
	f.work = filepath.Join(dir, "work")
	gittest.Git(t, "", "clone", "--quiet", f.bare, f.work)

	agentYAML := fmt.Sprintf("repo: {url: %q}\nhost: %s\n%s", f.url, host, agentConfig)
	require.NoError(t, os.WriteFile(filepath.Join(install, "agent.yaml"), []byte(agentYAML), 0o644))
	controllerEnv := fmt.Sprintf("GITFLEET_REPO=%s\nGITFLEET_INTERVAL=%s\n", f.url, controllerInterval)
	require.NoError(t, os.WriteFile(filepath.Join(install, "controller.env"), []byte(controllerEnv), 0o644))

	// README's install steps, as an operator runs them.
	s.sh(`install -m 0755 /mnt/gitfleet/gitfleet /usr/local/bin/gitfleet
install -m 0644 /mnt/gitfleet/gitfleet-agent.service /mnt/gitfleet/gitfleet-controller.service /etc/systemd/system/
install -d -m 0755 /etc/gitfleet /etc/systemd/system/gitfleet-agent.service.d
install -m 0600 /mnt/gitfleet/agent.yaml /etc/gitfleet/agent.yaml
install -m 0600 /mnt/gitfleet/controller.env /etc/gitfleet/controller.env
install -m 0644 /mnt/gitfleet/watchdog.conf /etc/systemd/system/gitfleet-agent.service.d/test-watchdog.conf
systemctl daemon-reload
systemctl enable gitfleet-agent gitfleet-controller`)
	// systemd itself finds nothing wrong with the shipped units.
	out := s.sh("systemd-analyze verify /etc/systemd/system/gitfleet-agent.service /etc/systemd/system/gitfleet-controller.service 2>&1")
	assert.Empty(t, strings.TrimSpace(out), "systemd-analyze verify")
	return s, f
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(to, b, 0o755))
}

// sh runs a shell script inside the container and returns its output;
// the test fails when it fails.
func (s *sdMachine) sh(script string) string {
	s.t.Helper()
	out, err := s.m.Exec(context.Background(), "sh", "-ec", script)
	require.NoError(s.t, err)
	return string(out)
}

// show reads properties of a unit (systemctl show).
func (s *sdMachine) show(unit string, props ...string) map[string]string {
	s.t.Helper()
	args := []string{"systemctl", "show", unit}
	for _, p := range props {
		args = append(args, "-p", p)
	}
	out, err := s.m.Exec(context.Background(), args...)
	require.NoError(s.t, err)
	got := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			got[k] = v
		}
	}
	return got
}

// monotonic reads a *TimestampMonotonic property as a duration since
// the container's clock started.
func monotonic(t *testing.T, v string) time.Duration {
	t.Helper()
	us, err := strconv.ParseInt(v, 10, 64)
	require.NoError(t, err, "monotonic timestamp %q", v)
	return time.Duration(us) * time.Microsecond
}

// timed runs a command inside the container and returns how long it took.
func (s *sdMachine) timed(args ...string) time.Duration {
	s.t.Helper()
	start := time.Now()
	_, err := s.m.Exec(context.Background(), args...)
	require.NoError(s.t, err)
	return time.Since(start)
}

// journal is the unit's journal, messages only.
func (s *sdMachine) journal(unit string) string {
	s.t.Helper()
	out, err := s.m.Exec(context.Background(), "journalctl", "--no-pager", "-o", "cat", "-u", unit)
	require.NoError(s.t, err)
	return string(out)
}

// waitUnit polls the unit's properties until cond holds (waitLimit bounds
// a broken run) and returns them and how long it took.
func (s *sdMachine) waitUnit(what, unit string, props []string, cond func(map[string]string) bool) (map[string]string, time.Duration) {
	s.t.Helper()
	start := time.Now()
	for {
		p := s.show(unit, props...)
		if cond(p) {
			s.t.Logf("%s (after %.1fs)", what, time.Since(start).Seconds())
			return p, time.Since(start)
		}
		if time.Since(start) > waitLimit {
			s.t.Fatalf("waiting for %s: gave up after %s; last seen: %v", what, waitLimit, p)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// vmsOf is a status's VMs for comparison; nil without a status.
func vmsOf(st *status.Status) []status.VM {
	if st == nil {
		return nil
	}
	return st.VMs
}

// TestSystemdAgentUnit runs the shipped units under systemd with the
// memory backend and pins what the agent's unit promises: start reaches
// active through Type=notify (READY=1), a wedged agent is killed by the
// watchdog and restarted, `systemctl restart` leaves the guests as they
// are, and `systemctl stop` ends the agent by SIGTERM well within
// TimeoutStopSec. It also runs the controller's unit (DynamicUser,
// CacheDirectory, EnvironmentFile) until it publishes.
func TestSystemdAgentUnit(t *testing.T) {
	s, f := bootSystemd(t, "backend: memory\nintervals: {tick: 1s, poll: 1s, heartbeat: 5s}\nlogLevel: debug\n")
	ctx := context.Background()
	f.push("two VMs", map[string]string{
		"hosts/" + host + ".yaml": hostFile,
		"vms/a.yaml":              memoryVMFile("a"),
		"vms/b.yaml":              memoryVMFile("b"),
	})

	// The agent's sandbox is as tight as docs/DESIGN.md says.
	out := s.sh("systemd-analyze security --no-pager gitfleet-agent.service")
	m := regexp.MustCompile(`Overall exposure level for gitfleet-agent.service: ([0-9.]+)`).FindStringSubmatch(out)
	require.NotNil(t, m, "systemd-analyze security: %s", out)
	exposure, err := strconv.ParseFloat(m[1], 64)
	require.NoError(t, err)
	t.Logf("systemd-analyze security: exposure %.1f", exposure)
	assert.LessOrEqual(t, exposure, 3.4, "the agent unit's exposure grew past what docs/DESIGN.md states")

	// The controller's unit runs as a dynamic user and publishes.
	s.timed("systemctl", "start", "gitfleet-controller")
	f.waitFor("the controller (in its unit) publishes the snapshot", func() (bool, string) {
		return f.snapshot() != nil, "no snapshot for " + host
	})
	// Its sandbox is as tight as docs/DESIGN.md says, and under it the
	// controller answers /healthz on its listener and takes a reload.
	out = s.sh("systemd-analyze security --no-pager gitfleet-controller.service")
	m = regexp.MustCompile(`Overall exposure level for gitfleet-controller.service: ([0-9.]+)`).FindStringSubmatch(out)
	require.NotNil(t, m, "systemd-analyze security: %s", out)
	exposure, err = strconv.ParseFloat(m[1], 64)
	require.NoError(t, err)
	t.Logf("systemd-analyze security: controller exposure %.1f", exposure)
	assert.LessOrEqual(t, exposure, 2.0, "the controller unit's exposure grew past what docs/DESIGN.md states")
	health, err := s.m.Exec(ctx, "bash", "-c", `exec 3<>/dev/tcp/127.0.0.1/9780 && printf 'GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n' >&3 && cat <&3`)
	require.NoError(t, err)
	assert.Contains(t, string(health), "200 OK", "the sandboxed controller's /healthz")
	s.timed("systemctl", "reload", "gitfleet-controller")
	assert.Equal(t, "active", s.show("gitfleet-controller", "ActiveState")["ActiveState"], "the controller after a reload")

	// Start: with Type=notify, `systemctl start` returns once the agent
	// sent READY=1; active is entered then, after the process started.
	startWall := s.timed("systemctl", "start", "gitfleet-agent")
	p := s.show("gitfleet-agent", "Type", "NotifyAccess", "ActiveState", "SubState", "Result", "MainPID",
		"ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic", "WatchdogUSec", "KillMode", "TimeoutStopUSec")
	require.Equal(t, "notify", p["Type"])
	require.Equal(t, "main", p["NotifyAccess"])
	require.Equal(t, "active", p["ActiveState"], "%v", p)
	require.Equal(t, "running", p["SubState"], "%v", p)
	require.Equal(t, "process", p["KillMode"])
	execStart, activeEnter := monotonic(t, p["ExecMainStartTimestampMonotonic"]), monotonic(t, p["ActiveEnterTimestampMonotonic"])
	require.GreaterOrEqual(t, activeEnter, execStart, "active before the main process started: %v", p)
	t.Logf("start: `systemctl start` returned after %.2fs; READY=1 came %.3fs after the agent process started (ExecMainStart -> ActiveEnter)",
		startWall.Seconds(), (activeEnter - execStart).Seconds())

	// The agent pings the watchdog while it runs.
	ping := s.show("gitfleet-agent", "WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"]
	s.waitUnit("the agent pings the watchdog", "gitfleet-agent", []string{"WatchdogTimestampMonotonic"}, func(p map[string]string) bool {
		return p["WatchdogTimestampMonotonic"] != ping
	})

	// The guests the agent runs (here: memory backend entries) and the
	// status it reports, which every later step must leave as they are.
	var before []status.VM
	f.waitFor("both VMs ready in status", func() (bool, string) {
		st := f.status()
		if st == nil {
			return false, "no status yet"
		}
		a, b := st.VM("a"), st.VM("b")
		if a == nil || b == nil || a.Phase != status.PhaseReady || b.Phase != status.PhaseReady {
			return false, vmState(st, "a") + "; " + vmState(st, "b")
		}
		before = st.VMs
		return true, ""
	})
	table := s.sh("cat /var/lib/gitfleet/memory-backend.json")
	var vms struct {
		VMs map[string]struct{ Running bool } `json:"vms"`
	}
	require.NoError(t, json.Unmarshal([]byte(table), &vms))
	require.True(t, vms.VMs["a"].Running && vms.VMs["b"].Running, "the backend runs both VMs: %s", table)
	untouched := func(step string) {
		t.Helper()
		assert.Equal(t, table, s.sh("cat /var/lib/gitfleet/memory-backend.json"), "%s: the backend's VM table changed", step)
		// A status written after the step shows the same VMs.
		writes := e2etest.Writes(t, f.bare, host)
		f.waitFor(step+": a newer status", func() (bool, string) {
			n := writes()
			return n >= 1, fmt.Sprintf("%d writes", n)
		})
		assert.Equal(t, before, vmsOf(f.status()), "%s: status VMs changed", step)
	}

	// Reload: `systemctl reload` (what gitfleet reconcile agent runs) goes
	// through the unit's ExecReload to the running agent, which runs a
	// pass at once and keeps every guest.
	s.timed("systemctl", "reload", "gitfleet-agent")
	f.waitFor("systemctl reload reaches the agent", func() (bool, string) {
		return strings.Contains(s.journal("gitfleet-agent"), "reconcile requested"), "no reconcile request in the journal"
	})
	untouched("systemctl reload")

	// Watchdog: a wedged agent (SIGSTOP) stops pinging; systemd kills it
	// (WatchdogSignal, then the restart) and starts it again.
	p = s.show("gitfleet-agent", "MainPID", "NRestarts", "WatchdogUSec")
	require.Equal(t, sdWatchdog, p["WatchdogUSec"])
	wedged, restarts := p["MainPID"], p["NRestarts"]
	s.sh("kill -STOP " + wedged)
	n0, err := strconv.Atoi(restarts)
	require.NoError(t, err)
	_, took := s.waitUnit("the watchdog restarts the wedged agent", "gitfleet-agent", []string{"MainPID", "NRestarts", "ActiveState"}, func(p map[string]string) bool {
		n, _ := strconv.Atoi(p["NRestarts"])
		return n > n0 && p["ActiveState"] == "active" && p["MainPID"] != wedged && p["MainPID"] != "0"
	})
	t.Logf("watchdog: wedged at t=0, active again with a new agent after %.1fs (WatchdogSec=%s, RestartSec=5s)", took.Seconds(), sdWatchdog)
	assert.Contains(t, s.journal("gitfleet-agent"), "Watchdog timeout", "the journal says why the agent was killed")
	_, err = s.m.Exec(ctx, "sh", "-c", "kill -0 "+wedged)
	assert.Error(t, err, "the wedged agent %s still exists", wedged)
	untouched("after the watchdog restart")

	// Restart: a new agent process; the guests and status stay.
	old := s.show("gitfleet-agent", "MainPID")["MainPID"]
	restartWall := s.timed("systemctl", "restart", "gitfleet-agent")
	p = s.show("gitfleet-agent", "MainPID", "ActiveState")
	require.Equal(t, "active", p["ActiveState"])
	require.NotEqual(t, old, p["MainPID"], "systemctl restart kept the agent process")
	t.Logf("restart: `systemctl restart gitfleet-agent` took %.2fs", restartWall.Seconds())
	untouched("after systemctl restart")

	// Stop: SIGTERM ends the agent by itself (exit status 0), well before
	// TimeoutStopSec would have it killed (Result would be "timeout"),
	// even with a git request hanging on a server that does not answer.
	f.stall.Store(true)
	select {
	case <-f.stalled:
	case <-time.After(waitLimit):
		t.Fatal("the agent sent no git request to the stalled server")
	}
	stopWall := s.timed("systemctl", "stop", "gitfleet-agent")
	f.stall.Store(false)
	p = s.show("gitfleet-agent", "ActiveState", "Result", "ExecMainCode", "ExecMainStatus", "TimeoutStopUSec",
		"InactiveEnterTimestampMonotonic", "ActiveExitTimestampMonotonic")
	assert.Equal(t, "inactive", p["ActiveState"], "%v", p)
	assert.Equal(t, "success", p["Result"], "%v", p)
	assert.Equal(t, "1", p["ExecMainCode"], "the agent did not exit by itself (CLD_EXITED): %v", p)
	assert.Equal(t, "0", p["ExecMainStatus"], "%v", p)
	t.Logf("stop: `systemctl stop gitfleet-agent`, a git request hanging, took %.2fs (TimeoutStopSec=%s); deactivating for %.3fs",
		stopWall.Seconds(), p["TimeoutStopUSec"],
		(monotonic(t, p["InactiveEnterTimestampMonotonic"]) - monotonic(t, p["ActiveExitTimestampMonotonic"])).Seconds())
	journal := s.journal("gitfleet-agent")
	assert.Contains(t, journal, "Deactivated successfully")
	assert.NotContains(t, journal, "timed out")
	assert.Equal(t, table, s.sh("cat /var/lib/gitfleet/memory-backend.json"), "stop changed the backend's VM table")
	assert.True(t, reflect.DeepEqual(before, vmsOf(f.status())), "the last status after stop shows other VMs")

	s.timed("systemctl", "stop", "gitfleet-controller")
	p = s.show("gitfleet-controller", "ActiveState", "Result")
	assert.Equal(t, "success", p["Result"], "controller stop: %v", p)
}

// TestSystemdRestartKeepsQEMUGuest runs the shipped agent unit with the
// QEMU backend (TCG, the tiny guest) and pins what KillMode=process and
// the per-VM scope are for: the guest's QEMU runs in its own scope
// (gitfleet-vm-<name>.scope), outside the agent's cgroup, and neither the
// watchdog's kill of a wedged agent, nor `systemctl restart
// gitfleet-agent`, nor `systemctl stop` touches it; the restarted agent
// adopts it (same QEMU process, still ready).
func TestSystemdRestartKeepsQEMUGuest(t *testing.T) {
	s, f := bootSystemd(t, `backend: qemu
qemu: {accel: tcg}
artifacts: {allowNetworks: [127.0.0.0/8]}   # the test's artifact server, on the container's loopback
intervals: {tick: 1s, poll: 1s, heartbeat: 5s}
readyTimeout: 10m
logLevel: debug
`)
	// The tiny guest's artifacts, served on the container's loopback.
	tg := newTinyGuest(t)
	l, err := s.m.Listen("127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: tg.handler}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	const vm = "guest"
	f.push("one guest", map[string]string{
		"hosts/" + host + ".yaml": hostFile,
		"vms/" + vm + ".yaml":     tg.vmFile(vm, "http://"+l.Addr().String()),
	})
	s.timed("systemctl", "start", "gitfleet-controller")
	s.timed("systemctl", "start", "gitfleet-agent")
	f.waitFor("the guest is ready", func() (bool, string) {
		st := f.status()
		vmst := st.VM(vm)
		if st == nil || vmst == nil || vmst.Phase != status.PhaseReady {
			return false, vmState(st, vm)
		}
		return true, ""
	})

	pidfile := "/var/lib/gitfleet/vms/" + vm + "/qemu.pid"
	qemu := strings.TrimSpace(s.sh("cat " + pidfile))
	// The process behind the pidfile, with its start time: a QEMU started
	// again under the same pid would show another.
	identity := func() string {
		out, err := s.m.Exec(context.Background(), "cat", "/proc/"+qemu+"/stat")
		if err != nil {
			return "gone"
		}
		fields := strings.Fields(string(out))
		return fields[1] + " started at tick " + fields[21]
	}
	started := identity()
	require.Contains(t, started, "qemu", "pid %s from %s", qemu, pidfile)
	cgroup := s.sh("cat /proc/" + qemu + "/cgroup")
	assert.Contains(t, cgroup, "/system.slice/gitfleet-vm-"+vm+".scope", "QEMU runs in its own scope")
	assert.NotContains(t, cgroup, "gitfleet-agent.service", "QEMU runs in the agent's cgroup")
	assert.Equal(t, "active", strings.TrimSpace(s.sh("systemctl is-active gitfleet-vm-"+vm+".scope || true")))
	// The scope is a cgroup only: QEMU keeps the agent unit's sandbox (as
	// the unit's comment says), under QEMU's own filter.
	procStatus := s.sh("cat /proc/" + qemu + "/status")
	assert.Regexp(t, `(?m)^NoNewPrivs:\s+1$`, procStatus)
	assert.Regexp(t, `(?m)^Seccomp:\s+2$`, procStatus)
	// The agent and, in its own scope, QEMU may open no device but KVM,
	// tun and the pseudo devices: a block device node is refused.
	// (ProtectClock= adds the clock's read-only device to the agent's.)
	s.assertDevicePolicy("gitfleet-agent.service", "/dev/kvm rw", "/dev/net/tun rw", "char-rtc r")
	s.assertDevicePolicy("gitfleet-vm-"+vm+".scope", "/dev/kvm rw", "/dev/net/tun rw")
	before := vmsOf(f.status())

	// The watchdog kills only the wedged agent, never its guest.
	p := s.show("gitfleet-agent", "MainPID", "NRestarts")
	wedged, n0 := p["MainPID"], p["NRestarts"]
	s.sh("kill -STOP " + wedged)
	_, took := s.waitUnit("the watchdog restarts the wedged agent", "gitfleet-agent", []string{"MainPID", "NRestarts", "ActiveState"}, func(p map[string]string) bool {
		return p["NRestarts"] != n0 && p["ActiveState"] == "active" && p["MainPID"] != wedged && p["MainPID"] != "0"
	})
	t.Logf("watchdog: active again with a new agent %.1fs after the wedge, QEMU guest running", took.Seconds())
	assert.Equal(t, started, identity(), "QEMU after the watchdog restart")

	restartWall := s.timed("systemctl", "restart", "gitfleet-agent")
	t.Logf("restart: `systemctl restart gitfleet-agent` took %.2fs with a QEMU guest running", restartWall.Seconds())
	assert.Equal(t, started, identity(), "QEMU after systemctl restart")
	writes := e2etest.Writes(t, f.bare, host)
	f.waitFor("a status from the restarted agent", func() (bool, string) {
		n := writes()
		return n >= 1, fmt.Sprintf("%d writes", n)
	})
	assert.Equal(t, before, vmsOf(f.status()), "status VMs after systemctl restart")
	assert.Equal(t, started, identity(), "QEMU after the restarted agent's passes")

	stopWall := s.timed("systemctl", "stop", "gitfleet-agent")
	p = s.show("gitfleet-agent", "ActiveState", "Result", "ExecMainCode", "ExecMainStatus")
	assert.Equal(t, map[string]string{"ActiveState": "inactive", "Result": "success", "ExecMainCode": "1", "ExecMainStatus": "0"}, p)
	t.Logf("stop: `systemctl stop gitfleet-agent` took %.2fs with a QEMU guest running", stopWall.Seconds())
	assert.Equal(t, started, identity(), "QEMU after systemctl stop")
}

// assertDevicePolicy checks that unit (the agent's service or a VM's
// scope) runs with DevicePolicy=closed and allows exactly the devices
// allow (systemctl show's DeviceAllow entries), and, where this container lets the difference show (its
// cgroups let systemd enforce a device policy, and nothing else refuses a
// block device first), that a shell moved into the unit's cgroup is
// refused a block device node that a shell outside it is not.
func (s *sdMachine) assertDevicePolicy(unit string, allow ...string) {
	t := s.t
	t.Helper()
	p := s.show(unit, "DevicePolicy", "ControlGroup")
	assert.Equal(t, "closed", p["DevicePolicy"], "%s: DevicePolicy", unit)
	// systemctl show prints a list property once per entry.
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(s.sh("systemctl show -p DeviceAllow "+unit)), "\n") {
		got = append(got, strings.TrimPrefix(line, "DeviceAllow="))
	}
	assert.ElementsMatch(t, allow, got, "%s: DeviceAllow", unit)
	// A loop device node (in /dev: /run is nodev): opening it outside the
	// policy fails, if at all, for want of the device, never for the
	// policy.
	probe := `[ -e /dev/gf-block-probe ] || mknod /dev/gf-block-probe b 7 200
head -c 1 /dev/gf-block-probe >/dev/null 2>/run/gf-probe.err || true; cat /run/gf-probe.err`
	outside := s.sh(probe)
	var join []string
	for _, h := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/devices", "/sys/fs/cgroup/systemd"} {
		join = append(join, fmt.Sprintf("{ [ -w %[1]s%[2]s/cgroup.procs ] && echo $$ > %[1]s%[2]s/cgroup.procs; } 2>/dev/null || true", h, p["ControlGroup"]))
	}
	inside := s.sh(strings.Join(join, "; ") + "; " + probe)
	if inside == outside {
		t.Logf("%s: this container cannot tell a device policy at work (a shell in the unit's cgroup and one outside both get %q); the properties above are what a host enforces", unit, strings.TrimSpace(inside))
		return
	}
	assert.Contains(t, inside, "Operation not permitted", "%s: a block device opened from inside the unit's cgroup (outside: %q)", unit, outside)
}
