package agent_test

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// TestStatusFileGolden pins the whole status file an agent writes for a
// host with a running VM, a stopped one, one failing, one quarantined, one
// vanished (dropped from the snapshot without a tombstone), an ack, volumes
// and an orphan.
func TestStatusFileGolden(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	clk := newClock()
	h := newHostAgent(t, bare, clk, nil)
	// Two VMs boot at once; addresses are handed out as the test answers,
	// not in the order the workers happen to run, so the file is stable.
	h.prov.SetLateAddress(true)
	vols := []string{"web-01-data"}
	publish(t, bare, withVolumes(snap(1, vm("web-01", volumes(vols...)), vm("db-01", stopped), vm("old-01", stopped), vm("bad-01", stopped), vm("lost-01")),
		vol("web-01-data", 10), vol("scratch", 1)))
	require.NoError(t, h.once())
	h.prov.AnswerAddress("web-01")

	h.prov.FailAlways(agenttest.OpBoot, agent.Permanent(errors.New("qemu exited: exit status 1: qemu-system-x86_64: -drive: Could not open root.qcow2")))
	clk.Add(time.Minute)
	publish(t, bare, withVolumes(snap(2, vm("web-01", volumes(vols...)), vm("db-01", stopped), tombstoned(vm("old-01", stopped)), vm("bad-01"), tombstoned(vm("gone-01"))),
		vol("web-01-data", 10)))
	require.NoError(t, h.once())

	got, err := gitShow(bare, status.HostBranch(testHost)+":"+status.Path(testHost))
	require.NoError(t, err)
	golden := filepath.Join("testdata", "status.golden")
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(golden, got, 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err, "run go test -run TestStatusFileGolden -update to create it")
	assert.Equal(t, string(want), string(got))
}
