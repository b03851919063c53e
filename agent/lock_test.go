package agent_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
)

// stallingReadiness is a backend whose Readiness blocks while armed, as a
// backend that reads a disk or a socket might.
type stallingReadiness struct {
	*agenttest.Provisioner
	mu      sync.Mutex
	armed   bool
	entered chan struct{}
	release chan struct{}
}

func (p *stallingReadiness) Readiness(name string) agent.Readiness {
	p.mu.Lock()
	armed := p.armed
	p.armed = false
	p.mu.Unlock()
	if armed {
		close(p.entered)
		<-p.release
	}
	return p.Provisioner.Readiness(name)
}

// TestReportAsksTheBackendOutsideTheEngineLock: while Report waits on the
// backend, the engine still answers (Snapshot takes the engine lock), so a
// slow backend never stalls a tick or the status writer behind it.
func TestReportAsksTheBackendOutsideTheEngineLock(t *testing.T) {
	p := &stallingReadiness{Provisioner: agenttest.New(), entered: make(chan struct{}), release: make(chan struct{})}
	f := newFixture(t, func(c *agent.EngineConfig) { c.Provisioner = p })
	st := f.step(snap(1, vm("web-01")))
	require.Equal(t, status.PhaseReady, row(t, st, "web-01").Phase)

	p.mu.Lock()
	p.armed = true
	p.mu.Unlock()
	done := make(chan *status.Status)
	go func() { done <- f.eng.Report() }()
	<-p.entered // Report is inside the backend now
	answered := make(chan struct{})
	go func() { f.eng.Snapshot(); close(answered) }()
	select {
	case <-answered:
	case <-time.After(30 * time.Second):
		close(p.release)
		t.Fatal("the engine lock is held while Report waits on the backend")
	}
	close(p.release)
	assert.Equal(t, status.PhaseReady, row(t, <-done, "web-01").Phase)
}
