// Package e2e runs gitfleet end to end: the built binary as separate
// processes — `gitfleet controller` and `gitfleet agent` — against a git
// smart-HTTP server (git http-backend on 127.0.0.1), booting real QEMU
// guests (the tiny guest, served from a local HTTP server). It pins the
// life of a VM and its volume from a push to their finalized deletes, and
// an agent killed with SIGKILL in the middle of a create.
//
// Every wait is a poll with a deadline that only bounds a broken run; no
// assertion is about speed. The tests skip when QEMU is not installed.
package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent/qemu"
	"github.com/gitfleet/gitfleet/internal/tinyguest"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/e2etest"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// binary is the gitfleet binary TestMain builds; skipReason is set instead
// when the machine cannot run these tests.
var binary, skipReason string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if b := os.Getenv(binaryEnv); b != "" {
		// A test re-run inside its network namespace uses the parent's build.
		binary = b
		return m.Run()
	}
	for _, bin := range []string{"qemu-system-x86_64", "qemu-img", "git"} {
		if _, err := exec.LookPath(bin); err != nil {
			skipReason = bin + " is not installed (apt-get install qemu-system-x86 qemu-utils git busybox-static, or make test)"
			return m.Run()
		}
	}
	b, remove, err := e2etest.BuildBinary("gitfleet-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer remove()
	binary = b
	os.Setenv(binaryEnv, binary)
	return m.Run()
}

// binaryEnv hands the built binary to a test re-run in a network namespace.
const binaryEnv = "GITFLEET_E2E_BINARY"

const host = "e2e"

// Graces and intervals of the processes under test, short so the whole
// life of a VM fits in a few minutes.
const (
	tombstoneGrace     = 15 * time.Second
	controllerInterval = "2s"
)

// waitLimit bounds every wait; it is far above what a working run needs
// under TCG on two busy cores and only ends a broken run.
const waitLimit = 4 * time.Minute

// artifacts serves the tiny guest over HTTP on 127.0.0.1. The path
// /slow/initrd is the initramfs with zero padding appended (so a different
// sha256, and the kernel skips the padding); until release is called, a
// request for it gets half of the file and then hangs, which holds a
// create in the middle of its download.
type artifacts struct {
	srv     *httptest.Server
	guest   *tinyguest.Guest
	kernel  []byte
	initrd  []byte
	slow    []byte
	hit     chan struct{} // receives once per request of /slow/initrd while held
	gate    chan struct{} // closed by release
	release func()
}

func serveArtifacts(t *testing.T) *artifacts {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	g, err := tinyguest.Build(ctx, tinyguest.TestCacheDir())
	require.NoError(t, err, "build the tiny guest")
	a := &artifacts{guest: g, hit: make(chan struct{}, 16), gate: make(chan struct{})}
	a.kernel, err = os.ReadFile(g.Kernel)
	require.NoError(t, err)
	a.initrd, err = os.ReadFile(g.Initrd)
	require.NoError(t, err)
	a.slow = append(append([]byte(nil), a.initrd...), make([]byte, 4096)...)
	var once sync.Once
	a.release = func() { once.Do(func() { close(a.gate) }) }
	t.Cleanup(a.release)

	mux := http.NewServeMux()
	mux.HandleFunc("/vmlinuz", func(w http.ResponseWriter, _ *http.Request) { w.Write(a.kernel) })
	mux.HandleFunc("/initrd", func(w http.ResponseWriter, _ *http.Request) { w.Write(a.initrd) })
	mux.HandleFunc("/slow/initrd", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-a.gate:
			w.Write(a.slow)
			return
		default:
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(a.slow)))
		w.Write(a.slow[:len(a.slow)/2])
		w.(http.Flusher).Flush()
		select {
		case a.hit <- struct{}{}:
		default:
		}
		select {
		case <-a.gate: // the client is long gone by then; end the response short
		case <-r.Context().Done():
		}
	})
	a.srv = httptest.NewServer(mux)
	t.Cleanup(a.srv.Close)
	return a
}

func sha(b []byte) string { return fmt.Sprintf("%x", sha256.Sum256(b)) }

// vmFile is a VM object for the tiny guest; slow selects /slow/initrd.
func (a *artifacts) vmFile(name, power string, volumes []string, slow bool) string {
	initrdURL, initrdSum := a.srv.URL+"/initrd", sha(a.initrd)
	if slow {
		initrdURL, initrdSum = a.srv.URL+"/slow/initrd", sha(a.slow)
	}
	vols := ""
	if len(volumes) > 0 {
		vols = "  volumes: [" + strings.Join(volumes, ", ") + "]\n"
	}
	return fmt.Sprintf(`apiVersion: gitfleet.dev/v1alpha1
kind: VM
metadata:
  name: %s
spec:
  host: %s
  vcpus: 1
  memoryMB: 128
  diskGB: 1
  power: %s
  kernel:
    url: %s
    sha256: %s
    initrd: {url: %s, sha256: %s}
    cmdline: %q
%s  cloudInit:
    userData: |
      #cloud-config
      hostname: %s
`, name, host, power, a.srv.URL+"/vmlinuz", sha(a.kernel), initrdURL, initrdSum, a.guest.Cmdline, vols, name)
}

const hostFile = `apiVersion: gitfleet.dev/v1alpha1
kind: Host
metadata: {name: ` + host + `}
spec:
  capacity: {vcpus: 4, memoryMB: 1024}
`

func volumeFile(name string) string {
	return fmt.Sprintf(`apiVersion: gitfleet.dev/v1alpha1
kind: Volume
metadata: {name: %s}
spec: {host: %s, sizeGB: 1}
`, name, host)
}

// proc is a gitfleet child process with its output in a log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// fleetUnderTest is one fleet: the bare repository behind the HTTP
// server, a working clone that pushes, and the processes.
type fleetUnderTest struct {
	t        *testing.T
	dir      string
	bare     string
	url      string
	work     string
	stateDir string
	agentCfg string
	art      *artifacts
	ctrl     *proc
	agent    *proc
	nstart   int
}

func newFleet(t *testing.T) *fleetUnderTest {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	f := &fleetUnderTest{t: t, dir: t.TempDir()}
	f.bare = gittest.NewBare(t)
	f.url = gittest.Serve(t, filepath.Dir(f.bare)) + "/" + filepath.Base(f.bare)
	f.art = serveArtifacts(t)
	f.stateDir = filepath.Join(f.dir, "state")
	f.agentCfg = filepath.Join(f.dir, "agent.yaml")
	cfg := fmt.Sprintf(`repo: {url: %q}
host: %s
stateDir: %q
backend: qemu
qemu: {accel: %s}
artifacts: {allowNetworks: [127.0.0.0/8]}   # the test's artifact server
intervals: {tick: 1s, poll: 2s, heartbeat: 5s}
graces: {tombstone: %s}
readyTimeout: 10m
logLevel: debug
`, f.url, host, f.stateDir, envOr("GITFLEET_TEST_ACCEL", "auto"), tombstoneGrace)
	require.NoError(t, os.WriteFile(f.agentCfg, []byte(cfg), 0o644))

	// Whatever happens, no process or guest outlives the test.
	t.Cleanup(f.killAll)

	f.work = filepath.Join(f.dir, "work")
	gittest.Git(t, "", "clone", "--quiet", f.url, f.work)
	return f
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// start runs `gitfleet args...` as a child process.
func (f *fleetUnderTest) start(name string, args ...string) *proc {
	f.t.Helper()
	f.nstart++
	p := &proc{name: name, log: filepath.Join(f.dir, fmt.Sprintf("%s-%d.log", name, f.nstart)), done: make(chan struct{})}
	out, err := os.Create(p.log)
	require.NoError(f.t, err)
	p.cmd = exec.Command(binary, args...)
	p.cmd.Stdout, p.cmd.Stderr = out, out
	// Should the test binary die, so do its children (QEMU, detached by
	// design, is swept by killAll on a normal exit only).
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p.cmd.Env = append(os.Environ(), "GITFLEET_GIT_TOKEN=", "GITFLEET_TOKEN=")
	require.NoError(f.t, p.cmd.Start())
	go func() {
		p.cmd.Wait()
		out.Close()
		close(p.done)
	}()
	return p
}

func (f *fleetUnderTest) startController() {
	f.ctrl = f.start("controller", "controller", "--repo", f.url, "--interval", controllerInterval,
		"--cache-dir", filepath.Join(f.dir, "controller-git"))
}

func (f *fleetUnderTest) startAgent() {
	f.agent = f.start("agent", "agent", "--config", f.agentCfg)
}

// kill9 kills p with SIGKILL and waits for it.
func (f *fleetUnderTest) kill9(p *proc) {
	f.t.Helper()
	require.NoError(f.t, p.cmd.Process.Signal(syscall.SIGKILL))
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		f.t.Fatalf("%s did not die", p.name)
	}
}

// killAll kills the processes and every QEMU running a guest of this test.
func (f *fleetUnderTest) killAll() {
	for _, p := range []*proc{f.agent, f.ctrl} {
		if p != nil && p.cmd.Process != nil {
			p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
	}
	for _, pid := range qemuPids(f.stateDir) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	if f.t.Failed() || os.Getenv("GITFLEET_E2E_LOGS") != "" {
		for _, p := range []*proc{f.ctrl, f.agent} {
			if p != nil {
				b, _ := os.ReadFile(p.log)
				f.t.Logf("=== %s log (last 6 KB):\n%s", p.name, tail(b, 6<<10))
			}
		}
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// push commits the given writes and removals in the working clone,
// pushes them over HTTP, as a person would, and returns the commit.
func (f *fleetUnderTest) push(msg string, write map[string]string, remove ...string) string {
	f.t.Helper()
	return e2etest.Push(f.t, f.work, msg, write, remove...)
}

// show reads branch:path in the bare repository; ok is false when absent.
func (f *fleetUnderTest) show(branch, path string) ([]byte, bool) {
	return e2etest.Show(f.bare, branch, path)
}

func (f *fleetUnderTest) status() *status.Status { return e2etest.Status(f.t, f.bare, host) }

func (f *fleetUnderTest) snapshot() *snapshots.Snapshot { return e2etest.Snapshot(f.t, f.bare, host) }

// waitFor polls cond until it holds; past waitLimit, or if a process under
// test exits, the test fails with cond's last account of what it saw.
func (f *fleetUnderTest) waitFor(what string, cond func() (bool, string)) {
	f.t.Helper()
	f.waitWithin(waitLimit, what, cond)
}

// waitWithin is waitFor with its own limit, for waits that are long by
// nature (a real distribution booting under TCG).
func (f *fleetUnderTest) waitWithin(limit time.Duration, what string, cond func() (bool, string)) {
	f.t.Helper()
	start := time.Now()
	deadline := start.Add(limit)
	last := ""
	for {
		ok, seen := cond()
		if ok {
			f.t.Logf("%s (after %.1fs)", what, time.Since(start).Seconds())
			return
		}
		last = seen
		for _, p := range []*proc{f.ctrl, f.agent} {
			if p == nil {
				continue
			}
			select {
			case <-p.done:
				f.t.Fatalf("waiting for %s: %s exited: %v", what, p.name, p.cmd.ProcessState)
			default:
			}
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("waiting for %s: gave up after %s; last seen: %s", what, limit, last)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func quarantine(st *status.Status, name string) *status.Quarantine {
	if st == nil {
		return nil
	}
	for i := range st.Quarantined {
		if st.Quarantined[i].Name == name {
			return &st.Quarantined[i]
		}
	}
	return nil
}

// vmState is how a condition reports a VM in its "last seen".
func vmState(st *status.Status, name string) string {
	if st == nil {
		return "no status yet"
	}
	if vm := st.VM(name); vm != nil {
		return fmt.Sprintf("%s phase=%s power=%s lastError=%q message=%q (heartbeat %d)", name, vm.Phase, vm.Power, vm.LastError, vm.Message, st.Heartbeat)
	}
	return fmt.Sprintf("%s not in vms; quarantined=%v destroyed=%v (heartbeat %d)", name, st.Quarantined, st.Destroyed, st.Heartbeat)
}

// vmDir is a VM's directory in the agent's state store.
func (f *fleetUnderTest) vmDir(name string) string { return filepath.Join(f.stateDir, "vms", name) }

// volumePath is a volume's file in the agent's state store.
func (f *fleetUnderTest) volumePath(name string) string {
	return filepath.Join(f.stateDir, "volumes", name)
}

// qemuPids lists the QEMU processes whose command line names a path under
// dir: the guests of one test.
func qemuPids(dir string) []int {
	if dir == "" {
		return nil
	}
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0})
		if len(args) == 0 || !strings.Contains(filepath.Base(string(args[0])), "qemu-system") {
			continue
		}
		if bytes.Contains(b, []byte(dir+string(filepath.Separator))) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// guestPids lists the QEMU processes of one VM.
func (f *fleetUnderTest) guestPids(name string) []int { return qemuPids(f.vmDir(name)) }

// serial is a VM's serial console log.
func (f *fleetUnderTest) serial(name string) string {
	b, _ := os.ReadFile(filepath.Join(f.vmDir(name), qemu.SerialLog))
	return string(b)
}

// strays lists files under the state directory that a finished create or
// destroy must not leave: partial downloads and disks, and QEMU pidfiles or
// sockets of VMs that are not running.
func (f *fleetUnderTest) strays(running ...string) []string {
	var out []string
	filepath.Walk(f.stateDir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		base := filepath.Base(p)
		if strings.HasSuffix(base, ".partial") || strings.Contains(base, ".partial-") || strings.HasSuffix(base, ".work") || strings.HasPrefix(base, ".tmp") {
			out = append(out, p)
		}
		if base == qemu.PidFile || base == qemu.QMPSocket {
			vm := filepath.Base(filepath.Dir(p))
			if !slices.Contains(running, vm) {
				out = append(out, p)
			}
		}
		return nil
	})
	return out
}

// TestVMLifecycle pushes a VM with a volume and follows it through a power
// change, a delete and the volume's own delete, with the controller and the
// agent as separate processes over HTTP.
func TestVMLifecycle(t *testing.T) {
	f := newFleet(t)
	f.startController()
	f.startAgent()
	const vm, vol = "vm-a", "vm-a-data"

	// Push a VM → ready.
	f.push("add vm-a with a volume", map[string]string{
		"hosts/e2e.yaml":           hostFile,
		"volumes/" + vol + ".yaml": volumeFile(vol),
		"vms/" + vm + ".yaml":      f.art.vmFile(vm, "running", []string{vol}, false),
	})
	f.waitFor("vm-a ready in status", func() (bool, string) {
		st := f.status()
		v := st.VM(vm)
		return v != nil && v.Phase == status.PhaseReady && v.Power == "running" && v.SSH != "", vmState(st, vm)
	})
	assert.Len(t, f.guestPids(vm), 1, "one QEMU for vm-a")
	f.waitFor("vm-a's guest booted and sees its volume", func() (bool, string) {
		s := f.serial(vm)
		return strings.Contains(s, "tinyguest: disk vdc serial="+vol) && strings.Contains(s, "tinyguest: ready"), s
	})

	// power: stopped → stopped, the QEMU gone, the disk kept.
	f.push("stop vm-a", map[string]string{"vms/" + vm + ".yaml": f.art.vmFile(vm, "stopped", []string{vol}, false)})
	f.waitFor("vm-a stopped in status", func() (bool, string) {
		st := f.status()
		v := st.VM(vm)
		return v != nil && v.Phase == status.PhaseStopped && v.Power == "stopped", vmState(st, vm)
	})
	assert.Empty(t, f.guestPids(vm), "no QEMU for a stopped VM")
	assert.FileExists(t, filepath.Join(f.vmDir(vm), qemu.RootDiskFile), "stopping keeps the disk")
	assert.Contains(t, f.serial(vm), "tinyguest: power button", "stopped through an ACPI powerdown")

	// Mark the volume, to see it untouched later.
	marker := []byte("written by the guest, kept by gitfleet")
	vf, err := os.OpenFile(f.volumePath(vol), os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = vf.WriteAt(marker, 4096)
	require.NoError(t, err)
	require.NoError(t, vf.Close())

	// Delete the VM's file → quarantined → destroyed after the grace →
	// finalized → gone from the snapshot; the volume stays.
	removal := f.push("remove vm-a", nil, "vms/"+vm+".yaml")
	f.waitFor("vm-a tombstoned in the snapshot", func() (bool, string) {
		s := f.snapshot()
		v := s.VM(vm)
		return v != nil && v.Tombstoned && v.Tombstone != nil, fmt.Sprintf("%+v", v)
	})
	if ts := f.snapshot().VM(vm).Tombstone; assert.NotNil(t, ts) {
		assert.Equal(t, removal, string(ts.Commit), "the tombstone names the removing commit")
		assert.Contains(t, ts.Author, "E2E Person")
	}
	var since time.Time
	f.waitFor("vm-a quarantined in status", func() (bool, string) {
		st := f.status()
		q := quarantine(st, vm)
		if q != nil {
			since = q.Since
		}
		return q != nil, vmState(st, vm)
	})
	if time.Since(since) < tombstoneGrace-2*time.Second {
		assert.FileExists(t, filepath.Join(f.vmDir(vm), qemu.RootDiskFile), "quarantine keeps the disk until the grace has passed")
	} else {
		t.Logf("quarantine seen %s after it began: too late to check the disk is kept during the grace", time.Since(since))
	}
	f.waitFor("vm-a finalized: gone from the snapshot", func() (bool, string) {
		s := f.snapshot()
		return s != nil && s.VM(vm) == nil, fmt.Sprintf("%+v", s.VM(vm))
	})
	f.waitFor("vm-a gone from status", func() (bool, string) {
		st := f.status()
		return st != nil && st.VM(vm) == nil && quarantine(st, vm) == nil && !slices.Contains(st.Destroyed, vm), vmState(st, vm)
	})
	assert.NoFileExists(t, filepath.Join(f.vmDir(vm), qemu.RootDiskFile), "destroyed")
	assert.Empty(t, f.guestPids(vm))
	got := make([]byte, len(marker))
	vf, err = os.Open(f.volumePath(vol))
	require.NoError(t, err, "the volume outlives its VM")
	_, err = vf.ReadAt(got, 4096)
	require.NoError(t, err)
	vf.Close()
	assert.Equal(t, marker, got, "the volume is untouched")
	s := f.snapshot()
	require.NotNil(t, s.Volume(vol))
	assert.False(t, s.Volume(vol).Tombstoned)
	if v := f.status().Volume(vol); assert.NotNil(t, v) {
		assert.True(t, v.Present)
	}

	// Delete the volume's own file → reclaimed after the grace →
	// finalized.
	f.push("remove vm-a-data", nil, "volumes/"+vol+".yaml")
	f.waitFor("vm-a-data tombstoned in the snapshot", func() (bool, string) {
		v := f.snapshot().Volume(vol)
		return v != nil && v.Tombstoned, fmt.Sprintf("%+v", v)
	})
	f.waitFor("vm-a-data reclaimed and finalized", func() (bool, string) {
		_, statErr := os.Stat(f.volumePath(vol))
		s, st := f.snapshot(), f.status()
		return os.IsNotExist(statErr) && s != nil && s.Volume(vol) == nil && st != nil && st.Volume(vol) == nil,
			fmt.Sprintf("stat: %v; snapshot: %+v; status: %+v", statErr, s.Volume(vol), st.Volume(vol))
	})
	assert.Empty(t, f.strays(), "nothing left behind")
}

// TestAgentKilledMidCreate kills the agent with SIGKILL while a create is
// in the middle of its download, starts it again, and checks the VM still
// converges with one QEMU and nothing left behind; then kills it once more
// while the VM runs and checks the new agent re-attaches instead of
// booting a second QEMU.
func TestAgentKilledMidCreate(t *testing.T) {
	f := newFleet(t)
	f.startController()
	f.startAgent()
	const vm = "vm-b"

	f.push("add vm-b", map[string]string{
		"hosts/e2e.yaml":      hostFile,
		"vms/" + vm + ".yaml": f.art.vmFile(vm, "running", nil, true),
	})
	select {
	case <-f.art.hit:
	case <-time.After(waitLimit):
		t.Fatalf("the agent never fetched vm-b's initrd; status: %s", vmState(f.status(), vm))
	}
	// A download streams into <sha256>.partial-<random> in the cache.
	partial := filepath.Join(f.stateDir, "images", sha(f.art.slow)+".partial-*")
	f.waitFor("vm-b's initrd half downloaded", func() (bool, string) {
		files, err := filepath.Glob(partial)
		if err != nil || len(files) == 0 {
			return false, fmt.Sprintf("no %s: %v", partial, err)
		}
		fi, err := os.Stat(files[0])
		return err == nil && fi.Size() > 0, fmt.Sprint(err)
	})
	f.kill9(f.agent)
	assert.Empty(t, f.guestPids(vm), "no QEMU before the download finished")
	f.art.release()
	f.startAgent()

	f.waitFor("vm-b ready after the restart", func() (bool, string) {
		st := f.status()
		v := st.VM(vm)
		return v != nil && v.Phase == status.PhaseReady, vmState(st, vm)
	})
	f.waitFor("vm-b's guest booted", func() (bool, string) {
		s := f.serial(vm)
		return strings.Contains(s, "tinyguest: ready"), s
	})
	pids := f.guestPids(vm)
	require.Len(t, pids, 1, "exactly one QEMU for vm-b")
	pidfile, err := os.ReadFile(filepath.Join(f.vmDir(vm), qemu.PidFile))
	require.NoError(t, err)
	assert.Equal(t, strconv.Itoa(pids[0]), strings.TrimSpace(string(pidfile)), "the pidfile names the live QEMU")
	assert.Empty(t, f.strays(vm), "nothing leaked")

	// Kill it again while the VM runs: the next agent re-attaches.
	writes := e2etest.Writes(f.t, f.bare, host)
	f.kill9(f.agent)
	f.startAgent()
	f.waitFor("the restarted agent reports vm-b ready again", func() (bool, string) {
		st := f.status()
		v := st.VM(vm)
		return st != nil && writes() >= 2 && v != nil && v.Phase == status.PhaseReady, vmState(st, vm)
	})
	assert.Equal(t, []int{pids[0]}, f.guestPids(vm), "the same QEMU, re-attached")
	assert.Empty(t, f.strays(vm), "nothing leaked")

	// Kill it the moment a create has started QEMU, before the agent can
	// have recorded the boot: the next agent must adopt that QEMU or
	// replace it, never run two.
	const vm2 = "vm-c"
	f.push("add vm-c", map[string]string{"vms/" + vm2 + ".yaml": f.art.vmFile(vm2, "running", nil, false)})
	deadline := time.Now().Add(waitLimit)
	for len(f.guestPids(vm2)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no QEMU for vm-c; status: %s", vmState(f.status(), vm2))
		}
		time.Sleep(5 * time.Millisecond)
	}
	f.kill9(f.agent)
	t.Logf("killed the agent with vm-c's QEMU started; status then: %s", vmState(f.status(), vm2))
	f.startAgent()
	f.waitFor("vm-c ready after the restart", func() (bool, string) {
		st := f.status()
		v := st.VM(vm2)
		return v != nil && v.Phase == status.PhaseReady, vmState(st, vm2)
	})
	f.waitFor("vm-c's guest booted", func() (bool, string) {
		s := f.serial(vm2)
		return strings.Contains(s, "tinyguest: ready"), s
	})
	assert.Len(t, f.guestPids(vm2), 1, "exactly one QEMU for vm-c")
	assert.Equal(t, []int{pids[0]}, f.guestPids(vm), "vm-b untouched")
	assert.Empty(t, f.strays(vm, vm2), "nothing leaked")
}
