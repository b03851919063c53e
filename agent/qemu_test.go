package agent_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/qemu"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/tinyguest"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
)

// fileArtifact names a local file by file:// URL and sha256.
func fileArtifact(t *testing.T, path string) desired.Artifact {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	sum := sha256.Sum256(data)
	return desired.Artifact{URL: "file://" + path, SHA256: hex.EncodeToString(sum[:])}
}

// TestEngineWithRealQEMU runs the engine over the QEMU provisioner under
// TCG with the tiny guest: create with a volume; edits that cannot be
// applied (a wrong kernel sha256, a kernel server that keeps failing) which
// leave the same QEMU running, the error in status, and stop after the
// retry budget; a larger disk grown under the running guest; an agent
// restart that re-attaches instead of booting again; then delete through
// quarantine and destroy, leaving the volume.
func TestEngineWithRealQEMU(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a real VM; skipped with -short")
	}
	for _, bin := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed (apt-get install qemu-system-x86 qemu-utils busybox-static)", bin)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	g, err := tinyguest.Build(ctx, tinyguest.TestCacheDir())
	// QEMU is here, so the tiny guest must build (busybox-static and a
	// kernel come with the same install): a failure is a failure, not a skip.
	require.NoError(t, err, "build the tiny guest")
	base := filepath.Join(t.TempDir(), "base.qcow2")
	out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", base, "64M").CombinedOutput()
	require.NoError(t, err, string(out))
	kernel, initrd, image := fileArtifact(t, g.Kernel), fileArtifact(t, g.Initrd), fileArtifact(t, base)

	spec := desired.VMSpec{Host: testHost, VCPUs: 1, MemoryMB: 128, DiskGB: 1, Power: desired.PowerRunning,
		Image:   &image,
		Kernel:  &desired.Kernel{URL: kernel.URL, SHA256: kernel.SHA256, Initrd: &initrd, Cmdline: g.Cmdline},
		Volumes: []string{"web-01-data"}}
	vmEntry := snapshots.SnapshotVM{Name: "web-01", SpecHash: desired.SpecHash(spec), Spec: spec}
	volumes := []snapshots.SnapshotVolume{{Name: "web-01-data", SizeGB: 1}}

	runAs := qemuUser(t)
	dir := t.TempDir()
	clk := newClock()
	var store *agent.Store
	var prov *qemu.Provisioner
	var eng *agent.Engine
	start := func() {
		store, err = agent.OpenStore(filepath.Join(dir, "state"))
		require.NoError(t, err)
		prov, err = qemu.New(qemu.Config{CacheDir: filepath.Join(dir, "images"), MachineDir: store.VMDir, Accel: "tcg",
			RunAs: runAs, Artifacts: qemu.ArtifactPolicy{FileRoots: []string{filepath.Dir(g.Kernel), filepath.Dir(g.Initrd), filepath.Dir(base)},
				AllowNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, // the edit test's kernel server
			PowerdownTimeout: 20 * time.Second, KillTimeout: 5 * time.Second, BootTimeout: 90 * time.Second, Logger: quietLog()})
		require.NoError(t, err)
		eng, err = agent.NewEngine(agent.EngineConfig{Host: testHost, Store: store, Provisioner: prov,
			Now: clk.Now, TombstoneGrace: time.Minute, MaxAttempts: 3, Log: quietLog()})
		require.NoError(t, err)
	}
	step := func(s *snapshots.Snapshot) *status.Status {
		t.Helper()
		require.NoError(t, eng.Tick(context.Background(), s))
		require.NoError(t, eng.Settle(context.Background()))
		return eng.Report()
	}
	start()
	t.Cleanup(func() {
		eng.Close(context.Background())
		_ = prov.Destroy(context.Background(), "web-01")
	})

	st := step(&snapshots.Snapshot{Host: testHost, Epoch: 1, VMs: []snapshots.SnapshotVM{vmEntry}, Volumes: volumes})
	r := row(t, st, "web-01")
	// QEMU is up, the guest has not answered yet: booting, not ready.
	require.Equal(t, status.PhaseBooting, r.Phase, r.LastError)
	// The tiny guest declares itself on its console; the engine notices
	// without a tick.
	r = waitPhase(t, eng, "web-01", status.PhaseReady)
	assert.Empty(t, r.LastError)
	assert.NotEmpty(t, r.SSH, "user-mode networking forwards SSH")
	assert.Equal(t, "tcg", prov.Accel())
	pid, err := os.ReadFile(filepath.Join(store.VMDir("web-01"), qemu.PidFile))
	require.NoError(t, err)

	// Make before break: a wrong kernel sha256 fails the edit at once
	// (permanent), and the running VM is never stopped.
	qemuPid := func() string {
		b, err := os.ReadFile(filepath.Join(store.VMDir("web-01"), qemu.PidFile))
		require.NoError(t, err)
		return string(b)
	}
	edit := func(epoch uint64, mod func(*desired.VMSpec)) *snapshots.Snapshot {
		s := spec
		k := *s.Kernel
		s.Kernel = &k
		mod(&s)
		return &snapshots.Snapshot{Host: testHost, Epoch: epoch, Volumes: volumes,
			VMs: []snapshots.SnapshotVM{{Name: "web-01", SpecHash: desired.SpecHash(s), Spec: s}}}
	}
	wrongSum := edit(2, func(s *desired.VMSpec) { s.Kernel.SHA256 = strings.Repeat("0", 64) })
	for i := 0; i < 2; i++ {
		r = row(t, step(wrongSum), "web-01")
		assert.Equal(t, status.PhaseReady, r.Phase)
		assert.Equal(t, vmEntry.SpecHash, r.SpecHash, "still the previous spec")
		assert.Contains(t, r.LastError, "sha256 mismatch")
		assert.Contains(t, r.LastError, "keeps its previous spec")
	}
	assert.True(t, prov.Running("web-01"))
	assert.Equal(t, string(pid), qemuPid(), "the same QEMU runs on")

	// A kernel server that keeps failing (HTTP 503, transient) is asked
	// MaxAttempts times, then no more.
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		http.Error(w, "try later", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	unreachable := edit(3, func(s *desired.VMSpec) {
		s.Kernel.URL = srv.URL + "/vmlinuz"
		s.Kernel.SHA256 = strings.Repeat("1", 64)
	})
	for i := 0; i < 5; i++ {
		r = row(t, step(unreachable), "web-01")
	}
	assert.Equal(t, int32(3), hits.Load(), "the retry budget, then no more")
	assert.Contains(t, r.LastError, "given up after 3 attempts")
	assert.Equal(t, status.PhaseReady, r.Phase)
	assert.Equal(t, string(pid), qemuPid(), "the same QEMU runs on")

	// A larger disk is grown under the running guest.
	grown := edit(4, func(s *desired.VMSpec) { s.DiskGB = 2 })
	r = row(t, step(grown), "web-01")
	assert.Equal(t, grown.VMs[0].SpecHash, r.SpecHash)
	assert.Empty(t, r.LastError)
	assert.Equal(t, string(pid), qemuPid(), "grown online, not restarted")
	vmEntry = grown.VMs[0]

	// The agent restarts; QEMU does not.
	eng.Close(context.Background())
	start()
	st = step(nil)
	assert.Equal(t, status.PhaseReady, row(t, st, "web-01").Phase, "the guest answered in this boot: a restarted agent knows it at once")
	again, err := os.ReadFile(filepath.Join(store.VMDir("web-01"), qemu.PidFile))
	require.NoError(t, err)
	assert.Equal(t, string(pid), string(again), "re-attached, not booted again")
	assertConfined(t, strings.TrimSpace(string(pid)), runAs)
	assertQEMUFiles(t, strings.TrimSpace(string(pid)), filepath.Join(dir, "images"), store.VMDir("web-01"), store.VolumePath("web-01-data"))

	deleted := vmEntry
	deleted.Tombstoned = true
	tomb := &snapshots.Snapshot{Host: testHost, Epoch: 5, VMs: []snapshots.SnapshotVM{deleted}, Volumes: volumes}
	st = step(tomb)
	require.Len(t, st.Quarantined, 1)
	assert.False(t, prov.Running("web-01"), "shut down for its quarantine")
	_, err = os.Stat(filepath.Join(store.VMDir("web-01"), qemu.RootDiskFile))
	assert.NoError(t, err, "the disk is kept through the grace")

	clk.Add(2 * time.Minute)
	st = step(tomb)
	assert.Equal(t, []string{"web-01"}, st.Destroyed)
	_, err = os.Stat(store.VMDir("web-01"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	_, err = os.Stat(store.VolumePath("web-01-data"))
	assert.NoError(t, err, "a VM's destroy never takes its volume")
}

// waitPhase polls the engine's report, without ticking it, until the VM
// shows phase (at most 2 min) and returns its row.
func waitPhase(t *testing.T, eng *agent.Engine, name, phase string) status.VM {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		r := row(t, eng.Report(), name)
		if r.Phase == phase {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("vm %s still %s (%s), want %s", name, r.Phase, r.LastError, phase)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// assertQEMUFiles checks that QEMU (pid) holds no file outside allowed:
// the image cache, the VM's directory, its volumes. Devices, pipes,
// sockets and anonymous files are not files a guest reads.
func assertQEMUFiles(t *testing.T, pid string, allowed ...string) {
	t.Helper()
	fds, err := os.ReadDir("/proc/" + pid + "/fd")
	require.NoError(t, err)
	held := 0
	for _, fd := range fds {
		target, err := os.Readlink("/proc/" + pid + "/fd/" + fd.Name())
		if err != nil || !strings.HasPrefix(target, "/") || strings.HasPrefix(target, "/dev/") {
			continue
		}
		held++
		ok := false
		for _, a := range allowed {
			ok = ok || target == a || strings.HasPrefix(target, a+"/")
		}
		assert.True(t, ok, "qemu holds %s, outside the image cache, the VM's directory and its volumes", target)
	}
	assert.NotZero(t, held, "qemu holds no file at all: the check proves nothing")
}

// qemuUser returns the unprivileged user QEMU should run as: the dedicated
// user (made when missing) when the test runs as root, else "" (QEMU runs
// as the test's own, unprivileged, user).
func qemuUser(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		return ""
	}
	if _, err := user.Lookup(qemu.DefaultQEMUUser); err != nil {
		out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", qemu.DefaultQEMUUser).CombinedOutput()
		if _, lerr := user.Lookup(qemu.DefaultQEMUUser); lerr != nil {
			t.Fatalf("create %s: %v: %s", qemu.DefaultQEMUUser, err, out)
		}
	}
	return qemu.DefaultQEMUUser
}

// assertConfined checks in /proc that QEMU (pid) runs without root and
// under its seccomp sandbox.
func assertConfined(t *testing.T, pid, runAs string) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + pid + "/status")
	require.NoError(t, err)
	fields := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ":")
		fields[k] = strings.Join(strings.Fields(v), " ")
	}
	for _, id := range strings.Fields(fields["Uid"]) {
		assert.NotEqual(t, "0", id, "qemu runs with a root uid (Uid: %s)", fields["Uid"])
	}
	if runAs != "" {
		u, err := user.Lookup(runAs)
		require.NoError(t, err)
		assert.Equal(t, strings.Repeat(u.Uid+" ", 3)+u.Uid, fields["Uid"])
	}
	assert.Equal(t, "2", fields["Seccomp"], "qemu runs without its seccomp sandbox")
}
