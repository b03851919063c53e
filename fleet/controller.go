package fleet

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"regexp"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/internal/safetext"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/trust"
)

// Controller runs passes over one repository. Pass and Run may be called
// from one goroutine at a time (a second Pass waits for the first); Kick
// from any goroutine.
type Controller struct {
	cfg  Config
	repo *gitsource.Repo
	// tips serves the snapshots and status branches; tipsOpened is when
	// New or renewTips opened it (zero when it is not renewed).
	tips       *gitsource.Repo
	tipsOpened time.Time
	// hosts serves the status branch and the host branches: tips, or
	// Config.StatusURL's repository (opened and renewed with tips).
	hosts   *gitsource.Repo
	log     *logrus.Entry
	clock   func() time.Time
	metrics *metrics
	reg     *prometheus.Registry

	kick chan struct{}
	// health is the pass loop's progress, for Healthz.
	health health
	// locks are held on the cache directories New opened (see Close).
	locks []*cacheLock

	mu       sync.Mutex // one pass at a time; guards everything below
	loader   *desired.Loader
	statuses *status.Reader
	live     *liveness
	hashes   map[*desired.VM]desired.Hash // spec hash of every VM of loadedFleet
	// last good load: the commit and its fleet, so an unchanged head is
	// not loaded again.
	loadedHead  string
	loadedFleet *desired.Fleet
	// baseline is the applied commit whose tree the loader compares a
	// new head with (desired.Loader.SetBaseline); "" when none is set.
	// loaderHead is the commit of the loader's last Load.
	baseline   desired.Hash
	loaderHead string
	// ledgerSrc caches the last ledger read (the authentic one, see
	// authenticLedger) with the snapshots tip it was read at.
	ledgerSrc *ledgerSource
	// ledgerKeys are the keys whose snapshots commits the controller
	// trusts (nil without a signing key); signedOnce is set once this
	// process published a signed commit (TrustUnsignedLedgerOnce is over);
	// history is the deep repository the last walk read (closed when
	// replaced).
	ledgerKeys *trust.Signers
	signedOnce bool
	// trustFlagIgnored is set once the log said that
	// TrustUnsignedLedgerOnce is set over a signed tip.
	trustFlagIgnored bool
	// failingAt is when recordBeforeFirstPass last wrote the failing
	// pass's record.
	failingAt time.Time
	history   *gitsource.Repo
	// lastSigned is the last snapshots commit a controller key signed
	// that this process wrote or verified at the tip (nil before one):
	// the ledger a walk that finds no signed commit falls back to.
	lastSigned *signedLedger
	// fleetsAt are the desired states fleetAt loaded, by commit;
	// removals removedBy's verdicts, by object and commit.
	fleetsAt map[desired.Hash]*desired.Fleet
	removals map[string]bool
	// verifiedTip is the snapshots tip whose host files are known to be
	// the ones the ledger published (this controller wrote or checked
	// them); a pass on another tip checks every file.
	verifiedTip string
	// lastKey is the inputs of the last pass that completed and left
	// nothing waiting ("" when something waits): a pass on the same
	// inputs is skipped.
	lastKey    string
	summary    []byte // last README.md content known on the status branch
	summaryKey []byte // summary with heartbeat-driven fields blanked
	summaryAt  time.Time
	summaryDue bool // a changed summary waits for SummaryInterval
	// livenessRows are the rows of the last liveness.yaml encoded, and
	// livenessData that encoding (see liveness).
	livenessRows []status.HostState
	livenessData []byte
	// ackVerdicts are the verdicts on the hosts' status commits of the
	// last pass (authenticate), by host.
	ackVerdicts map[string]ackVerdict
	// eventKeys caches status.EventKey digests by blob hash, for the
	// statuses of the last pass.
	eventKeys map[string]string
	// fetched is branch → tip of the tip repository's branches as this
	// pass fetched them ("" for one the remote lacks); nil before the
	// fetch, or when it failed. update builds on them without fetching
	// again. hostTrees are the host branches' trees the last pass read.
	fetched   map[string]string
	hostTrees map[string]hostTree
	// statusSeen is the status branch's tip as the last pass fetched or
	// wrote it ("" when it did not fetch it).
	statusSeen string
	// rejectLogged is the last rejection logged; failLogged the last
	// unreadable or refused cause logged ("" after a pass that was
	// neither).
	rejectLogged string
	failLogged   string
	// failures counts the passes in a row that were unreadable or
	// refused: Run backs off by it.
	failures int
	// failing is the failure recorded on the status branch (nil while
	// passes succeed); lastSummary the summary of the last pass that
	// completed in this process (nil before one did). See recordFailure.
	failing     *status.PassFailure
	lastSummary *status.Summary
	// rangeKey is "applied head" of rangeVal, the commits since the
	// applied one; sigKey the same of sigErr, the last signature verdict
	// (nil: verified).
	rangeKey, sigKey string
	rangeVal         []*gitsource.Commit
	rangeTrunc       bool
	sigErr           error
	// seen is when this controller first saw each desired-state commit
	// whose signature it checks (or when a signed ledger says one was),
	// sigSeen that record of the commits of the last verdict; snapSeen
	// the same for snapshots commits (signseen.go).
	seen, snapSeen *trust.FirstSeen
	sigSeen        []snapshots.SeenCommit
	// epochs is this controller's own history of epochs (epochMemory);
	// unfollowedLogged the status epochs it logged as not followed, by
	// host.
	epochs           *epochMemory
	unfollowedLogged map[string]string
	// ignored are the hosts whose status was ignored and logged once
	// (unknown to the desired state and the ledger).
	ignored map[string]bool

	// beforePublish, when set (by tests), runs after a pass read the
	// desired branch and the statuses and before it publishes.
	beforePublish func()
}

// PassResult says what one pass observed and did.
type PassResult struct {
	// Head is the desired-state commit the pass read ("" if the fetch
	// failed).
	Head string
	// Rejected is set when the desired-state commit is invalid (it matches
	// desired.ErrInvalid, or ErrRetainedVolume): the last good snapshots
	// stayed. A commit that could not be read is not rejected: Pass
	// returns an ErrUnreadable or ErrRefused error instead (see Outcome).
	Rejected error
	// Skipped is true when nothing changed since the last pass: no git
	// write was attempted.
	Skipped bool
	// SnapshotsCommit is the snapshots branch tip after the pass.
	SnapshotsCommit string
	// Published is host → epoch of every snapshot file written.
	Published map[string]uint64
	// Epochs is host → last epoch published, for every host the ledger
	// knows (after the pass; nil when the pass was skipped or failed).
	Epochs map[string]uint64
	// Removed lists hosts whose snapshot file was removed (the host left
	// the fleet with nothing pending).
	Removed []string
	// FenceJumps is host → epoch the ledger jumped to because the host had
	// seen a higher one.
	FenceJumps map[string]uint64
	// Tombstoned, Undeleted, Finalized (acked) and Swept (abandoned) list
	// the objects whose delete moved, as "Kind name@host".
	Tombstoned, Undeleted, Finalized, Swept []string
	// Confirmed lists the pending deletes whose host's quarantine nonce
	// this pass published in their tombstone (docs/DESIGN.md, "Delete
	// confirmation"), as "Kind name@host".
	Confirmed []string
	// Retained lists the objects a history rewrite dropped that this pass
	// kept (never tombstoned); Unretained those desired again on their
	// host. RetainedTotal is the number kept after the pass.
	Retained, Unretained []string
	RetainedTotal        int
	// ForgedAcks are the acks this pass did not act on: the host's status
	// commit is not signed by its Host's spec.agentKey. Their deletes stay
	// pending.
	ForgedAcks []ForgedAck
	// ForgedCommits are the snapshots commits above the newest one a
	// controller key signed, newest first (only with a signing key): the
	// pass read the ledger of that signed commit instead and wrote over
	// them, repairing every host file that differed.
	ForgedCommits []ForgedCommit
	// Repaired lists hosts whose file on the snapshots branch differed from
	// the snapshot the controller computes for it (edited, forged or
	// removed): published again with a new epoch.
	Repaired []string
	// Held is host → why its snapshot was not published (its epoch at the
	// bound, see ErrEpochBound); every other host was.
	Held map[string]string
	// EpochsNotFollowed is host → why the fence recovery did not follow
	// its status's lastSeenEpoch: beyond the epochs this controller
	// published, with no agentKey signature to vouch for it
	// (docs/DESIGN.md, "Epoch bounds"). The host published as usual.
	EpochsNotFollowed map[string]string
	// IgnoredStatuses lists the hosts whose status file was ignored: they
	// are neither in the desired state nor in the ledger.
	IgnoredStatuses []string
	// Pending is the number of tombstones pending after the pass.
	Pending int
	// SummaryWritten is true when README.md on the status branch was
	// rewritten.
	SummaryWritten bool
}

// Changed reports whether the pass wrote anything to the snapshots branch.
func (r PassResult) Changed() bool { return len(r.Published) > 0 || len(r.Removed) > 0 }

// tipsRenewal is how long a tip repository opened by the controller is kept
// before it is opened afresh (by the controller's clock).
const tipsRenewal = time.Hour

// renewTips opens a fresh depth-1, in-memory repository for the snapshots
// and status branches.
func (c *Controller) renewTips() error {
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: c.cfg.URL, Auth: c.cfg.Auth,
		CacheDir: c.cfg.TipsCacheDir, Depth: 1, Timeout: c.cfg.GitTimeout, Logger: c.cfg.Logger})
	if err != nil {
		return err // "open git source URL: …"
	}
	c.tips, c.hostTrees = repo, nil
	if err := c.openHosts(); err != nil {
		return err
	}
	if c.cfg.TipsCacheDir == "" {
		// In memory: opened afresh when due. On disk the cache's own
		// upkeep keeps it small, and one directory has one Repo.
		c.tipsOpened = c.clock()
	}
	return nil
}

// Registry is the private Prometheus registry holding the controller's
// metrics, or nil when Config.Registerer was given.
func (c *Controller) Registry() *prometheus.Registry { return c.reg }

// Repo is the repository of the desired branch.
func (c *Controller) Repo() *gitsource.Repo { return c.repo }

// Kick asks Run for a pass at once (a webhook arrived). It never blocks.
func (c *Controller) Kick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Run runs passes until ctx ends: at once, then every interval (jittered,
// default 15 s, at most OfflineAfter/6: see liveness.look), whenever the desired branch moves (Watch: polling, and
// fsnotify on a local repository), on Kick, and when a host branch or the
// status branch moves (at most one such pass per 2 s) — but not when the
// status branch's tip is the one the last pass read or wrote itself. A
// failed pass is logged and retried at the next trigger. It returns ctx's
// error.
func (c *Controller) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		interval = DefaultInterval
	}
	// Read the statuses within the liveness's look gap, jitter and all.
	interval = min(interval, c.cfg.OfflineAfter/6)
	// All three resolve heads only: the cache does not grow. The status
	// branch moves for agents of the old layout, and for this
	// controller's own summary writes.
	mainCh := c.repo.Watch(ctx, c.cfg.Branch, interval)
	watched := c.repo
	if c.hosts != c.tips {
		watched = c.hosts
	}
	hostsCh := watched.WatchPrefix(ctx, status.HostBranchPrefix, interval)
	statusCh := watched.Watch(ctx, c.cfg.StatusBranch, interval)
	c.health.started.Store(c.clock().UnixNano())
	for {
		started := time.Now()
		_, _ = c.Pass(ctx) // Pass logs what a person needs
		c.mu.Lock()
		wait := backoff(interval, c.failures)
		c.mu.Unlock()
		c.health.lastPass.Store(c.clock().UnixNano())
		c.health.maxWait.Store(int64(wait + wait/2)) // jittered below
		wait = wait/2 + time.Duration(rand.Int64N(int64(wait)+1))
		t := time.NewTimer(wait)
		next := c.await(ctx, t, started, mainCh, hostsCh, statusCh)
		t.Stop()
		if !next {
			return ctx.Err()
		}
	}
}

// await waits for the next pass's trigger (see Run): t, the desired
// branch, a kick, or a host branch or the status branch moving, which
// waits out statusGap from started. A status tip the last pass read or
// wrote is no trigger: the controller's own write moves the branch after
// every publish. It returns false when ctx ended.
func (c *Controller) await(ctx context.Context, t *time.Timer, started time.Time, mainCh, hostsCh, statusCh <-chan string) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-mainCh:
			return true
		case <-c.kick:
			return true
		case <-t.C:
			return true
		case <-hostsCh:
		case tip := <-statusCh:
			c.mu.Lock()
			seen := tip != "" && tip == c.statusSeen
			c.mu.Unlock()
			if seen {
				continue
			}
		}
		// Agents write often; a status change waits out the gap so a
		// thousand heartbeats do not become a thousand passes.
		gap := time.NewTimer(time.Until(started.Add(statusGap)))
		defer gap.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-mainCh:
		case <-c.kick:
		case <-gap.C:
		}
		return true
	}
}

// statusGap is the least time between the starts of two passes when the
// second is started by a status change.
const statusGap = 2 * time.Second

// Pass runs one level-triggered pass (docs/DESIGN.md, Controller semantics 1–7):
// read desired, read statuses, compute tombstones, finalizations and
// snapshots on the snapshots tip, publish them in one compare-and-swap
// commit, and rewrite the status summary when it changed. A rejected desired
// state is not an error of the pass: it is reported in PassResult.Rejected.
// The error is a failure of git (the pass is retried by Run), or a refusal
// that writes nothing: ErrLedgerMismatch (the ledger belongs to another
// branch or path) or ErrNoLastSpec, wrapped with the names a person needs
// to fix it. A host whose epoch is at the bound is held (PassResult.Held),
// never the pass.
func (c *Controller) Pass(ctx context.Context) (PassResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	start := time.Now()
	res, err := c.pass(ctx)
	err = passError(err)
	outcome := PassOutcome(res, err)
	c.metrics.observe(res, outcome, time.Since(start))
	log := c.log.WithField("commit", desired.Hash(res.Head).Short())
	if res.Head == "" {
		// No commit was read (a failed fetch, a missing branch): name the
		// branch instead of an empty commit.
		log = c.log.WithField("branch", c.cfg.Branch)
	}
	if outcome == OutcomeUnreadable || outcome == OutcomeRefused {
		c.failures++
		c.recordFailure(ctx, outcome, err)
	} else {
		if c.failLogged != "" {
			log.Info("git readable and the pass accepted again")
		}
		c.failures, c.failLogged = 0, ""
	}
	switch outcome {
	case OutcomeUnreadable, OutcomeRefused:
		// Once per distinct cause, not once per pass: a pass that fails
		// the same way every interval says nothing new.
		if key := string(outcome) + "\x00" + err.Error(); key != c.failLogged && ctx.Err() == nil {
			c.failLogged = key
			msg := "git failed; the last good snapshots stay, retrying with back-off"
			if outcome == OutcomeRefused {
				msg = "refusing to publish; the last good snapshots stay"
			}
			log.WithField("outcome", string(outcome)).WithError(cleanErr(err)).Error(msg)
		}
	case OutcomeRejected:
		// Once per rejection, not once per pass.
		if key := res.Head + "\x00" + res.Rejected.Error(); key != c.rejectLogged {
			c.rejectLogged = key
			log.WithField("outcome", string(outcome)).WithError(cleanErr(res.Rejected)).Error("desired state rejected; the last good snapshots stay")
		}
	case OutcomeSkipped:
		log.Debug("nothing changed")
	case OutcomePublished:
		log.WithFields(logrus.Fields{"published": len(res.Published), "removed": len(res.Removed),
			"pending": res.Pending, "snapshots": desired.Hash(res.SnapshotsCommit).Short()}).Info("snapshots published")
	default:
		log.WithFields(logrus.Fields{"pending": res.Pending}).Debug("pass done, nothing to publish")
	}
	// What the status branch held after this pass, writes included
	// (recordFailure's too): Run does not wake for it.
	c.statusSeen = c.fetched[c.cfg.StatusBranch]
	return res, err
}

// pass is Pass's steps, in order; the first error, or a step that ends the
// pass (skipUnchanged), stops it.
func (c *Controller) pass(ctx context.Context) (PassResult, error) {
	now := c.clock()
	c.renewTipsWhenDue(now)
	p := &passState{c: c, ctx: ctx, now: now,
		read: gitsource.WithAdvertisement(ctx, &gitsource.Advertisement{})}
	for _, step := range []func() error{p.readDesired, p.readStatuses, p.skipUnchanged, p.publish, p.record} {
		if err := step(); err != nil || p.done {
			return p.res, err
		}
	}
	return p.res, nil
}

// passState is the state pass's steps share.
type passState struct {
	c   *Controller
	ctx context.Context
	now time.Time
	// read is ctx for the fetches of readDesired and readStatuses, which
	// run under one ref advertisement: the desired branch's fetch records
	// it, and the tip repository's fetch runs no upload-pack when none of
	// its branches moved in it (gitsource.WithAdvertisement).
	read context.Context
	res  PassResult
	// head, fl and loadErr are the desired state last read (readDesired,
	// again after a lost race).
	head    string
	fl      *desired.Fleet
	loadErr error
	obs     observation
	// offline is the offline hosts at now (liveness.offlineSet), in the
	// skip key.
	offline string
	// sum is the summary of the last computation; out the output of the
	// last computation of write (nil before one ran), and sw the status
	// write planned from it. written is whether the publish moved the
	// status tip.
	sum     status.Summary
	out     *output
	sw      *statusWrite
	written bool
	// done ends the pass after the current step with res as it stands.
	done bool
}

// readDesired is step 1: read desired. Any error keeps the last good
// snapshots; one that is git's, not the commit's, ends the pass (every
// later step needs git too, and nothing is said about the commit).
func (p *passState) readDesired() error {
	head, fl, loadErr := p.c.readDesired(p.read)
	p.c.fetched = nil
	if errors.Is(loadErr, gitsource.ErrBranchNotFound) {
		// Git answered: there is no such branch. Never an empty fleet.
		p.res.Head = head
		return fmt.Errorf("%w: %w", ErrRefused, loadErr)
	}
	return p.take(head, fl, loadErr)
}

// take makes the desired state read at head the pass's: a commit git
// could not read ends the pass (ErrUnreadable); an invalid one is
// rejected (res.Rejected).
func (p *passState) take(head string, fl *desired.Fleet, loadErr error) error {
	p.head, p.fl, p.loadErr = head, fl, loadErr
	p.res.Head = head
	if loadErr != nil && !errors.Is(loadErr, desired.ErrInvalid) {
		return fmt.Errorf("%w: read the desired state: %w", ErrUnreadable, loadErr)
	}
	p.res.Rejected = loadErr
	return nil
}

// readStatuses is step 2: read the hosts' statuses; a failure disables
// the sweep. A remote that stalls ends the pass: every later step waits on
// it too, and a pass must not cost a git timeout per step.
func (p *passState) readStatuses() error {
	p.obs = p.c.observe(p.read, p.fl, p.now)
	if errors.Is(p.obs.err, gitsource.ErrTimeout) {
		return fmt.Errorf("%w: read the statuses: %w", ErrUnreadable, p.obs.err)
	}
	return nil
}

// skipUnchanged ends the pass (res.Skipped) when nothing observable changed
// since a pass that left nothing waiting (lastKey, set by record). The
// snapshots tip is in the key too (fetched with the statuses): a hand edit
// of the snapshots branch is repaired at the next pass. When the fetch
// failed, the key holds no tip and never matches.
func (p *passState) skipUnchanged() error {
	c := p.c
	snapsTip, ok := c.fetched[c.cfg.SnapshotsBranch]
	if !ok {
		snapsTip = "unread"
	}
	p.offline = c.live.offlineSet(p.now)
	if p.loadErr == nil && p.obs.err == nil && p.key(snapsTip) == c.lastKey && !c.refreshDue(p.now) {
		p.res.Skipped = true
		p.done = true
	}
	return nil
}

// key is the skip key of the pass's inputs with the snapshots tip snaps.
func (p *passState) key(snaps string) string {
	return fmt.Sprintf("%s|%s|%s|%v|%s", p.head, snaps, p.obs.tip, p.obs.err == nil, p.offline)
}

// publish is steps 3 and 4: compute on the snapshots tip and publish in
// one CAS commit, pushed in one atomic push with the summary on the status
// branch. A publish that lost a race with another controller
// (errStaleHead) reads the desired branch again and computes anew, as a
// rejected push fetches again.
func (p *passState) publish() error {
	c := p.c
	if c.beforePublish != nil {
		c.beforePublish()
	}
	tip, written, err := p.write()
	for tries := 0; errors.Is(err, errStaleHead) && tries < 3; tries++ {
		c.log.WithError(cleanErr(err)).Info("reading the desired branch again")
		if err := p.take(c.readDesired(p.ctx)); err != nil {
			return err
		}
		tip, written, err = p.write()
	}
	p.res.SnapshotsCommit = tip
	p.written = written
	return err
}

// statusWriteFor is step 4's write, planned from one computation's output:
// this pass acted, so a failure recorded on the status branch is over.
// Statuses the computation ignored (hosts it does not know) are neither
// shown nor copied.
func (p *passState) statusWriteFor(out *output) (*statusWrite, error) {
	shown := p.fl
	if out.rejected != nil {
		shown = nil // summarized without the refused state
	}
	p.sum = p.c.summarize(out.ledger, shown, withoutHosts(p.obs.reports, out.ignored), out.forgedAcks, p.obs.err == nil, p.now)
	copies := statusCopies{tips: maps.Clone(p.obs.copies.tips), event: p.obs.copies.event}
	for _, h := range out.ignored {
		delete(copies.tips, h)
	}
	return p.c.planStatus(p.sum, copies, p.now)
}

// record reports the published computation in res and keeps what the next
// pass needs: the summary, and the skip key.
func (p *passState) record() error {
	c, res, out := p.c, &p.res, p.out
	c.report(res, out)
	if out.rejected != nil {
		// Refused by the computation: report it like any rejection.
		res.Rejected = out.rejected
	}
	sum := p.sum
	c.failing, c.lastSummary = nil, &sum
	res.SummaryWritten = p.written
	// The next pass may skip on the same inputs only when this one left
	// nothing waiting: no rejection to retry, no tombstone waiting for an
	// ack or for time to pass, no summary held back, and no summary just
	// written (our write moved the status tip; the next pass reads it).
	c.lastKey = ""
	if res.Rejected == nil && p.obs.err == nil && !waiting(out.ledger) && !p.written && !c.summaryDue {
		c.lastKey = p.key(res.SnapshotsCommit)
	}
	return nil
}

// waiting reports whether a tombstone of l waits for time to pass (the
// abandon grace). A swept tombstone waits only for its host's ack, which
// arrives as a change of the status branch, itself in the skip key.
func waiting(l *snapshots.Ledger) bool {
	for _, t := range l.Tombstones {
		if t.SweptAt == nil {
			return true
		}
	}
	return false
}

// cleanErr is err fit for a log line: valid UTF-8, no control characters,
// a long error list cut to its first lines with a count of the rest.
func cleanErr(err error) error {
	return errors.New(safetext.Lines(err.Error()))
}

// renewTipsWhenDue opens the tip repository afresh once it is older than
// tipsRenewal; a failure keeps the old one.
func (c *Controller) renewTipsWhenDue(now time.Time) {
	if c.tipsOpened.IsZero() || now.Sub(c.tipsOpened) <= tipsRenewal {
		return
	}
	if err := c.renewTips(); err != nil {
		c.log.WithError(err).Warn("renew the tip repository; keeping the old one")
		return
	}
	// The ledger cache is keyed by tip and stays valid.
	c.log.Debug("tip repository opened afresh")
}

// observation is what a pass read of the host branches and the status
// branch.
type observation struct {
	// tip names what was read: the status branch tip and every host
	// branch tip ("" when there are none); err why it could not be read
	// (then statuses is empty and no delete is finalized).
	tip     string
	err     error
	reports []status.Report
	// statuses are the readable statuses by host.
	statuses map[string]*status.Status
	// copies are the copies to bring up to date on the status branch.
	copies statusCopies
	// hostTips are the host branches' tips the statuses were read at,
	// whose signatures input judges (authenticate).
	hostTips map[string]string
}

// observe reads the hosts' statuses and feeds the liveness clock with
// them and with the hosts fl desires (fl may be nil).
func (c *Controller) observe(ctx context.Context, fl *desired.Fleet, now time.Time) observation {
	var obs observation
	obs.tip, obs.reports, obs.copies, obs.hostTips, obs.err = c.readStatuses(ctx)
	obs.statuses = map[string]*status.Status{}
	if obs.err == nil {
		var l *snapshots.Ledger
		if c.ledgerSrc != nil {
			l = c.ledgerSrc.ledger
		}
		// A status its Host's agentKey did not sign is no heartbeat of
		// the host: anyone who can push its branch wrote it. (The pass
		// judges its acks again against the ledger it computes on.)
		unsigned := c.authenticate(fl, l, obs.reports, obs.hostTips)
		c.live.look(now)
		for _, rep := range obs.reports {
			_, forged := unsigned[rep.Host]
			// A signed status is a heartbeat only with a number above
			// every one seen signed: a replayed older commit is none.
			replayed := !forged && rep.Status != nil && c.signedHost(fl, l, rep.Host) && !c.live.fresh(rep.Host, rep.Status.Heartbeat)
			if c.known(fl, rep.Host) && !forged && !replayed {
				// A host the computation ignores keeps no liveness.
				c.live.observe(rep.Host, rep.ID, now)
			}
			if rep.Status != nil {
				obs.statuses[rep.Host] = rep.Status
			} else {
				c.log.WithField("host", rep.Host).WithError(rep.Err).Warn("status file unreadable")
			}
		}
	} else {
		c.log.WithError(obs.err).Warn("read statuses; no delete is finalized this pass")
	}
	if fl != nil {
		for h := range fl.Hosts {
			c.live.watch(h, now)
		}
	}
	return obs
}

// signedHost reports whether host's statuses must be signed (its Host,
// or its ledger record, names an agentKey).
func (c *Controller) signedHost(fl *desired.Fleet, l *snapshots.Ledger, host string) bool {
	if fl == nil {
		fl = c.loadedFleet
	}
	return agentKey(fl, l, host) != ""
}

// known reports whether host is in fl (else the last good fleet) or in
// the last ledger read: the hosts whose status the pass reads.
func (c *Controller) known(fl *desired.Fleet, host string) bool {
	if fl == nil {
		fl = c.loadedFleet
	}
	if fl != nil && fl.Hosts[host] != nil {
		return true
	}
	l := c.lastLedger()
	return l != nil && l.Hosts[host] != nil
}

// withoutHosts is reports less those of hosts.
func withoutHosts(reports []status.Report, hosts []string) []status.Report {
	if len(hosts) == 0 {
		return reports
	}
	drop := make(map[string]bool, len(hosts))
	for _, h := range hosts {
		drop[h] = true
	}
	out := make([]status.Report, 0, len(reports))
	for _, r := range reports {
		if !drop[r.Host] {
			out = append(out, r)
		}
	}
	return out
}

// write computes the pass's decisions on the snapshots tip and writes
// them in one compare-and-swap commit (recomputed on a moved tip), leaving
// the computation in out. It returns the new tip (also with the error of a
// write that ran no computation) and whether the status tip moved.
//
// The status branch's write is planned from the output of each
// computation (statusWriteFor; a nil write: nothing to write); both
// branches are written in one compare-and-swap write, one push, that the
// remote takes whole or refuses whole (a moved tip of either runs both
// again). The planned write's done is called once it is pushed.
func (p *passState) write() (string, bool, error) {
	c := p.c
	p.out, p.sw = nil, nil
	tips, err := c.updateMany(p.ctx, []string{c.cfg.SnapshotsBranch, c.cfg.StatusBranch},
		[]gitsource.Mutation{p.editSnapshots, p.editStatus})
	if err != nil {
		return "", false, fmt.Errorf("publish snapshots: %w", err)
	}
	tip, written := tips[0], false
	if p.sw != nil {
		p.sw.done()
		written = tips[1] != p.sw.base
	}
	if p.out == nil {
		return tip, false, errors.New("publish snapshots: no computation ran")
	}
	c.recordPublished(tip, p.out.ledger)
	return tip, written, nil
}

// editSnapshots is the snapshots branch's edit of one attempt of write:
// compute on the ledger at tip (its output left in out), and the files and
// message of its commit.
func (p *passState) editSnapshots(tip string, read func(string) ([]byte, error)) (map[string][]byte, string, error) {
	c := p.c
	src, err := c.ledgerAt(p.ctx, tip, read)
	if err != nil {
		return nil, "", err
	}
	if err := c.checkHead(p.ctx, p.head, src.ledger); err != nil {
		return nil, "", err
	}
	o, err := compute(p.computeInput(tip, src, read))
	if err != nil {
		return nil, "", err
	}
	p.out = o
	return p.snapshotsCommit(tip, src, read, o)
}

// computeInput is compute's input on tip, whose ledger src holds and whose
// files read returns: the published files are checked unless tip is known
// to hold them (verifiedTip).
func (p *passState) computeInput(tip string, src *ledgerSource, read func(string) ([]byte, error)) input {
	verify := read
	if tip != "" && tip == p.c.verifiedTip {
		verify = nil
	}
	in := p.c.input(p.head, p.fl, p.loadErr, p.obs, p.now, src.ledger, src.read, verify)
	in.forged, in.tip = src.forged, desired.Hash(tip)
	if src.adopted {
		in.adopted = desired.Hash(tip)
	}
	return in
}

// snapshotsCommit is the files and message of the commit of o over tip:
// o's files and ledger, what src restores, and on an adopted tip the
// removal of every file the adoption did not vouch for (dropUnadopted).
// None when tip holds them already.
func (p *passState) snapshotsCommit(tip string, src *ledgerSource, read func(string) ([]byte, error), o *output) (map[string][]byte, string, error) {
	data, err := o.ledger.Marshal()
	if err != nil {
		return nil, "", err
	}
	old, err := read(snapshots.LedgerPath)
	if err != nil && !errors.Is(err, gitsource.ErrFileNotFound) {
		return nil, "", fmt.Errorf("read %s: %w", snapshots.LedgerPath, err)
	}
	if len(o.files) == 0 && string(old) == string(data) && src.from == tip {
		// A tip no controller key signed is written over even when
		// nothing else changed: the next tip is signed again.
		return nil, "", nil
	}
	files := o.files
	files[snapshots.LedgerPath] = data
	if err := src.restore(files); err != nil {
		return nil, "", err
	}
	if src.adopted {
		if err := p.c.dropUnadopted(tip, files, o.ledger); err != nil {
			return nil, "", err
		}
	}
	return files, commitMessage(p.head, o), nil
}

// editStatus is the status branch's edit of one attempt of write. It runs
// after the snapshots edit of the same attempt: out is that attempt's
// computation, from which statusWriteFor plans the write (left in sw).
func (p *passState) editStatus(statusTip string, read func(string) ([]byte, error)) (map[string][]byte, string, error) {
	p.sw = nil
	if p.out == nil {
		return nil, "", errors.New("no computation ran")
	}
	w, err := p.statusWriteFor(p.out)
	if err != nil {
		return nil, "", fmt.Errorf("write summary: %w", err)
	}
	if w == nil {
		return nil, "", nil
	}
	p.sw = w
	files, msg, err := w.mutate(statusTip, read)
	if err != nil {
		return nil, "", fmt.Errorf("write summary: %w", err)
	}
	return files, msg, nil
}

// recordPublished records tip, the snapshots commit this process just
// wrote, as holding the ledger l and the files l describes.
func (c *Controller) recordPublished(tip string, l *snapshots.Ledger) {
	c.epochs.note(l)
	c.verifiedTip = tip
	c.ledgerSrc = &ledgerSource{tip: tip, from: tip, ledger: l, read: func(p string) ([]byte, error) {
		return c.tips.ReadFileMax(tip, p, snapshots.MaxSnapshotBytes)
	}}
	if c.ledgerKeys != nil && tip != "" {
		c.signedOnce = true
		c.lastSigned = &signedLedger{commit: tip, ledger: l, repo: c.tips}
		c.snapSeen.At(tip, c.clock()) // written now, by this controller
	}
	if c.history != nil {
		// The walk's clone is read no more: the next pass reads the tip
		// this one wrote.
		c.history.Close()
		c.history = nil
	}
}

// dropUnadopted adds to files a removal of every path of tip, an adopted
// unsigned commit (Config.TrustUnsignedLedgerOnce), that files does not
// write and that is neither the ledger nor the host file of a host l, the
// ledger written, has a record of. A person checked the ledger there,
// nothing else: without this, a file planted beside it (a host file for a
// host the desired state does not have, whose agent may still run) would
// be signed with the controller's first commit and every later one. The
// host files of hosts l knows are the computation's: rewritten, or found
// to be what it computes (step 5).
func (c *Controller) dropUnadopted(tip string, files map[string][]byte, l *snapshots.Ledger) error {
	tree, err := c.tips.Tree(tip, "")
	if err != nil {
		return fmt.Errorf("list the adopted commit %s: %w", desired.Hash(tip).Short(), err)
	}
	return tree.Walk(func(f desired.File) error {
		if _, ok := files[f.Path]; ok || f.Path == snapshots.LedgerPath {
			return nil
		}
		if h, ok := snapshots.HostFromPath(f.Path); ok && l.Hosts[h] != nil {
			return nil
		}
		files[f.Path] = nil
		return nil
	})
}

// input is compute's input for one attempt on the snapshots tip whose
// ledger is l and whose files read returns; verify checks the published
// files (nil when the tip is known to hold them).
func (c *Controller) input(head string, fl *desired.Fleet, loadErr error, obs observation, now time.Time,
	l *snapshots.Ledger, read, verify func(string) ([]byte, error)) input {
	hashes := c.hashes
	// The hosts whose status may not ack deletes are judged against the
	// fleet and the ledger this attempt computes on: a departed host's
	// last agentKey is in l (the authentic ledger), which a just-started
	// controller has read nowhere else yet.
	var unsigned map[string]ackRefusal
	if obs.err == nil {
		unsigned = c.authenticate(fl, l, obs.reports, obs.hostTips)
	}
	signed := map[string]bool{}
	for h, v := range c.ackVerdicts {
		signed[h] = v.why == "" && !v.retry
	}
	if verify != nil { // a tip another wrote; read reads the commit whose ledger l is, bounded
		c.observeBranchEpochs(read, obs.statuses, signed)
	}
	return input{
		branch: c.cfg.Branch, head: desired.Hash(head), fleet: fl, loadErr: loadErr,
		path:   c.cfg.Path,
		ledger: l, statuses: obs.statuses, statusOK: obs.err == nil, unsigned: unsigned, signed: signed,
		ownEpoch: c.epochs.bound,
		offline:  func(h string) (bool, time.Duration) { return c.live.offline(h, now) },
		now:      now, grace: c.cfg.AbandonGrace,
		attribute: func(refs []ref) (map[ref]snapshots.Tombstone, error) {
			return attribute(c.repo, c.cfg.Path, string(l.Applied.Commit), head, refs)
		},
		rewritten: func() (bool, error) {
			anc, err := c.repo.IsAncestor(string(l.Applied.Commit), head)
			return !anc, err
		},
		readTip:      verify,
		lastSnapshot: func(host string) (*snapshots.Snapshot, error) { return readSnapshot(read, host) },
		specHash:     func(vm *desired.VM) desired.Hash { return hashes[vm] },
		appliedRange: func() ([]*gitsource.Commit, bool, error) {
			rng, truncated, err := c.appliedRange(l, head)
			if err != nil {
				return nil, false, err
			}
			all, err := WithMergedCommits(c.repo, rng)
			return all, truncated, err
		},
		verify:         c.verifier(l, head, now, c.signedLedger()),
		controllerKeys: c.ledgerKeys,
		deletes:        DeleteGuard{Max: c.cfg.MaxDeletes},
		desiredAt:      c.desiredAtFunc(),
		removedBy:      c.removedByFunc(),
	}
}

// removedByFunc is compute's removedBy: nil when the ledger is
// authenticated by a controller key's signature, else removedBy.
func (c *Controller) removedByFunc() func(ref, desired.Hash) (bool, error) {
	if c.ledgerKeys != nil {
		return nil
	}
	return c.removedBy
}

// maxRemovals bounds the verdicts removedBy keeps.
const maxRemovals = 100000

// removedBy reports whether commit (a full hash in the desired branch's
// clone, which holds only what was fetched from the desired branch)
// removed r, as attribution reads it (removes). A verdict is kept by
// object and commit (a commit's content never changes). An error is
// git's.
func (c *Controller) removedBy(r ref, commit desired.Hash) (bool, error) {
	key := r.String() + "\x00" + string(commit)
	if ok, seen := c.removals[key]; seen {
		return ok, nil
	}
	ok, err := func() (bool, error) {
		if !commitHash.MatchString(string(commit)) {
			return false, nil
		}
		info, err := c.repo.CommitInfo(string(commit))
		if errors.Is(err, gitsource.ErrObjectMissing) {
			return false, nil
		}
		if err != nil || len(info.Parents) == 0 {
			return false, err
		}
		return removes(c.repo, c.cfg.Path, info.Parents[0], info.Hash, r)
	}()
	if err != nil {
		return false, err
	}
	if c.removals == nil || len(c.removals) >= maxRemovals {
		c.removals = map[string]bool{}
	}
	c.removals[key] = ok
	return ok, nil
}

// desiredAtFunc is compute's desiredAt: nil when the ledger is
// authenticated by a controller key's signature, else fleetAt.
func (c *Controller) desiredAtFunc() func(desired.Hash) (*desired.Fleet, error) {
	if c.ledgerKeys != nil {
		return nil
	}
	return c.fleetAt
}

// commitHash is a full SHA-1 commit hash, the only form fleetAt reads.
var commitHash = regexp.MustCompile(`^[0-9a-f]{40}$`)

// maxFleetsAt bounds the desired states fleetAt keeps loaded.
const maxFleetsAt = 2

// fleetAt loads the desired state at commit from the desired branch's
// repository, which holds only what was fetched from the desired branch
// (never from the snapshots or status branches): the history ledger
// records are checked against. A commit it does not hold wraps
// gitsource.ErrObjectMissing. The last maxFleetsAt are kept.
func (c *Controller) fleetAt(commit desired.Hash) (*desired.Fleet, error) {
	if f, ok := c.fleetsAt[commit]; ok {
		return f, nil
	}
	if !commitHash.MatchString(string(commit)) {
		// Never a revision ("HEAD", a ref) the cache would resolve.
		return nil, fmt.Errorf("%w: %q is not a commit hash", gitsource.ErrObjectMissing, commit)
	}
	if commit == desired.Hash(c.loadedHead) && c.loadedFleet != nil {
		return c.loadedFleet, nil
	}
	tree, err := c.repo.Tree(string(commit), "")
	if err != nil {
		return nil, err
	}
	f, err := desired.NewLoader(c.cfg.Path).Load(tree)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", commit.Short(), err)
	}
	if len(c.fleetsAt) >= maxFleetsAt || c.fleetsAt == nil {
		c.fleetsAt = map[desired.Hash]*desired.Fleet{}
	}
	c.fleetsAt[commit] = f
	return f, nil
}

// appliedRange is the first-parent commits from head back to the commit l
// applied (see appliedRange), kept for the next pass on the same pair.
func (c *Controller) appliedRange(l *snapshots.Ledger, head string) ([]*gitsource.Commit, bool, error) {
	applied := string(l.AppliedHash())
	key := applied + " " + head
	if key == c.rangeKey {
		return c.rangeVal, c.rangeTrunc, nil
	}
	rng, truncated, err := AppliedRange(c.repo, applied, head)
	if err != nil {
		return nil, false, err
	}
	c.rangeKey, c.rangeVal, c.rangeTrunc = key, rng, truncated
	return rng, truncated, nil
}

// readDesired fetches the desired branch and loads its tree. The error is
// the reason the desired state is rejected.
func (c *Controller) readDesired(ctx context.Context) (string, *desired.Fleet, error) {
	head, err := c.fetch(ctx, c.repo, c.cfg.Branch)
	if errors.Is(err, gitsource.ErrBranchNotFound) {
		return "", nil, fmt.Errorf("the desired branch %q is missing from the repository (deleted, or never pushed): %w", c.cfg.Branch, err)
	}
	if err != nil {
		return "", nil, err // gitsource names the branch and the remote
	}
	if head == c.loadedHead && c.loadedFleet != nil {
		return head, c.loadedFleet, nil
	}
	tree, err := c.repo.Tree(head, "")
	if err != nil {
		return head, nil, fmt.Errorf("read tree of %s: %w", desired.Hash(head).Short(), err)
	}
	c.setBaseline()
	c.loaderHead = head
	fl, err := c.loader.Load(tree)
	if err != nil {
		return head, nil, err
	}
	c.loadedHead, c.loadedFleet = head, fl
	c.hashes = c.specHashes(fl)
	return head, fl, nil
}

// fetch is repo.Fetch of branch, timed for the metrics; a missing branch
// is git's answer, not its failure.
func (c *Controller) fetch(ctx context.Context, repo *gitsource.Repo, branch string) (string, error) {
	start := time.Now()
	tip, err := repo.Fetch(ctx, branch)
	c.metrics.gitOp(GitFetch, time.Since(start), err != nil && !errors.Is(err, gitsource.ErrBranchNotFound))
	return tip, err
}

// signerFor is the signer of the controller's commits on branch:
// Config.SigningKey on the snapshots branch, nil (unsigned) on any other.
// A signature by a controller key is what agents and the ledger walk take
// as "a snapshots commit a controller wrote", and they check only the
// signature: a signed commit on the status branch, built on a tree anyone
// who can push there chose (a planted ledger.yaml or host file), would be
// that once pushed to the snapshots branch (docs/DESIGN.md, "Signed
// snapshots").
func (c *Controller) signerFor(branch string) gitsource.CommitSigner {
	if branch != c.cfg.SnapshotsBranch {
		return nil
	}
	return c.cfg.SigningKey
}

// update is repo.Update of branch with mutate, each commit on the
// snapshots branch signed with Config.SigningKey when set (never another
// branch's: see signerFor), timed for the metrics as a push; an error of
// mutate itself (the controller's, not git's) is not counted as git's
// failure. A branch of the tip repository this pass fetched is updated on
// that tip (EditAt), and its new tip recorded.
func (c *Controller) update(ctx context.Context, repo *gitsource.Repo, branch string, mutate gitsource.Mutation) (string, error) {
	var own error
	edit := c.editFor(branch, mutate, &own)
	start := time.Now()
	var tip string
	var err error
	if fetched, ok := c.fetched[branch]; ok && repo == c.repoOf(branch) {
		// Built on the tip this pass fetched: no second fetch.
		tip, err = repo.EditAt(ctx, branch, fetched, edit)
	} else {
		tip, err = repo.Edit(ctx, branch, edit)
	}
	c.metrics.gitOp(GitPush, time.Since(start), err != nil && (own == nil || !errors.Is(err, own)))
	if err == nil && c.fetched != nil && repo == c.repoOf(branch) {
		c.fetched[branch] = tip
	}
	return tip, err
}

// updateMany is update of several branches of the tip repository in one
// compare-and-swap write (gitsource.EditMany: one atomic push), each
// built on the tip this pass fetched when it fetched it, the snapshots
// commit signed with Config.SigningKey when set (signerFor); their new
// tips are recorded. With the status branch in a repository of its own
// (Config.StatusURL) each repository's branches are one write, in the
// order given: a later one's failure leaves the earlier written.
func (c *Controller) updateMany(ctx context.Context, branches []string, mutates []gitsource.Mutation) ([]string, error) {
	if c.hosts == c.tips {
		return c.updateManyIn(ctx, c.tips, branches, mutates)
	}
	tips := make([]string, 0, len(branches))
	for i, branch := range branches {
		t, err := c.updateManyIn(ctx, c.repoOf(branch), branches[i:i+1], mutates[i:i+1])
		if err != nil {
			return nil, err
		}
		tips = append(tips, t...)
	}
	return tips, nil
}

// updateManyIn is updateMany of branches that repo holds.
func (c *Controller) updateManyIn(ctx context.Context, repo *gitsource.Repo, branches []string, mutates []gitsource.Mutation) ([]string, error) {
	var own error
	edits := make([]gitsource.BranchEdit, len(branches))
	for i, branch := range branches {
		edits[i] = gitsource.BranchEdit{Branch: branch, Edit: c.editFor(branch, mutates[i], &own)}
		edits[i].Tip, edits[i].Known = c.fetched[branch]
	}
	start := time.Now()
	tips, err := repo.EditMany(ctx, edits)
	c.metrics.gitOp(GitPush, time.Since(start), err != nil && (own == nil || !errors.Is(err, own)))
	if err == nil && c.fetched != nil {
		for i, branch := range branches {
			c.fetched[branch] = tips[i]
		}
	}
	return tips, err
}

// editFor is mutate as the edit of branch: its commit signed as
// signerFor says, and mutate's own error (the controller's, not git's)
// left in *own for the metrics.
func (c *Controller) editFor(branch string, mutate gitsource.Mutation, own *error) gitsource.EditFunc {
	signer := c.signerFor(branch)
	return func(tip *gitsource.Commit, read func(string) ([]byte, error)) (gitsource.Write, error) {
		hash := ""
		if tip != nil {
			hash = tip.Hash
		}
		files, msg, err := mutate(hash, read)
		*own = err
		return gitsource.Write{Files: files, Message: msg, Signer: signer}, err
	}
}

// setBaseline gives the loader the tree of the commit the ledger last
// read says is applied, so that a name defined twice is reported at the
// file the change added. Best effort: without a ledger yet (the first
// pass), or when that commit cannot be read (a force-push dropped it),
// the loader has no baseline and reports the later path. When the applied
// commit is the one the loader read last (this controller published it),
// its tree is not walked again.
func (c *Controller) setBaseline() {
	applied := c.lastLedger().AppliedHash()
	if applied == c.baseline {
		return
	}
	if applied != "" && string(applied) == c.loaderHead && c.loader.SetBaselineLast() {
		c.baseline = applied
		return
	}
	var tree desired.Tree
	if applied != "" {
		t, err := c.repo.Tree(string(applied), "")
		if err != nil {
			c.log.WithError(err).WithField("commit", applied.Short()).Debug("applied commit unreadable; duplicate names are reported at the later path")
		} else {
			tree = t
		}
	}
	if err := c.loader.SetBaseline(tree); err != nil {
		c.log.WithError(err).Debug("baseline not set")
		_ = c.loader.SetBaseline(nil)
		applied = ""
	}
	c.baseline = applied
}

// specHashes returns the spec hash of every VM of fl, reusing the hashes of
// objects the Loader kept from the last load. It runs once per loaded
// commit, not once per pass.
func (c *Controller) specHashes(fl *desired.Fleet) map[*desired.VM]desired.Hash {
	next := make(map[*desired.VM]desired.Hash, len(fl.VMs))
	for _, vm := range fl.VMs {
		h, ok := c.hashes[vm]
		if !ok {
			h = desired.SpecHash(vm.Spec)
		}
		next[vm] = h
	}
	c.hashes = next
	return next
}

// bounded is read limited to files of max bytes at tip, checked before a
// file is read (gitsource.ErrFileTooLarge); read as it is when the branch
// has no tip yet.
func (c *Controller) bounded(tip string, read func(string) ([]byte, error), max int64) func(string) ([]byte, error) {
	if tip == "" {
		return read
	}
	return func(p string) ([]byte, error) { return c.tips.ReadFileMax(tip, p, max) }
}

// ledgerAt returns the ledger a pass computes on at tip and where it was
// read (authenticLedger), from the cache when tip is the one last written
// or read.
func (c *Controller) ledgerAt(ctx context.Context, tip string, read func(string) ([]byte, error)) (*ledgerSource, error) {
	if tip != "" && c.ledgerSrc != nil && tip == c.ledgerSrc.tip {
		return c.ledgerSrc, nil
	}
	src, err := c.authenticLedger(ctx, tip, read)
	if err != nil {
		return nil, err
	}
	c.ledgerSrc = src
	c.epochs.note(src.ledger)
	return src, nil
}

// lastLedger is the ledger last read or written, nil before the first.
func (c *Controller) lastLedger() *snapshots.Ledger {
	if c.ledgerSrc == nil {
		return nil
	}
	return c.ledgerSrc.ledger
}

// readSnapshot reads host's snapshot at the tip; nil when it has none or it
// cannot be parsed (then a tombstone carries no last spec).
func readSnapshot(read func(string) ([]byte, error), host string) (*snapshots.Snapshot, error) {
	data, err := read(snapshots.Path(host))
	if errors.Is(err, gitsource.ErrFileNotFound) {
		return nil, nil
	}
	if errors.Is(err, gitsource.ErrFileTooLarge) || errors.Is(err, gitsource.ErrNotAFile) {
		return nil, nil // refused like one that does not parse
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", snapshots.Path(host), err)
	}
	s, err := snapshots.ParseSnapshot(data)
	if err != nil {
		return nil, nil
	}
	return s, nil
}
