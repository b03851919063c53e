package inmem

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
)

func machine(t *testing.T, name string, diskGB int, vols ...string) agent.Machine {
	spec := desired.VMSpec{Host: "hv-a", VCPUs: 1, MemoryMB: 512, DiskGB: diskGB, Power: desired.PowerRunning}
	return agent.Machine{Name: name, Dir: t.TempDir(), Spec: spec, Volumes: vols}
}

func TestBehavesLikeAHypervisor(t *testing.T) {
	ctx := context.Background()
	p := New()
	m := machine(t, "web-01", 5)

	assert.ErrorContains(t, p.Boot(ctx, m), "no root disk")
	require.NoError(t, p.PrepareRootDisk(ctx, m))
	require.NoError(t, p.Boot(ctx, m))
	assert.True(t, p.Running("web-01"))
	assert.True(t, p.Readiness("web-01").Ready, "guests answer SSH at boot")
	assert.Equal(t, agent.ReadySSH, p.Readiness("web-01").Via)
	assert.Equal(t, agent.Address{IP: "10.77.1.2", SSH: "127.0.0.1:2202"}, p.Address("web-01"))

	vol := filepath.Join(t.TempDir(), "data")
	other := machine(t, "db-01", 1, vol)
	require.NoError(t, p.PrepareRootDisk(ctx, other))
	assert.ErrorIs(t, p.Boot(ctx, other), os.ErrNotExist, "a volume path that is not a file")
	require.NoError(t, os.WriteFile(vol, nil, 0o600))
	require.NoError(t, p.Boot(ctx, other))
	assert.Equal(t, "10.77.1.3", p.Address("db-01").IP)

	require.NoError(t, p.Shutdown(ctx, "web-01"))
	assert.False(t, p.Readiness("web-01").Ready, "a stopped VM has no readiness")
	m.Spec.DiskGB = 3
	require.NoError(t, p.PrepareRootDisk(ctx, m))
	assert.Equal(t, 5, p.DiskGB("web-01"), "never shrinks")
	require.NoError(t, p.Destroy(ctx, "web-01"))
	assert.Empty(t, p.Address("web-01"), "released")
	assert.Zero(t, p.DiskGB("web-01"))
	require.NoError(t, p.Destroy(ctx, "web-01"), "destroying an absent VM succeeds")
	assert.Empty(t, p.FailureReason("db-01"))
	_, _, ok := p.VMProgress("db-01")
	assert.False(t, ok)
}

// TestOpenKeepsTheTableAcrossProcesses: what `agent --once` twice relies
// on. A second Open of the same file sees the first's VMs running, at the
// same addresses, and hands out new addresses after them.
func TestOpenKeepsTheTableAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), StateFile)
	p, err := Open(path)
	require.NoError(t, err)
	require.NoError(t, p.Preflight(ctx))
	m := machine(t, "web-01", 5)
	require.NoError(t, p.PrepareRootDisk(ctx, m))
	require.NoError(t, p.Boot(ctx, m))

	q, err := Open(path)
	require.NoError(t, err)
	assert.True(t, q.Running("web-01"))
	assert.True(t, q.Readiness("web-01").Ready)
	assert.Equal(t, p.Address("web-01"), q.Address("web-01"))
	assert.Equal(t, 5, q.DiskGB("web-01"))
	n := machine(t, "web-02", 5)
	require.NoError(t, q.PrepareRootDisk(ctx, n))
	require.NoError(t, q.Boot(ctx, n))
	assert.Equal(t, "10.77.1.3", q.Address("web-02").IP, "no address handed out twice")

	require.NoError(t, q.Destroy(ctx, "web-01"))
	r, err := Open(path)
	require.NoError(t, err)
	assert.False(t, r.Running("web-01"))
	assert.True(t, r.Running("web-02"))
	ents, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	assert.Len(t, ents, 1, "no temporary file left behind")
}

// TestOpenRefusesAFileItCannotRead: an unreadable table is an error, never
// an empty one (which would read as every VM gone).
func TestOpenRefusesAFileItCannotRead(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"garbage": "{not json",
		"version": `{"version": 9, "nextIP": 2, "vms": {}}`,
	} {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
		_, err := Open(path)
		assert.ErrorContains(t, err, path, name)
	}
	p, err := Open(filepath.Join(dir, "absent"))
	require.NoError(t, err, "an absent file is an empty table")
	assert.Zero(t, p.RunningCount())
}

func TestWorldEvents(t *testing.T) {
	ctx := context.Background()
	p := New()
	p.SetSilentGuests(true)
	p.SetLateAddress(true)
	m := machine(t, "web-01", 5)
	require.NoError(t, p.PrepareRootDisk(ctx, m))
	require.NoError(t, p.Boot(ctx, m))
	assert.False(t, p.Readiness("web-01").Ready, "a silent guest stays booting")
	assert.Empty(t, p.Address("web-01").IP, "no address before the guest asks")
	p.AnswerAddress("web-01")
	p.Answer("web-01", agent.ReadyGuestAgent)
	r := p.Readiness("web-01")
	assert.True(t, r.Ready)
	assert.Equal(t, agent.ReadyGuestAgent, r.Via)
	assert.Equal(t, "10.77.1.2", p.Address("web-01").IP)

	m.Spec.DiskGB = 8
	require.NoError(t, p.PrepareRootDisk(ctx, m))
	assert.Equal(t, 1, p.GrownOnline("web-01"))
	p.Crash("web-01")
	assert.False(t, p.Running("web-01"))
	assert.False(t, p.Readiness("web-01").Ready)
	require.NoError(t, p.Boot(ctx, m))
	p.Reboot()
	assert.Zero(t, p.RunningCount())
	p.ForgetAddresses()
	assert.Empty(t, p.Address("web-01"))
}

func TestCanceledContextFailsEveryOperation(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p := New()
	m := machine(t, "web-01", 5)
	for name, err := range map[string]error{
		"preflight": p.Preflight(ctx),
		"rootdisk":  p.PrepareRootDisk(ctx, m),
		"stage":     p.Stage(ctx, m),
		"boot":      p.Boot(ctx, m),
		"shutdown":  p.Shutdown(ctx, "web-01"),
		"destroy":   p.Destroy(ctx, "web-01"),
	} {
		assert.ErrorIs(t, err, context.Canceled, name)
	}
	assert.Zero(t, p.DiskGB("web-01"))
}
