package agent_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// guarding counts GuardHost calls.
type guarding struct {
	*agenttest.Provisioner
	calls atomic.Int32
}

var _ agent.HostGuard = (*guarding)(nil)

func (g *guarding) GuardHost(context.Context) error {
	g.calls.Add(1)
	return nil
}

// The host's guards against guests are put back at every tick, the host
// suspended or not: a suspension keeps guests running, and a flushed
// firewall would leave them reaching the host's services meanwhile.
func TestGuardHostRunsEveryTickSuspendedOrNot(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	var g *guarding
	h := newHostAgent(t, bare, newClock(), func(c *agent.EngineConfig) {
		g = &guarding{Provisioner: c.Provisioner.(*agenttest.Provisioner)}
		c.Provisioner = g
	})
	publish(t, bare, snap(1, vm("web-01")))
	require.NoError(t, h.once())
	n := g.calls.Load()
	require.NotZero(t, n, "GuardHost runs at a tick")
	publish(t, bare, suspended(snap(2, vm("web-01")), "maintenance"))
	require.NoError(t, h.once())
	require.NoError(t, h.once())
	require.Greater(t, g.calls.Load(), n+1, "GuardHost runs at every tick of a suspended host")
}
