package fleet

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// Two controllers: A reads the desired branch, is slowed, and meanwhile a
// delete is pushed and B publishes its tombstone. A's publish (of an edit
// it read, which B publishes too) must not move the ledger's applied
// commit back to the head it read (that would read as a history rewrite
// and un-delete the VM): it loses the race, reads the desired branch
// again, and publishes nothing B has not.
func TestStaleControllerLosesTheRace(t *testing.T) {
	e := newEnv(t, baseFleet())
	a, b := e.c, e.newController()
	e.pass()
	if _, err := b.Pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Something for A to publish from the head it reads: it builds on
	// the snapshots tip it fetched, which B moves meanwhile.
	e.commit(growDB())
	var deleted string
	a.beforePublish = func() {
		a.beforePublish = nil
		deleted = e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}, Message: "retire web-01"})
		res, err := b.Pass(t.Context())
		if err != nil || len(res.Tombstoned) != 1 {
			t.Fatalf("B's pass: %+v, %v; want web-01 tombstoned", res, err)
		}
	}
	before := e.snapshot("hv-a").Epoch
	res := e.pass() // A, with the head it read before the delete
	if len(res.Undeleted) != 0 || len(res.Retained) != 0 {
		t.Fatalf("the stale controller undid the delete: %+v", res)
	}
	if res.Head != deleted {
		t.Errorf("A's pass ended on %s, want the head it read again, %s", res.Head, deleted)
	}
	l := e.ledger()
	if l.Applied == nil || string(l.Applied.Commit) != deleted {
		t.Fatalf("applied commit %+v, want %s: it went backwards", l.Applied, deleted)
	}
	if len(l.Tombstones) != 1 || l.Tombstones[0].Name != "web-01" {
		t.Fatalf("tombstones %+v, want web-01's", l.Tombstones)
	}
	snap := e.snapshot("hv-a")
	if snap.Epoch < before {
		t.Errorf("epoch went back from %d to %d", before, snap.Epoch)
	}
	if vm := snap.VM("web-01"); vm == nil || !vm.Tombstoned {
		t.Errorf("web-01 in hv-a's snapshot: %+v, want tombstoned", vm)
	}
}

// A slow controller with nothing to publish from the head it read builds
// on the snapshots tip it fetched, which another controller moved
// meanwhile: it writes nothing, so the applied commit stays the other
// controller's, and its next pass reads the new tips.
func TestStaleControllerWithNothingToPublishWritesNothing(t *testing.T) {
	e := newEnv(t, baseFleet())
	a, b := e.c, e.newController()
	e.pass()
	if _, err := b.Pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	var deleted, moved string
	a.beforePublish = func() {
		a.beforePublish = nil
		deleted = e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}, Message: "retire web-01"})
		res, err := b.Pass(t.Context())
		if err != nil || len(res.Tombstoned) != 1 {
			t.Fatalf("B's pass: %+v, %v; want web-01 tombstoned", res, err)
		}
		moved = res.SnapshotsCommit
	}
	if res := e.pass(); len(res.Published) != 0 || len(res.Undeleted) != 0 {
		t.Fatalf("the stale controller published: %+v", res)
	}
	if tip := gittest.Rev(t, e.dir, "refs/heads/"+DefaultSnapshotsBranch); tip != moved {
		t.Fatalf("snapshots tip %s, want B's %s untouched", tip, moved)
	}
	if l := e.ledger(); l.Applied == nil || string(l.Applied.Commit) != deleted {
		t.Fatalf("applied commit %+v, want %s", l.Applied, deleted)
	}
	res := e.pass()
	if res.Head != deleted || len(res.Undeleted) != 0 {
		t.Errorf("A's next pass: head %s, undeleted %v; want %s and nothing undeleted", res.Head, res.Undeleted, deleted)
	}
}

// A history really rewritten (the desired branch reset to an older
// commit, and still there when the publish re-checks) is no lost race: it
// is published, and what it dropped is retained, not deleted.
func TestRewriteIsNoLostRace(t *testing.T) {
	e := newEnv(t, baseFleet())
	first := gittest.Rev(t, e.dir, "main")
	e.pass()
	e.commit(gittest.Edit{Write: map[string]string{"vms/web-02.yaml": vmYAML("web-02", "hv-a", 1)}})
	e.pass()
	gittest.SetBranch(t, e.dir, "main", first)
	res := e.pass()
	if res.Head != first || len(res.Retained) != 1 {
		t.Fatalf("a reset to an older commit: %+v, want it published with web-02 retained", res)
	}
	if l := e.ledger(); string(l.Applied.Commit) != first {
		t.Errorf("applied %s, want the reset head %s", l.Applied.Commit, first)
	}
}

// Two controllers cannot share a cache directory: the second is refused
// until the first is closed, and a tips cache is locked the same way.
func TestCacheDirectoryLocked(t *testing.T) {
	dir := gittest.NewBare(t)
	cache, tips := filepath.Join(t.TempDir(), "git"), filepath.Join(t.TempDir(), "tips")
	first, err := New(Config{URL: dir, CacheDir: cache, TipsCacheDir: tips, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]Config{
		"cache":      {URL: dir, CacheDir: cache, Logger: quietLogger()},
		"tips cache": {URL: dir, CacheDir: filepath.Join(t.TempDir(), "other"), TipsCacheDir: tips, Logger: quietLogger()},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrCacheInUse) || !strings.Contains(err.Error(), fmt.Sprint(os.Getpid())) {
			t.Errorf("%s shared: %v, want ErrCacheInUse naming the holder", name, err)
		}
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second, err := New(Config{URL: dir, CacheDir: cache, TipsCacheDir: tips, Logger: quietLogger()})
	if err != nil {
		t.Fatalf("after Close: %v", err)
	}
	second.Close()
}
