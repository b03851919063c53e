package agent_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/qemu"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
)

// A VM deleted while its create is in flight (here: a root disk whose
// download trickles for as long as it is let run) is quarantined at once:
// the tombstone cancels the create's context, which spends no attempt, and
// the delete's pass runs next. Without it the delete waited for the
// download, up to the pass's 30 minutes.
func TestDeleteInterruptsACreateInFlight(t *testing.T) {
	f := newFixture(t, func(c *agent.EngineConfig) { c.VMTimeout = time.Hour })
	entered := make(chan struct{}, 1)
	cancelled := make(chan error, 1)
	release := make(chan struct{}) // ends the download when the test fails
	t.Cleanup(func() { close(release) })
	f.prov.SetHook(func(ctx context.Context, op agenttest.Op, name string) error {
		if op != agenttest.OpRootDisk {
			return nil
		}
		entered <- struct{}{}
		select {
		case <-ctx.Done():
			cancelled <- context.Cause(ctx)
			return ctx.Err()
		case <-release:
			return context.Canceled
		}
	})
	require.NoError(t, f.eng.Tick(context.Background(), snap(1, vm("web-01"))))
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("the create never reached its root disk")
	}
	require.NoError(t, f.eng.Tick(context.Background(), snap(2, tombstoned(vm("web-01")))))
	select {
	case cause := <-cancelled:
		t.Logf("the create's context ended: %v", cause)
	case <-time.After(30 * time.Second):
		t.Fatal("the tombstone did not cancel the create in flight")
	}
	settle, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, f.eng.Settle(settle))
	rec := f.record("web-01")
	assert.NotNil(t, rec.QuarantinedAt, "the deleted VM is quarantined")
	assert.Equal(t, status.PhaseQuarantined, rec.Phase)
	assert.Zero(t, rec.Attempts, "the interrupted create spent an attempt")
	assert.Empty(t, f.prov.Calls(agenttest.OpBoot), "the interrupted create went on to boot")
}

// The same over the QEMU backend, whose create fetches an image that a
// server trickles a byte at a time: the tombstone quarantines the VM at
// once, the download ends (the server sees its client leave) and no
// partial file is left in the image cache.
func TestDeleteInterruptsATricklingDownload(t *testing.T) {
	for _, bin := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed (apt-get install qemu-system-x86 qemu-utils)", bin)
		}
	}
	image := []byte(strings.Repeat("an image that takes for ever ", 1<<10))
	sum := sha256.Sum256(image)
	served, left := make(chan struct{}, 1), make(chan struct{}, 1)
	ended := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(image)))
		for i := range image {
			w.Write(image[i : i+1])
			w.(http.Flusher).Flush()
			if i == 0 {
				served <- struct{}{}
			}
			select {
			case <-r.Context().Done():
				left <- struct{}{}
				return
			case <-ended:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	store, err := agent.OpenStore(filepath.Join(dir, "state"))
	require.NoError(t, err)
	cache := filepath.Join(dir, "images")
	prov, err := qemu.New(qemu.Config{CacheDir: cache, MachineDir: store.VMDir, Accel: qemu.AccelTCG, RunAs: qemuUser(t),
		Artifacts: qemu.ArtifactPolicy{AllowNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, Logger: quietLog()})
	require.NoError(t, err)
	eng, err := agent.NewEngine(agent.EngineConfig{Host: testHost, Store: store, Provisioner: prov,
		VMTimeout: time.Hour, TombstoneGrace: time.Hour, Log: quietLog()})
	require.NoError(t, err)
	t.Cleanup(func() { eng.Close(context.Background()) })
	t.Cleanup(func() { close(ended) }) // first: a failed run's download ends

	spec := desired.VMSpec{Host: testHost, VCPUs: 1, MemoryMB: 128, DiskGB: 1, Power: desired.PowerRunning,
		Image: &desired.Artifact{URL: srv.URL + "/slow.qcow2", SHA256: hex.EncodeToString(sum[:])}}
	entry := snapshots.SnapshotVM{Name: "web-01", SpecHash: desired.SpecHash(spec), Spec: spec}
	require.NoError(t, eng.Tick(context.Background(), &snapshots.Snapshot{Host: testHost, Epoch: 1, VMs: []snapshots.SnapshotVM{entry}}))
	select {
	case <-served:
	case <-time.After(time.Minute):
		t.Fatal("the create never started its download")
	}
	entry.Tombstoned = true
	require.NoError(t, eng.Tick(context.Background(), &snapshots.Snapshot{Host: testHost, Epoch: 2, VMs: []snapshots.SnapshotVM{entry}}))
	select {
	case <-left:
	case <-time.After(30 * time.Second):
		t.Fatal("the download went on after the VM's delete")
	}
	settle, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, eng.Settle(settle))
	rec, err := store.LoadRecord("web-01")
	require.NoError(t, err)
	assert.Equal(t, status.PhaseQuarantined, rec.Phase, rec.LastError)
	assert.NotNil(t, rec.QuarantinedAt)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		partials, _ := filepath.Glob(filepath.Join(cache, "*.partial-*"))
		if len(partials) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partial downloads left in the cache: %v", partials)
		}
	}
}
