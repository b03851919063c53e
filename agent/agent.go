package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/status"
)

// Defaults of Config.
const (
	DefaultTickInterval = 10 * time.Second
	DefaultPollInterval = 15 * time.Second
	DefaultHeartbeat    = 60 * time.Second
	// DefaultStepTimeout bounds one fetch-tick-report step (its git calls).
	DefaultStepTimeout = 2 * time.Minute
	// DefaultStopTimeout bounds how long Run waits, once asked to stop, for
	// passes in flight and the last status write.
	DefaultStopTimeout = 30 * time.Second
)

// Config configures an Agent. Zero values take the defaults noted.
type Config struct {
	Host string
	// Repo is the fleet repository; open it with Depth 1.
	Repo   *gitsource.Repo
	Engine *Engine
	Store  *Store
	// SnapshotsBranch and StatusBranch default to SnapshotsBranch and
	// StatusBranch.
	SnapshotsBranch string
	StatusBranch    string
	// TickInterval is the level-triggered tick (default 10 s, jittered);
	// PollInterval how often the snapshots branch is polled (default 15 s,
	// jittered; a local repository is watched with fsnotify as well).
	TickInterval time.Duration
	PollInterval time.Duration
	// Heartbeat is the longest time between status writes (default 60 s);
	// a status whose content changed is written at once.
	Heartbeat time.Duration
	// StepTimeout bounds one step's git calls (default 2 min); StopTimeout
	// bounds the shutdown (default 30 s).
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
	// Ready is called once, after the first step (systemd READY=1); Alive
	// after every step and at least every AliveEvery (systemd watchdog
	// pings). Both optional.
	Ready      func()
	Alive      func()
	AliveEvery time.Duration
}

// Agent runs one host: it fetches the host's snapshot, ticks the engine and
// writes the host's status. Run is the daemon's loop; Once is one step that
// also waits for the workers, for --once and for tests.
type Agent struct {
	cfg    Config
	source *Source
	log    logrus.FieldLogger

	mu          sync.Mutex        // serializes steps and status writes
	current     *desired.Snapshot // the last snapshot fetched (maybe fenced); nil: the engine's last accepted
	fetchFailed bool
	snapErr     string
	lastKey     *status.Status // the last status written, heartbeat and observedAt zero
	lastWrite   time.Time
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
	return &Agent{
		cfg:    cfg,
		source: NewSource(cfg.Repo, cfg.Host, cfg.SnapshotsBranch),
		log:    cfg.Log.WithField("component", "agent").WithField("host", cfg.Host),
	}, nil
}

// Once runs one step, waits for every VM's pass to finish, and writes the
// status: what `gitfleet agent --once` does.
func (a *Agent) Once(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	fetchErr, tickErr := a.tickLocked(ctx, true)
	if errors.Is(tickErr, ErrFenced) {
		tickErr = nil // reported in the status
	}
	if err := a.cfg.Engine.Settle(ctx); err != nil {
		return err
	}
	return errors.Join(fetchErr, tickErr, a.writeStatusLocked(ctx))
}

// reportGather is how long Run waits after a worker's change before it
// writes the status, so a burst of changes makes one write. It is short
// because a guest's first answer should show as ready within moments
// (docs/DESIGN.md, Phases and readiness).
const reportGather = 250 * time.Millisecond

// Run is the agent's loop: a step at once, then on every jittered tick and
// at once when the snapshots branch moves; a status write whenever a worker
// changed something. When ctx ends it lets the passes in flight finish
// (within StopTimeout), writes the status one last time and returns nil. It
// never stops or destroys a VM on its way out.
func (a *Agent) Run(ctx context.Context) error {
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	moved := a.cfg.Repo.Watch(watchCtx, a.source.branch, a.cfg.PollInterval)

	var alive <-chan time.Time
	if a.cfg.Alive != nil && a.cfg.AliveEvery > 0 {
		t := time.NewTicker(a.cfg.AliveEvery)
		defer t.Stop()
		alive = t.C
	}
	tick := time.NewTimer(0)
	defer tick.Stop()
	var report <-chan time.Time
	fetch, ready := true, false
	for {
		select {
		case <-ctx.Done():
			return a.stop()
		case <-tick.C:
			a.step(ctx, fetch)
			fetch = false
			tick.Reset(jitter(a.cfg.TickInterval))
			if !ready && a.cfg.Ready != nil {
				a.cfg.Ready()
			}
			ready = true
		case _, ok := <-moved:
			if !ok {
				moved = nil
				continue
			}
			a.step(ctx, true)
		case <-a.cfg.Engine.Changed():
			if report == nil {
				report = time.After(reportGather)
			}
			continue
		case <-report:
			report = nil
			a.mu.Lock()
			wctx, cancel := a.stepContext(ctx)
			if err := a.writeStatusLocked(wctx); err != nil {
				a.log.WithError(err).Warn("write status")
			}
			cancel()
			a.mu.Unlock()
		case <-alive:
		}
		if a.cfg.Alive != nil {
			a.cfg.Alive()
		}
	}
}

// stepContext bounds one step's git calls; it is not cancelled by the end
// of the run, so a step under way finishes.
func (a *Agent) stepContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), a.cfg.StepTimeout)
}

// step fetches (when asked, or when the last fetch failed), ticks, and
// writes the status when it changed or the heartbeat is due.
func (a *Agent) step(ctx context.Context, fetch bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	sctx, cancel := a.stepContext(ctx)
	defer cancel()
	if _, err := a.tickLocked(sctx, fetch); err != nil && !errors.Is(err, ErrFenced) {
		a.log.WithError(err).Warn("tick")
	}
	if err := a.writeStatusLocked(sctx); err != nil {
		a.log.WithError(err).Warn("write status")
	}
}

func (a *Agent) stop() error {
	a.log.Info("stopping: finishing the passes in flight; VMs keep running")
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.StopTimeout)
	defer cancel()
	a.cfg.Engine.Close(ctx)
	a.mu.Lock()
	defer a.mu.Unlock()
	wctx, wcancel := context.WithTimeout(context.Background(), a.cfg.StopTimeout)
	defer wcancel()
	a.lastKey = nil // write once more whatever changed
	if err := a.writeStatusLocked(wctx); err != nil {
		a.log.WithError(err).Warn("last status write")
	}
	return nil
}

// tickLocked fetches the snapshot when asked (or when the last fetch
// failed) and ticks the engine. A fetch failure leaves the engine on the
// last snapshot it accepted; a snapshot that does not parse is refused,
// reported in the status, and the engine stays on its last accepted one.
// fetchErr is git's failure (already logged), tickErr the engine's.
func (a *Agent) tickLocked(ctx context.Context, fetch bool) (fetchErr, tickErr error) {
	if fetch || a.fetchFailed {
		snap, tip, err := a.source.Fetch(ctx)
		switch {
		case errors.Is(err, ErrSnapshotInvalid):
			a.fetchFailed = false
			if a.snapErr != err.Error() {
				a.log.WithField("commit", tip).WithError(err).Error("snapshot refused; keeping the last accepted one")
			}
			a.snapErr = err.Error()
			a.current = nil
		case err != nil:
			if !a.fetchFailed {
				a.log.WithError(err).Warn("cannot fetch the snapshot; reconciling the last accepted one")
			}
			a.fetchFailed = true
			fetchErr = err
		default:
			a.fetchFailed = false
			a.snapErr = ""
			if snap != nil {
				a.current = snap
			}
		}
	}
	return fetchErr, a.cfg.Engine.Tick(ctx, a.current)
}

// statusLocked is the status as it would be written now, heartbeat and
// observedAt left zero.
func (a *Agent) statusLocked() *status.Status {
	st := a.cfg.Engine.Report()
	st.Agent = status.AgentInfo{Version: a.cfg.Version, BootID: a.cfg.BootID(), Accel: a.cfg.Accel}
	if a.snapErr != "" {
		st.SnapshotError = a.snapErr
	}
	return st
}

// writeStatusLocked pushes the status when its content (heartbeat and
// observedAt aside) changed since the last write, or the heartbeat is due.
// The heartbeat counter is kept in the store and reserved before the push,
// so a number is never reused; it also always exceeds the one on the branch.
func (a *Agent) writeStatusLocked(ctx context.Context) error {
	st := a.statusLocked()
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
	path := status.Path(a.cfg.Host)
	_, err = a.cfg.Repo.Update(ctx, a.cfg.StatusBranch, func(_ string, read func(string) ([]byte, error)) (map[string][]byte, string, error) {
		st.Heartbeat = hb
		if old, rerr := read(path); rerr == nil {
			if prev, perr := status.Parse(path, old); perr == nil && prev.Heartbeat >= hb {
				st.Heartbeat = prev.Heartbeat + 1
			}
		}
		data, err := status.Marshal(st)
		if err != nil {
			return nil, "", err
		}
		return map[string][]byte{path: data}, fmt.Sprintf("status: %s heartbeat %d", a.cfg.Host, st.Heartbeat), nil
	})
	if err != nil {
		return fmt.Errorf("write status %s to %s: %w", path, a.cfg.StatusBranch, err)
	}
	if st.Heartbeat != hb {
		if err := a.cfg.Store.SaveHeartbeat(st.Heartbeat); err != nil {
			return err
		}
	}
	a.lastKey, a.lastWrite = &key, now
	return nil
}

// jitter returns d scaled by a random factor in [0.9, 1.1].
func jitter(d time.Duration) time.Duration {
	return d*9/10 + time.Duration(rand.Int64N(int64(d)/5+1))
}
