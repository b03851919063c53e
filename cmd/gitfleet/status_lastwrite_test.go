package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// gitfleet status shows how old the controller's view is: its age after
// a controller just wrote, and, when the last write is older than three
// refresh intervals (a stopped controller), a warning above everything,
// in the table and in the JSON.
func TestStatusSaysWhenTheControllerLastWrote(t *testing.T) {
	gittest.NeedGit(t)
	dir := cliFleet(t)
	code, out := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once")
	require.Equal(t, 0, code, out)

	code, out = runCLI(t, "status", "--repo", dir)
	require.Equal(t, 0, code, out)
	require.True(t, strings.HasPrefix(out, "Controller last wrote "), "the age comes first:\n%s", out)
	require.NotContains(t, out, "WARNING")
	rep, out := statusJSON(t, dir)
	require.NotNil(t, rep.ControllerWrote, out)
	require.False(t, rep.ControllerWrote.Stale, out)
	require.Equal(t, int64(fleet.DefaultSummaryInterval/time.Second), rep.ControllerWrote.RefreshSeconds)

	// The controller stopped two hours ago: its last write says so.
	old, err := status.MarshalLastWrite(status.LastWrite{At: time.Now().Add(-2 * time.Hour), RefreshSeconds: 600})
	require.NoError(t, err)
	gittest.Commit(t, dir, gittest.Edit{Branch: fleet.DefaultStatusBranch, Write: map[string]string{status.LastWritePath: string(old)}})
	code, out = runCLI(t, "status", "--repo", dir)
	require.Equal(t, 0, code, out)
	require.True(t, strings.HasPrefix(out, "WARNING: the controller last wrote 2h0m"), "a stale view is said first:\n%s", out)
	require.Contains(t, out, "What follows is its last view")
	rep, out = statusJSON(t, dir)
	require.NotNil(t, rep.ControllerWrote, out)
	require.True(t, rep.ControllerWrote.Stale, out)
	require.GreaterOrEqual(t, rep.ControllerWrote.AgeSeconds, int64(7200))

	// Within three intervals it is not stale: an idle fleet writes every ten minutes.
	recent, err := status.MarshalLastWrite(status.LastWrite{At: time.Now().Add(-25 * time.Minute), RefreshSeconds: 600})
	require.NoError(t, err)
	gittest.Commit(t, dir, gittest.Edit{Branch: fleet.DefaultStatusBranch, Write: map[string]string{status.LastWritePath: string(recent)}})
	code, out = runCLI(t, "status", "--repo", dir)
	require.Equal(t, 0, code, out)
	require.NotContains(t, out, "WARNING", out)
	require.Contains(t, out, "Controller last wrote 25m")

	// An unreadable file is said, never read as fresh.
	gittest.Commit(t, dir, gittest.Edit{Branch: fleet.DefaultStatusBranch, Write: map[string]string{status.LastWritePath: "at: yesterday\n"}})
	code, out = runCLI(t, "status", "--repo", dir)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "Controller last wrote: unknown")
}

// statusJSON is `gitfleet status --format json` of dir, which must exit 0,
// parsed, with its output.
func statusJSON(t *testing.T, dir string) (statusReport, string) {
	t.Helper()
	code, out := runCLI(t, "status", "--repo", dir, "--format", "json")
	require.Equal(t, 0, code, out)
	var rep statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	return rep, out
}
