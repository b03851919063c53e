package agent_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
)

const testHost = "hv-a"

// clock is the engine's injectable clock; tests move it forward instead of
// sleeping through graces.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// fixture is one host: a state directory, the in-memory backend, a clock and
// a boot id, and the engine over them.
type fixture struct {
	t     testing.TB
	dir   string
	store *agent.Store
	prov  *agenttest.Provisioner
	clock *clock
	mu    sync.Mutex
	boot  string
	eng   *agent.Engine
	// tune adjusts the engine config before every (re)start.
	tune func(*agent.EngineConfig)
}

func newFixture(t testing.TB, tune ...func(*agent.EngineConfig)) *fixture {
	t.Helper()
	f := &fixture{t: t, dir: t.TempDir(), prov: agenttest.New(), boot: "boot-1",
		clock: &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}}
	if len(tune) > 0 {
		f.tune = tune[0]
	}
	f.start()
	return f
}

func (f *fixture) bootID() string { f.mu.Lock(); defer f.mu.Unlock(); return f.boot }

// rebootHost plays a host reboot: a new boot id and every VM stopped.
func (f *fixture) rebootHost() {
	f.mu.Lock()
	f.boot += "'"
	f.mu.Unlock()
	f.prov.Reboot()
}

func (f *fixture) config() agent.EngineConfig {
	log := logrus.New()
	log.SetOutput(io.Discard)
	cfg := agent.EngineConfig{
		Host: testHost, Store: f.store, Provisioner: f.prov,
		BootID: f.bootID, Now: f.clock.Now, Log: log,
		TombstoneGrace: 5 * time.Minute, VanishGrace: time.Hour, MaxAttempts: 3,
	}
	if f.tune != nil {
		f.tune(&cfg)
	}
	return cfg
}

// start opens the store and builds an engine over it, as an agent process
// starting does: nothing survives but what is on disk.
func (f *fixture) start() {
	f.t.Helper()
	st, err := agent.OpenStore(f.dir)
	require.NoError(f.t, err)
	f.store = st
	eng, err := agent.NewEngine(f.config())
	require.NoError(f.t, err)
	f.eng = eng
	f.t.Cleanup(func() { eng.Close(context.Background()) })
}

// restart ends the engine and starts a new one over the same directory and
// backend (the VMs outlive the agent).
func (f *fixture) restart() {
	f.eng.Close(context.Background())
	f.start()
}

// step runs one tick over snap (nil: the last accepted) and waits for every
// worker's pass before reporting, which production never does but a test
// must to observe a tick.
func (f *fixture) step(snap *snapshots.Snapshot) *status.Status {
	f.t.Helper()
	err := f.eng.Tick(context.Background(), snap)
	if err != nil && !errors.Is(err, agent.ErrFenced) {
		f.t.Fatalf("tick: %v", err)
	}
	require.NoError(f.t, f.eng.Settle(context.Background()))
	return f.eng.Report()
}

func (f *fixture) record(name string) *agent.Record {
	f.t.Helper()
	rec, err := f.store.LoadRecord(name)
	require.NoError(f.t, err)
	return rec
}

func snap(epoch uint64, vms ...snapshots.SnapshotVM) *snapshots.Snapshot {
	return &snapshots.Snapshot{Host: testHost, Epoch: epoch, VMs: vms, Volumes: []snapshots.SnapshotVolume{}}
}

func withVolumes(s *snapshots.Snapshot, vols ...snapshots.SnapshotVolume) *snapshots.Snapshot {
	s.Volumes = vols
	return s
}

func withCapacity(s *snapshots.Snapshot, vcpus, memMB int) *snapshots.Snapshot {
	s.HostSpec.Capacity = &desired.Capacity{VCPUs: vcpus, MemoryMB: memMB}
	return s
}

func vm(name string, edits ...func(*desired.VMSpec)) snapshots.SnapshotVM {
	spec := agenttest.Spec(testHost)
	for _, e := range edits {
		e(&spec)
	}
	return snapshots.SnapshotVM{Name: name, SpecHash: desired.SpecHash(spec), Spec: spec}
}

func tombstoned(v snapshots.SnapshotVM) snapshots.SnapshotVM { v.Tombstoned = true; return v }

func vcpus(n int) func(*desired.VMSpec)         { return func(s *desired.VMSpec) { s.VCPUs = n } }
func memoryMB(n int) func(*desired.VMSpec)      { return func(s *desired.VMSpec) { s.MemoryMB = n } }
func diskGB(n int) func(*desired.VMSpec)        { return func(s *desired.VMSpec) { s.DiskGB = n } }
func stopped(s *desired.VMSpec)                 { s.Power = desired.PowerStopped }
func volumes(v ...string) func(*desired.VMSpec) { return func(s *desired.VMSpec) { s.Volumes = v } }
func network(n string) func(*desired.VMSpec)    { return func(s *desired.VMSpec) { s.Network = n } }
func image(sha string) func(*desired.VMSpec) {
	return func(s *desired.VMSpec) {
		s.Image = &desired.Artifact{URL: "https://images.example/" + sha[:4] + ".qcow2", SHA256: sha}
	}
}

func row(t *testing.T, st *status.Status, name string) status.VM {
	t.Helper()
	for _, v := range st.VMs {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("no status row for vm %s in %+v", name, st.VMs)
	return status.VM{}
}

func hasRow(st *status.Status, name string) bool {
	for _, v := range st.VMs {
		if v.Name == name {
			return true
		}
	}
	return false
}

func quarantined(st *status.Status) []string {
	var out []string
	for _, q := range st.Quarantined {
		out = append(out, q.Name)
	}
	return out
}

var errTransient = errors.New("disk busy")

func TestCreateRunsTheStepsInOrderAndReportsReady(t *testing.T) {
	f := newFixture(t)
	st := f.step(snap(1, vm("web-01")))

	var ops []agenttest.Op
	for _, c := range f.prov.AllCalls() {
		ops = append(ops, c.Op)
	}
	assert.Equal(t, []agenttest.Op{agenttest.OpPreflight, agenttest.OpRootDisk, agenttest.OpBoot}, ops)
	r := row(t, st, "web-01")
	assert.Equal(t, status.PhaseReady, r.Phase)
	assert.Equal(t, "running", r.Power)
	assert.Equal(t, "10.77.1.2", r.IP)
	assert.Equal(t, "127.0.0.1:2202", r.SSH)
	assert.Empty(t, r.LastError)
	assert.Equal(t, vm("web-01").SpecHash, r.SpecHash)
	assert.Equal(t, uint64(1), st.LastSeenEpoch)
	assert.False(t, st.FenceViolation)

	rec := f.record("web-01")
	assert.Equal(t, "boot-1", rec.BootID, "the boot id witnesses the completed create")
	assert.NotEmpty(t, rec.InstanceID)
	m, ok := f.prov.BootedWith("web-01")
	require.True(t, ok)
	assert.Equal(t, f.store.VMDir("web-01"), m.Dir)
	assert.Equal(t, rec.InstanceID, m.InstanceID)
}

func TestAStoppedVMIsCreatedButNotBooted(t *testing.T) {
	f := newFixture(t)
	st := f.step(snap(1, vm("web-01", stopped)))
	assert.Equal(t, []string{"web-01"}, f.prov.Calls(agenttest.OpRootDisk))
	assert.Empty(t, f.prov.Calls(agenttest.OpBoot))
	assert.Equal(t, status.PhaseStopped, row(t, st, "web-01").Phase)
}

func TestAnInterruptedCreateIsRunAgainWhateverFilesExist(t *testing.T) {
	f := newFixture(t)
	// A create that wrote its record and a disk but never booted: no boot id.
	spec := vm("web-01")
	require.NoError(t, f.store.SaveRecord(&agent.Record{Name: "web-01", InstanceID: "i-1", Spec: spec.Spec, SpecHash: spec.SpecHash, Phase: status.PhaseCreating}))
	require.NoError(t, os.WriteFile(filepath.Join(f.store.VMDir("web-01"), "root.qcow2"), []byte("partial"), 0o600))
	f.restart()

	st := f.step(snap(1, spec))
	assert.Equal(t, []string{"web-01"}, f.prov.Calls(agenttest.OpRootDisk), "the root disk step runs again")
	assert.Equal(t, []string{"web-01"}, f.prov.Calls(agenttest.OpBoot))
	assert.Equal(t, status.PhaseReady, row(t, st, "web-01").Phase)
	assert.Equal(t, "i-1", f.record("web-01").InstanceID, "the instance id survives")
}

func TestACreateThatBootedButNeverRecordedItIsWitnessedNotRedone(t *testing.T) {
	f := newFixture(t)
	f.step(snap(1, vm("web-01")))
	f.eng.Close(context.Background())
	rec := f.record("web-01")
	rec.BootID, rec.Phase = "", status.PhaseCreating // the agent stopped between boot and record
	require.NoError(t, f.store.SaveRecord(rec))
	f.prov.ResetCalls()
	f.start()

	st := f.step(nil)
	assert.Empty(t, f.prov.Calls(agenttest.OpRootDisk), "the running VM's disk is not prepared again")
	assert.Equal(t, status.PhaseReady, row(t, st, "web-01").Phase)
	assert.Equal(t, "boot-1", f.record("web-01").BootID)
}

func TestAnUnreadableRecordIsLeftAloneNeverCreatedOver(t *testing.T) {
	f := newFixture(t)
	f.step(snap(1, vm("web-01"), vm("web-02")))
	f.eng.Close(context.Background())
	require.NoError(t, os.WriteFile(f.store.RecordPath("web-01"), []byte("{not json"), 0o600))
	f.prov.Crash("web-01") // even a VM that needs a boot is not touched
	f.prov.ResetCalls()
	f.start()

	st := f.step(snap(2, vm("web-01"), tombstoned(vm("web-02"))))
	assert.NotContains(t, f.prov.Calls(agenttest.OpRootDisk), "web-01")
	assert.NotContains(t, f.prov.Calls(agenttest.OpBoot), "web-01")
	r := row(t, st, "web-01")
	assert.Equal(t, status.PhaseFailed, r.Phase)
	assert.Contains(t, r.LastError, "unreadable")

	t.Run("a tombstone of an unreadable record is not acked", func(t *testing.T) {
		f.eng.Close(context.Background())
		require.NoError(t, os.WriteFile(f.store.RecordPath("web-02"), []byte("garbage"), 0o600))
		f.start()
		f.clock.Add(time.Hour)
		st := f.step(snap(2, vm("web-01"), tombstoned(vm("web-02"))))
		assert.NotContains(t, st.Destroyed, "web-02")
		assert.Empty(t, f.prov.Calls(agenttest.OpDestroy))
	})

	t.Run("a directory with files but no record is unreadable too", func(t *testing.T) {
		require.NoError(t, os.WriteFile(filepath.Join(f.store.VMDir("web-02"), "root.qcow2"), nil, 0o600))
		require.NoError(t, os.Remove(f.store.RecordPath("web-02")))
		_, err := f.store.LoadRecord("web-02")
		assert.ErrorIs(t, err, agent.ErrRecordUnreadable)
	})

	t.Run("once readable again the VM is reconciled", func(t *testing.T) {
		spec := vm("web-01")
		require.NoError(t, f.store.SaveRecord(&agent.Record{Name: "web-01", InstanceID: "i-1", Spec: spec.Spec, SpecHash: spec.SpecHash, BootID: "boot-1", DiskGB: 5, Phase: status.PhaseReady}))
		st := f.step(snap(3, vm("web-01")))
		assert.Equal(t, status.PhaseReady, row(t, st, "web-01").Phase)
		assert.Contains(t, f.prov.Calls(agenttest.OpBoot), "web-01", "the lost VM is booted again")
		assert.NotContains(t, f.prov.Calls(agenttest.OpRootDisk), "web-01", "and never re-created")
	})
}

func TestRecordsThatCannotBeListedStopTheTick(t *testing.T) {
	f := newFixture(t)
	f.eng.Close(context.Background())
	vms := filepath.Join(f.dir, "vms")
	require.NoError(t, os.RemoveAll(vms))
	require.NoError(t, os.WriteFile(vms, nil, 0o600)) // not a directory: ReadDir fails
	// The engine reads the records when it starts (over the store opened
	// before the damage); it cannot, and its ticks must not act either.
	eng, err := agent.NewEngine(f.config())
	require.NoError(t, err)
	f.eng = eng
	t.Cleanup(func() { eng.Close(context.Background()) })
	err = f.eng.Tick(context.Background(), snap(1, vm("web-01")))
	require.Error(t, err)
	require.NoError(t, f.eng.Settle(context.Background()))
	assert.Empty(t, f.prov.AllCalls(), "an unlisted VM would look like one to create")

	require.NoError(t, os.Remove(vms))
	require.NoError(t, os.Mkdir(vms, 0o700))
	st := f.step(snap(1, vm("web-01")))
	assert.Equal(t, status.PhaseReady, row(t, st, "web-01").Phase)
}

func TestAdmissionAgainstHostCapacity(t *testing.T) {
	cases := []struct {
		name      string
		snap      *snapshots.Snapshot
		bootOnce  error
		wantBoots int
		wantErr   string
	}{
		{name: "two VMs over the vCPU cap: one boots", wantBoots: 1, wantErr: "vcpus",
			snap: withCapacity(snap(1, vm("a", vcpus(2)), vm("b", vcpus(2))), 3, 0)},
		{name: "two VMs over the memory cap: one boots", wantBoots: 1, wantErr: "memoryMB",
			snap: withCapacity(snap(1, vm("a", memoryMB(1024)), vm("b", memoryMB(1024))), 0, 1536)},
		{name: "a failed create still counts against its sibling", wantBoots: 0, wantErr: "vcpus", bootOnce: errTransient,
			snap: withCapacity(snap(1, vm("a", vcpus(2)), vm("b", vcpus(2))), 3, 0)},
		{name: "both fit", wantBoots: 2,
			snap: withCapacity(snap(1, vm("a", vcpus(2)), vm("b", vcpus(2))), 4, 0)},
		{name: "ten VMs started together, room for four", wantBoots: 4,
			snap: withCapacity(snap(1, vm("a"), vm("b"), vm("c"), vm("d"), vm("e"), vm("f"), vm("g"), vm("h"), vm("i"), vm("j")), 4, 0)},
		{name: "no capacity means no limit", wantBoots: 2,
			snap: snap(1, vm("a", vcpus(64)), vm("b", vcpus(64)))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if tc.bootOnce != nil {
				f.prov.FailOnce(agenttest.OpBoot, tc.bootOnce)
			}
			st := f.step(tc.snap)
			assert.Equal(t, tc.wantBoots, f.prov.RunningCount())
			if tc.wantErr == "" {
				return
			}
			var blocked []status.VM
			for _, r := range st.VMs {
				if strings.Contains(r.LastError, "capacity limit") && strings.Contains(r.LastError, tc.wantErr) {
					blocked = append(blocked, r)
				}
			}
			require.Len(t, blocked, 1, "exactly one VM is refused: %+v", st.VMs)
			assert.Equal(t, status.PhaseFailed, blocked[0].Phase)
			assert.Zero(t, f.record(blocked[0].Name).Attempts, "a capacity refusal spends no attempt")
		})
	}
}

func TestVMsCreatedTogetherGetDistinctAddresses(t *testing.T) {
	f := newFixture(t)
	st := f.step(snap(1, vm("a"), vm("b"), vm("c")))
	seen := map[string]string{}
	for _, r := range st.VMs {
		require.NotEmpty(t, r.IP, r.Name)
		assert.NotContains(t, seen, r.IP, "%s and %s share an address", r.Name, seen[r.IP])
		seen[r.IP] = r.Name
	}
}

func TestCapacityFreedByADeleteAdmitsTheWaitingVM(t *testing.T) {
	f := newFixture(t, func(c *agent.EngineConfig) { c.TombstoneGrace = time.Minute })
	f.step(withCapacity(snap(1, vm("a", vcpus(2))), 3, 0))
	st := f.step(withCapacity(snap(2, vm("a", vcpus(2)), vm("b", vcpus(2))), 3, 0))
	require.Equal(t, status.PhaseFailed, row(t, st, "b").Phase)

	f.step(withCapacity(snap(3, tombstoned(vm("a", vcpus(2))), vm("b", vcpus(2))), 3, 0))
	st = f.step(withCapacity(snap(3, tombstoned(vm("a", vcpus(2))), vm("b", vcpus(2))), 3, 0))
	assert.Equal(t, status.PhaseReady, row(t, st, "b").Phase, "a quarantined VM holds no capacity")
}

// A crash between saving the snapshot and saving its epoch leaves the
// snapshot of the next epoch on disk with the old epoch. The engine that
// starts over it reconciles that snapshot, so it must also record its epoch:
// otherwise, after the next restart, another snapshot at that epoch (a hand
// edit) would pass as a new epoch.
func TestFenceRecordsTheEpochOfASnapshotSavedBeforeACrash(t *testing.T) {
	f := newFixture(t)
	f.step(snap(1, vm("web-01"), vm("db-01")))
	require.NoError(t, f.store.SaveSnapshot(snap(2, vm("web-01"), vm("db-01")))) // then the crash
	f.restart()
	st := f.step(nil)
	assert.False(t, st.FenceViolation)
	assert.Equal(t, uint64(2), st.LastSeenEpoch)
	epoch, err := f.store.LastEpoch()
	require.NoError(t, err)
	assert.Equal(t, uint64(2), epoch, "the epoch file catches up with the snapshot reconciled")

	f.restart()
	f.prov.ResetCalls()
	st = f.step(snap(2, tombstoned(vm("db-01"))))
	assert.True(t, st.FenceViolation, "a different snapshot at the accepted epoch is refused")
	assert.Empty(t, f.prov.AllCalls())
	assert.Empty(t, quarantined(st))
}

func TestFenceRefusesAnOlderSnapshotAndActsOnNothing(t *testing.T) {
	f := newFixture(t)
	f.step(snap(5, vm("web-01"), vm("old-01")))
	f.step(snap(6, vm("web-01"), tombstoned(vm("old-01"))))
	f.prov.Crash("web-01") // even a lost VM waits while fenced
	f.prov.ResetCalls()

	st := f.step(snap(3)) // a restored branch: everything "missing", lower epoch
	assert.True(t, st.FenceViolation)
	assert.Equal(t, uint64(6), st.LastSeenEpoch)
	assert.Empty(t, f.prov.AllCalls(), "a fenced tick calls the provisioner for nothing")
	assert.Equal(t, []string{"old-01"}, quarantined(st), "the report still shows quarantined VMs")
	assert.False(t, hasRow(st, "old-01"), "a quarantined VM is not an active row")
	assert.True(t, hasRow(st, "web-01"))

	f.clock.Add(time.Hour)
	st = f.step(snap(3))
	assert.Empty(t, f.prov.Calls(agenttest.OpDestroy), "no grace runs out while fenced")
	assert.True(t, st.FenceViolation)

	t.Run("the fence survives a restart", func(t *testing.T) {
		f.restart()
		st := f.step(snap(4))
		assert.True(t, st.FenceViolation)
		assert.Empty(t, f.prov.AllCalls())
	})

	t.Run("a newer epoch lifts the fence", func(t *testing.T) {
		st := f.step(snap(7, vm("web-01"), tombstoned(vm("old-01"))))
		assert.False(t, st.FenceViolation)
		assert.Equal(t, uint64(7), st.LastSeenEpoch)
		assert.Equal(t, []string{"web-01"}, f.prov.Calls(agenttest.OpBoot))
	})
}

func TestASnapshotAtTheSameEpochWithOtherContentIsAFenceViolation(t *testing.T) {
	edits := []struct {
		name string
		snap *snapshots.Snapshot
	}{
		{"a vm removed", snap(6, vm("web-01"))},
		{"a vm tombstoned", snap(6, vm("web-01"), tombstoned(vm("db-01")))},
		{"a spec edited", snap(6, vm("web-01"), vm("db-01", vcpus(4)))},
	}
	for _, tc := range edits {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.step(snap(6, vm("web-01"), vm("db-01")))
			f.prov.ResetCalls()

			st := f.step(tc.snap)
			assert.True(t, st.FenceViolation)
			assert.Contains(t, st.SnapshotError, "snapshot at epoch 6 differs from the one accepted at that epoch")
			assert.Equal(t, uint64(6), st.LastSeenEpoch)
			f.clock.Add(48 * time.Hour)
			st = f.step(tc.snap)
			assert.Empty(t, f.prov.AllCalls(), "a fenced tick acts on nothing")
			assert.Equal(t, vm("db-01").SpecHash, row(t, st, "db-01").SpecHash)
			assert.Empty(t, st.Vanished)
			assert.Empty(t, st.Quarantined)
			err := f.eng.Tick(context.Background(), tc.snap)
			assert.ErrorIs(t, err, agent.ErrFenced)

			f.restart()
			st = f.step(tc.snap)
			assert.True(t, st.FenceViolation, "the accepted content survives a restart")
			assert.Empty(t, f.prov.AllCalls())

			st = f.step(snap(6, vm("web-01"), vm("db-01")))
			assert.False(t, st.FenceViolation, "the accepted content at the same epoch is a re-fetch")
			assert.Empty(t, st.SnapshotError)

			st = f.step(tc.snap)
			require.True(t, st.FenceViolation)
			st = f.step(snap(7, vm("web-01"), vm("db-01")))
			assert.False(t, st.FenceViolation, "a newer epoch lifts the fence")
			assert.Empty(t, st.SnapshotError)
		})
	}

	t.Run("identical content parsed again is accepted", func(t *testing.T) {
		f := newFixture(t)
		f.step(snap(6, vm("web-01")))
		for i := 0; i < 2; i++ {
			st := f.step(snap(6, vm("web-01")))
			assert.False(t, st.FenceViolation)
			f.restart()
		}
		assert.Len(t, f.prov.Calls(agenttest.OpBoot), 1)
	})

	t.Run("state written without the hash still fences, from the snapshot on disk", func(t *testing.T) {
		f := newFixture(t)
		f.step(snap(6, vm("web-01"), vm("db-01")))
		f.eng.Close(context.Background())
		require.NoError(t, os.Remove(filepath.Join(f.dir, "accepted")))
		f.start()
		st := f.step(snap(6, vm("web-01")))
		assert.True(t, st.FenceViolation)
		st = f.step(snap(6, vm("web-01"), vm("db-01")))
		assert.False(t, st.FenceViolation)
	})

	t.Run("an epoch with no record of its content refuses that epoch and accepts the next", func(t *testing.T) {
		f := newFixture(t)
		f.step(snap(6, vm("web-01"), vm("db-01")))
		f.eng.Close(context.Background())
		require.NoError(t, os.Remove(filepath.Join(f.dir, "accepted")))
		require.NoError(t, os.Remove(filepath.Join(f.dir, "snapshot.json")))
		f.start()
		f.prov.ResetCalls()
		for _, s := range []*snapshots.Snapshot{snap(6, vm("web-01")), snap(6, vm("web-01"), vm("db-01"))} {
			st := f.step(s)
			assert.True(t, st.FenceViolation, "the same epoch cannot be compared with anything")
			assert.Contains(t, st.SnapshotError, "state directory has epoch 6 but no record of its content")
			assert.Contains(t, st.SnapshotError, "waiting for epoch 7")
			assert.Contains(t, st.SnapshotError, "merge any change for this host")
			assert.ErrorIs(t, f.eng.Tick(context.Background(), s), agent.ErrFenced)
		}
		f.clock.Add(48 * time.Hour)
		f.step(nil)
		assert.Empty(t, f.prov.AllCalls(), "a fenced host acts on nothing")
		f.restart()
		st := f.step(snap(6, vm("web-01")))
		assert.True(t, st.FenceViolation, "still refused after a restart")
		st = f.step(snap(5, vm("web-01")))
		assert.Contains(t, st.SnapshotError, "below the last accepted epoch 6")

		st = f.step(snap(7, vm("web-01")))
		assert.False(t, st.FenceViolation, "the next epoch is accepted")
		assert.Empty(t, st.SnapshotError)
		st = f.step(snap(7, vm("web-01"), vm("db-01")))
		assert.True(t, st.FenceViolation, "and the same-epoch fence is on again")
		f.restart()
		st = f.step(snap(7, vm("web-01")))
		assert.False(t, st.FenceViolation)
	})

	t.Run("a hash made by another encoding yields to the snapshot on disk", func(t *testing.T) {
		f := newFixture(t)
		f.step(snap(6, vm("web-01"), vm("db-01")))
		f.eng.Close(context.Background())
		accepted := filepath.Join(f.dir, "accepted")
		require.NoError(t, os.WriteFile(accepted, []byte("6 0123456789abcdef\n"), 0o600))
		f.start()
		st := f.step(snap(6, vm("web-01"), vm("db-01")))
		assert.False(t, st.FenceViolation, "the same content as the accepted snapshot")
		data, err := os.ReadFile(accepted)
		require.NoError(t, err)
		assert.NotContains(t, string(data), "0123456789abcdef", "the hash is rewritten")
		st = f.step(snap(6, vm("web-01")))
		assert.True(t, st.FenceViolation)
	})

	t.Run("a lower epoch says why too", func(t *testing.T) {
		f := newFixture(t)
		f.step(snap(6, vm("web-01")))
		st := f.step(snap(5, vm("web-01")))
		assert.True(t, st.FenceViolation)
		assert.Contains(t, st.SnapshotError, "snapshot epoch 5 is below the last accepted epoch 6")
	})
}

func TestCreateRetryBudget(t *testing.T) {
	t.Run("transient errors retry until the budget is spent", func(t *testing.T) {
		f := newFixture(t)
		f.prov.FailAlways(agenttest.OpRootDisk, errTransient)
		for i := 1; i < 3; i++ {
			r := row(t, f.step(snap(1, vm("web-01"))), "web-01")
			assert.Equal(t, status.PhaseCreating, r.Phase, "attempt %d", i)
			assert.Equal(t, "root disk: disk busy", r.LastError)
		}
		assert.Equal(t, status.PhaseFailed, row(t, f.step(snap(1, vm("web-01"))), "web-01").Phase)
		f.prov.FailAlways(agenttest.OpRootDisk, nil) // the cause clears, too late
		assert.Equal(t, status.PhaseFailed, row(t, f.step(snap(1, vm("web-01"))), "web-01").Phase)
		assert.Len(t, f.prov.Calls(agenttest.OpRootDisk), 3, "no fourth attempt")

		t.Run("an edited spec gets a fresh budget", func(t *testing.T) {
			st := f.step(snap(2, vm("web-01", memoryMB(1024))))
			assert.Equal(t, status.PhaseReady, row(t, st, "web-01").Phase)
			assert.Len(t, f.prov.Calls(agenttest.OpRootDisk), 4)
			assert.Zero(t, f.record("web-01").Attempts)
		})
	})

	t.Run("a permanent error fails at once", func(t *testing.T) {
		f := newFixture(t)
		f.prov.FailAlways(agenttest.OpRootDisk, agent.Permanent(errors.New("diskGB 1 is smaller than the image")))
		r := row(t, f.step(snap(1, vm("web-01"))), "web-01")
		assert.Equal(t, status.PhaseFailed, r.Phase)
		assert.Contains(t, r.LastError, "smaller than the image")
		f.step(snap(1, vm("web-01")))
		assert.Len(t, f.prov.Calls(agenttest.OpRootDisk), 1)
	})

	t.Run("a preflight refusal comes before the disk", func(t *testing.T) {
		f := newFixture(t)
		f.prov.FailAlways(agenttest.OpPreflight, agent.Permanent(errors.New("no qemu-system-x86_64 on this host")))
		r := row(t, f.step(snap(1, vm("web-01"))), "web-01")
		assert.Equal(t, status.PhaseFailed, r.Phase)
		assert.Equal(t, "preflight: no qemu-system-x86_64 on this host", r.LastError)
		assert.Empty(t, f.prov.Calls(agenttest.OpRootDisk))
	})

	t.Run("the budget survives a restart", func(t *testing.T) {
		f := newFixture(t)
		f.prov.FailAlways(agenttest.OpBoot, errTransient)
		f.step(snap(1, vm("web-01")))
		f.step(snap(1, vm("web-01")))
		f.restart()
		assert.Equal(t, status.PhaseFailed, row(t, f.step(nil), "web-01").Phase)
		assert.Len(t, f.prov.Calls(agenttest.OpBoot), 3)
	})
}

func TestWatchdog(t *testing.T) {
	wedge := func(ctx context.Context, op agenttest.Op, _ string) error {
		if op == agenttest.OpRootDisk {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}

	t.Run("a wedged step is ended and spends no attempt", func(t *testing.T) {
		f := newFixture(t, func(c *agent.EngineConfig) { c.VMTimeout = 50 * time.Millisecond })
		f.prov.SetHook(wedge)
		st := f.step(snap(1, vm("web-01"), vm("web-02")))
		for _, name := range []string{"web-01", "web-02"} {
			r := row(t, st, name)
			assert.Equal(t, status.PhaseCreating, r.Phase, name)
			assert.Contains(t, r.LastError, "watchdog")
			assert.Contains(t, r.LastError, "deadline exceeded")
			assert.Zero(t, f.record(name).Attempts, "%s: the watchdog's failure is not the VM's", name)
		}
		f.prov.SetHook(nil)
		assert.Equal(t, status.PhaseReady, row(t, f.step(nil), "web-01").Phase)
	})

	t.Run("zero means no deadline", func(t *testing.T) {
		f := newFixture(t)
		sawDeadline := false
		f.prov.SetHook(func(ctx context.Context, _ agenttest.Op, _ string) error {
			if _, ok := ctx.Deadline(); ok {
				sawDeadline = true
			}
			return nil
		})
		f.step(snap(1, vm("web-01")))
		assert.False(t, sawDeadline)
	})
}

func TestPower(t *testing.T) {
	f := newFixture(t)
	f.step(snap(1, vm("web-01")))
	st := f.step(snap(2, vm("web-01", stopped)))
	assert.Equal(t, []string{"web-01"}, f.prov.Calls(agenttest.OpShutdown))
	r := row(t, st, "web-01")
	assert.Equal(t, status.PhaseStopped, r.Phase)
	assert.Equal(t, "stopped", r.Power)
	assert.Empty(t, r.IP, "a stopped VM answers on no address")
	assert.Empty(t, r.SSH, "a stopped VM has no SSH forward")

	f.rebootHost()
	f.step(snap(2, vm("web-01", stopped)))
	assert.Len(t, f.prov.Calls(agenttest.OpBoot), 1, "a stopped VM stays stopped across a host reboot")

	st = f.step(snap(3, vm("web-01")))
	assert.Len(t, f.prov.Calls(agenttest.OpBoot), 2, "back to running boots it")
	r = row(t, st, "web-01")
	assert.Equal(t, status.PhaseReady, r.Phase)
	assert.Equal(t, "10.77.1.2", r.IP, "running again shows the address")
}

func TestALostVMIsBootedAgain(t *testing.T) {
	cases := []struct {
		name   string
		lose   func(f *fixture)
		reason string
		want   string
	}{
		{name: "host reboot", lose: func(f *fixture) { f.rebootHost() }},
		{name: "hypervisor crash", lose: func(f *fixture) { f.prov.Crash("web-01") }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.step(snap(1, vm("web-01")))
			tc.lose(f)
			st := f.step(snap(1, vm("web-01")))
			assert.Len(t, f.prov.Calls(agenttest.OpBoot), 2)
			assert.Len(t, f.prov.Calls(agenttest.OpRootDisk), 1, "booted again, not created again")
			r := row(t, st, "web-01")
			assert.Equal(t, status.PhaseReady, r.Phase)
			assert.Equal(t, "10.77.1.2", r.IP)
			assert.Equal(t, f.bootID(), f.record("web-01").BootID)
		})
	}
}

// A failed boot says why in one chain: the step, then the backend's error,
// which carries the hypervisor's account of that boot. The account of the
// run that was lost before it (FailureReason) is never appended: it
// belongs to another run.
func TestAFailedBootSaysWhyAndIsRetried(t *testing.T) {
	cases := []struct {
		err, lastRun, want string
	}{
		{err: "qemu exited: exit status 1: qemu: could not open disk image: Permission denied", want: "boot: qemu exited: exit status 1: qemu: could not open disk image: Permission denied"},
		{err: "root disk: missing", lastRun: "qemu-system-x86_64: terminating on signal 15", want: "boot: root disk: missing"},
	}
	for _, tc := range cases {
		t.Run(tc.want, func(t *testing.T) {
			f := newFixture(t)
			f.step(snap(1, vm("web-01")))
			f.prov.Crash("web-01")
			f.prov.FailOnce(agenttest.OpBoot, errors.New(tc.err))
			f.prov.SetFailureReason("web-01", tc.lastRun)
			r := row(t, f.step(snap(1, vm("web-01"))), "web-01")
			assert.Equal(t, status.PhaseFailed, r.Phase)
			assert.Equal(t, tc.want, r.LastError)

			r = row(t, f.step(snap(1, vm("web-01"))), "web-01")
			assert.Equal(t, status.PhaseReady, r.Phase)
			assert.Empty(t, r.LastError, "a successful boot clears the error")
			assert.Empty(t, f.record("web-01").LastError)
		})
	}
}

func TestDeleteQuarantinesThenDestroysAfterTheGrace(t *testing.T) {
	f := newFixture(t)
	f.step(snap(1, vm("web-01")))
	st := f.step(snap(2, tombstoned(vm("web-01"))))
	assert.Equal(t, []string{"web-01"}, f.prov.Calls(agenttest.OpShutdown))
	assert.Equal(t, []string{"web-01"}, quarantined(st))
	assert.Equal(t, f.clock.Now(), st.Quarantined[0].Since)
	assert.False(t, hasRow(st, "web-01"))
	assert.Empty(t, st.Destroyed, "still in its grace")

	f.clock.Add(4 * time.Minute)
	f.restart() // the grace is measured from the marker on disk
	st = f.step(snap(2, tombstoned(vm("web-01"))))
	assert.Empty(t, f.prov.Calls(agenttest.OpDestroy))

	f.clock.Add(2 * time.Minute)
	st = f.step(snap(2, tombstoned(vm("web-01"))))
	assert.Equal(t, []string{"web-01"}, f.prov.Calls(agenttest.OpDestroy))
	assert.Equal(t, []string{"web-01"}, st.Destroyed)
	assert.Empty(t, st.Quarantined)
	_, err := os.Stat(f.store.VMDir("web-01"))
	assert.ErrorIs(t, err, os.ErrNotExist, "the record and the VM's directory are gone")
	assert.Empty(t, f.prov.Address("web-01"), "destroy releases the address")

	st = f.step(snap(2, tombstoned(vm("web-01"))))
	assert.Equal(t, []string{"web-01"}, st.Destroyed, "the ack is repeated until the name leaves the snapshot")
	st = f.step(snap(3))
	assert.Empty(t, st.Destroyed)
}

func TestAFailedDestroyKeepsTheRecordAndRetries(t *testing.T) {
	f := newFixture(t)
	f.step(snap(1, vm("web-01")))
	f.step(snap(2, tombstoned(vm("web-01"))))
	f.prov.FailAlways(agenttest.OpDestroy, errTransient)
	f.clock.Add(6 * time.Minute)
	st := f.step(snap(2, tombstoned(vm("web-01"))))
	assert.Equal(t, []string{"web-01"}, f.prov.Calls(agenttest.OpDestroy))
	assert.NotContains(t, st.Destroyed, "web-01", "nothing to ack while the backend holds the VM")
	assert.Equal(t, "destroy: disk busy", f.record("web-01").LastError)
	require.Len(t, st.Quarantined, 1)
	assert.Equal(t, "destroy: disk busy", st.Quarantined[0].LastError, "the failure is visible in status")

	f.prov.FailAlways(agenttest.OpDestroy, nil)
	st = f.step(snap(2, tombstoned(vm("web-01"))))
	assert.Len(t, f.prov.Calls(agenttest.OpDestroy), 2)
	assert.Contains(t, st.Destroyed, "web-01")
}

func TestARemovalThatFailsHalfWayKeepsTheRecordAndIsRetried(t *testing.T) {
	f := newFixture(t)
	f.step(snap(1, vm("web-01")))
	dir := f.store.VMDir("web-01")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "run"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "run", "serial.log"), []byte("boot"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "aaa.qcow2"), []byte("disk"), 0o600))
	f.step(snap(2, tombstoned(vm("web-01"))))
	f.clock.Add(5 * time.Minute)

	var removed []string
	agent.SetRemoveHook(f.store, func(path string) error {
		if filepath.Base(path) == "run" {
			return errors.New("device or resource busy")
		}
		removed = append(removed, filepath.Base(path))
		return nil
	})
	st := f.step(nil)
	assert.NotContains(t, removed, "record.json", "the record goes last")
	assert.Empty(t, st.Destroyed, "nothing acked while state remains")
	require.Equal(t, []string{"web-01"}, quarantined(st))
	assert.Contains(t, st.Quarantined[0].LastError, "device or resource busy")
	rec, err := f.store.LoadRecord("web-01")
	require.NoError(t, err, "the record is still readable")
	assert.NotNil(t, rec.QuarantinedAt)

	f.restart()
	agent.SetRemoveHook(f.store, nil)
	st = f.step(nil)
	assert.Equal(t, []string{"web-01"}, st.Destroyed, "the removal is retried and acked")
	assert.Len(t, f.prov.Calls(agenttest.OpDestroy), 1, "the destroy is on record; only the removal is retried")
	_, err = os.Stat(dir)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestRemoveVMRemovesTheRecordLast(t *testing.T) {
	st, err := agent.OpenStore(t.TempDir())
	require.NoError(t, err)
	require.NoError(t, st.SaveRecord(&agent.Record{Name: "web-01", Phase: status.PhaseQuarantined}))
	dir := st.VMDir("web-01")
	for _, n := range []string{"a.qcow2", "seed.img", "zz.pid"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), nil, 0o600))
	}
	var order []string
	agent.SetRemoveHook(st, func(path string) error {
		order = append(order, filepath.Base(path))
		if filepath.Base(path) == "zz.pid" {
			return errors.New("operation not permitted")
		}
		return nil
	})
	require.Error(t, st.RemoveVM("web-01"))
	_, err = st.LoadRecord("web-01")
	require.NoError(t, err, "a failure half-way leaves the record readable")

	order = nil
	agent.SetRemoveHook(st, func(path string) error { order = append(order, filepath.Base(path)); return nil })
	require.NoError(t, st.RemoveVM("web-01"))
	assert.Equal(t, "record.json", order[len(order)-1])
	_, err = os.Stat(dir)
	assert.ErrorIs(t, err, os.ErrNotExist)
	assert.NoError(t, st.RemoveVM("web-01"), "already gone")
}

func vanished(st *status.Status) []string {
	var out []string
	for _, v := range st.Vanished {
		out = append(out, v.Name)
	}
	return out
}

// A VM absent from the snapshot without a tombstone (a restored repository,
// a hand-edited snapshots branch) is never destroyed: it is left as it is
// for the vanish grace, then shut down and kept until it comes back.
func TestAVanishedVMIsKeptNeverDestroyed(t *testing.T) {
	f := newFixture(t)
	t0 := f.clock.Now()
	f.step(withVolumes(snap(1, vm("web-01", volumes("data")), vm("db-01")), vol("data", 1)))
	f.prov.ResetCalls()

	st := f.step(snap(2, vm("db-01")))
	assert.Empty(t, f.prov.Calls(agenttest.OpShutdown), "nothing happens to it inside the vanish grace")
	assert.True(t, f.prov.Running("web-01"), "a running VM keeps running")
	require.Equal(t, []string{"web-01"}, vanished(st))
	v := st.Vanished[0]
	assert.Equal(t, t0, v.Since)
	assert.Equal(t, "running", v.Power)
	assert.False(t, v.Quarantined)
	assert.Contains(t, v.Reason, "without a tombstone")
	assert.Empty(t, quarantined(st), "not a pending delete")
	assert.False(t, hasRow(st, "web-01"))
	assert.Equal(t, []string{"data"}, st.Orphans, "its volume is an orphan, kept")

	f.clock.Add(59 * time.Minute)
	f.restart() // the grace runs from the marker on disk
	st = f.step(nil)
	assert.Empty(t, f.prov.Calls(agenttest.OpShutdown))
	require.Equal(t, []string{"web-01"}, vanished(st))
	assert.Equal(t, t0, st.Vanished[0].Since, "a restart does not reset the grace")

	f.clock.Add(time.Minute)
	st = f.step(nil)
	assert.Equal(t, []string{"web-01"}, f.prov.Calls(agenttest.OpShutdown), "shut down gracefully after the grace")
	assert.False(t, f.prov.Running("web-01"))
	require.Equal(t, []string{"web-01"}, vanished(st))
	assert.True(t, st.Vanished[0].Quarantined)
	assert.Equal(t, "stopped", st.Vanished[0].Power)
	assert.Contains(t, st.Vanished[0].Reason, "kept")

	f.clock.Add(30 * 24 * time.Hour)
	st = f.step(nil)
	f.restart()
	st = f.step(nil)
	assert.Empty(t, f.prov.Calls(agenttest.OpDestroy), "never destroyed without a tombstone")
	assert.Empty(t, st.Destroyed, "nothing acked")
	assert.Equal(t, []string{"web-01"}, vanished(st))
	assert.Equal(t, vm("web-01").Spec.DiskGB, f.prov.DiskGB("web-01"), "the root disk is kept")
	assert.NotZero(t, f.prov.DiskGB("web-01"))
	_, err := os.Stat(f.store.VolumePath("data"))
	assert.NoError(t, err, "the volume is kept")
	rec := f.record("web-01")
	require.NotNil(t, rec.VanishedAt)
	assert.Equal(t, t0, *rec.VanishedAt)

	t.Run("reappearing resumes it on its disk", func(t *testing.T) {
		f.prov.ResetCalls()
		st := f.step(withVolumes(snap(3, vm("web-01", volumes("data")), vm("db-01")), vol("data", 1)))
		assert.Empty(t, st.Vanished)
		assert.Equal(t, status.PhaseReady, row(t, st, "web-01").Phase)
		assert.Equal(t, []string{"web-01"}, f.prov.Calls(agenttest.OpBoot), "booted again")
		assert.Empty(t, f.prov.Calls(agenttest.OpRootDisk), "on the disk it had")
		assert.Nil(t, f.record("web-01").VanishedAt, "the marker is cleared")
	})
}

func TestAVanishedVMIsDeletedOnlyByItsTombstone(t *testing.T) {
	f := newFixture(t)
	f.step(snap(1, vm("web-01")))
	f.step(snap(2))
	f.clock.Add(2 * time.Hour)
	f.step(snap(2))
	require.False(t, f.prov.Running("web-01"), "shut down after the vanish grace")

	t1 := f.clock.Now()
	st := f.step(snap(3, tombstoned(vm("web-01"))))
	assert.Empty(t, st.Vanished)
	require.Len(t, st.Quarantined, 1)
	assert.Equal(t, t1, st.Quarantined[0].Since, "the tombstone grace runs from its own marker")
	assert.Empty(t, f.prov.Calls(agenttest.OpDestroy))

	f.clock.Add(4 * time.Minute)
	st = f.step(nil)
	assert.Empty(t, f.prov.Calls(agenttest.OpDestroy), "the hours it spent vanished do not count")
	f.clock.Add(time.Minute)
	st = f.step(nil)
	assert.Equal(t, []string{"web-01"}, f.prov.Calls(agenttest.OpDestroy))
	assert.Equal(t, []string{"web-01"}, st.Destroyed, "acked as a delete")
}

func TestAWithdrawnTombstoneDestroysNothingAndAReturningOneStartsAgain(t *testing.T) {
	f := newFixture(t)
	f.step(snap(1, vm("web-01")))
	f.step(snap(2, tombstoned(vm("web-01"))))
	f.clock.Add(4 * time.Minute)
	// The snapshots branch loses the tombstone (restored, hand-edited): the
	// VM is neither named nor tombstoned any more.
	st := f.step(snap(3))
	assert.Empty(t, st.Quarantined)
	assert.Equal(t, []string{"web-01"}, vanished(st))
	f.clock.Add(48 * time.Hour)
	st = f.step(nil)
	assert.Empty(t, f.prov.Calls(agenttest.OpDestroy))
	assert.Empty(t, st.Destroyed)
	assert.Equal(t, []string{"web-01"}, vanished(st))

	st = f.step(snap(4, tombstoned(vm("web-01"))))
	assert.Equal(t, []string{"web-01"}, quarantined(st))
	f.clock.Add(4 * time.Minute)
	f.step(nil)
	assert.Empty(t, f.prov.Calls(agenttest.OpDestroy), "a returning tombstone gets a whole new grace")
	f.clock.Add(time.Minute)
	st = f.step(nil)
	assert.Equal(t, []string{"web-01"}, f.prov.Calls(agenttest.OpDestroy))
	assert.Equal(t, []string{"web-01"}, st.Destroyed)
}

func TestAFailedShutdownOfAVanishedVMIsRetried(t *testing.T) {
	f := newFixture(t)
	f.step(snap(1, vm("web-01")))
	f.step(snap(2))
	f.clock.Add(time.Hour)
	f.prov.FailAlways(agenttest.OpShutdown, errTransient)
	st := f.step(nil)
	require.Len(t, st.Vanished, 1)
	assert.Equal(t, "shutdown: disk busy", st.Vanished[0].LastError)
	assert.False(t, st.Vanished[0].Quarantined)
	assert.True(t, f.prov.Running("web-01"))

	f.prov.FailAlways(agenttest.OpShutdown, nil)
	st = f.step(nil)
	assert.True(t, st.Vanished[0].Quarantined)
	assert.Empty(t, st.Vanished[0].LastError)
	assert.Empty(t, f.prov.Calls(agenttest.OpDestroy))
}

func TestATombstoneThisHostNeverHadIsAckedEveryTime(t *testing.T) {
	f := newFixture(t)
	for i := 0; i < 2; i++ {
		st := f.step(snap(1, tombstoned(vm("ghost"))))
		assert.Equal(t, []string{"ghost"}, st.Destroyed)
	}
	assert.Empty(t, f.prov.AllCalls())
}

func TestUndelete(t *testing.T) {
	f := newFixture(t)
	f.step(snap(1, vm("web-01")))
	f.step(snap(2, tombstoned(vm("web-01"))))
	f.clock.Add(2 * time.Minute)
	st := f.step(snap(3, vm("web-01")))
	assert.Empty(t, st.Quarantined)
	r := row(t, st, "web-01")
	assert.Equal(t, status.PhaseReady, r.Phase, "the VM runs again")
	assert.Len(t, f.prov.Calls(agenttest.OpRootDisk), 1, "on the disk it had")
	assert.Nil(t, f.record("web-01").QuarantinedAt)

	f.clock.Add(24 * time.Hour)
	st = f.step(snap(4, tombstoned(vm("web-01"))))
	assert.Empty(t, f.prov.Calls(agenttest.OpDestroy), "a second delete gets a whole new grace")
	assert.Equal(t, []string{"web-01"}, quarantined(st))
}

func TestAddresses(t *testing.T) {
	t.Run("an address found after boot is picked up and kept", func(t *testing.T) {
		f := newFixture(t)
		f.prov.SetLateAddress(true)
		r := row(t, f.step(snap(1, vm("web-01"))), "web-01")
		assert.Equal(t, status.PhaseReady, r.Phase, "no address yet is not a failure")
		assert.Empty(t, r.IP)
		f.prov.AnswerAddress("web-01")
		r = row(t, f.step(nil), "web-01")
		assert.Equal(t, "10.77.1.2", r.IP)
		assert.Equal(t, "10.77.1.2", f.record("web-01").IP, "persisted, not only reported")
	})
	t.Run("an empty answer keeps the known address", func(t *testing.T) {
		f := newFixture(t)
		f.step(snap(1, vm("web-01")))
		f.prov.ForgetAddresses()
		r := row(t, f.step(nil), "web-01")
		assert.Equal(t, "10.77.1.2", r.IP)
		assert.Equal(t, "127.0.0.1:2202", r.SSH)
	})
	t.Run("a new network forgets the old network's address", func(t *testing.T) {
		f := newFixture(t)
		r := row(t, f.step(snap(1, vm("web-01"))), "web-01")
		require.NotEmpty(t, r.IP)
		f.prov.ForgetAddresses()
		f.prov.SetLateAddress(true) // the guest has no address on lan yet
		r = row(t, f.step(snap(2, vm("web-01", network("lan")))), "web-01")
		assert.Empty(t, r.IP, "an address of the old network is no address on the new one")
		assert.Empty(t, r.SSH)
	})
}

func TestSpecEditsOnARunningVM(t *testing.T) {
	const otherImage = "bb00000000000000000000000000000000000000000000000000000000000000"
	newCloudInit := &desired.CloudInit{SSHAuthorizedKeys: []string{"ssh-ed25519 AAAAnew"}, UserData: "#cloud-config\n"}
	cases := []struct {
		name        string
		edit        func(*desired.VMSpec)
		restart     bool
		rootDisk    bool
		wantDiskGB  int
		wantMessage string
	}{
		{name: "vcpus", edit: vcpus(4), restart: true, wantDiskGB: 5},
		{name: "memory", edit: memoryMB(4096), restart: true, wantDiskGB: 5},
		{name: "network", edit: network("lan"), restart: true, wantDiskGB: 5},
		{name: "mac", edit: func(s *desired.VMSpec) { s.MAC = "52:54:00:6b:3c:9a" }, restart: true, wantDiskGB: 5},
		{name: "an adopted root disk is not applied to the created VM", edit: func(s *desired.VMSpec) {
			s.RootDisk = &desired.RootDisk{Adopt: true}
		}, wantDiskGB: 5, wantMessage: agent.RootDiskNotApplied},
		{name: "static addresses are not applied to the created VM", edit: func(s *desired.VMSpec) {
			s.Static = &desired.StaticIP{Addresses: []string{"10.77.0.9/24"}}
		}, wantDiskGB: 5, wantMessage: agent.StaticNotApplied},
		{name: "volumes", edit: volumes("data"), restart: true, wantDiskGB: 5},
		{name: "kernel", edit: func(s *desired.VMSpec) {
			s.Kernel = &desired.Kernel{URL: "https://images.example/vmlinuz", SHA256: otherImage, Cmdline: "console=ttyS0"}
		}, restart: true, wantDiskGB: 5},
		{name: "diskGB grows online", edit: diskGB(20), rootDisk: true, wantDiskGB: 20},
		{name: "diskGB never shrinks", edit: diskGB(2), wantDiskGB: 5, wantMessage: "never shrink"},
		{name: "a new image leaves the root disk", edit: image(otherImage), wantDiskGB: 5, wantMessage: "existing root disk"},
		{name: "cloud-init is not applied to the created VM", edit: func(s *desired.VMSpec) { s.CloudInit = newCloudInit },
			wantDiskGB: 5, wantMessage: agent.CloudInitNotApplied},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			vols := []snapshots.SnapshotVolume{{Name: "data", SizeGB: 1}}
			created := vm("web-01")
			f.step(withVolumes(snap(1, created), vols...))
			f.prov.ResetCalls()

			edited := vm("web-01", tc.edit)
			st := f.step(withVolumes(snap(2, edited), vols...))
			r := row(t, st, "web-01")
			assert.Equal(t, status.PhaseReady, r.Phase)
			assert.Empty(t, r.LastError)
			assert.Equal(t, edited.SpecHash, r.SpecHash, "the edit is applied")
			assert.Contains(t, r.Message, tc.wantMessage)
			if tc.wantMessage == "" {
				assert.Empty(t, r.Message)
			}
			var ops []agenttest.Op
			for _, c := range f.prov.AllCalls() {
				ops = append(ops, c.Op)
			}
			// Every edit stages the new spec first, with the VM running.
			switch {
			case tc.rootDisk:
				assert.Equal(t, []agenttest.Op{agenttest.OpStage, agenttest.OpRootDisk}, ops, "grown online, no restart")
				assert.Equal(t, 1, f.prov.GrownOnline("web-01"))
			case tc.restart:
				assert.Equal(t, []agenttest.Op{agenttest.OpStage, agenttest.OpShutdown, agenttest.OpBoot}, ops, "staged, then a graceful restart")
			default:
				assert.Equal(t, []agenttest.Op{agenttest.OpStage}, ops, "the running VM is left alone")
			}
			assert.Equal(t, tc.wantDiskGB, f.prov.DiskGB("web-01"))
			staged, _ := f.prov.StagedWith("web-01")
			want := edited.Spec
			want.CloudInit = created.Spec.CloudInit // first boot only
			want.Static = created.Spec.Static
			want.RootDisk = created.Spec.RootDisk // adopted at create only
			assert.Equal(t, want, staged.Spec, "staged with the spec to apply")
			if tc.restart {
				m, _ := f.prov.BootedWith("web-01")
				assert.Equal(t, edited.Spec, m.Spec, "booted with the new spec")
			}

			// A later boot (the host rebooted) boots the applied spec: the
			// seed keeps the cloudInit and static addresses the VM was
			// created with.
			f.rebootHost()
			f.step(nil)
			m, _ := f.prov.BootedWith("web-01")
			assert.Equal(t, want, m.Spec)
		})
	}
}

// TestABadEditKeepsTheRunningVM pins make before break: an edit whose
// artifacts do not fetch or verify never stops the running VM; the error
// is in status; a permanent error is not retried, a transient one only
// within the budget; a new edit is tried afresh.
func TestABadEditKeepsTheRunningVM(t *testing.T) {
	badKernel := func(s *desired.VMSpec) {
		s.Kernel = &desired.Kernel{URL: "https://images.example/vmlinuz", SHA256: strings.Repeat("b", 64)}
	}
	t.Run("a checksum mismatch fails the edit at once", func(t *testing.T) {
		f := newFixture(t)
		good := vm("web-01")
		f.step(snap(1, good))
		f.prov.ResetCalls()
		f.prov.FailAlways(agenttest.OpStage, agent.Permanent(errors.New("fetch kernel: sha256 mismatch")))
		bad := vm("web-01", badKernel)
		for i := 0; i < 3; i++ {
			r := row(t, f.step(snap(2, bad)), "web-01")
			assert.Equal(t, status.PhaseReady, r.Phase, "the VM runs on")
			assert.Equal(t, good.SpecHash, r.SpecHash, "on its previous spec")
			assert.Contains(t, r.LastError, "stage: fetch kernel: sha256 mismatch")
			assert.Contains(t, r.LastError, "keeps its previous spec")
		}
		assert.Len(t, f.prov.Calls(agenttest.OpStage), 1, "a permanent error is not retried")
		assert.Empty(t, f.prov.Calls(agenttest.OpShutdown), "never stopped")
		assert.Equal(t, 1, f.prov.RunningCount())

		t.Run("a lost VM is still booted again on its previous spec", func(t *testing.T) {
			f.prov.Crash("web-01")
			r := row(t, f.step(snap(2, bad)), "web-01")
			assert.Equal(t, status.PhaseReady, r.Phase)
			assert.Contains(t, r.LastError, "sha256 mismatch")
			m, _ := f.prov.BootedWith("web-01")
			assert.Equal(t, good.Spec, m.Spec)
		})
		t.Run("a corrected edit is applied", func(t *testing.T) {
			f.prov.FailAlways(agenttest.OpStage, nil)
			fixed := vm("web-01", vcpus(2))
			r := row(t, f.step(snap(3, fixed)), "web-01")
			assert.Equal(t, fixed.SpecHash, r.SpecHash)
			assert.Empty(t, r.LastError)
			assert.Zero(t, f.record("web-01").Attempts)
		})
	})
	t.Run("a transient failure is retried within the budget", func(t *testing.T) {
		f := newFixture(t)
		good := vm("web-01")
		f.step(snap(1, good))
		f.prov.ResetCalls()
		f.prov.FailAlways(agenttest.OpStage, errTransient)
		bad := vm("web-01", badKernel)
		var r status.VM
		for i := 0; i < 5; i++ {
			r = row(t, f.step(snap(2, bad)), "web-01")
		}
		assert.Len(t, f.prov.Calls(agenttest.OpStage), 3, "MaxAttempts, then no more")
		assert.Contains(t, r.LastError, "given up after 3 attempts")
		assert.Equal(t, good.SpecHash, r.SpecHash)
		assert.Empty(t, f.prov.Calls(agenttest.OpShutdown))
		f.restart()
		f.step(snap(2, bad))
		assert.Len(t, f.prov.Calls(agenttest.OpStage), 3, "the spent budget survives a restart")
	})
	t.Run("status says restarting while the VM restarts", func(t *testing.T) {
		var logs bytes.Buffer
		f := newFixture(t, func(c *agent.EngineConfig) { c.Log = logTo(&logs) })
		f.step(snap(1, vm("web-01")))
		var during string
		f.prov.SetHook(func(_ context.Context, op agenttest.Op, name string) error {
			if op == agenttest.OpShutdown {
				during = f.record(name).Phase
			}
			return nil
		})
		r := row(t, f.step(snap(2, vm("web-01", vcpus(2)))), "web-01")
		assert.Equal(t, status.PhaseRestarting, during)
		assert.Equal(t, status.PhaseReady, r.Phase)
		assert.Contains(t, logs.String(), `reason="restart to apply the edited spec"`, "the log says why it boots")

		logs.Reset()
		f.step(snap(3, vm("web-01", vcpus(2), func(s *desired.VMSpec) { s.Power = desired.PowerStopped })))
		f.step(snap(4, vm("web-01", vcpus(2))))
		assert.Contains(t, logs.String(), `reason="spec says power: running"`)
	})
}

func TestAnEditThatDoesNotFitKeepsTheRunningVM(t *testing.T) {
	f := newFixture(t)
	f.step(withCapacity(snap(1, vm("web-01", vcpus(2))), 3, 0))
	f.prov.ResetCalls()
	st := f.step(withCapacity(snap(2, vm("web-01", vcpus(4))), 3, 0))
	r := row(t, st, "web-01")
	assert.Contains(t, r.LastError, "capacity limit")
	assert.Equal(t, vm("web-01", vcpus(2)).SpecHash, r.SpecHash, "still the old spec")
	assert.Empty(t, f.prov.Calls(agenttest.OpShutdown))
	assert.Equal(t, 1, f.prov.RunningCount())
}

func TestARestartedAgentKeepsEveryVM(t *testing.T) {
	f := newFixture(t)
	s := snap(1, vm("a"), vm("b"), vm("c", stopped))
	f.step(s)
	f.prov.ResetCalls()
	f.restart()
	st := f.step(s)
	assert.Empty(t, f.prov.AllCalls(), "nothing is created, booted or stopped again")
	assert.Equal(t, status.PhaseReady, row(t, st, "a").Phase)
	assert.Equal(t, status.PhaseReady, row(t, st, "b").Phase)
	assert.Equal(t, status.PhaseStopped, row(t, st, "c").Phase)
}

func TestTheLastAcceptedSnapshotIsReconciledWithoutGit(t *testing.T) {
	f := newFixture(t)
	f.step(snap(1, vm("web-01")))
	f.restart()
	f.rebootHost()
	st := f.step(nil) // nothing fetched: the snapshot on disk is the desired state
	assert.Equal(t, status.PhaseReady, row(t, st, "web-01").Phase)
	assert.Len(t, f.prov.Calls(agenttest.OpBoot), 2)
	assert.Equal(t, uint64(1), st.LastSeenEpoch)
}

func TestASnapshotForAnotherHostIsRefused(t *testing.T) {
	f := newFixture(t)
	other := snap(1, vm("web-01"))
	other.Host = "hv-b"
	err := f.eng.Tick(context.Background(), other)
	assert.ErrorIs(t, err, agent.ErrSnapshotInvalid)
	require.NoError(t, f.eng.Settle(context.Background()))
	assert.Empty(t, f.prov.AllCalls())
	assert.Zero(t, f.eng.Report().LastSeenEpoch)
}

func TestAStateDirectoryServesOneHost(t *testing.T) {
	f := newFixture(t)
	f.step(snap(1, vm("web-01")))
	cfg := f.config()
	cfg.Host = "hv-b" // a typo in the config
	_, err := agent.NewEngine(cfg)
	assert.ErrorIs(t, err, agent.ErrHostMismatch)

	t.Run("a host that is not a DNS label claims nothing", func(t *testing.T) {
		st, err := agent.OpenStore(t.TempDir())
		require.NoError(t, err)
		cfg := f.config()
		cfg.Store, cfg.Host = st, "../README"
		_, err = agent.NewEngine(cfg)
		assert.ErrorIs(t, err, agent.ErrInvalidName)
		_, err = os.Stat(filepath.Join(st.Root(), "host"))
		assert.ErrorIs(t, err, os.ErrNotExist)
	})
}

func TestNoSnapshotYetDoesNothing(t *testing.T) {
	f := newFixture(t)
	st := f.step(nil)
	assert.Empty(t, f.prov.AllCalls())
	assert.Empty(t, st.VMs)
	assert.Zero(t, st.LastSeenEpoch)
}

func TestInvalidVMNamesAreReportedNotJoinedIntoPaths(t *testing.T) {
	f := newFixture(t)
	bad := vm("x")
	bad.Name = "../../etc"
	st := f.step(snap(1, bad))
	assert.Empty(t, f.prov.AllCalls())
	r := row(t, st, "../../etc")
	assert.Equal(t, status.PhaseFailed, r.Phase)
	assert.Contains(t, r.LastError, "DNS label")
}

func TestProgressIsShownWhileCreating(t *testing.T) {
	f := newFixture(t)
	f.prov.FailAlways(agenttest.OpRootDisk, errTransient)
	f.prov.SetProgress("web-01", 1<<29, 2<<30)
	r := row(t, f.step(snap(1, vm("web-01"))), "web-01")
	assert.Equal(t, "downloading: 0.50 of 2.00 GB (25%)", r.Message)
	f.prov.SetProgress("web-01", 1<<30, -1)
	r = row(t, f.step(nil), "web-01")
	assert.Equal(t, "downloading: 1.00 GB so far", r.Message)
}

// The hash of the snapshot kept on disk (JSON) equals the hash of the same
// snapshot fetched from the branch (YAML): state written before hashes were
// kept fences by it without refusing a plain re-fetch.
func TestTheSnapshotOnDiskHashesAsTheFetchedOne(t *testing.T) {
	full := vm("web-01", volumes("data", "logs"), image("aa00000000000000000000000000000000000000000000000000000000000000"), func(s *desired.VMSpec) {
		s.Kernel = &desired.Kernel{URL: "https://k.example/vmlinuz", SHA256: strings.Repeat("b", 64), Initrd: &desired.Artifact{URL: "https://k.example/initrd", SHA256: strings.Repeat("c", 64)}, Cmdline: "console=ttyS0"}
		s.CloudInit = &desired.CloudInit{SSHAuthorizedKeys: []string{"ssh-ed25519 AAAA test"}, UserData: "#cloud-config\n"}
		s.Network = "lan"
	})
	gone := tombstoned(vm("old-01", stopped))
	gone.Tombstone = &snapshots.Tombstone{Commit: "0123abcd", Author: "A <a@example.com>", Time: "2026-01-02T03:04:05Z", Epoch: 5}
	s := withVolumes(withCapacity(snap(6, full, vm("bare-01"), gone), 8, 16384), vol("data", 10), tombVol("logs", 1))
	s.HostSpec.Networks = map[string]desired.Network{"lan": {Bridge: "br0"}}
	s.Source = snapshots.SnapshotSource{Commit: "0123abcd", Branch: "main"}

	data, err := snapshots.MarshalSnapshot(s)
	require.NoError(t, err)
	fetched, err := snapshots.ParseSnapshot(data)
	require.NoError(t, err)
	st, err := agent.OpenStore(t.TempDir())
	require.NoError(t, err)
	require.NoError(t, st.SaveSnapshot(fetched))
	onDisk, err := st.LoadSnapshot()
	require.NoError(t, err)

	want, err := agent.SnapshotHash(fetched)
	require.NoError(t, err)
	got, err := agent.SnapshotHash(onDisk)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	empty, err := snapshots.ParseSnapshot([]byte("host: hv-a\nepoch: 1\nsource: {commit: a, branch: main}\nhostSpec: {}\nvms: []\nvolumes: []\n"))
	require.NoError(t, err)
	require.NoError(t, st.SaveSnapshot(empty))
	onDisk, err = st.LoadSnapshot()
	require.NoError(t, err)
	want, _ = agent.SnapshotHash(empty)
	got, _ = agent.SnapshotHash(onDisk)
	assert.Equal(t, want, got)
}

func TestADestroyWhoseRemovalDidNotFinish(t *testing.T) {
	// destroyUnfinished destroys web-01 after its grace with every removal
	// failing, so the record stays behind with its DestroyedAt; kill plays
	// an agent killed between Destroy and RemoveVM: the disk holds exactly
	// what it held when the removal began.
	destroyUnfinished := func(t *testing.T, kill bool) *fixture {
		f := newFixture(t)
		f.step(snap(1, vm("web-01")))
		f.step(snap(2, tombstoned(vm("web-01"))))
		f.clock.Add(6 * time.Minute)
		var atRemoval []byte
		agent.SetRemoveHook(f.store, func(path string) error {
			if atRemoval == nil {
				data, err := os.ReadFile(f.store.RecordPath("web-01"))
				require.NoError(t, err)
				atRemoval = data
			}
			return errors.New("device or resource busy")
		})
		st := f.step(nil)
		require.Equal(t, []string{"web-01"}, f.prov.Calls(agenttest.OpDestroy))
		require.Empty(t, st.Destroyed, "nothing acked while state remains")
		require.NotNil(t, atRemoval)
		assert.Contains(t, string(atRemoval), `"destroyedAt"`, "the destroy is on disk before the removal starts")
		if kill {
			f.eng.Close(context.Background())
			require.NoError(t, os.WriteFile(f.store.RecordPath("web-01"), atRemoval, 0o600))
			f.start()
		}
		agent.SetRemoveHook(f.store, nil)
		f.prov.ResetCalls()
		return f
	}
	for _, kill := range []bool{false, true} {
		name := "removal failed"
		if kill {
			name = "killed between destroy and removal"
		}
		t.Run(name+": un-delete creates it again", func(t *testing.T) {
			f := destroyUnfinished(t, kill)
			old := f.record("web-01")
			require.NotNil(t, old.DestroyedAt)
			st := f.step(snap(3, vm("web-01")))
			r := row(t, st, "web-01")
			assert.Equal(t, status.PhaseReady, r.Phase, r.LastError)
			assert.Empty(t, r.LastError)
			assert.Equal(t, []string{"web-01"}, f.prov.Calls(agenttest.OpRootDisk), "a fresh root disk")
			assert.Equal(t, []string{"web-01"}, f.prov.Calls(agenttest.OpBoot))
			rec := f.record("web-01")
			assert.NotEqual(t, old.InstanceID, rec.InstanceID, "a new instance for cloud-init")
			assert.Nil(t, rec.DestroyedAt)
			assert.Nil(t, rec.QuarantinedAt)
			assert.NotEmpty(t, rec.BootID)
			m, ok := f.prov.BootedWith("web-01")
			require.True(t, ok)
			assert.Equal(t, rec.InstanceID, m.InstanceID)

			f.restart()
			st = f.step(nil)
			assert.Equal(t, status.PhaseReady, row(t, st, "web-01").Phase, "stays created across a restart")
			assert.Len(t, f.prov.Calls(agenttest.OpRootDisk), 1)
		})
		t.Run(name+": still tombstoned, the removal finishes and is acked", func(t *testing.T) {
			f := destroyUnfinished(t, kill)
			st := f.step(nil)
			assert.Equal(t, []string{"web-01"}, st.Destroyed)
			assert.Empty(t, st.Quarantined)
			assert.Empty(t, f.prov.Calls(agenttest.OpDestroy), "destroyed once already")
			assert.Empty(t, f.prov.Calls(agenttest.OpBoot))
			_, err := os.Stat(f.store.VMDir("web-01"))
			assert.ErrorIs(t, err, os.ErrNotExist)
		})
	}
}

// A snapshot whose epoch leaves no room to accept the next one (above
// snapshots.MaxAcceptedEpoch, such as a forged one just under 2^53) is
// refused like a fence violation: its tombstone destroys nothing, the
// status says why, and the next genuine epoch is still accepted.
func TestAnEpochWithoutRoomForTheNextIsRefused(t *testing.T) {
	f := newFixture(t)
	f.step(snap(5, vm("web-01")))
	f.prov.ResetCalls()
	for _, forged := range []uint64{snapshots.MaxAcceptedEpoch + 1, snapshots.MaxEpoch - 2, snapshots.MaxEpoch - 1} {
		st := f.step(snap(forged, tombstoned(vm("web-01"))))
		assert.True(t, st.FenceViolation, "epoch %d", forged)
		assert.Contains(t, st.SnapshotError, "no room to accept the next one")
		assert.Equal(t, uint64(5), st.LastSeenEpoch)
	}
	f.clock.Add(time.Hour) // past the tombstone grace
	st := f.step(snap(snapshots.MaxEpoch-2, tombstoned(vm("web-01"))))
	assert.Empty(t, f.prov.AllCalls(), "a refused snapshot acts on nothing")
	assert.Empty(t, quarantined(st))
	assert.True(t, hasRow(st, "web-01"))

	st = f.step(snap(6, vm("web-01")))
	assert.False(t, st.FenceViolation)
	assert.Equal(t, uint64(6), st.LastSeenEpoch)

	// The bound itself is accepted.
	st = f.step(snap(snapshots.MaxAcceptedEpoch, vm("web-01")))
	assert.False(t, st.FenceViolation)
	assert.Equal(t, snapshots.MaxAcceptedEpoch, st.LastSeenEpoch)
}

// The documented, reviewed way to trust a lower epoch again: epochReset
// {from, to} in the agent's configuration lowers the accepted epoch when it
// is exactly from, forgets the snapshot accepted above to, keeps the VMs,
// and then acts nowhere else (left in the configuration, it never acts
// twice; a from that is not the accepted epoch does nothing).
func TestEpochResetTrustsALowerEpochAgain(t *testing.T) {
	f := newFixture(t)
	high := snapshots.MaxAcceptedEpoch
	f.step(snap(high, vm("web-01")))
	st := f.step(snap(4, vm("web-01")))
	require.True(t, st.FenceViolation, "a lower epoch is fenced before the reset")

	f.tune = func(c *agent.EngineConfig) { c.EpochReset = &agent.EpochReset{From: high - 1, To: 3} }
	f.restart()
	st = f.step(snap(4, vm("web-01")))
	require.True(t, st.FenceViolation, "a reset naming another epoch does nothing")

	f.tune = func(c *agent.EngineConfig) { c.EpochReset = &agent.EpochReset{From: high, To: 3} }
	f.restart()
	f.prov.ResetCalls()
	st = f.step(snap(4, vm("web-01")))
	assert.False(t, st.FenceViolation)
	assert.Equal(t, uint64(4), st.LastSeenEpoch)
	assert.Empty(t, f.prov.Calls(agenttest.OpDestroy), "the reset keeps the VMs")
	assert.True(t, hasRow(st, "web-01"))

	// Still configured: the next start finds epoch 4, not from, and the
	// fence holds as usual.
	f.restart()
	st = f.step(snap(3, vm("web-01")))
	assert.True(t, st.FenceViolation)
	assert.Equal(t, uint64(4), st.LastSeenEpoch)

	_, err := f.store.ResetEpoch(4, 4)
	assert.Error(t, err, "to must be below from")
}
