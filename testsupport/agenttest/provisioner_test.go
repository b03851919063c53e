package agenttest

import (
	"context"
	"errors"
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

// The table itself (disks, boots, addresses, volumes) is inmem's and
// tested there; here, what agenttest adds.
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
