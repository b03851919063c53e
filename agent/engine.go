package agent

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/sealed"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
)

// Defaults of EngineConfig.
const (
	DefaultTombstoneGrace = 5 * time.Minute
	DefaultVanishGrace    = time.Hour
	DefaultMaxAttempts    = 3
	DefaultReadyTimeout   = 10 * time.Minute
	DefaultImageGrace     = 24 * time.Hour
	// ImageCollectInterval is the least time between two image cache
	// collections (EngineConfig.ImageGrace).
	ImageCollectInterval = 10 * time.Minute
	// ReadyPollInterval is how often the engine asks the provisioner
	// whether a booting guest has answered; a guest that has makes its
	// VM's pass run at once, so status shows ready within this interval
	// plus one pass of the guest's first answer.
	ReadyPollInterval = 200 * time.Millisecond
)

// Sentinel errors callers test with errors.Is.
var (
	// ErrFenced: the snapshot's epoch is below the last accepted one (the
	// snapshots branch was restored from an older copy), or equal to it with
	// different content (the branch was edited by hand, or two controllers
	// publish). Nothing was done; the status reports fenceViolation.
	ErrFenced = errors.New("snapshot fenced")
	// ErrCapacity: admitting the VM would exceed the host's capacity. It is
	// checked again on every tick and spends no create attempt.
	ErrCapacity = errors.New("capacity limit")
	// ErrVolumeMissing: a volume the VM names is not on this host yet. It is
	// checked again on every tick and spends no create attempt.
	ErrVolumeMissing = errors.New("volume not present on this host")
	// ErrNetworkMissing: the host network a VM's spec.network names is not
	// on this host yet (a bridge network whose bridge does not exist; the
	// agent never creates one). A create or an edit that meets it waits: it
	// is checked again on every tick, spends no attempt, and the VM comes
	// up at the first tick after the bridge appears.
	ErrNetworkMissing = errors.New("waiting for it; checked again every tick, no attempt spent")
	// ErrVolumeUnusable: something is at a volume's path but it cannot be
	// attached: a symlink to nothing (checked again on every tick, spends
	// no create attempt) or not a regular file (a permanent error). The
	// agent never deletes or replaces what is there.
	ErrVolumeUnusable = errors.New("volume path holds no usable file")
	// ErrDiskNotStaged: the VM's spec adopts a root disk
	// (rootDisk.adopt) and none is staged for it on this host yet
	// (gitfleet import --stage puts it there). A create that meets it
	// waits: checked again every tick, no attempt spent, so a disk staged
	// after the merge is taken at the next tick.
	ErrDiskNotStaged = errors.New("adopted root disk not staged on this host; checked again every tick, no attempt spent")
)

// waitsForHost reports whether err is something the host lacks for now
// and a person provides (a volume, a bridge, a dangling volume link made
// good, an adopted disk staged): a create or an edit that meets it is
// checked again every tick and spends no attempt.
func waitsForHost(err error) bool {
	return errors.Is(err, ErrVolumeMissing) || errors.Is(err, ErrNetworkMissing) || errors.Is(err, ErrDiskNotStaged) ||
		(errors.Is(err, ErrVolumeUnusable) && !IsPermanent(err))
}

// EngineConfig configures an Engine. Zero values take the defaults noted.
type EngineConfig struct {
	// Host is this host's name, as in the snapshot and status paths.
	Host        string
	Store       *Store
	Provisioner Provisioner
	// BootID returns the host's boot id; default HostBootID. A create is
	// complete once its record carries a boot id.
	BootID func() string
	// Now is the engine's clock for quarantine and volume graces; default
	// time.Now.
	Now func() time.Time
	// TombstoneGrace is how long a tombstoned VM or volume waits, measured
	// from its on-disk marker, before it is destroyed (default 5 min).
	TombstoneGrace time.Duration
	// VanishGrace is how long a VM absent from the snapshot without a
	// tombstone is left exactly as it is (a running VM keeps running),
	// measured from the VanishedAt marker in its record (default 1 h). After
	// it the VM is shut down gracefully and kept, record, root disk and
	// volumes, until it reappears or its tombstone arrives. It is never
	// destroyed for vanishing: only a tombstone, a reviewed delete, destroys a
	// VM: a repository restored from a backup, a hand-edited snapshots
	// branch or a controller bug must not cost a VM the snapshot lacks.
	VanishGrace time.Duration
	// MaxAttempts is the create retry budget per spec (default 3).
	MaxAttempts int
	// VMTimeout bounds one VM's pass (the watchdog); 0 means unbounded. A
	// pass the watchdog ends spends no create attempt.
	VMTimeout time.Duration
	// ReadyTimeout is how long a running VM's guest may take to prove it
	// is up (Provisioner.Readiness), measured from the start of its boot,
	// before lastError says it has not answered (default 10 min). The VM
	// stays booting and is never restarted or destroyed for it.
	ReadyTimeout time.Duration
	// ImageGrace is how long a cached artifact no VM uses is kept before
	// the backend's ImageCollector removes it (default 24 h; negative
	// turns collection off). Collection runs from Tick at most every
	// ImageCollectInterval.
	ImageGrace time.Duration
	// Metrics, when set, counts passes, creates and image collections, and
	// exports this engine's report as gauges (NewMetrics).
	Metrics *Metrics
	Log     logrus.FieldLogger
	// AgeIdentity is this host's age identities, which open a VM's
	// spec.cloudInit.encryptedUserData (give the backend the same
	// keyring: it decrypts when it builds the seed). The engine only
	// checks that they open it: a create whose user-data this host cannot
	// decrypt fails at its user-data step, before anything is fetched;
	// a created VM whose user-data it cannot decrypt (the host's key
	// changed) keeps running and says so in lastError. nil: no identity,
	// and such user-data is refused that way.
	AgeIdentity *sealed.Keyring
	// ConfirmDeletes makes every destroy of a tombstoned VM or volume
	// wait, besides its TombstoneGrace, for the controller's confirmation:
	// once its grace has passed, the quarantine gets a random nonce (on
	// disk with its marker, reported in the status), and the object is
	// destroyed only once the accepted snapshot's tombstone of it carries
	// that nonce (docs/DESIGN.md, "Delete confirmation"). An agent that verifies
	// snapshots turns it on (Config.ControllerKeys): only then does a
	// snapshot carrying the nonce prove the controller confirmed this
	// quarantine. Off, the grace alone gates a destroy.
	ConfirmDeletes bool
	// EpochReset, when set, lowers the accepted epoch from EpochReset.From
	// to EpochReset.To when NewEngine finds exactly From accepted
	// (Store.ResetEpoch); otherwise it does nothing.
	EpochReset *EpochReset
	// Backups configures scheduled backups (backups.go); its zero value
	// backs nothing up, and a VM whose spec asks for backups says so in
	// its status.
	Backups BackupConfig
}

// EpochReset is a reviewed instruction to trust a lower epoch again: the
// agent's accepted epoch From (as its status reports lastSeenEpoch) is
// replaced by To, below it. Naming From makes it act once, on the state it
// was written for.
type EpochReset struct {
	From, To uint64
}

// Engine is the level-triggered reconcile loop of one host. Tick accepts a
// snapshot (or refuses it, fenced), converges volumes, and kicks one worker
// per VM; workers run concurrently with each other and with the caller, and
// Settle waits for them. Report describes the host at any time.
//
// Records live in memory and are written through to the Store on every
// change; they are read from disk once, by NewEngine (or, when that
// failed, the first tick), so an idle tick touches no file.
//
// Methods are safe for concurrent use. Close ends the workers.
type Engine struct {
	cfg   EngineConfig
	store *Store
	prov  Provisioner
	log   logrus.FieldLogger

	ctx    context.Context // the workers'
	cancel context.CancelFunc

	admitMu sync.Mutex // serializes admission across workers
	tickMu  sync.Mutex // one Tick at a time

	mu       sync.Mutex
	idle     *sync.Cond // signalled when inflight drops to 0
	inflight int
	closed   bool
	loaded   bool
	// ticked is set by the first Tick: before it no pass runs, not even
	// one the readiness watch would kick.
	ticked    bool
	recs      map[string]*Record  // treat values as immutable: replace, never mutate
	bad       map[string]error    // names whose records cannot be read
	snap      *snapshots.Snapshot // last accepted
	want      map[string]*snapshots.SnapshotVM
	lastEpoch uint64
	// lastHash is SnapshotHash of the snapshot accepted at lastEpoch; ""
	// when unknown: then a snapshot at lastEpoch (above 0) is refused, since
	// nothing says what was accepted at it, and lastEpoch+1 is awaited.
	lastHash string
	// snapHash is SnapshotHash of snap.
	snapHash string
	// hashed memoizes SnapshotHash of the last snapshot Tick checked;
	// guarded by tickMu.
	hashed    *snapshots.Snapshot
	hashedSum string
	fenced    bool
	fenceMsg  string
	// suspended is set while the accepted snapshot's Host spec suspends
	// the host: no pass, volume, network or image change runs.
	suspended *status.Suspension
	// lastCollect is when collectImages last ran; guarded by tickMu.
	lastCollect time.Time
	volumes     []status.Volume
	orphans     []string
	workers     map[string]*worker
	wg          sync.WaitGroup
	changed     chan struct{}
	// opens memoizes whether AgeIdentity opens a ciphertext (sealed.go).
	opens sync.Map
	// confirmDeletes is EngineConfig.ConfirmDeletes, or turned on by an
	// Agent that verifies snapshots (requireConfirmation).
	confirmDeletes atomic.Bool
	// awaiting are the quarantined objects whose grace has passed and
	// whose delete waits for the controller's confirmation, by
	// confirmKey, with the nonce logged for them (confirm.go).
	awaiting map[string]string
	// volQuarantined are the quarantined volumes as the last volume pass
	// found them.
	volQuarantined []status.Quarantine
	// bk is the backup scheduler (backups.go).
	bk backups
	// netHealth is what the last tick's NetworkHealthReporter said of the
	// host networks (nethealth.go).
	netHealth map[string]string
}

type worker struct {
	kick chan struct{}
	// cancel ends the pass in flight, nil between passes; deletable is
	// set while that pass works toward a desired VM (not its delete), so
	// a tombstone interrupts it. Both guarded by Engine.mu.
	cancel    context.CancelCauseFunc
	deletable bool
}

// errDeleted is the cause a pass's context is cancelled with when its VM
// is tombstoned while the pass works toward it (a create downloading its
// image, an edit staging its artifacts): the delete's pass runs next.
var errDeleted = errors.New("the VM was deleted")

// passStarted records the pass of name that ctx's cancel ends; deletable
// when it works toward the VM (want is not its tombstone). A tombstone
// adopted since the pass read its want interrupts it at once.
func (e *Engine) passStarted(name string, cancel context.CancelCauseFunc, deletable bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if w := e.workers[name]; w != nil {
		w.cancel, w.deletable = cancel, deletable
	}
	e.interruptDeletedLocked()
}

// passEnded forgets name's pass in flight.
func (e *Engine) passEnded(name string) { e.passStarted(name, nil, false) }

// interruptDeletedLocked cancels, with errDeleted, every pass in flight
// that works toward a VM the accepted snapshot now tombstones. e.mu held.
func (e *Engine) interruptDeletedLocked() {
	for name, w := range e.workers {
		if want := e.want[name]; w.cancel != nil && w.deletable && want != nil && want.Tombstoned {
			e.log.WithField("vm", name).Info("vm deleted while its pass was in flight; interrupting it")
			w.cancel(errDeleted)
			w.deletable = false
		}
	}
}

// NewEngine builds an Engine over cfg.Store. It binds the store to cfg.Host
// (ErrHostMismatch when it belongs to another host) and reads the last
// accepted snapshot and epoch, so that Tick(ctx, nil) reconciles them while
// no newer snapshot can be fetched.
func NewEngine(cfg EngineConfig) (*Engine, error) {
	if cfg.Store == nil || cfg.Provisioner == nil {
		return nil, errors.New("new engine: Store and Provisioner are required")
	}
	cfg = cfg.withDefaults()
	e := &Engine{
		cfg:      cfg,
		store:    cfg.Store,
		prov:     cfg.Provisioner,
		log:      cfg.Log.WithField("component", "agent").WithField("host", cfg.Host),
		recs:     map[string]*Record{},
		bad:      map[string]error{},
		want:     map[string]*snapshots.SnapshotVM{},
		workers:  map[string]*worker{},
		changed:  make(chan struct{}, 1),
		awaiting: map[string]string{},
	}
	e.bk.init()
	e.confirmDeletes.Store(cfg.ConfirmDeletes)
	e.idle = sync.NewCond(&e.mu)
	e.ctx, e.cancel = context.WithCancel(context.Background())
	if err := e.claimHost(); err != nil {
		return nil, fmt.Errorf("new engine: %w", err)
	}
	if err := e.restoreAccepted(); err != nil {
		return nil, fmt.Errorf("new engine: %w", err)
	}
	// The records are read now, not at the first tick, so that a status
	// written before it (the agent's git loop starts at once) shows each
	// VM as its record says, with its phase and why it is not ready,
	// never as pending. A failure is read again by the first tick.
	if err := e.load(); err != nil {
		e.log.WithError(err).Warn("vm records not read; reading them at the first tick")
	}
	e.wg.Add(1)
	go e.watchReadiness()
	cfg.Metrics.watch(e)
	return e, nil
}

// withDefaults returns cfg with every unset knob at its Default* value,
// the host's boot id reader, the wall clock and logrus's standard logger.
func (cfg EngineConfig) withDefaults() EngineConfig {
	if cfg.BootID == nil {
		cfg.BootID = HostBootID
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.TombstoneGrace <= 0 {
		cfg.TombstoneGrace = DefaultTombstoneGrace
	}
	if cfg.VanishGrace <= 0 {
		cfg.VanishGrace = DefaultVanishGrace
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.ImageGrace == 0 {
		cfg.ImageGrace = DefaultImageGrace
	}
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	return cfg
}

// claimHost checks the configured host name and claims the state
// directory for it (Store.ClaimHost), then applies a configured epoch
// reset. An engine without a host name (tests) claims nothing.
func (e *Engine) claimHost() error {
	if e.cfg.Host != "" {
		if err := CheckHostName(e.cfg.Host); err != nil {
			return err
		}
		if err := e.store.ClaimHost(e.cfg.Host); err != nil {
			return err
		}
	}
	r := e.cfg.EpochReset
	if r == nil {
		return nil
	}
	done, err := e.store.ResetEpoch(r.From, r.To)
	if err != nil {
		return err
	}
	if done {
		e.log.WithField("from", r.From).WithField("to", r.To).Warn("accepted epoch reset by the configuration's epochReset: a snapshot above the new epoch is accepted again")
	}
	return nil
}

// restoreAccepted reads back the fence and the last accepted snapshot:
// the highest epoch seen, the snapshot (accepted again when it is not
// below that epoch) and the hash the fence compares the next snapshot
// of the same epoch with. An unreadable snapshot or hash is logged and
// waits for the next fetch; an unreadable epoch is an error, since the
// fence cannot be guessed.
func (e *Engine) restoreAccepted() error {
	var err error
	if e.lastEpoch, err = e.store.LastEpoch(); err != nil {
		return err
	}
	snap, err := e.store.LoadSnapshot()
	if err != nil {
		// The epoch still fences; the snapshot comes back with the next fetch.
		e.log.WithError(err).Warn("last accepted snapshot unreadable; waiting for a fetch")
	}
	if snap != nil && snap.Epoch >= e.lastEpoch {
		if e.snapHash, err = SnapshotHash(snap); err != nil {
			return err
		}
		e.accept(snap)
	}
	epoch, hash, err := e.store.AcceptedHash()
	if err != nil {
		// The snapshot on disk is the witness instead (below).
		e.log.WithError(err).Warn("hash of the last accepted snapshot unreadable")
		epoch, hash = 0, ""
	}
	switch {
	case epoch == e.lastEpoch && hash != "":
		e.lastHash = hash
	case e.snap != nil && e.snap.Epoch == e.lastEpoch:
		// Written by a version that kept no hash, or a crash came between
		// the epoch and the hash: the snapshot on disk is the witness.
		e.lastHash = e.snapHash
	}
	return nil
}

// watchReadiness runs, every ReadyPollInterval, the pass of each booting
// VM whose guest has answered (and holds the lease of its address, or is
// to be told why not) or whose ReadyTimeout has just run out, and
// of each ready VM whose running guest no longer counts as answering (its
// sshd refuses), so its phase changes within moments instead of at the
// next tick. It asks
// the provisioner's memory only (Readiness never waits for a guest).
func (e *Engine) watchReadiness() {
	defer e.wg.Done()
	t := time.NewTicker(ReadyPollInterval)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
		e.kickAnswered()
	}
}

// kickAnswered kicks the pass of each booting VM whose guest has answered
// or whose ReadyTimeout has just run out, and of each ready VM whose
// running guest no longer counts as answering (its sshd refuses). The
// provisioner is asked outside the engine lock.
func (e *Engine) kickAnswered() {
	type watched struct{ name, phase, lastError string }
	e.mu.Lock()
	var recs []watched
	if !e.closed && !e.fenced && e.ticked && e.suspended == nil {
		for _, rec := range e.recs {
			if rec.Phase == status.PhaseBooting || rec.Phase == status.PhaseReady {
				recs = append(recs, watched{rec.Name, rec.Phase, rec.LastError})
			}
		}
	}
	e.mu.Unlock()
	var due []string
	for _, rec := range recs {
		r := e.prov.Readiness(rec.name)
		switch rec.phase {
		case status.PhaseBooting:
			late := !r.Booted.IsZero() && e.now().Sub(r.Booted) >= e.cfg.ReadyTimeout
			if r.Ready {
				// An answered guest waits for its lease without a pass
				// every poll: it is due once leased, or once its
				// lastError is to say why it is not.
				err := e.unleased(rec.name)
				if err == nil || (late || errors.Is(err, ErrAddressHeld)) && !strings.HasPrefix(rec.lastError, notLeased) {
					due = append(due, rec.name)
				}
			} else if late && !strings.HasPrefix(rec.lastError, notAnswered) {
				due = append(due, rec.name)
			}
		case status.PhaseReady:
			if !r.Booted.IsZero() && !r.Ready {
				due = append(due, rec.name)
			}
		}
	}
	if len(due) == 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed || e.fenced || e.suspended != nil {
		return
	}
	for _, name := range due {
		e.kickLocked(name)
	}
}

// SnapshotHash is the lowercase hex sha256 of snap's canonical encoding
// (snapshots.MarshalSnapshot): two snapshots with the same hash ask for the
// same thing. The engine keeps the hash of the snapshot it accepted at its
// last epoch, so that another snapshot at that epoch is refused.
func SnapshotHash(snap *snapshots.Snapshot) (string, error) {
	data, err := snapshots.MarshalSnapshot(snap)
	if err != nil {
		return "", fmt.Errorf("hash snapshot: %w", err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

// hashOf is SnapshotHash memoized for the snapshot last asked about: the
// agent ticks the same parsed snapshot again and again. e.tickMu held.
func (e *Engine) hashOf(snap *snapshots.Snapshot) (string, error) {
	if snap == e.hashed {
		return e.hashedSum, nil
	}
	h, err := SnapshotHash(snap)
	if err != nil {
		return "", err
	}
	e.hashed, e.hashedSum = snap, h
	return h, nil
}

// HostBootID reads the kernel's boot id, which changes on every boot of the
// host; "" when it cannot be read.
func HostBootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Snapshot returns the last accepted snapshot, nil when there is none.
func (e *Engine) Snapshot() *snapshots.Snapshot {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.snap
}

// accept makes snap the current desired state; e.mu held or not yet shared.
func (e *Engine) accept(snap *snapshots.Snapshot) {
	e.snap = snap
	e.want = make(map[string]*snapshots.SnapshotVM, len(snap.VMs))
	for i := range snap.VMs {
		e.want[snap.VMs[i].Name] = &snap.VMs[i]
	}
	e.fenced, e.fenceMsg = false, ""
}

// fenceLocked marks the host fenced with msg and returns the tick's error.
func (e *Engine) fenceLocked(snap *snapshots.Snapshot, msg string) error {
	was := e.fenced && e.fenceMsg == msg
	e.fenced, e.fenceMsg = true, msg
	if !was {
		e.log.WithField("epoch", snap.Epoch).WithField("lastSeenEpoch", e.lastEpoch).WithField("commit", snap.Source.Commit).Error(msg)
	}
	return fmt.Errorf("tick: %s: %w", msg, ErrFenced)
}

// Tick runs one pass. snap is the snapshot just fetched, or nil to reconcile
// the last accepted one again (nothing happens while there is none). A
// snapshot whose epoch is below the last accepted is refused: Tick acts on
// nothing, marks the host fenced and returns ErrFenced; so is one at the
// last accepted epoch with other content, or at that epoch when the state
// directory no longer records what was accepted at it. Otherwise it
// persists the snapshot and epoch, converges volumes, and kicks every VM's
// worker; it does not wait for them (see Settle). Concurrent calls run one
// after the other.
//
// A pass is decide (under the engine lock: fence or accept, and what to
// persist) → persist (files, unlocked) → adopt (under the lock), then the
// volume and network passes (unlocked) and the kicks (locked): no file or
// provisioner I/O runs under the engine lock, so Report never waits on a
// disk.
func (e *Engine) Tick(ctx context.Context, snap *snapshots.Snapshot) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	e.tickMu.Lock()
	defer e.tickMu.Unlock()
	if err := e.load(); err != nil {
		return err
	}
	snap, err := e.candidate(snap)
	if err != nil || snap == nil {
		return err
	}
	// Hashed without e.mu (500 VMs take tens of ms), so Report is not held
	// up; only Tick, serialized by tickMu, changes what decide checks.
	hash, err := e.hashOf(snap)
	if err != nil {
		return fmt.Errorf("tick: %w", err)
	}
	d, err := e.decide(snap, hash)
	if err != nil {
		return err
	}
	if err := e.persist(snap, hash, d); err != nil {
		return fmt.Errorf("tick: %w", err)
	}
	inUse := e.adopt(snap, hash)
	e.guardHost(ctx)
	e.checkNetworks(ctx, snap)
	if e.suspendedNow() {
		return nil
	}
	vols, orphans, volQuarantined := e.reconcileVolumes(snap, inUse)
	e.reconcileNetworks(ctx, snap)
	e.kickAll(vols, orphans, volQuarantined)
	e.collectImages(ctx, snap)
	e.scheduleBackups(snap)
	return nil
}

// suspendedNow reports whether the accepted snapshot suspends the host. A
// suspended host's tick accepts snapshots (so the one that resumes it is
// seen) and does nothing else: passes already running finish, no new one
// starts.
func (e *Engine) suspendedNow() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.suspended != nil
}

// collectImages has an ImageCollector remove the cached artifacts no VM of
// this host uses (see ImageCollector), at most every ImageCollectInterval,
// and never while a record cannot be read. Called by Tick only (tickMu
// guards lastCollect).
func (e *Engine) collectImages(ctx context.Context, snap *snapshots.Snapshot) {
	ic, ok := e.prov.(ImageCollector)
	if !ok || e.cfg.ImageGrace < 0 {
		return
	}
	now := e.now()
	if !e.lastCollect.IsZero() && now.Sub(e.lastCollect) < ImageCollectInterval {
		return
	}
	vms, ok := e.machinesInUse(snap)
	if !ok {
		e.log.Warn("image cache not collected: a VM record cannot be read, so what the cache holds for it is unknown")
		return
	}
	e.lastCollect = now
	res, err := ic.CollectImages(ctx, vms, e.cfg.ImageGrace)
	e.cfg.Metrics.images(res)
	if err != nil {
		e.log.WithError(err).Warn("image cache collection")
	}
	if len(res.Removed) > 0 {
		e.log.WithField("removed", len(res.Removed)).WithField("removedBytes", res.RemovedBytes).
			WithField("kept", res.Kept).WithField("keptBytes", res.KeptBytes).
			WithField("grace", e.cfg.ImageGrace).Info("image cache: removed artifacts no VM used for the grace")
	}
}

// machinesInUse lists every VM this host has a record of and every VM of
// snap (tombstoned ones too), each with the spec it records or asks for;
// ok is false while a record cannot be read.
func (e *Engine) machinesInUse(snap *snapshots.Snapshot) (vms []Machine, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.bad) > 0 {
		return nil, false
	}
	for _, rec := range e.recs {
		vms = append(vms, Machine{Name: rec.Name, Dir: e.store.VMDir(rec.Name), Spec: rec.Spec})
	}
	for _, v := range snap.VMs {
		if validName(v.Name) {
			vms = append(vms, Machine{Name: v.Name, Dir: e.store.VMDir(v.Name), Spec: v.Spec})
		}
	}
	return vms, true
}

// candidate returns the snapshot this tick works on: snap, or the last
// accepted one when snap is nil (nil when there is none). A snapshot for
// another host is invalid; one below the last accepted epoch fences the
// host.
func (e *Engine) candidate(snap *snapshots.Snapshot) (*snapshots.Snapshot, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errors.New("tick: engine closed")
	}
	if snap == nil {
		snap = e.snap
	}
	if snap == nil {
		return nil, nil // no snapshot yet: nothing to do
	}
	if e.cfg.Host != "" && snap.Host != e.cfg.Host {
		return nil, fmt.Errorf("tick: snapshot is for host %q, not %q: %w", snap.Host, e.cfg.Host, ErrSnapshotInvalid)
	}
	if snap.Epoch > snapshots.MaxAcceptedEpoch {
		return nil, e.fenceLocked(snap, fmt.Sprintf("snapshot epoch %d is above %d, the highest this agent accepts: it would leave no room to accept the next one (a forged or broken snapshots branch); refused, acting on nothing until an epoch within the bound is published", snap.Epoch, snapshots.MaxAcceptedEpoch))
	}
	if snap.Epoch < e.lastEpoch {
		return nil, e.fenceLocked(snap, fmt.Sprintf("snapshot epoch %d is below the last accepted epoch %d (the snapshots branch was restored from an older copy?); refused, acting on nothing until a newer epoch is published", snap.Epoch, e.lastEpoch))
	}
	return snap, nil
}

// acceptance is what decide found a tick must write before the engine
// adopts its snapshot.
type acceptance struct {
	snapshot bool // the snapshot is new: save it
	epoch    bool // its epoch is above the last accepted: save it
	hash     bool // the accepted hash changes: save it
}

// decide applies the same-epoch fences to snap (whose SnapshotHash is
// hash) and says what to persist.
func (e *Engine) decide(snap *snapshots.Snapshot, hash string) (acceptance, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if snap.Epoch == e.lastEpoch && e.lastEpoch > 0 && e.lastHash == "" {
		// The epoch file survived but neither the accepted hash nor the
		// snapshot did: what was accepted at this epoch is unknown, so a
		// snapshot at it cannot be told from a hand edit or a second
		// controller. Refusing it until the next epoch is safe and
		// recoverable; accepting it would switch the same-epoch fence off.
		return acceptance{}, e.fenceLocked(snap, fmt.Sprintf("state directory has epoch %d but no record of its content (%s and %s are missing or unreadable); refused, waiting for epoch %d: the controller publishes it on the next change to this host's desired state, so merge any change for this host to force it", e.lastEpoch, filepath.Join(e.store.Root(), acceptedFile), filepath.Join(e.store.Root(), snapshotFile), e.lastEpoch+1))
	}
	if snap.Epoch == e.lastEpoch && e.lastHash != "" && hash != e.lastHash {
		// The same epoch with other content: a hand edit of the snapshots
		// branch, or a second controller. Only a higher epoch may change
		// what this host runs. The snapshot accepted at this epoch, hashed
		// by this version, may still match (an upgrade changed the
		// encoding the stored hash was made with).
		if same := e.snap != nil && e.snap.Epoch == snap.Epoch && e.snapHash == hash; !same {
			return acceptance{}, e.fenceLocked(snap, fmt.Sprintf("snapshot at epoch %d differs from the one accepted at that epoch (sha256 %.12s, accepted %.12s): the snapshots branch was edited by hand or another controller published; refused, acting on nothing until a newer epoch is published", snap.Epoch, hash, e.lastHash))
		}
	}
	newEpoch := snap.Epoch > e.lastEpoch
	return acceptance{
		snapshot: e.snap == nil || snap.Epoch != e.snap.Epoch || hash != e.snapHash,
		epoch:    newEpoch,
		hash:     newEpoch || hash != e.lastHash,
	}, nil
}

// persist writes what decide asked for, in the order that keeps the fence
// sound across a crash between any two writes.
func (e *Engine) persist(snap *snapshots.Snapshot, hash string, d acceptance) error {
	if d.snapshot {
		// Snapshot before epoch: a crash in between leaves the new snapshot
		// with the old epoch, which still passes the fence.
		if err := e.store.SaveSnapshot(snap); err != nil {
			return err
		}
		e.log.WithField("epoch", snap.Epoch).WithField("commit", snap.Source.Commit).Info("snapshot accepted")
		e.checkHostRecipient(snap.HostSpec.AgeRecipient)
	}
	if d.epoch {
		// Also when the snapshot was already on disk (that crash): an epoch
		// left behind would let another snapshot at this one pass as newer.
		if err := e.store.SaveEpoch(snap.Epoch); err != nil {
			return err
		}
	}
	if d.hash {
		// After the epoch: a crash in between leaves no hash for the new
		// epoch, and the next engine hashes the snapshot on disk instead.
		if err := e.store.SaveAcceptedHash(snap.Epoch, hash); err != nil {
			return err
		}
	}
	return nil
}

// adopt makes the persisted snap the engine's desired state and returns the
// volumes its VMs (and every VM record) use.
func (e *Engine) adopt(snap *snapshots.Snapshot, hash string) map[string]bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.accept(snap)
	e.snapHash = hash
	// An epoch below lastEpoch was refused by candidate, and only Tick,
	// serialized by tickMu, changes lastEpoch: snap is now the last
	// accepted epoch.
	e.lastEpoch, e.lastHash = snap.Epoch, hash
	e.adoptSuspensionLocked(snap)
	e.retryBadLocked()
	e.interruptDeletedLocked()
	return e.volumesInUseLocked(snap)
}

// adoptSuspensionLocked takes the accepted snapshot's suspend setting,
// logging when it changes.
func (e *Engine) adoptSuspensionLocked(snap *snapshots.Snapshot) {
	was := e.suspended
	if !snap.HostSpec.Suspend {
		e.suspended = nil
		if was != nil {
			e.log.WithField("epoch", snap.Epoch).Info("host resumed: reconciling again")
		}
		return
	}
	e.suspended = &status.Suspension{Epoch: snap.Epoch, Reason: snap.HostSpec.SuspendReason}
	if was == nil || was.Reason != e.suspended.Reason {
		e.log.WithField("epoch", snap.Epoch).WithField("reason", snap.HostSpec.SuspendReason).
			Warn("host suspended by its Host spec: guests are kept as they are and nothing is acted on (no create, boot, stop, destroy, volume, network or image change) until a snapshot resumes it")
	}
}

// kickAll publishes the volume pass's result and kicks the worker of every
// VM whose record can be read and whose name is valid.
func (e *Engine) kickAll(vols []status.Volume, orphans []string, volQuarantined []status.Quarantine) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.volumes, e.orphans, e.volQuarantined = vols, orphans, volQuarantined
	e.ticked = true
	for _, name := range e.namesLocked() {
		if !validName(name) || e.bad[name] != nil {
			continue // reported, never acted on
		}
		e.kickLocked(name)
	}
}

// guardHost has a HostGuard put back its firewall rules if anyone
// removed or changed them.
func (e *Engine) guardHost(ctx context.Context) {
	if g, ok := e.prov.(HostGuard); ok {
		if err := g.GuardHost(ctx); err != nil {
			e.log.WithError(err).Warn("host guard")
		}
	}
}

// reconcileNetworks has a NetworkReconciler make the snapshot's host
// networks real, ready for the VMs the snapshot puts on them, keeping
// every network a VM record names.
func (e *Engine) reconcileNetworks(ctx context.Context, snap *snapshots.Snapshot) {
	nr, ok := e.prov.(NetworkReconciler)
	if !ok {
		return
	}
	e.mu.Lock()
	inUse := map[string]bool{}
	for _, rec := range e.recs {
		for _, nic := range rec.Spec.Interfaces() {
			inUse[nic.Network] = true
		}
	}
	if len(e.bad) > 0 {
		inUse = nil // an unreadable record may name any network
	}
	var members []NetworkMember
	for _, vm := range snap.VMs {
		if vm.Tombstoned {
			continue
		}
		spec := vm.Spec
		if rec := e.recs[vm.Name]; rec != nil && rec.BootID != "" {
			spec = firstBootOnly(spec, rec.Spec) // static is first-boot-only
		}
		for i, nic := range spec.Interfaces() {
			if _, ok := snap.HostSpec.Networks[nic.Network]; !ok {
				continue
			}
			members = append(members, NetworkMember{VM: vm.Name, Network: nic.Network, Static: nic.Static, Index: i, MAC: nic.MAC})
		}
	}
	sort.SliceStable(members, func(i, j int) bool { return members[i].VM < members[j].VM })
	e.mu.Unlock()
	if err := nr.ReconcileNetworks(ctx, snap.HostSpec.Networks, members, inUse); err != nil {
		e.log.WithError(err).Warn("host networks")
	}
}

// load reads the records once. Until the vms directory can be listed no
// tick acts, since an unlisted VM would look like one to create.
func (e *Engine) load() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.loaded {
		return nil
	}
	recs, bad, err := e.store.LoadRecords()
	if err != nil {
		return fmt.Errorf("tick: %w", err)
	}
	for name, err := range bad {
		e.log.WithField("vm", name).WithError(err).Error("vm record unreadable; leaving the VM alone")
	}
	e.recs, e.bad, e.loaded = recs, bad, true
	return nil
}

// retryBadLocked reads unreadable records again; one that reads now joins
// the reconcile.
func (e *Engine) retryBadLocked() {
	for name := range e.bad {
		rec, err := e.store.LoadRecord(name)
		switch {
		case err == nil:
			e.recs[name] = rec
			delete(e.bad, name)
			e.log.WithField("vm", name).Info("vm record readable again")
		case errors.Is(err, os.ErrNotExist):
			delete(e.bad, name)
		default:
			e.bad[name] = err
		}
	}
}

// volumesInUseLocked names the tombstoned volumes of snap that a VM on this
// host still attaches: one whose record (kept until a successful destroy)
// lists it, whatever its power state, and whether the snapshot still names
// the VM or not (a stopped, vanished or quarantined VM keeps its volumes).
// While any record cannot be read, every tombstoned volume counts as in use:
// what that VM attaches is unknown. A volume in use waits; its grace does
// not make it deletable under a VM.
func (e *Engine) volumesInUseLocked(snap *snapshots.Snapshot) map[string]bool {
	inUse := map[string]bool{}
	for _, v := range snap.Volumes {
		if v.Tombstoned {
			inUse[v.Name] = len(e.bad) > 0
		}
	}
	if len(inUse) == 0 {
		return nil
	}
	for _, rec := range e.recs {
		for _, v := range rec.Spec.Volumes {
			if _, ok := inUse[v]; ok {
				inUse[v] = true
			}
		}
	}
	return inUse
}

// namesLocked is every VM the engine knows of: the snapshot's and the
// records', sorted.
func (e *Engine) namesLocked() []string {
	names := make([]string, 0, len(e.want)+len(e.recs))
	for n := range e.want {
		names = append(names, n)
	}
	for n := range e.recs {
		if e.want[n] == nil {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// kickLocked schedules a pass of name's worker, starting the worker when
// needed. A worker with a pass already pending is not kicked twice.
func (e *Engine) kickLocked(name string) {
	w := e.workers[name]
	if w == nil {
		w = &worker{kick: make(chan struct{}, 1)}
		e.workers[name] = w
		e.wg.Add(1)
		go e.run(name, w)
	}
	select {
	case w.kick <- struct{}{}:
		e.inflight++
	default:
	}
}

// run is one VM's worker: it runs a pass per kick, and ends when the VM is
// gone from both the snapshot and the records, or when the engine closes.
func (e *Engine) run(name string, w *worker) {
	defer e.wg.Done()
	for {
		select {
		case <-e.ctx.Done():
			e.mu.Lock()
			if len(w.kick) > 0 {
				<-w.kick
				e.doneLocked()
			}
			delete(e.workers, name)
			e.mu.Unlock()
			return
		case <-w.kick:
		}
		start := time.Now()
		gone := e.pass(name)
		e.cfg.Metrics.pass(time.Since(start))
		e.mu.Lock()
		e.doneLocked()
		if gone && len(w.kick) == 0 {
			delete(e.workers, name)
			e.mu.Unlock()
			return
		}
		e.mu.Unlock()
	}
}

func (e *Engine) doneLocked() {
	e.inflight--
	if e.inflight == 0 {
		e.idle.Broadcast()
	}
}

// Settle waits until every kicked pass has finished, or ctx ends.
func (e *Engine) Settle(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		e.mu.Lock()
		e.idle.Broadcast()
		e.mu.Unlock()
	})
	defer stop()
	e.mu.Lock()
	defer e.mu.Unlock()
	for e.inflight > 0 && ctx.Err() == nil {
		e.idle.Wait()
	}
	return ctx.Err()
}

// Close lets the passes in flight finish until ctx ends, then cancels them
// and waits for every worker to return. It never stops, shuts down or
// destroys a VM: the VMs outlive the agent.
func (e *Engine) Close(ctx context.Context) {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	_ = e.Settle(ctx)
	e.cancel()
	e.wg.Wait()
}

// view returns name's desired entry and a copy of its record; skip is true
// when the engine is fenced or suspended, or the record is unreadable.
func (e *Engine) view(name string) (want *snapshots.SnapshotVM, rec *Record, hostCap *desired.Capacity, hostNets map[string]desired.Network, skip bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.fenced || e.suspended != nil || e.bad[name] != nil {
		return nil, nil, nil, nil, true
	}
	if r := e.recs[name]; r != nil {
		c := *r
		rec = &c
	}
	if e.snap != nil {
		hostCap, hostNets = e.snap.HostSpec.Capacity, e.snap.HostSpec.Networks
	}
	return e.want[name], rec, hostCap, hostNets, false
}

// commit saves rec to disk and publishes it to the engine when it differs
// from what the engine holds.
func (e *Engine) commit(rec *Record) error {
	e.mu.Lock()
	old := e.recs[rec.Name]
	e.mu.Unlock()
	if old != nil && reflect.DeepEqual(old, rec) {
		return nil
	}
	c := *rec
	if err := e.store.SaveRecord(&c); err != nil {
		e.log.WithField("vm", rec.Name).WithError(err).Error("save vm record")
		return err
	}
	e.mu.Lock()
	e.recs[rec.Name] = &c
	e.mu.Unlock()
	e.signal()
	return nil
}

func (e *Engine) forget(name string) {
	e.mu.Lock()
	delete(e.recs, name)
	delete(e.awaiting, confirmKey(confirmVM, name))
	e.mu.Unlock()
	e.signal()
}

func (e *Engine) signal() {
	select {
	case e.changed <- struct{}{}:
	default:
	}
}

// Changed receives a value after a worker changed a VM's record, so the
// caller can report without waiting for the next tick. It holds one value:
// several changes read as one.
func (e *Engine) Changed() <-chan struct{} { return e.changed }

func (e *Engine) now() time.Time { return e.cfg.Now() }

func newInstanceID(name string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return name + "-" + hex.EncodeToString(b[:])
}
