package agent_test

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/qemu"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/internal/errchain"
	"github.com/gitfleet/gitfleet/internal/tinyguest"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// TestEachFailureReadsAsOneChain provokes representative failures of each
// create step with the QEMU backend and real QEMU (TCG, the tiny guest) and
// checks every lastError is one chain: no prefix or segment twice
// ("boot: boot: …"), the QEMU output only of the run that failed, never a
// previous run's log appended to an unrelated error.
func TestEachFailureReadsAsOneChain(t *testing.T) {
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
	require.NoError(t, err, "build the tiny guest")
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", base, "64M").CombinedOutput()
	require.NoError(t, err, string(out))
	garbage := filepath.Join(dir, "garbage.bin")
	require.NoError(t, os.WriteFile(garbage, make([]byte, 64<<10), 0o644)) // no kernel QEMU can load
	kernel, initrd, image, notAKernel := fileArtifact(t, g.Kernel), fileArtifact(t, g.Initrd), fileArtifact(t, base), fileArtifact(t, garbage)

	newEngine := func(t *testing.T, qemuBin string) (*agent.Engine, *agent.Store) {
		store, err := agent.OpenStore(filepath.Join(t.TempDir(), "state"))
		require.NoError(t, err)
		prov, err := qemu.New(qemu.Config{QEMU: qemuBin, CacheDir: filepath.Join(dir, "images"), MachineDir: store.VMDir, Accel: "tcg",
			RunAs: qemuUser(t), Artifacts: qemu.ArtifactPolicy{FileRoots: []string{filepath.Dir(g.Kernel), filepath.Dir(g.Initrd), dir},
				AllowNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}},
			PowerdownTimeout: 5 * time.Second, KillTimeout: 5 * time.Second, BootTimeout: 90 * time.Second, Logger: quietLog()})
		require.NoError(t, err)
		eng, err := agent.NewEngine(agent.EngineConfig{Host: testHost, Store: store, Provisioner: prov, MaxAttempts: 3, Log: quietLog()})
		require.NoError(t, err)
		t.Cleanup(func() {
			eng.Close(context.Background())
			_ = prov.Destroy(context.Background(), "web-01")
		})
		return eng, store
	}
	spec := func(k desired.Artifact) desired.VMSpec {
		return desired.VMSpec{Host: testHost, VCPUs: 1, MemoryMB: 128, DiskGB: 1, Power: desired.PowerRunning, Image: &image,
			Kernel: &desired.Kernel{URL: k.URL, SHA256: k.SHA256, Initrd: &initrd, Cmdline: g.Cmdline}}
	}
	var epoch uint64
	tick := func(t *testing.T, eng *agent.Engine, s desired.VMSpec) status.VM {
		t.Helper()
		epoch++
		sn := snap(epoch, snapshots.SnapshotVM{Name: "web-01", SpecHash: desired.SpecHash(s), Spec: s})
		require.NoError(t, eng.Tick(context.Background(), sn))
		require.NoError(t, eng.Settle(context.Background()))
		return row(t, eng.Report(), "web-01")
	}
	oneChain := func(t *testing.T, r status.VM, step string) {
		t.Helper()
		assert.True(t, strings.HasPrefix(r.LastError, step+": "), "lastError %q names the step %q first", r.LastError, step)
		assert.Empty(t, errchain.Repeat(r.LastError), "lastError %q repeats %q", r.LastError, errchain.Repeat(r.LastError))
	}

	t.Run("preflight: QEMU missing", func(t *testing.T) {
		eng, _ := newEngine(t, filepath.Join(dir, "no-such-qemu"))
		r := tick(t, eng, spec(kernel))
		oneChain(t, r, agent.StepPreflight)
	})
	t.Run("root disk: image checksum", func(t *testing.T) {
		eng, _ := newEngine(t, "")
		bad := spec(kernel)
		img := image
		img.SHA256 = strings.Repeat("0", 64)
		bad.Image = &img
		r := tick(t, eng, bad)
		oneChain(t, r, agent.StepRootDisk)
		assert.Contains(t, r.LastError, "sha256 mismatch")
	})
	t.Run("boot: QEMU exits; then an unrelated failure", func(t *testing.T) {
		eng, store := newEngine(t, "")
		r := tick(t, eng, spec(notAKernel))
		oneChain(t, r, agent.StepBoot)
		assert.Contains(t, r.LastError, "qemu exited")
		assert.Contains(t, r.LastError, "exit status 1: qemu", "QEMU's own output of the run that failed")
		assert.Equal(t, 1, strings.Count(r.LastError, "kernel"), "QEMU's output once: %s", r.LastError)

		// The spec is fixed and the VM boots; then its QEMU is stopped
		// from outside (its log says so) and its root disk is gone: the
		// boot that follows fails before any QEMU runs, and its error is
		// that alone, without the earlier run's log.
		good := spec(kernel)
		r = tick(t, eng, good)
		require.Contains(t, []string{status.PhaseBooting, status.PhaseReady}, r.Phase, r.LastError)
		b, err := os.ReadFile(filepath.Join(store.VMDir("web-01"), qemu.PidFile))
		require.NoError(t, err)
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		require.NoError(t, err)
		require.NoError(t, syscall.Kill(pid, syscall.SIGTERM))
		for i := 0; syscall.Kill(pid, 0) == nil; i++ {
			require.Less(t, i, 200, "QEMU outlived SIGTERM for 10 s")
			time.Sleep(50 * time.Millisecond)
		}
		log, _ := os.ReadFile(filepath.Join(store.VMDir("web-01"), qemu.QEMULog))
		require.Contains(t, string(log), "terminating on signal", "the stopped run's log")
		require.NoError(t, os.Remove(filepath.Join(store.VMDir("web-01"), qemu.RootDiskFile)))
		r = tick(t, eng, good)
		oneChain(t, r, agent.StepBoot)
		assert.Contains(t, r.LastError, "root disk")
		assert.NotContains(t, r.LastError, "terminating on signal", "the previous run's log appended to an unrelated error")
	})
}

// The agent's snapshot fetch fails as one chain too: gitsource names the
// branch and the remote; the agent does not say "fetch" again.
func TestSnapshotFetchFailureReadsAsOneChain(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: bare, Logger: quietLog().WithField("test", t.Name())})
	require.NoError(t, err)
	require.NoError(t, os.Rename(bare, bare+".gone"))
	_, _, err = agent.NewSource(repo, testHost, "").Fetch(context.Background())
	require.Error(t, err)
	assert.Empty(t, errchain.Repeat(err.Error()), "%q repeats %q", err, errchain.Repeat(err.Error()))
	assert.Equal(t, 1, strings.Count(err.Error(), agent.SnapshotsBranch), err.Error())
}
