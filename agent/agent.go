package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/internal/safetext"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
)

// Defaults of Config.
const (
	DefaultTickInterval = 10 * time.Second
	DefaultPollInterval = 15 * time.Second
	DefaultHeartbeat    = 60 * time.Second
	// DefaultStepTimeout bounds one git step: a fetch of the snapshot, or
	// one status write with its retries. (Each git operation within it is
	// bounded by the Repo's own timeout.)
	DefaultStepTimeout = 2 * time.Minute
	// DefaultStopTimeout bounds the whole shutdown once Run is asked to
	// stop: git operations in flight are cancelled at once, passes in
	// flight get most of it, the last status write the rest. The shipped
	// systemd unit's TimeoutStopSec leaves room above it.
	DefaultStopTimeout = 12 * time.Second
)

// lastWriteShare is the part of StopTimeout kept for the last status write.
const lastWriteShare = 3

// Config configures an Agent. Zero values take the defaults noted.
type Config struct {
	Host string
	// Repo is the fleet repository; open it with Depth 1.
	Repo *gitsource.Repo
	// StatusRepo, when set, is the repository of the host branch (the
	// controller's Config.StatusURL), opened with Depth 1; nil writes the
	// status to Repo.
	StatusRepo *gitsource.Repo
	Engine     *Engine
	Store      *Store
	// SnapshotsBranch defaults to SnapshotsBranch. The status is written
	// to the host's own branch, status.HostBranch(Host); StatusBranch
	// (default StatusBranch) is the shared status branch of the old
	// layout, read once when the host branch does not exist yet so the
	// heartbeat continues (docs/DESIGN.md, Branches and files).
	SnapshotsBranch string
	StatusBranch    string
	// AppendStatus makes every status write a new commit on the host
	// branch. By default a heartbeat-only write replaces a heartbeat-only
	// tip (a non-fast-forward compare-and-swap), so the branch's history
	// grows with events only; set it for a git host that forbids
	// non-fast-forward updates (a refusal is also met by appending).
	AppendStatus bool
	// TickInterval is the level-triggered tick (default 10 s, jittered);
	// PollInterval how often the snapshots branch is polled (default 15 s,
	// jittered; a local repository is watched with fsnotify as well).
	TickInterval time.Duration
	PollInterval time.Duration
	// Heartbeat is the longest time between status writes (default 60 s);
	// a status whose content changed is written at once.
	Heartbeat time.Duration
	// StepTimeout bounds one git step, a fetch or a status write (default
	// 2 min); StopTimeout bounds the whole shutdown (default 12 s).
	StepTimeout time.Duration
	StopTimeout time.Duration
	// Version, Accel and BootID describe the agent in its status. Accel
	// defaults to the provisioner's (AccelReporter); BootID to the
	// Engine's (itself HostBootID by default).
	Version string
	Accel   string
	BootID  func() string
	// Now is the clock of the heartbeat and observedAt; Now and Log default
	// to the Engine's.
	Now func() time.Time
	Log logrus.FieldLogger
	// Ready is called once, when Run starts: the state is loaded (the
	// Engine was made), before any git operation (systemd READY=1). Alive
	// is called by the reconcile loop after every tick and at least every
	// AliveEvery while that loop runs (systemd watchdog pings): a loop
	// that stops ticking stops the pings. Both optional.
	Ready      func()
	Alive      func()
	AliveEvery time.Duration
	// Metrics, when set, times fetches and status pushes and records each
	// finished tick (Metrics.LastTick, for a health check); give it to the
	// Engine too.
	Metrics *Metrics
	// ControllerKeys, when set, are the keys the controller signs the
	// snapshots branch with (*trust.Signers from the agent's
	// controllerKeys): a tip not signed by one of them is refused like a
	// fence violation (ErrSnapshotSignature): the engine keeps the last
	// accepted snapshot, the status's snapshotError says whose key and
	// which commit, gitfleet_agent_snapshot_refusals_total counts it. Nil
	// verifies nothing. Set, it also makes the Engine's destroys wait for
	// the controller's confirmation (EngineConfig.ConfirmDeletes): a
	// genuine but stale snapshot, pushed back to the branch, then shuts a
	// VM down but never destroys it.
	ControllerKeys CommitVerifier
	// SigningKey, when set, signs every status commit on the host branch
	// (trust.CommitSigner, the agent's signingKey): the controller
	// finalizes a delete only on an ack signed by the key the Host's
	// spec.agentKey names. Nil writes unsigned commits.
	SigningKey gitsource.CommitSigner
}

// Agent runs one host: it fetches the host's snapshot, ticks the engine and
// writes the host's status. Run is the daemon's loop; Once is one step that
// also waits for the workers, for --once and for tests.
type Agent struct {
	cfg    Config
	source *Source
	log    logrus.FieldLogger

	// snapMu guards the fetch results the reconcile loop reads.
	snapMu      sync.Mutex
	current     *snapshots.Snapshot // the last snapshot fetched (maybe fenced); nil: the engine's last accepted
	fetchFailed bool
	snapErr     string
	refusedTip  string // the last tip refused, counted once
	// noSnapshotTip is the snapshots tip at which "no snapshot for this
	// host" was last logged ("-" once logged for a missing branch).
	noSnapshotTip string

	// now carries ReconcileNow's requests to the git loop.
	now chan struct{}

	// started is when Run began (Healthz).
	started atomic.Pointer[time.Time]

	// refused is set while the remote refuses the status writes
	// (gitsource.ErrPushRefused), for Healthz and the metrics; nil once
	// one is taken.
	refused atomic.Pointer[writeRefusal]

	// statusMu serializes status writes.
	statusMu  sync.Mutex
	writer    *status.Writer
	lastKey   *status.Status // the last status written, heartbeat and observedAt zero
	lastWrite time.Time
}

// New checks cfg and returns an Agent.
func New(cfg Config) (*Agent, error) {
	if cfg.Repo == nil || cfg.Engine == nil || cfg.Store == nil || cfg.Host == "" {
		return nil, errors.New("new agent: Host, Repo, Engine and Store are required")
	}
	if err := CheckHostName(cfg.Host); err != nil {
		return nil, fmt.Errorf("new agent: %w", err)
	}
	if cfg.StatusBranch == "" {
		cfg.StatusBranch = StatusBranch
	}
	if cfg.TickInterval <= 0 {
		cfg.TickInterval = DefaultTickInterval
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.StepTimeout <= 0 {
		cfg.StepTimeout = DefaultStepTimeout
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = DefaultStopTimeout
	}
	// The engine already holds defaulted ones: the status then reports the
	// boot id and clock the engine's records were written with.
	if cfg.BootID == nil {
		cfg.BootID = cfg.Engine.cfg.BootID
	}
	if cfg.Now == nil {
		cfg.Now = cfg.Engine.cfg.Now
	}
	if cfg.Log == nil {
		cfg.Log = cfg.Engine.cfg.Log
	}
	if cfg.Accel == "" {
		if a, ok := cfg.Engine.prov.(AccelReporter); ok {
			cfg.Accel = a.Accel()
		}
	}
	if cfg.ControllerKeys != nil {
		cfg.Engine.requireConfirmation()
	}
	return &Agent{
		cfg:    cfg,
		source: NewSource(cfg.Repo, cfg.Host, cfg.SnapshotsBranch).Verified(cfg.ControllerKeys, cfg.Store, cfg.Now),
		log:    cfg.Log.WithField("component", "agent").WithField("host", cfg.Host),
		now:    make(chan struct{}, 1),
		writer: &status.Writer{Repo: statusRepo(cfg), Host: cfg.Host, OldBranch: cfg.StatusBranch, AppendOnly: cfg.AppendStatus,
			Signer: cfg.SigningKey},
	}, nil
}

// statusRepo is the repository the host branch is written to.
func statusRepo(cfg Config) *gitsource.Repo {
	if cfg.StatusRepo != nil {
		return cfg.StatusRepo
	}
	return cfg.Repo
}

// ReconcileNow asks Run for a pass at once: a fetch of the snapshot, a
// tick on it (or on the last accepted one, when nothing new came), and a
// status write, instead of waiting for the poll or the tick interval. It
// never blocks and is safe from any goroutine (gitfleet agent calls it on
// SIGHUP); requests made while one is pending are one request. A
// suspended host's pass still acts on nothing.
func (a *Agent) ReconcileNow() {
	select {
	case a.now <- struct{}{}:
	default:
	}
}

// Once fetches, ticks, waits for every VM's pass to finish, and writes the
// status: what `gitfleet agent --once` does.
func (a *Agent) Once(ctx context.Context) error {
	gctx, cancel := a.stepContext(ctx)
	fetchErr := a.fetch(gctx)
	cancel()
	tickErr := a.tick(ctx)
	if errors.Is(tickErr, ErrFenced) {
		tickErr = nil // reported in the status
	}
	if err := a.cfg.Engine.Settle(ctx); err != nil {
		return err
	}
	wctx, wcancel := a.stepContext(ctx)
	defer wcancel()
	return errors.Join(fetchErr, tickErr, a.writeStatus(wctx))
}

// Run is the agent's daemon: two loops that never wait on each other.
//
// The reconcile loop ticks the engine at once, then every TickInterval
// (jittered) and as soon as a new snapshot is fetched, on the snapshot just
// fetched or else the last accepted one; it calls Alive after every tick.
// Git plays no part in it: a remote that stalls or fails leaves the VMs
// reconciled against the last accepted snapshot.
//
// The git loop fetches the snapshot at once, whenever the snapshots branch
// moves (polled every PollInterval; watched for a local repository), on
// ReconcileNow (then the reconcile loop ticks even if nothing new came), and
// again every TickInterval after a failed fetch; it writes the status when
// its content changed (a worker's change is gathered for reportGather) or the
// heartbeat is due.
//
// Ready is called first: the state is loaded before Run. When ctx ends,
// git operations in flight are cancelled, the passes in flight finish
// within StopTimeout, the status is written once more, and Run returns
// nil; the whole stop takes at most about StopTimeout. It never stops or
// destroys a VM on its way out.
func (a *Agent) Run(ctx context.Context) error {
	now := a.cfg.Now()
	a.started.Store(&now)
	if a.cfg.Ready != nil {
		a.cfg.Ready()
	}
	gitCtx, stopGit := context.WithCancel(ctx)
	defer stopGit()
	fetched := make(chan struct{}, 1)
	gitDone := make(chan struct{})
	go func() {
		defer close(gitDone)
		a.gitLoop(gitCtx, fetched)
	}()

	var alive <-chan time.Time
	if a.cfg.Alive != nil && a.cfg.AliveEvery > 0 {
		t := time.NewTicker(a.cfg.AliveEvery)
		defer t.Stop()
		alive = t.C
	}
	tick := time.NewTimer(0)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return a.stop(stopGit, gitDone)
		case <-tick.C:
		case <-fetched:
			if !tick.Stop() {
				select {
				case <-tick.C:
				default:
				}
			}
		case <-alive:
			a.cfg.Alive()
			continue
		}
		if err := a.tick(ctx); err != nil && !errors.Is(err, ErrFenced) && ctx.Err() == nil {
			a.log.WithError(err).Warn("tick")
		}
		tick.Reset(jitter(a.cfg.TickInterval))
		if a.cfg.Alive != nil {
			a.cfg.Alive()
		}
	}
}

// gitLoop is Run's git side: fetches and status writes. It returns when
// ctx ends; every git operation it starts ends with ctx.
func (a *Agent) gitLoop(ctx context.Context, fetched chan<- struct{}) {
	moved := a.cfg.Repo.Watch(ctx, a.source.branch, a.cfg.PollInterval)
	retry := time.NewTicker(a.cfg.TickInterval)
	defer retry.Stop()
	fetch, forced := true, false
	for {
		if fetch {
			before := a.snapshot()
			sctx, cancel := a.stepContext(ctx)
			_ = a.fetch(sctx)
			cancel()
			if a.snapshot() != before || forced {
				select {
				case fetched <- struct{}{}:
				default:
				}
			}
			fetch, forced = false, false
		}
		if ctx.Err() != nil {
			return
		}
		// A fetch, a retry tick or a gathered change: the status is
		// written when it changed or the heartbeat is due.
		wctx, cancel := a.stepContext(ctx)
		if err := a.writeStatus(wctx); err != nil && ctx.Err() == nil {
			a.log.WithError(err).Warn("write status")
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case _, ok := <-moved:
			if !ok {
				moved = nil
				continue
			}
			fetch = true
		case <-retry.C:
			fetch = a.lastFetchFailed()
		case <-a.now:
			a.log.Info("reconcile requested: fetching and ticking now")
			fetch, forced = true, true
		case <-a.cfg.Engine.Changed():
			// Gather a burst of changes into one write.
			select {
			case <-ctx.Done():
				return
			case <-time.After(reportGather):
			}
		}
	}
}

// reportGather is how long the git loop waits after a worker's change
// before it writes the status, so a burst of changes makes one write. It is
// short because a guest's first answer should show as ready within moments
// (docs/DESIGN.md, Phases and readiness).
const reportGather = 250 * time.Millisecond

// stepContext bounds one git step.
func (a *Agent) stepContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.cfg.StepTimeout)
}

// stop ends Run: git at once, then the passes in flight, then one last
// status write, all within StopTimeout.
func (a *Agent) stop(stopGit context.CancelFunc, gitDone <-chan struct{}) error {
	a.log.Info("stopping: finishing the passes in flight; VMs keep running")
	deadline := time.Now().Add(a.cfg.StopTimeout)
	stopGit()
	select {
	case <-gitDone:
	case <-time.After(time.Until(deadline)):
		a.log.Warn("a git operation did not end when cancelled; stopping without it")
	}
	lastWrite := a.cfg.StopTimeout / lastWriteShare
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(-lastWrite))
	a.cfg.Engine.Close(ctx)
	cancel()
	wctx, wcancel := context.WithDeadline(context.Background(), deadline)
	defer wcancel()
	a.statusMu.Lock()
	a.lastKey = nil // write once more whatever changed
	a.statusMu.Unlock()
	if err := a.writeStatus(wctx); err != nil {
		a.log.WithError(err).Warn("last status write")
	}
	return nil
}

// snapshot is the last snapshot fetched (nil: reconcile the last accepted).
func (a *Agent) snapshot() *snapshots.Snapshot {
	a.snapMu.Lock()
	defer a.snapMu.Unlock()
	return a.current
}

func (a *Agent) lastFetchFailed() bool {
	a.snapMu.Lock()
	defer a.snapMu.Unlock()
	return a.fetchFailed
}

// fetch fetches the host's snapshot. A failure leaves the engine on the
// last snapshot it accepted (logged once, at warning: git's failure says
// nothing about the desired state); a snapshot that does not parse is
// refused, reported in the status, and the engine stays on its last
// accepted one. The error returned is git's.
func (a *Agent) fetch(ctx context.Context) error {
	start := time.Now()
	snap, tip, err := a.source.Fetch(ctx)
	a.cfg.Metrics.gitOp(GitFetch, time.Since(start), gitFailure(err))
	a.snapMu.Lock()
	defer a.snapMu.Unlock()
	switch {
	case errors.Is(err, ErrSnapshotInvalid):
		a.fetchFailed = false
		// Written to the status branch and the log: valid UTF-8, no
		// control characters, a long list cut with a count.
		reason := safetext.Lines(err.Error())
		if a.snapErr != reason {
			a.log.WithField("commit", tip).WithField("error", reason).Error("snapshot refused; keeping the last accepted one")
		}
		if tip != a.refusedTip {
			a.cfg.Metrics.refused(err)
		}
		a.snapErr, a.refusedTip = reason, tip
		a.current = nil
		return nil
	case err != nil:
		if !a.fetchFailed {
			a.log.WithField("error", safetext.Line(err.Error())).Warn("cannot fetch the snapshot; reconciling the last accepted one")
		}
		a.fetchFailed = true
		return err
	default:
		if a.fetchFailed {
			a.log.Info("snapshot fetched again")
		}
		a.fetchFailed = false
		a.snapErr = ""
		if snap != nil {
			a.current = snap
			a.noSnapshotTip = ""
		} else {
			a.logNoSnapshot(tip)
		}
		return nil
	}
}

// logNoSnapshot says, once per snapshots tip, that the branch holds no
// snapshot for this host: a host name that matches no Host object, or a
// controller that has not published, leaves the agent doing nothing, and
// an operator must hear why.
func (a *Agent) logNoSnapshot(tip string) {
	key := tip
	if key == "" {
		key = "-"
	}
	if a.noSnapshotTip == key {
		return
	}
	a.noSnapshotTip = key
	branch := a.source.branch
	where := fmt.Sprintf("branch %s does not exist yet", branch)
	if tip != "" {
		where = fmt.Sprintf("branch %s at %.12s has no %s", branch, tip, snapshots.Path(a.cfg.Host))
	}
	a.log.Warnf("no snapshot for host %s: %s; is the controller running, and does the desired state have a Host object named exactly %q? Until one is published this agent acts on nothing new", a.cfg.Host, where, a.cfg.Host)
}

// gitFailure is err when git failed; a snapshot that fetched but does not
// parse is no git failure.
func gitFailure(err error) error {
	if errors.Is(err, ErrSnapshotInvalid) {
		return nil
	}
	return err
}

// tick ticks the engine on the last snapshot fetched.
func (a *Agent) tick(ctx context.Context) error {
	err := a.cfg.Engine.Tick(ctx, a.snapshot())
	a.cfg.Metrics.ticked(a.cfg.Now())
	return err
}

// report is the status as it would be written now, heartbeat and
// observedAt left zero.
func (a *Agent) report() *status.Status {
	st := a.cfg.Engine.Report()
	st.Agent = status.AgentInfo{Version: a.cfg.Version, BootID: a.cfg.BootID(), Accel: a.cfg.Accel}
	if r, ok := a.cfg.Engine.prov.(ArchReporter); ok {
		st.Agent.Arch, st.Agent.Emulated = r.Arch(), r.Emulated()
	}
	a.snapMu.Lock()
	if a.snapErr != "" {
		st.SnapshotError = a.snapErr
	}
	a.snapMu.Unlock()
	return st
}

// writeStatus pushes the status to the host branch (status.Writer) when
// its content (heartbeat and observedAt aside) changed since the last
// write, or the heartbeat is due.
// The heartbeat counter is kept in the store and reserved before the push,
// so a number is never reused; it also always exceeds the one on the branch.
// Writes run one at a time.
func (a *Agent) writeStatus(ctx context.Context) error {
	a.statusMu.Lock()
	defer a.statusMu.Unlock()
	st := a.report()
	now := a.cfg.Now()
	if reflect.DeepEqual(st, a.lastKey) && now.Sub(a.lastWrite) < a.cfg.Heartbeat {
		return nil // compared as values: encoding 500 rows costs more than the tick
	}
	key := *st
	hb, err := a.cfg.Store.Heartbeat()
	if err != nil {
		return err
	}
	hb++
	if err := a.cfg.Store.SaveHeartbeat(hb); err != nil {
		return err
	}
	st.ObservedAt = now.UTC().Truncate(time.Second)
	st.Heartbeat = hb
	start := time.Now()
	out, err := a.writer.Write(ctx, st)
	a.cfg.Metrics.gitOp(GitPush, time.Since(start), err)
	a.noteRefusal(err, now)
	if err != nil {
		return err
	}
	if out.Refused {
		a.log.Warn("the remote refuses non-fast-forward updates of the host branch: every status write is now a new commit (set appendStatus to say so)")
	}
	// Higher only: a heartbeat that points the branch back at the
	// other heartbeat commit reports that commit's lower number.
	if out.Heartbeat > hb {
		if err := a.cfg.Store.SaveHeartbeat(out.Heartbeat); err != nil {
			return err
		}
	}
	a.lastKey, a.lastWrite = &key, now
	return nil
}

// writeRefusal is the remote refusing the status writes: since when
// (the agent's clock at the first refused write) and what the last one
// said, the remote's own message included.
type writeRefusal struct {
	Since time.Time
	Error string
	// Said is the remote's own message (gitsource.RemoteMessage).
	Said string
}

// noteRefusal records the outcome of one status write at now: a refusal
// by the remote (gitsource.ErrPushRefused) is logged at error level when
// its text changes, with the remote's message, and kept for Healthz and
// the metrics; a write taken clears it. Another failure (git
// unreachable, a timeout) changes nothing: it says nothing about
// whether the remote would take the write.
func (a *Agent) noteRefusal(err error, now time.Time) {
	prev := a.refused.Load()
	switch {
	case err == nil:
		if prev != nil {
			a.log.WithField("since", prev.Since.UTC().Format(time.RFC3339)).Info("the remote takes the status writes again")
			a.refused.Store(nil)
			a.cfg.Metrics.statusRefused(nil)
		}
	case errors.Is(err, gitsource.ErrPushRefused):
		r := &writeRefusal{Since: now, Error: safetext.Line(err.Error()), Said: gitsource.RemoteMessage(err)}
		if prev != nil {
			r.Since = prev.Since
		}
		if prev == nil || prev.Error != r.Error {
			a.log.WithField("branch", status.HostBranch(a.cfg.Host)).WithField("error", r.Error).
				Error("the remote refuses this host's status writes: the controller sees no status from this host (offline) until it takes them; VMs keep being reconciled")
		}
		a.refused.Store(r)
		a.cfg.Metrics.statusRefused(r)
	}
}

// jitter returns d scaled by a random factor in [0.9, 1.1].
func jitter(d time.Duration) time.Duration {
	return d*9/10 + time.Duration(rand.Int64N(int64(d)/5+1))
}
