package agent_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/backup"
	"github.com/gitfleet/gitfleet/agent/qemu"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/tinyguest"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/netnstest"
	"github.com/gitfleet/gitfleet/testsupport/resticserver"
)

// backupHost is one agent host of the backup tests: a store, the QEMU
// backend and the engine over them, on the test's clock.
type backupHost struct {
	name  string
	store *agent.Store
	prov  *qemu.Provisioner
	eng   *agent.Engine
}

func newBackupHost(t *testing.T, name string, clk *clock, g *tinyguest.Guest, base string, secrets map[string]agent.BackupSecrets) *backupHost {
	t.Helper()
	dir := t.TempDir()
	store, err := agent.OpenStore(filepath.Join(dir, "state"))
	require.NoError(t, err)
	prov, err := qemu.New(qemu.Config{CacheDir: filepath.Join(dir, "images"), MachineDir: store.VMDir, Accel: "tcg", RunAs: qemuUser(t),
		Artifacts: qemu.ArtifactPolicy{FileRoots: []string{filepath.Dir(g.Kernel), filepath.Dir(g.Initrd), filepath.Dir(base)},
			AllowNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}},
		PowerdownTimeout: 20 * time.Second, KillTimeout: 5 * time.Second, BootTimeout: 90 * time.Second, Logger: quietLog()})
	require.NoError(t, err)
	eng, err := agent.NewEngine(agent.EngineConfig{Host: name, Store: store, Provisioner: prov, Now: clk.Now,
		TombstoneGrace: time.Minute, MaxAttempts: 3, Log: quietLog(),
		Backups: agent.BackupConfig{Secrets: secrets, CacheDir: filepath.Join(dir, "restic-cache")}})
	require.NoError(t, err)
	h := &backupHost{name: name, store: store, prov: prov, eng: eng}
	t.Cleanup(func() {
		eng.Close(context.Background())
		_ = prov.Destroy(context.Background(), "db-01")
	})
	return h
}

func (h *backupHost) step(t *testing.T, s *snapshots.Snapshot) *status.Status {
	t.Helper()
	require.NoError(t, h.eng.Tick(context.Background(), s))
	require.NoError(t, h.eng.Settle(context.Background()))
	return h.eng.Report()
}

// console waits for a line of the VM's serial console matching re and
// returns its submatches.
func (h *backupHost) console(t *testing.T, vm string, re *regexp.Regexp) []string {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		b, _ := os.ReadFile(filepath.Join(h.store.VMDir(vm), qemu.SerialLog))
		if m := re.FindStringSubmatch(string(b)); m != nil {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("no console line %s of %s on %s:\n%s", re, vm, h.name, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitBackup waits for the VM's backup status to change from before (a
// new success or a new failure) and returns it.
func waitBackup(t *testing.T, h *backupHost, vm string, before status.Backup) status.Backup {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		r := row(t, h.eng.Report(), vm)
		if b := r.Backup; b != nil && (!b.LastSuccess.Equal(before.LastSuccess) || !b.LastFailure.Equal(before.LastFailure)) {
			return *b
		}
		if time.Now().After(deadline) {
			t.Fatalf("no backup of %s finished on %s: %+v", vm, h.name, r.Backup)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// backupRepo is a restic repository the backup test writes to: its
// location and the secrets a host reaches it with.
type backupRepo struct {
	url     string
	secrets agent.BackupSecrets
}

func needBackupTools(t *testing.T) {
	t.Helper()
	for _, bin := range []string{"qemu-system-x86_64", "qemu-img", "qemu-nbd", "nbdcopy", "restic"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed (scripts/install-deps.sh installs it)", bin)
		}
	}
}

// TestScheduledBackupAndRestoreOnAnotherHost: a running tiny guest writes
// known data to its root disk and its volume; its scheduled backup goes
// into a local restic repository while it runs; a failing backup (a
// wrong password) is reported, leaves the guest running and is retried;
// retention keeps the newest; the VM is deleted through its reviewed
// delete; a second host creates it from the backup, and the guest finds
// its data with the same hashes and instance-id.
func TestScheduledBackupAndRestoreOnAnotherHost(t *testing.T) {
	if testing.Short() {
		t.Skip("boots two real VMs; skipped with -short")
	}
	needBackupTools(t)
	dir := t.TempDir()
	pw := filepath.Join(dir, "password")
	require.NoError(t, os.WriteFile(pw, []byte("backup test password\n"), 0o600))
	backupAndRestore(t, backupRepo{url: filepath.Join(dir, "repo"), secrets: agent.BackupSecrets{PasswordFile: pw}})
}

// TestScheduledBackupAndRestoreOverSFTP is the same through an sftp:
// repository on an OpenSSH server in a network namespace the test makes.
func TestScheduledBackupAndRestoreOverSFTP(t *testing.T) {
	if testing.Short() {
		t.Skip("boots two real VMs; skipped with -short")
	}
	needBackupTools(t)
	if !netnstest.Enter(t) {
		return
	}
	const nsAddr = "10.251.7.1"
	resticserver.AddAddress(t, "gfbk1", nsAddr+"/24")
	srv := resticserver.StartSFTP(t, nsAddr)
	dir := t.TempDir()
	pw := filepath.Join(dir, "password")
	require.NoError(t, os.WriteFile(pw, []byte("backup test password\n"), 0o600))
	backupAndRestore(t, backupRepo{url: srv.URL("repo"),
		secrets: agent.BackupSecrets{PasswordFile: pw, SSHKey: srv.KeyFile, KnownHosts: srv.KnownHostsFile}})
}

func backupAndRestore(t *testing.T, repo backupRepo) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	g, err := tinyguest.Build(ctx, tinyguest.TestCacheDir())
	require.NoError(t, err, "build the tiny guest")
	base := filepath.Join(t.TempDir(), "base.qcow2")
	out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", base, "64M").CombinedOutput()
	require.NoError(t, err, string(out))
	kernel, initrd, image := fileArtifact(t, g.Kernel), fileArtifact(t, g.Initrd), fileArtifact(t, base)
	var mark [8]byte
	_, _ = rand.Read(mark[:])
	marker := "gitfleet-known-data-" + hex.EncodeToString(mark[:])
	spec := func(host string) desired.VMSpec {
		return desired.VMSpec{Host: host, VCPUs: 1, MemoryMB: 128, DiskGB: 1, Power: desired.PowerRunning, Image: &image,
			Kernel:    &desired.Kernel{URL: kernel.URL, SHA256: kernel.SHA256, Initrd: &initrd, Cmdline: g.Cmdline},
			Volumes:   []string{"db-01-data"},
			CloudInit: &desired.CloudInit{UserData: tinyguest.KnownDataScript(marker)}}
	}
	repos := []snapshots.SnapshotBackupRepository{{Name: "store", URL: repo.url, Maintenance: true}}
	secrets := map[string]agent.BackupSecrets{"store": repo.secrets}
	clk := newClock()

	// Host A: the VM with its backup policy.
	a := newBackupHost(t, "hv-a", clk, g, base, secrets)
	sa := spec("hv-a")
	sa.Backup = &desired.BackupPolicy{Repository: "store", Schedule: "every 1h", Keep: desired.BackupKeep{Last: 1}}
	vm := snapshots.SnapshotVM{Name: "db-01", SpecHash: desired.SpecHash(sa), Spec: sa}
	snapA := &snapshots.Snapshot{Host: "hv-a", Epoch: 1, VMs: []snapshots.SnapshotVM{vm},
		Volumes: []snapshots.SnapshotVolume{{Name: "db-01-data", SizeGB: 1}}, BackupRepositories: repos}
	a.step(t, snapA)
	waitPhase(t, a.eng, "db-01", status.PhaseReady)
	a.console(t, "db-01", regexp.MustCompile(`probe wrote `+marker))
	hashes := a.console(t, "db-01", regexp.MustCompile(`probe hash root ([0-9a-f]{64})\s+tinyguest: probe hash vol ([0-9a-f]{64})`))
	iid := a.console(t, "db-01", regexp.MustCompile(`seed /dev/vd[a-z] instance-id=(\S+)`))[1]
	pid, err := os.ReadFile(filepath.Join(a.store.VMDir("db-01"), qemu.PidFile))
	require.NoError(t, err)

	// The first backup is due at once, and runs while the guest runs.
	a.step(t, snapA)
	first := waitBackup(t, a, "db-01", status.Backup{})
	require.Empty(t, first.LastError)
	assert.Equal(t, "store", first.Repository)
	assert.Equal(t, backup.ConsistencyCrash, first.Consistency, "the tiny guest has no guest agent")
	assert.Equal(t, uint64(2<<30), first.Bytes, "root (1 GiB) and volume (1 GiB)")
	assert.NotEmpty(t, first.LastSnapshot)
	assert.Equal(t, clk.Now().Add(time.Hour), first.NextDue)

	// A wrong password: the backup fails, says why, and the guest runs on.
	require.NoError(t, os.WriteFile(repo.secrets.PasswordFile, []byte("not the password\n"), 0o600))
	clk.Add(time.Hour)
	a.step(t, snapA)
	failed := waitBackup(t, a, "db-01", first)
	assert.Contains(t, failed.LastError, "wrong password")
	assert.Equal(t, first.LastBackupID, failed.LastBackupID, "the last success is still reported")
	assert.Equal(t, clk.Now().Add(agent.DefaultBackupRetryMin), failed.NextDue, "retried after the backoff")
	again, err := os.ReadFile(filepath.Join(a.store.VMDir("db-01"), qemu.PidFile))
	require.NoError(t, err)
	assert.Equal(t, string(pid), string(again), "the guest runs on, untouched")
	assert.True(t, a.prov.Running("db-01"))

	// Fixed, the retry succeeds; retention keeps the newest backup only.
	require.NoError(t, os.WriteFile(repo.secrets.PasswordFile, []byte("backup test password\n"), 0o600))
	clk.Add(2 * time.Minute)
	a.step(t, snapA)
	second := waitBackup(t, a, "db-01", failed)
	require.Empty(t, second.LastError)
	require.NotEqual(t, first.LastBackupID, second.LastBackupID)
	r := &backup.Repository{URL: repo.url, PasswordFile: repo.secrets.PasswordFile, SSHKey: repo.secrets.SSHKey,
		KnownHosts: repo.secrets.KnownHosts, CacheDir: filepath.Join(t.TempDir(), "cache")}
	metas, err := r.Snapshots(ctx, backup.Filter{Host: "hv-a", Tags: []string{backup.TagOwner, backup.TagVM("db-01"), backup.TagMeta}})
	require.NoError(t, err)
	require.Len(t, metas, 1, "keep last 1")
	assert.Equal(t, second.LastSnapshot, metas[0].ID)
	assert.True(t, metas[0].HasTag(backup.TagBackup(second.LastBackupID)))
	all, err := r.Snapshots(ctx, backup.Filter{Tags: []string{backup.TagOwner}})
	require.NoError(t, err)
	assert.Len(t, all, 3, "two disks and the meta snapshot of the one backup kept")

	// The reviewed delete: quarantine, grace, destroy.
	deleted := vm
	deleted.Tombstoned = true
	tomb := &snapshots.Snapshot{Host: "hv-a", Epoch: 2, VMs: []snapshots.SnapshotVM{deleted},
		Volumes: []snapshots.SnapshotVolume{{Name: "db-01-data", SizeGB: 1}}, BackupRepositories: repos}
	a.step(t, tomb)
	clk.Add(2 * time.Minute)
	require.Equal(t, []string{"db-01"}, a.step(t, tomb).Destroyed)
	_, err = os.Stat(filepath.Join(a.store.Root(), "backups", "db-01.json"))
	assert.ErrorIs(t, err, os.ErrNotExist, "a destroyed VM's backup state goes with it")

	// Host B creates the VM from the latest backup hv-a made.
	b := newBackupHost(t, "hv-b", clk, g, base, secrets)
	sb := spec("hv-b")
	sb.Restore = &desired.RestoreSource{Repository: "store", Host: "hv-a", Backup: desired.RestoreLatest}
	snapB := &snapshots.Snapshot{Host: "hv-b", Epoch: 1,
		VMs:                []snapshots.SnapshotVM{{Name: "db-01", SpecHash: desired.SpecHash(sb), Spec: sb}},
		Volumes:            []snapshots.SnapshotVolume{{Name: "db-01-data", SizeGB: 1}},
		BackupRepositories: []snapshots.SnapshotBackupRepository{{Name: "store", URL: repo.url}}}
	b.step(t, snapB)
	rb := waitPhase(t, b.eng, "db-01", status.PhaseReady)
	assert.Empty(t, rb.LastError)
	b.console(t, "db-01", regexp.MustCompile(`probe found `+marker))
	got := b.console(t, "db-01", regexp.MustCompile(`probe hash root ([0-9a-f]{64})\s+tinyguest: probe hash vol ([0-9a-f]{64})`))
	assert.Equal(t, hashes[1:], got[1:], "the restored guest reads the same root and volume")
	assert.Equal(t, iid, b.console(t, "db-01", regexp.MustCompile(`seed /dev/vd[a-z] instance-id=(\S+)`))[1],
		"restored under its own name: the same instance")
}
