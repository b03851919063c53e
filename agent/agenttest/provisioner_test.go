package agenttest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
)

func machine(t *testing.T, name string, diskGB int, vols ...string) agent.Machine {
	spec := Spec("hv-a")
	spec.DiskGB = diskGB
	return agent.Machine{Name: name, Dir: t.TempDir(), Spec: spec, Volumes: vols}
}

func TestTheInMemoryBackendBehavesLikeAHypervisor(t *testing.T) {
	ctx := context.Background()
	p := New()
	m := machine(t, "web-01", 5)

	assert.Error(t, p.Boot(ctx, m), "no root disk yet")
	require.NoError(t, p.PrepareRootDisk(ctx, m))
	require.NoError(t, p.Boot(ctx, m))
	assert.True(t, p.Running("web-01"))
	assert.Equal(t, agent.Address{IP: "10.77.1.2", SSH: "127.0.0.1:2202"}, p.Address("web-01"))
	m.Spec.DiskGB = 6
	require.NoError(t, p.PrepareRootDisk(ctx, m))
	assert.Equal(t, 6, p.DiskGB("web-01"), "grown under the running guest")
	assert.Equal(t, 1, p.GrownOnline("web-01"))
	require.NoError(t, p.Stage(ctx, m))
	staged, _ := p.StagedWith("web-01")
	assert.Equal(t, m.Spec, staged.Spec)
	assert.True(t, p.Running("web-01"), "staging leaves the VM running")

	require.NoError(t, p.Shutdown(ctx, "web-01"))
	m.Spec.DiskGB = 3
	require.NoError(t, p.PrepareRootDisk(ctx, m))
	assert.Equal(t, 6, p.DiskGB("web-01"), "never shrinks")
	m.Spec.DiskGB = 8
	require.NoError(t, p.PrepareRootDisk(ctx, m))
	assert.Equal(t, 8, p.DiskGB("web-01"))

	require.NoError(t, p.Boot(ctx, m))
	assert.Equal(t, "10.77.1.2", p.Address("web-01").IP, "sticky")
	require.NoError(t, p.Destroy(ctx, "web-01"))
	assert.False(t, p.Running("web-01"))
	assert.Empty(t, p.Address("web-01").IP, "released")
	assert.Zero(t, p.DiskGB("web-01"))
	require.NoError(t, p.Destroy(ctx, "web-01"), "destroying an absent VM is a no-op")
}

func TestBootRefusesAVolumeThatIsNotAFile(t *testing.T) {
	ctx := context.Background()
	p := New()
	vol := filepath.Join(t.TempDir(), "data")
	m := machine(t, "web-01", 5, vol)
	require.NoError(t, p.PrepareRootDisk(ctx, m))
	assert.ErrorIs(t, p.Boot(ctx, m), os.ErrNotExist)
	require.NoError(t, os.WriteFile(vol, nil, 0o600))
	require.NoError(t, p.Boot(ctx, m))
}

func TestInjectedErrorsAndCalls(t *testing.T) {
	ctx := context.Background()
	p := New()
	boom := errors.New("boom")
	p.FailOnce(OpPreflight, boom)
	assert.ErrorIs(t, p.Preflight(ctx), boom)
	assert.NoError(t, p.Preflight(ctx), "once means once")
	p.FailAlways(OpShutdown, boom)
	assert.ErrorIs(t, p.Shutdown(ctx, "a"), boom)
	assert.ErrorIs(t, p.Shutdown(ctx, "a"), boom)
	p.FailAlways(OpShutdown, nil)
	assert.NoError(t, p.Shutdown(ctx, "a"))
	assert.Equal(t, []string{"a", "a", "a"}, p.Calls(OpShutdown), "failed calls are recorded too")

	p.SetLateAddress(true)
	m := machine(t, "b", 1)
	require.NoError(t, p.PrepareRootDisk(ctx, m))
	require.NoError(t, p.Boot(ctx, m))
	assert.Empty(t, p.Address("b").IP)
	p.AnswerAddress("b")
	assert.NotEmpty(t, p.Address("b").IP)
}
