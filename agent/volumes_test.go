package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
)

func vol(name string, sizeGB int) snapshots.SnapshotVolume {
	return snapshots.SnapshotVolume{Name: name, SizeGB: sizeGB}
}

func tombVol(name string, sizeGB int) snapshots.SnapshotVolume {
	v := vol(name, sizeGB)
	v.Tombstoned = true
	return v
}

func volRow(t *testing.T, st *status.Status, name string) status.Volume {
	t.Helper()
	for _, v := range st.Volumes {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("no volume row %s in %+v", name, st.Volumes)
	return status.Volume{}
}

func TestAVolumeIsCreatedSparseAtItsSize(t *testing.T) {
	f := newFixture(t)
	st := f.step(withVolumes(snap(1), vol("data", 50)))
	assert.Equal(t, status.Volume{Name: "data", Present: true, SizeGB: 50}, volRow(t, st, "data"))
	fi, err := os.Stat(f.store.VolumePath("data"))
	require.NoError(t, err)
	assert.Equal(t, int64(50)<<30, fi.Size())
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	blocks := fi.Sys().(*syscall.Stat_t).Blocks
	assert.Less(t, blocks, int64(1024), "sparse: no data blocks written")
	_, err = os.Stat(f.store.VolumePath("data") + ".partial")
	assert.ErrorIs(t, err, os.ErrNotExist, "the temporary was renamed into place")
}

func TestATornPartialIsReplacedNotTrusted(t *testing.T) {
	f := newFixture(t)
	require.NoError(t, os.WriteFile(f.store.VolumePath("data")+".partial", []byte("torn"), 0o600))
	st := f.step(withVolumes(snap(1), vol("data", 2)))
	assert.Equal(t, 2, volRow(t, st, "data").SizeGB)
	assert.Empty(t, st.Orphans, "a temporary is not an orphan")
}

func TestAVolumeIsNeverResized(t *testing.T) {
	for _, size := range []int{1, 100} {
		f := newFixture(t)
		f.step(withVolumes(snap(1), vol("data", 10)))
		st := f.step(withVolumes(snap(2), vol("data", size)))
		assert.Equal(t, 10, volRow(t, st, "data").SizeGB, "asked %d GB", size)
	}
}

func TestOrphanVolumesAreReportedAndKept(t *testing.T) {
	f := newFixture(t)
	f.step(withVolumes(snap(1), vol("data", 1), vol("logs", 1)))
	f.clock.Add(48 * time.Hour)
	st := f.step(withVolumes(snap(2), vol("data", 1)))
	assert.Equal(t, []string{"logs"}, st.Orphans)
	_, err := os.Stat(f.store.VolumePath("logs"))
	assert.NoError(t, err, "a volume the snapshot forgot is kept")

	st = f.step(snap(3))
	assert.Equal(t, []string{"data", "logs"}, st.Orphans, "an empty snapshot deletes no volume either")
}

func TestAVolumeGoneFromTheSnapshotWithItsVMIsKept(t *testing.T) {
	f := newFixture(t)
	f.step(withVolumes(snap(1, vm("web-01", volumes("data"))), vol("data", 1)))
	// A restored repository lacks both the VM and its volume, untombstoned.
	st := f.step(snap(2))
	f.clock.Add(365 * 24 * time.Hour)
	st = f.step(snap(2))
	assert.Equal(t, []string{"data"}, st.Orphans)
	_, err := os.Stat(f.store.VolumePath("data"))
	assert.NoError(t, err, "an orphan is kept, however long")
	assert.Equal(t, []string{"web-01"}, vanished(st))
}

func TestAVolumeTombstoneThatLeavesTheSnapshotIsForgotten(t *testing.T) {
	f := newFixture(t)
	f.step(withVolumes(snap(1), vol("data", 1)))
	f.step(withVolumes(snap(2), tombVol("data", 1)))
	f.clock.Add(4 * time.Minute)
	st := f.step(snap(3)) // the tombstone is lost, not finalized
	assert.Equal(t, []string{"data"}, st.Orphans)
	_, err := os.Stat(f.store.VolumePath("data") + ".tombstone")
	assert.ErrorIs(t, err, os.ErrNotExist, "the pending reclaim is forgotten")

	f.clock.Add(time.Hour)
	st = f.step(withVolumes(snap(4), tombVol("data", 1)))
	assert.True(t, volRow(t, st, "data").Present, "a returning tombstone gets a whole new grace")
	f.clock.Add(5 * time.Minute)
	st = f.step(nil)
	assert.False(t, volRow(t, st, "data").Present)
}

func TestATombstonedVolumeIsDeletedOnlyAfterItsGrace(t *testing.T) {
	f := newFixture(t)
	f.step(withVolumes(snap(1), vol("data", 1)))
	st := f.step(withVolumes(snap(2), tombVol("data", 1)))
	assert.True(t, volRow(t, st, "data").Present)
	marker := f.store.VolumePath("data") + ".tombstone"
	_, err := os.Stat(marker)
	require.NoError(t, err, "the grace starts from a marker on disk")

	f.clock.Add(4 * time.Minute)
	f.restart() // restating the tombstone, or restarting, does not restart the clock
	st = f.step(withVolumes(snap(3), tombVol("data", 1)))
	assert.True(t, volRow(t, st, "data").Present)

	f.clock.Add(time.Minute)
	st = f.step(withVolumes(snap(3), tombVol("data", 1)))
	assert.Equal(t, status.Volume{Name: "data", Present: false}, volRow(t, st, "data"))
	for _, p := range []string{f.store.VolumePath("data"), marker} {
		_, err := os.Stat(p)
		assert.ErrorIs(t, err, os.ErrNotExist, p)
	}
}

func TestAnUndeletedVolumeForgetsItsPendingReclaim(t *testing.T) {
	f := newFixture(t)
	f.step(withVolumes(snap(1), vol("data", 1)))
	f.step(withVolumes(snap(2), tombVol("data", 1)))
	f.clock.Add(4 * time.Minute)
	f.step(withVolumes(snap(3), vol("data", 1)))
	f.clock.Add(4 * time.Minute)
	st := f.step(withVolumes(snap(4), tombVol("data", 1)))
	assert.True(t, volRow(t, st, "data").Present, "a new delete gets a whole new grace")
}

func TestATombstonedVolumeAttachedToARunningVMWaits(t *testing.T) {
	f := newFixture(t)
	f.step(withVolumes(snap(1, vm("web-01", volumes("data"))), vol("data", 1)))
	f.clock.Add(time.Hour)
	f.step(withVolumes(snap(2, vm("web-01", volumes("data"))), tombVol("data", 1)))
	f.clock.Add(time.Hour)
	st := f.step(withVolumes(snap(2, vm("web-01", volumes("data"))), tombVol("data", 1)))
	assert.True(t, volRow(t, st, "data").Present)
}

// A volume is reclaimed only once no VM on the host attaches it: a stopped
// VM, one the snapshot dropped (vanished), or one whose record cannot be
// read (what it attaches is unknown) all keep it.
func TestATombstonedVolumeWaitsForEveryVMThatMayAttachIt(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after func(f *fixture) *snapshots.Snapshot // the snapshot that tombstones data
	}{
		{"stopped VM", func(f *fixture) *snapshots.Snapshot {
			return withVolumes(snap(2, vm("db-01", volumes("data"), stopped)), tombVol("data", 1))
		}},
		{"vanished VM", func(f *fixture) *snapshots.Snapshot {
			return withVolumes(snap(2), tombVol("data", 1))
		}},
		{"unreadable record", func(f *fixture) *snapshots.Snapshot {
			f.eng.Close(context.Background())
			require.NoError(t, os.WriteFile(f.store.RecordPath("db-01"), []byte("{not json"), 0o600))
			f.start()
			return withVolumes(snap(2, tombstoned(vm("db-01", volumes("data")))), tombVol("data", 1))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.step(withVolumes(snap(1, vm("db-01", volumes("data"))), vol("data", 1)))
			next := tc.after(f)
			f.step(next)
			for i := 0; i < 3; i++ {
				f.clock.Add(time.Hour)
				f.step(next)
			}
			_, err := os.Stat(f.store.VolumePath("data"))
			require.NoError(t, err, "the volume a VM on this host attaches was deleted")
		})
	}
}

// Deleting a VM and its volume in one reviewed change destroys the VM
// first; the volume goes at the next tick after that.
func TestAVolumeDeletedWithItsVMGoesAfterTheVM(t *testing.T) {
	f := newFixture(t)
	f.step(withVolumes(snap(1, vm("db-01", volumes("data"))), vol("data", 1)))
	gone := withVolumes(snap(2, tombstoned(vm("db-01", volumes("data")))), tombVol("data", 1))
	f.step(gone)
	f.clock.Add(time.Hour)
	st := f.step(gone)
	assert.Contains(t, st.Destroyed, "db-01")
	st = f.step(gone)
	assert.False(t, volRow(t, st, "data").Present, "reclaimed once the VM was destroyed")
}

func TestATombstonedVolumeThatIsNotHereIsReportedAbsent(t *testing.T) {
	f := newFixture(t)
	st := f.step(withVolumes(snap(1), tombVol("data", 1)))
	assert.Equal(t, status.Volume{Name: "data", Present: false}, volRow(t, st, "data"))
}

func TestAStatErrorReadsAsPresent(t *testing.T) {
	f := newFixture(t)
	p := f.store.VolumePath("data")
	require.NoError(t, os.Symlink(filepath.Base(p), p)) // a loop: stat fails, not with "does not exist"
	st := f.step(withVolumes(snap(1), vol("data", 1)))
	assert.True(t, volRow(t, st, "data").Present)
	assert.Contains(t, volRow(t, st, "data").Error, "stat "+p, "and says why its size is unknown")
	target, err := os.Readlink(p)
	require.NoError(t, err, "nothing was created over it")
	assert.Equal(t, "data", target)
}

func TestVolumeNamesAreCheckedBeforeAnyPath(t *testing.T) {
	f := newFixture(t)
	outside := filepath.Join(f.dir, "precious")
	require.NoError(t, os.WriteFile(outside, []byte("keep"), 0o600))
	names := []string{"../precious", "a/b", "Data", "with.dot", "", "-x"}
	var vols []snapshots.SnapshotVolume
	for _, n := range names {
		vols = append(vols, tombVol(n, 1))
	}
	f.step(withVolumes(snap(1), vols...))
	f.clock.Add(time.Hour)
	st := f.step(withVolumes(snap(1), vols...))
	for _, n := range names {
		assert.False(t, volRow(t, st, n).Present, "%q", n)
	}
	data, err := os.ReadFile(outside)
	require.NoError(t, err)
	assert.Equal(t, "keep", string(data))
	ents, err := os.ReadDir(f.store.VolumesDir())
	require.NoError(t, err)
	assert.Empty(t, ents, "nothing made for a name that is not one")
}

func TestVolumesExistBeforeTheVMBoots(t *testing.T) {
	f := newFixture(t)
	st := f.step(withVolumes(snap(1, vm("web-01", volumes("data", "logs"))), vol("data", 1), vol("logs", 2)))
	assert.Equal(t, status.PhaseReady, row(t, st, "web-01").Phase)
	m, ok := f.prov.BootedWith("web-01")
	require.True(t, ok)
	assert.Equal(t, []string{f.store.VolumePath("data"), f.store.VolumePath("logs")}, m.Volumes, "in spec order")
}

func TestAVMWhoseVolumeIsNotHereWaitsWithoutSpendingAttempts(t *testing.T) {
	f := newFixture(t)
	for i := 0; i < 4; i++ {
		r := row(t, f.step(snap(1, vm("web-01", volumes("data")))), "web-01")
		assert.Equal(t, status.PhaseCreating, r.Phase)
		assert.Contains(t, r.LastError, "volume not present")
	}
	assert.Empty(t, f.prov.Calls(agenttest.OpBoot))
	st := f.step(withVolumes(snap(2, vm("web-01", volumes("data"))), vol("data", 1)))
	assert.Equal(t, status.PhaseReady, row(t, st, "web-01").Phase)
}

func TestTheStoreIsPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	st, err := agent.OpenStore(dir)
	require.NoError(t, err)
	fi, err := os.Stat(st.Root())
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
	require.NoError(t, st.SaveRecord(&agent.Record{Name: "web-01"}))
	fi, err = os.Stat(st.RecordPath("web-01"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	ents, err := os.ReadDir(st.VMDir("web-01"))
	require.NoError(t, err)
	assert.Len(t, ents, 1, "no temporary left beside the record")
	assert.ErrorIs(t, st.SaveRecord(&agent.Record{Name: "../x"}), agent.ErrInvalidName)
}

func TestTheStoreKeepsCounters(t *testing.T) {
	st, err := agent.OpenStore(t.TempDir())
	require.NoError(t, err)
	for _, c := range []struct {
		get  func() (uint64, error)
		save func(uint64) error
	}{{st.LastEpoch, st.SaveEpoch}, {st.Heartbeat, st.SaveHeartbeat}} {
		n, err := c.get()
		require.NoError(t, err)
		assert.Zero(t, n)
		require.NoError(t, c.save(42))
		n, err = c.get()
		require.NoError(t, err)
		assert.Equal(t, uint64(42), n)
	}
	snap, err := st.LoadSnapshot()
	require.NoError(t, err)
	assert.Nil(t, snap, "none accepted yet")
}

func TestADanglingSymlinkIsAPresentVolumeThatSaysWhy(t *testing.T) {
	f := newFixture(t)
	p := f.store.VolumePath("data")
	target := filepath.Join(f.dir, "elsewhere", "data.img")
	require.NoError(t, os.Symlink(target, p))
	s := withVolumes(snap(1, vm("web-01", volumes("data"))), vol("data", 1))
	for i := 0; i < 4; i++ {
		st := f.step(s)
		v := volRow(t, st, "data")
		assert.True(t, v.Present, "a link is there: never created over")
		assert.Contains(t, v.Error, "symlink")
		assert.Contains(t, v.Error, target)
		r := row(t, st, "web-01")
		assert.Equal(t, status.PhaseFailed, r.Phase)
		assert.Contains(t, r.LastError, "volume data: "+p+" is a symlink to")
		assert.Contains(t, r.LastError, "which does not exist")
	}
	assert.Zero(t, f.record("web-01").Attempts, "no attempt spent: it is checked again every tick")
	assert.Empty(t, f.prov.Calls(agenttest.OpBoot))
	got, err := os.Readlink(p)
	require.NoError(t, err, "the link is left as it is")
	assert.Equal(t, target, got)

	// The operator restores the link's target: the create goes on.
	require.NoError(t, os.MkdirAll(filepath.Dir(target), 0o700))
	require.NoError(t, os.WriteFile(target, nil, 0o600))
	require.NoError(t, os.Truncate(target, 1<<30))
	st := f.step(s)
	assert.Equal(t, status.Volume{Name: "data", Present: true, SizeGB: 1}, volRow(t, st, "data"))
	r := row(t, st, "web-01")
	assert.Equal(t, status.PhaseReady, r.Phase, r.LastError)
	assert.Empty(t, r.LastError)
}

func TestAVolumePathThatIsNotARegularFileIsNeverAttached(t *testing.T) {
	f := newFixture(t)
	p := f.store.VolumePath("data")
	require.NoError(t, os.Mkdir(p, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(p, "keep"), []byte("guest data"), 0o600))
	s := withVolumes(snap(1, vm("web-01", volumes("data"))), vol("data", 1))
	st := f.step(s)
	v := volRow(t, st, "data")
	assert.True(t, v.Present)
	assert.Zero(t, v.SizeGB)
	assert.Contains(t, v.Error, p+" is not a regular file")
	r := row(t, st, "web-01")
	assert.Equal(t, status.PhaseFailed, r.Phase)
	assert.Contains(t, r.LastError, "volume data: "+p+" is not a regular file")
	assert.Contains(t, r.LastError, "refusing to attach it")
	assert.True(t, f.record("web-01").Failed, "a permanent error")
	assert.Empty(t, f.prov.Calls(agenttest.OpBoot), "never handed to the hypervisor")

	t.Run("a created VM whose volume became a directory is not booted", func(t *testing.T) {
		f := newFixture(t)
		s := withVolumes(snap(1, vm("web-01", volumes("data"))), vol("data", 1))
		require.Equal(t, status.PhaseReady, row(t, f.step(s), "web-01").Phase)
		f.prov.Crash("web-01")
		require.NoError(t, os.Remove(f.store.VolumePath("data")))
		require.NoError(t, os.Mkdir(f.store.VolumePath("data"), 0o700))
		f.prov.ResetCalls()
		r := row(t, f.step(s), "web-01")
		assert.Equal(t, status.PhaseFailed, r.Phase)
		assert.Contains(t, r.LastError, "is not a regular file")
		assert.Empty(t, f.prov.Calls(agenttest.OpBoot))
	})

	data, err := os.ReadFile(filepath.Join(p, "keep"))
	require.NoError(t, err, "never deleted or replaced")
	assert.Equal(t, "guest data", string(data))

	t.Run("its tombstone removes nothing either", func(t *testing.T) {
		// No VM attaches it and the grace is over: the agent made no
		// such thing and removes none, not even an empty directory.
		f := newFixture(t)
		p := f.store.VolumePath("data")
		require.NoError(t, os.Mkdir(p, 0o700))
		f.step(withVolumes(snap(1), tombVol("data", 1)))
		f.clock.Add(time.Hour)
		st := f.step(withVolumes(snap(1), tombVol("data", 1)))
		v := volRow(t, st, "data")
		assert.True(t, v.Present)
		assert.Contains(t, v.Error, "not a regular file")
		fi, err := os.Stat(p)
		require.NoError(t, err)
		assert.True(t, fi.IsDir())
	})
}
