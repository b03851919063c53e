package fleet

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// Without agent keys, a host status anyone can push to the host's branch
// reports a lastSeenEpoch just under the highest an agent accepts, then
// one above it. Before, the fence recovery followed the first, and after
// three reviewed edits the host sat at the bound, its snapshot held, until
// a person restored the ledger and deployed an epoch reset; the second
// held it as long as it stayed. Neither is followed now: the controller
// never published such an epoch, and no signature vouches for the status.
// Every edit publishes at the next epoch, and the pass says why the status
// was not followed.
func TestAttackForgedStatusFreezesNoHost(t *testing.T) {
	e := newEnv(t, baseFleet())
	epoch := e.pass().Published["hv-a"]
	for i, seen := range []uint64{snapshots.MaxAcceptedEpoch - 1, snapshots.MaxAcceptedEpoch + 1} {
		writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: uint64(10 + i), LastSeenEpoch: seen})
		for edit := range 3 {
			e.commit(gittest.Edit{Write: map[string]string{"vms/web-01.yaml": vmYAML("web-01", "hv-a", 3+3*i+edit)}, Message: "a reviewed edit"})
			res := e.pass()
			epoch++
			if res.Published["hv-a"] != epoch || len(res.Held) != 0 || len(res.FenceJumps) != 0 {
				t.Fatalf("forged lastSeenEpoch %d, edit %d: published %v, held %v, jumps %v; want hv-a at %d", seen, edit, res.Published, res.Held, res.FenceJumps, epoch)
			}
			why := res.EpochsNotFollowed["hv-a"]
			if !strings.Contains(why, "not followed") || !strings.Contains(why, "agentKey") || !strings.Contains(why, status.HostBranch("hv-a")) {
				t.Fatalf("forged lastSeenEpoch %d: not followed because %q", seen, why)
			}
		}
	}
	if got := e.ledger().Hosts["hv-a"].Epoch; got != epoch {
		t.Fatalf("ledger at %d, want %d", got, epoch)
	}
}

// publishEpochs makes the controller publish hv-a n more times (an edit
// each) and returns hv-a's epoch then.
func (e *env) publishEpochs(n int) uint64 {
	e.t.Helper()
	var epoch uint64
	for i := range n {
		e.commit(gittest.Edit{Write: map[string]string{"vms/web-01.yaml": vmYAML("web-01", "hv-a", 3+i)}})
		epoch = e.pass().Published["hv-a"]
	}
	return epoch
}

// resetSnapshots moves the snapshots branch back to commit, as restoring
// it from an old copy does.
func (e *env) resetSnapshots(commit string) {
	e.t.Helper()
	gittest.Git(e.t, e.dir, "update-ref", "refs/heads/"+DefaultSnapshotsBranch, commit)
}

// A snapshots branch restored from an old copy, below the epochs this
// controller published: the agent's unsigned status, at an epoch the
// controller did publish, is followed back up, by the running controller
// and by one restarted over the same cache directory (whose history is
// kept beside it). A controller with no such history (a new cache
// directory) does not follow it, and says why.
func TestFenceRecoveryFollowsARestoredBranch(t *testing.T) {
	e := newEnv(t, nil)
	e.commit(gittest.Edit{Write: baseFleet(), Message: "initial fleet"})
	cache := filepath.Join(t.TempDir(), "cache")
	withCache := func(dir string) *Controller {
		c, err := New(Config{URL: e.url, CacheDir: dir, Clock: e.clock.Now, Logger: quietLogger(), SummaryInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	e.c = withCache(cache)
	e.pass()
	old := e.snapshotsTip()
	oldEpoch := e.snapshot("hv-a").Epoch
	top := e.publishEpochs(4)

	for _, restart := range []bool{false, true} {
		e.resetSnapshots(old)
		if restart {
			e.c.Close()
			e.c = withCache(cache)
		}
		writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: top, LastSeenEpoch: top, FenceViolation: true,
			SnapshotError: "snapshot epoch below the one accepted"})
		res := e.pass()
		if res.FenceJumps["hv-a"] != top || res.Published["hv-a"] != top+1 || len(res.EpochsNotFollowed) != 0 {
			t.Fatalf("restart %v: jumps %v, published %v, not followed %v; want hv-a jumped to %d, published at %d", restart, res.FenceJumps, res.Published, res.EpochsNotFollowed, top, top+1)
		}
		top++
		writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: top, LastSeenEpoch: top})
		e.pass()
	}

	e.resetSnapshots(old)
	e.c.Close()
	e.c = withCache(filepath.Join(t.TempDir(), "other"))
	res := e.pass()
	if _, ok := res.EpochsNotFollowed["hv-a"]; !ok || res.FenceJumps["hv-a"] != 0 || res.Published["hv-a"] > top {
		t.Fatalf("a controller without the history: jumps %v, published %v, not followed %v", res.FenceJumps, res.Published, res.EpochsNotFollowed)
	}
	if e.snapshot("hv-a").Epoch <= oldEpoch {
		t.Fatalf("hv-a at %d", e.snapshot("hv-a").Epoch)
	}
}

// Without keys, what the snapshots branch holds is what agents accept: a
// snapshot pushed there at a high epoch, tombstoning web-01, is accepted
// by hv-a's agent, whose status then reports that epoch. The controller
// saw the file on the branch, so it follows the status past it and
// publishes hv-a above it, web-01 live again, within the agent's grace.
// (A status alone at such an epoch, with no such file, moves nothing:
// TestAttackForgedStatusFreezesNoHost.)
func TestFenceRecoveryFollowsAForgedSnapshotItSaw(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	forged := *e.snapshot("hv-a")
	forged.Epoch = 5000
	forged.VMs = append([]snapshots.SnapshotVM(nil), forged.VMs...)
	for i := range forged.VMs {
		if forged.VMs[i].Name == "web-01" {
			forged.VMs[i].Tombstoned = true
			forged.VMs[i].Tombstone = &snapshots.Tombstone{Commit: "0123456789abcdef0123456789abcdef01234567", Author: "Eve <eve@example.com>", Time: "2026-01-01T00:00:00Z", Epoch: 5000}
		}
	}
	data, err := snapshots.MarshalSnapshot(&forged)
	if err != nil {
		t.Fatal(err)
	}
	e.commit(gittest.Edit{Branch: DefaultSnapshotsBranch, Message: "forged", Write: map[string]string{snapshots.Path("hv-a"): string(data)}})
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 2, LastSeenEpoch: 5000})
	res := e.pass()
	if res.FenceJumps["hv-a"] != 5000 || res.Published["hv-a"] != 5001 || len(res.EpochsNotFollowed) != 0 {
		t.Fatalf("jumps %v, published %v, not followed %v; want hv-a published at 5001", res.FenceJumps, res.Published, res.EpochsNotFollowed)
	}
	if vm := e.snapshot("hv-a").VM("web-01"); vm == nil || vm.Tombstoned {
		t.Fatalf("web-01 in hv-a's snapshot: %+v", vm)
	}
}
