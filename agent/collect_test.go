package agent_test

import (
	"context"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
)

// collecting is a backend with an image cache: it records what the engine
// asks it to keep.
type collecting struct {
	*agenttest.Provisioner
	mu     sync.Mutex
	passes [][]string // VM names per CollectImages call
	grace  time.Duration
}

func (c *collecting) CollectImages(_ context.Context, vms []agent.Machine, grace time.Duration) (agent.ImageCollection, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var names []string
	for _, m := range vms {
		names = append(names, m.Name)
	}
	sort.Strings(names)
	c.passes = append(c.passes, names)
	c.grace = grace
	// As a cache holding one artifact in use (1 GiB) and one removed.
	return agent.ImageCollection{Removed: []string{"old"}, RemovedBytes: 512, Kept: 1, KeptBytes: 1 << 30}, nil
}

func (c *collecting) calls() [][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]string(nil), c.passes...)
}

// The engine asks the backend to collect its image cache at most every
// ImageCollectInterval, naming every VM it has a record of (a vanished one
// included) and every VM of the snapshot (a tombstoned one included), and
// never while a record cannot be read.
func TestTickCollectsTheImageCacheWithEveryVMItKnows(t *testing.T) {
	p := &collecting{Provisioner: agenttest.New()}
	f := newFixture(t, func(c *agent.EngineConfig) { c.Provisioner = p; c.ImageGrace = 36 * time.Hour })
	f.step(snap(1, vm("web-01"), vm("db-01")))
	require.Equal(t, [][]string{{"db-01", "web-01"}}, p.calls(), "the snapshot's VMs, before any record exists")
	assert.Equal(t, 36*time.Hour, p.grace)

	f.step(snap(2, vm("web-01"), tombstoned(vm("gone-01"))))
	assert.Len(t, p.calls(), 1, "not again within the interval")

	f.clock.Add(agent.ImageCollectInterval)
	f.step(nil)
	calls := p.calls()
	require.Len(t, calls, 2)
	assert.Equal(t, []string{"db-01", "gone-01", "web-01", "web-01"}, calls[1], "db-01 vanished but has a record; gone-01 is tombstoned")

	f.eng.Close(context.Background())
	require.NoError(t, os.WriteFile(f.store.RecordPath("web-01"), []byte("{not json"), 0o600))
	f.start()
	f.clock.Add(agent.ImageCollectInterval)
	f.step(nil)
	assert.Len(t, p.calls(), 2, "an unreadable record stops collection")
}

// ImageGrace below zero turns collection off.
func TestNegativeImageGraceTurnsCollectionOff(t *testing.T) {
	p := &collecting{Provisioner: agenttest.New()}
	f := newFixture(t, func(c *agent.EngineConfig) { c.Provisioner = p; c.ImageGrace = -1 })
	f.step(snap(1, vm("web-01")))
	assert.Empty(t, p.calls())
}
