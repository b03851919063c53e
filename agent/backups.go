package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/agent/backup"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
)

// BackupSecrets are the host's own files of one backup repository, named
// in the agent configuration under the BackupRepository's name (never in
// git): see backup.Repository for what each must be.
type BackupSecrets struct {
	PasswordFile    string
	EnvironmentFile string
	SSHKey          string
	KnownHosts      string
}

// BackupConfig configures scheduled backups (docs/DESIGN.md, "Scheduled
// backups"). Zero durations take the defaults below.
type BackupConfig struct {
	// Secrets are the files of each repository this host may use, by
	// name. A VM whose repository has none fails its backups, saying so.
	Secrets map[string]BackupSecrets
	// CacheDir is restic's cache; default <state dir>/restic-cache.
	CacheDir string
	// Restic is the restic binary (default "restic" from PATH).
	Restic string
	// RetryMin and RetryMax bound the backoff after a failed backup: the
	// n-th failure in a row waits RetryMin·2^(n-1), at most RetryMax
	// (defaults 1 min and 1 h), whatever the schedule.
	RetryMin, RetryMax time.Duration
	// Timeout bounds one backup run of a VM, every disk and the retention
	// included (default 6 h).
	Timeout time.Duration
	// MaintenanceEvery is how often the maintenance host of a repository
	// prunes and checks it (default 24 h).
	MaintenanceEvery time.Duration
	// CheckSubset is restic check's --read-data-subset of the maintenance
	// check (default "1/20": each check reads a twentieth of the data).
	CheckSubset string
	// Repository, when set, replaces how a repository is opened (tests
	// give their own restic timeouts); nil builds a backup.Repository from
	// the URL and Secrets.
	Repository func(name, url string, s BackupSecrets) *backup.Repository
}

// Defaults of BackupConfig.
const (
	DefaultBackupRetryMin    = time.Minute
	DefaultBackupRetryMax    = time.Hour
	DefaultBackupTimeout     = 6 * time.Hour
	DefaultMaintenanceEvery  = 24 * time.Hour
	DefaultCheckSubset       = "1/20"
	backupStateDirName       = "backups"
	backupStateFormatVersion = 1
)

// ErrBackupUnsupported is a VM's backup on a backend that implements no
// DiskSnapshotter.
var ErrBackupUnsupported = errors.New("this backend cannot read its disks: no backups")

// backupState is what the agent remembers of one VM's backups, in
// <state dir>/backups/<vm>.json, so a restart keeps the schedule and the
// status. Times are UTC.
type backupState struct {
	Format      int           `json:"format"`
	Repository  string        `json:"repository"`
	LastSuccess time.Time     `json:"lastSuccess,omitempty"`
	BackupID    string        `json:"backupID,omitempty"`
	Snapshot    string        `json:"snapshot,omitempty"`
	Bytes       int64         `json:"bytes,omitempty"`
	BytesAdded  int64         `json:"bytesAdded,omitempty"`
	Duration    time.Duration `json:"duration,omitempty"`
	Consistency string        `json:"consistency,omitempty"`
	LastError   string        `json:"lastError,omitempty"`
	LastFailure time.Time     `json:"lastFailure,omitempty"`
	Failures    int           `json:"failures,omitempty"`
	RetryAt     time.Time     `json:"retryAt,omitempty"`
}

// backups is the engine's backup scheduler: the state of each VM's
// backups, the runs in flight, and the repositories opened.
type backups struct {
	// setup serializes openRepository's first-time setup (init, unlock);
	// never held with mu.
	setup    sync.Mutex
	mu       sync.Mutex
	state    map[string]*backupState
	running  map[string]bool
	repos    map[string]*backup.Repository // by name + "\x00" + URL
	unlocked map[string]bool               // repositories whose stale locks were cleared
	maint    map[string]time.Time          // last maintenance start, by repository
	loaded   bool
}

func (b *backups) init() {
	b.state, b.running = map[string]*backupState{}, map[string]bool{}
	b.repos, b.unlocked, b.maint = map[string]*backup.Repository{}, map[string]bool{}, map[string]time.Time{}
}

func (e *Engine) backupStatePath(vm string) string {
	return filepath.Join(e.store.Root(), backupStateDirName, vm+".json")
}

// loadBackupStates reads every VM's saved backup state once; an unreadable
// one is logged and starts afresh (a backup is then due at once, which
// costs a backup, never data).
func (e *Engine) loadBackupStatesLocked() {
	b := &e.bk
	if b.loaded {
		return
	}
	b.loaded = true
	entries, _ := os.ReadDir(filepath.Join(e.store.Root(), backupStateDirName))
	for _, ent := range entries {
		name, ok := strings.CutSuffix(ent.Name(), ".json")
		if !ok || !validName(name) {
			continue
		}
		data, err := os.ReadFile(e.backupStatePath(name))
		var st backupState
		if err == nil {
			err = json.Unmarshal(data, &st)
		}
		if err != nil || st.Format != backupStateFormatVersion {
			e.log.WithField("vm", name).WithError(err).Warn("backup state unreadable; the next backup is due at once")
			continue
		}
		b.state[name] = &st
	}
}

// saveBackupState writes st for vm (atomically) and publishes it.
func (e *Engine) saveBackupState(vm string, st backupState) {
	st.Format = backupStateFormatVersion
	e.bk.mu.Lock()
	e.bk.state[vm] = &st
	e.bk.mu.Unlock()
	data, _ := json.Marshal(st)
	dir := filepath.Join(e.store.Root(), backupStateDirName)
	err := os.MkdirAll(dir, 0o700)
	if err == nil {
		err = writeFileAtomic(e.backupStatePath(vm), data)
	}
	if err != nil {
		e.log.WithField("vm", vm).WithError(err).Error("save backup state")
	}
	e.signal()
}

// forgetBackups drops the backup state of a VM destroyed here: a VM
// created again under its name starts its schedule afresh. Its backups
// stay in the repository (retention runs only after a new backup).
func (e *Engine) forgetBackups(vm string) {
	e.bk.mu.Lock()
	delete(e.bk.state, vm)
	e.bk.mu.Unlock()
	if err := os.Remove(e.backupStatePath(vm)); err != nil && !errors.Is(err, os.ErrNotExist) {
		e.log.WithField("vm", vm).WithError(err).Warn("remove the backup state of a destroyed vm")
	}
}

// backupRow is the status of vm's backups under policy, nil without one.
func (e *Engine) backupRow(vm string, policy *desired.BackupPolicy) *status.Backup {
	if policy == nil {
		return nil
	}
	e.bk.mu.Lock()
	defer e.bk.mu.Unlock()
	row := &status.Backup{Repository: policy.Repository}
	st := e.bk.state[vm]
	if st == nil {
		return row
	}
	row.LastError, row.LastFailure = st.LastError, st.LastFailure
	if st.Repository == policy.Repository {
		row.LastSuccess, row.LastBackupID, row.LastSnapshot = st.LastSuccess, st.BackupID, st.Snapshot
		row.Bytes, row.BytesAdded, row.Consistency = uint64(max(st.Bytes, 0)), uint64(max(st.BytesAdded, 0)), st.Consistency
		row.DurationSeconds = int64(st.Duration.Round(time.Second) / time.Second)
	}
	if due, ok := nextDue(policy, st); ok {
		row.NextDue = due
	}
	return row
}

// nextDue is when the next backup of a VM under policy is due: after a
// failure, its retry time (the backoff); else the
// schedule's next time after the last success in the same repository
// (the zero time, at once, when there was none).
func nextDue(policy *desired.BackupPolicy, st *backupState) (time.Time, bool) {
	sched, err := desired.ParseSchedule(policy.Schedule)
	if err != nil {
		return time.Time{}, false
	}
	var last time.Time
	if st != nil && st.Repository == policy.Repository {
		last = st.LastSuccess
	}
	due := sched.Due(last)
	if st != nil && !st.RetryAt.IsZero() {
		return st.RetryAt, true
	}
	return due.UTC(), true
}

// backupJob is one VM's backup to run: its name, policy and the
// repository as the snapshot gives it.
type backupJob struct {
	vm     string
	policy desired.BackupPolicy
	repo   snapshots.SnapshotBackupRepository
	spec   desired.VMSpec
	iid    string
}

// scheduleBackups starts, in the background, the backup of each running
// VM of snap whose spec asks for one and whose backup is due, and the
// maintenance of each repository this host maintains. Called by Tick
// (not while fenced or suspended); a run in flight is never started
// twice, and runs end with the engine (e.ctx).
func (e *Engine) scheduleBackups(snap *snapshots.Snapshot) {
	now := e.now()
	var jobs []backupJob
	e.mu.Lock()
	e.bk.mu.Lock()
	e.loadBackupStatesLocked()
	for _, want := range snap.VMs {
		b := want.Spec.Backup
		rec := e.recs[want.Name]
		// A stopped VM is not backed up (its last backup stands): reading
		// its disks would hold their image lock against its next boot.
		if b == nil || want.Tombstoned || rec == nil || rec.QuarantinedAt != nil || rec.BootID == "" ||
			rec.Power != string(desired.PowerRunning) || e.bk.running[want.Name] {
			continue
		}
		if due, ok := nextDue(b, e.bk.state[want.Name]); !ok || due.After(now) {
			continue
		}
		job := backupJob{vm: want.Name, policy: *b, spec: rec.Spec, iid: rec.InstanceID}
		if r := snap.BackupRepository(b.Repository); r != nil {
			job.repo = *r
		}
		e.bk.running[want.Name] = true
		jobs = append(jobs, job)
	}
	maint := e.dueMaintenanceLocked(snap, now)
	e.bk.mu.Unlock()
	e.mu.Unlock()
	for _, j := range jobs {
		e.wg.Add(1)
		go e.runBackup(j)
	}
	for _, r := range maint {
		e.wg.Add(1)
		go e.runMaintenance(r)
	}
}

// runBackup runs one job to its end and records the outcome: a success
// clears the failures, a failure is reported and retried with backoff.
func (e *Engine) runBackup(j backupJob) {
	defer e.wg.Done()
	defer func() {
		e.bk.mu.Lock()
		delete(e.bk.running, j.vm)
		e.bk.mu.Unlock()
	}()
	log := e.log.WithField("vm", j.vm).WithField("repository", j.policy.Repository)
	ctx, cancel := context.WithTimeout(e.ctx, orDefault(e.cfg.Backups.Timeout, DefaultBackupTimeout))
	defer cancel()
	start := e.now()
	e.bk.mu.Lock()
	prev := backupState{}
	if st := e.bk.state[j.vm]; st != nil {
		prev = *st
	}
	e.bk.mu.Unlock()
	res, err := e.backUpVM(ctx, j, log)
	next := prev
	next.Repository = j.policy.Repository
	if err != nil {
		next.LastError = fmt.Sprintf("backup to %s at %s failed: %v", j.policy.Repository, start.UTC().Format(time.RFC3339), err)
		next.LastFailure, next.Failures = start.UTC(), prev.Failures+1
		next.RetryAt = e.now().Add(e.backoff(next.Failures)).UTC()
		log.WithError(err).WithField("failures", next.Failures).WithField("retryAt", next.RetryAt).Warn("backup failed; the vm is untouched")
		e.saveBackupState(j.vm, next)
		return
	}
	next.LastSuccess, next.BackupID, next.Snapshot = start.UTC(), res.id, res.meta
	next.Bytes, next.BytesAdded, next.Duration, next.Consistency = res.bytes, res.added, e.now().Sub(start), res.consistency
	next.LastError, next.LastFailure, next.Failures, next.RetryAt = "", time.Time{}, 0, time.Time{}
	log.WithField("backup", res.id).WithField("bytesAdded", res.added).WithField("consistency", res.consistency).Info("backup done")
	e.saveBackupState(j.vm, next)
}

// backoff is how long the n-th failure in a row waits.
func (e *Engine) backoff(n int) time.Duration {
	lo := orDefault(e.cfg.Backups.RetryMin, DefaultBackupRetryMin)
	hi := orDefault(e.cfg.Backups.RetryMax, DefaultBackupRetryMax)
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// backupResult is one whole backup: its id, the meta snapshot's restic id,
// bytes read and added, and its consistency.
type backupResult struct {
	id, meta, consistency string
	bytes, added          int64
}

// Steps of a backup, as its errors name them.
const (
	StepBackupRepository = "repository"
	StepBackupSnapshot   = "point-in-time view"
	StepBackupDisk       = "disk"
	StepBackupManifest   = "manifest"
	StepBackupRetention  = "retention"
)

// backUpVM takes the point-in-time view of every disk of the running VM,
// stores each disk and then the manifest, and applies retention. Any
// snapshot of a disk made by a run that does not end with its manifest is
// forgotten again, so a backup counts only whole. It only reads the VM's
// disks; the view is released on every path.
func (e *Engine) backUpVM(ctx context.Context, j backupJob, log logrus.FieldLogger) (res backupResult, err error) {
	ds, ok := e.prov.(DiskSnapshotter)
	if !ok {
		return res, ErrBackupUnsupported
	}
	repo, err := e.openRepository(ctx, j.policy.Repository, j.repo)
	if err != nil {
		return res, fmt.Errorf("%s: %w", StepBackupRepository, err)
	}
	if !e.prov.Running(j.vm) {
		return res, fmt.Errorf("%s: %w", StepBackupSnapshot, ErrNotRunning)
	}
	res.id = newBackupID(e.now())
	snap, err := ds.SnapshotDisks(ctx, j.vm, SnapshotOptions{Freeze: true})
	if err != nil {
		return res, fmt.Errorf("%s: %w", StepBackupSnapshot, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if rerr := ds.ReleaseSnapshot(rctx, j.vm); rerr != nil {
			log.WithError(rerr).Warn("release the point-in-time view")
		}
	}()
	res.consistency = snap.Consistency
	var made []string
	defer func() {
		if err != nil && len(made) > 0 {
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if ferr := repo.ForgetSnapshots(fctx, backup.VMScope(e.cfg.Host, j.vm), made, false); ferr != nil {
				log.WithError(ferr).Warn("forget the disks of a backup that is not whole")
			}
		}
	}()
	m := backup.Manifest{Format: backup.ManifestFormat, BackupID: res.id, VM: j.vm, InstanceID: j.iid, Host: e.cfg.Host,
		Time: snap.At.UTC(), Consistency: snap.Consistency}
	for _, d := range snap.Disks {
		md, r, err := e.backUpDisk(ctx, ds, repo, j.vm, res.id, d)
		if err != nil {
			return res, fmt.Errorf("%s %s: %w", StepBackupDisk, d.Name, err)
		}
		made = append(made, r.SnapshotID)
		m.Disks = append(m.Disks, md)
		res.bytes, res.added = res.bytes+r.BytesProcessed, res.added+r.BytesAdded
	}
	if res.meta, err = e.writeManifest(ctx, repo, m, j.spec); err != nil {
		return res, fmt.Errorf("%s: %w", StepBackupManifest, err)
	}
	made = nil // whole: it counts
	if err := e.retain(ctx, repo, j.vm, j.policy.Keep.Policy()); err != nil {
		// The backup is whole and counts; retention runs again next time.
		log.WithError(err).Warn("retention of the vm's backups failed; retried after the next backup")
	}
	return res, nil
}

// retain applies the keep policy to this host's whole backups of vm: to
// their meta snapshots (restic forget --tag gitfleet,gitfleet-vm=<vm>,
// gitfleet-part=meta --host <host>), then forgets every other snapshot of
// the VM made by this host whose backup id is no kept manifest's: the
// disks of forgotten backups and those a killed run left without a
// manifest. Applying the policy to the disks themselves would let such
// leftovers, newer than the last whole backup, take the places the
// policy keeps, and forget the disks a kept manifest names. It runs after
// a whole backup, when no other backup of vm runs on this host.
func (e *Engine) retain(ctx context.Context, repo *backup.Repository, vm string, policy backup.KeepPolicy) error {
	metaScope := backup.Scope{Host: e.cfg.Host, Tags: []string{backup.TagOwner, backup.TagVM(vm), backup.TagMeta}}
	res, err := repo.Forget(ctx, metaScope, policy, false)
	if err != nil {
		return err
	}
	if len(res.Kept) == 0 {
		return fmt.Errorf("retention kept no backup of %s: nothing more is forgotten", vm)
	}
	scope := backup.VMScope(e.cfg.Host, vm)
	all, err := repo.Snapshots(ctx, backup.Filter(scope))
	if err != nil {
		return err
	}
	kept := map[string]bool{}
	for _, s := range all {
		if slices.Contains(res.Kept, s.ID) {
			for _, t := range s.Tags {
				kept[t] = kept[t] || strings.HasPrefix(t, backup.TagBackup(""))
			}
		}
	}
	var drop []string
	for _, s := range all {
		if s.HasTag(backup.TagMeta) {
			continue
		}
		whole := false
		for _, t := range s.Tags {
			whole = whole || kept[t]
		}
		if !whole {
			drop = append(drop, s.ID)
		}
	}
	return repo.ForgetSnapshots(ctx, scope, drop, false)
}

// backUpDisk streams one disk of the held view into a --stdin snapshot.
func (e *Engine) backUpDisk(ctx context.Context, ds DiskSnapshotter, repo *backup.Repository, vm, id string, d DiskInfo) (backup.ManifestDisk, backup.BackupResult, error) {
	s, err := ds.OpenSnapshotDisk(ctx, vm, d.Name)
	if err != nil {
		return backup.ManifestDisk{}, backup.BackupResult{}, err
	}
	defer s.Close()
	file := backup.DiskFilename(vm, d.Name)
	r, err := repo.Backup(ctx, s, backup.BackupRequest{Filename: file, Host: e.cfg.Host, Tags: backup.DiskTags(vm, d.Name, id), Size: s.Size()})
	if err != nil {
		return backup.ManifestDisk{}, r, err
	}
	return backup.ManifestDisk{Name: d.Name, VirtualSize: d.VirtualSize, SnapshotID: r.SnapshotID, File: file, SHA256: s.SHA256()}, r, nil
}

// writeManifest stores m as the backup's meta snapshot, written last. The
// spec it keeps leaves out cloudInit (user-data and keys are secrets that
// stay in git and on the host) and the backup policy's own fields are
// kept as they were.
func (e *Engine) writeManifest(ctx context.Context, repo *backup.Repository, m backup.Manifest, spec desired.VMSpec) (string, error) {
	spec.CloudInit = nil
	raw, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	m.Spec = raw
	if err := m.Check(); err != nil {
		return "", err
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return "", err
	}
	r, err := repo.Backup(ctx, bytes.NewReader(data), backup.BackupRequest{Filename: backup.ManifestFilename(m.VM), Host: e.cfg.Host,
		Tags: backup.MetaTags(m.VM, m.BackupID), Size: int64(len(data))})
	if err != nil {
		return "", err
	}
	return r.SnapshotID, nil
}

// newBackupID is a backup's id: its start time (UTC, seconds) and 32
// random bits, such as "20260102t030000z-1a2b3c4d": a path element and a
// tag value (backup.CheckName).
func newBackupID(t time.Time) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return t.UTC().Format("20060102t150405z") + "-" + hex.EncodeToString(b[:])
}

// openRepository returns the repository name as the snapshot names it
// (r, zero when the snapshot has no such repository for this host),
// opened with this host's secrets; the first time in this process it
// also clears the stale locks a killed restic left (restic unlock, which
// removes only locks of dead processes on this host and old ones, never
// --remove-all), and, on the repository's maintenance host only, creates
// the repository when restic says there is none at the URL (two hosts
// initializing one location at once would corrupt it).
func (e *Engine) openRepository(ctx context.Context, name string, r snapshots.SnapshotBackupRepository) (*backup.Repository, error) {
	if r.Name == "" {
		return nil, fmt.Errorf("the host's snapshot carries no BackupRepository %q: does its spec.hosts list %s?", name, e.cfg.Host)
	}
	sec, ok := e.cfg.Backups.Secrets[name]
	if !ok {
		return nil, fmt.Errorf("the agent config of %s names no password file for backup repository %q (backupRepositories.%s.passwordFile)", e.cfg.Host, name, name)
	}
	key := name + "\x00" + r.URL
	e.bk.mu.Lock()
	repo := e.bk.repos[key]
	if repo == nil {
		repo = e.newRepository(name, r.URL, sec)
		e.bk.repos[key] = repo
	}
	unlocked := e.bk.unlocked[key]
	e.bk.mu.Unlock()
	if unlocked {
		return repo, nil
	}
	// One first-time setup at a time: a backup and the maintenance
	// started by one tick must not both initialize the location.
	e.bk.setup.Lock()
	defer e.bk.setup.Unlock()
	e.bk.mu.Lock()
	unlocked = e.bk.unlocked[key]
	e.bk.mu.Unlock()
	if unlocked {
		return repo, nil
	}
	_, err := repo.Snapshots(ctx, backup.Filter{Host: e.cfg.Host, Tags: []string{backup.TagOwner, backup.TagMeta}})
	switch {
	case errors.Is(err, backup.ErrRepositoryMissing) && r.Maintenance:
		e.log.WithField("repository", name).Info("no restic repository at its URL yet; initializing it (this host maintains it)")
		err = repo.Init(ctx)
	case errors.Is(err, backup.ErrRepositoryMissing):
		// Two hosts that both initialize one location race to write
		// its config and keys: only the maintenance host does.
		err = fmt.Errorf("no restic repository at its URL yet; its maintenance host initializes it at its first backup or maintenance (or run restic init): %w", err)
	}
	if err != nil {
		return nil, err
	}
	if err := repo.Unlock(ctx); err != nil {
		return nil, fmt.Errorf("clear stale locks: %w", err)
	}
	e.bk.mu.Lock()
	e.bk.unlocked[key] = true
	e.bk.mu.Unlock()
	return repo, nil
}

func (e *Engine) newRepository(name, url string, s BackupSecrets) *backup.Repository {
	if f := e.cfg.Backups.Repository; f != nil {
		return f(name, url, s)
	}
	cache := e.cfg.Backups.CacheDir
	if cache == "" {
		cache = filepath.Join(e.store.Root(), "restic-cache")
	}
	return &backup.Repository{URL: url, PasswordFile: s.PasswordFile, EnvironmentFile: s.EnvironmentFile,
		SSHKey: s.SSHKey, KnownHosts: s.KnownHosts, CacheDir: cache, Restic: e.cfg.Backups.Restic}
}

// dueMaintenanceLocked returns the repositories this host maintains whose
// maintenance is due, marking them started. e.bk.mu held.
func (e *Engine) dueMaintenanceLocked(snap *snapshots.Snapshot, now time.Time) []snapshots.SnapshotBackupRepository {
	var due []snapshots.SnapshotBackupRepository
	every := orDefault(e.cfg.Backups.MaintenanceEvery, DefaultMaintenanceEvery)
	for _, r := range snap.BackupRepositories {
		key := "maint\x00" + r.Name
		if !r.Maintenance || e.bk.running[key] {
			continue
		}
		if last, ok := e.bk.maint[r.Name]; ok && now.Sub(last) < every {
			continue
		}
		if _, ok := e.cfg.Backups.Secrets[r.Name]; !ok {
			continue
		}
		e.bk.running[key], e.bk.maint[r.Name] = true, now
		due = append(due, r)
	}
	return due
}

// runMaintenance prunes and checks (a data subset) a repository this host
// maintains, under restic's exclusive lock (waited for; stale locks
// cleared). A failure is logged and tried again at the next interval.
func (e *Engine) runMaintenance(r snapshots.SnapshotBackupRepository) {
	defer e.wg.Done()
	defer func() {
		e.bk.mu.Lock()
		delete(e.bk.running, "maint\x00"+r.Name)
		e.bk.mu.Unlock()
	}()
	log := e.log.WithField("repository", r.Name)
	ctx := e.ctx
	repo, err := e.openRepository(ctx, r.Name, r)
	if err == nil {
		err = repo.Prune(ctx)
	}
	if err == nil {
		subset := e.cfg.Backups.CheckSubset
		if subset == "" {
			subset = DefaultCheckSubset
		}
		err = repo.Check(ctx, subset)
	}
	if err != nil {
		log.WithError(err).Warn("repository maintenance (prune, check) failed; tried again at the next interval")
		return
	}
	log.Info("repository maintenance done: pruned and checked")
}
