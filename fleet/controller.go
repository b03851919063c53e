package fleet

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/status"
)

// Defaults of Config.
const (
	DefaultBranch          = "main"
	DefaultSnapshotsBranch = "gitfleet/snapshots"
	DefaultStatusBranch    = "gitfleet/status"
	DefaultAbandonGrace    = 15 * time.Minute
	DefaultOfflineAfter    = 3 * time.Minute // three agent heartbeats of 60 s
	DefaultInterval        = 15 * time.Second
	DefaultSummaryInterval = 30 * time.Second
)

// Config configures a Controller. Zero values take the defaults above.
type Config struct {
	// Repo is an opened repository; when nil, New opens URL (with Auth,
	// cached in CacheDir, in memory when empty). It serves the desired
	// branch, whose whole history attribution walks.
	Repo *gitsource.Repo
	// TipRepo serves the snapshots and status branches, of which only the
	// tips are read. When nil and URL is set, New opens URL at depth 1 in
	// memory and opens it afresh every hour, so the status branch (a commit
	// per agent heartbeat) never piles up in the controller; when nil
	// without URL, Repo serves them too.
	TipRepo  *gitsource.Repo
	URL      string
	Auth     gitsource.Auth
	CacheDir string
	// Branch holds the desired state; Path is the objects' directory in it
	// ("" for the repository root), normalized by CleanPath ("./fleet",
	// "fleet/" and "fleet" are one directory; an absolute path or one with
	// ".." leaving the repository is an ErrConfig error).
	Branch string
	Path   string
	// SnapshotsBranch receives the host snapshots and ledger.yaml;
	// StatusBranch holds the agents' statuses and the README.md summary.
	// Branch, SnapshotsBranch and StatusBranch must be three different
	// branches (New returns an ErrConfig error otherwise).
	SnapshotsBranch string
	StatusBranch    string
	// AbandonGrace is how long a tombstone stays pending on an offline host
	// before the controller finalizes it itself (default 15 min; keep it
	// longer than the agents' tombstone grace).
	AbandonGrace time.Duration
	// OfflineAfter is how long the controller must see no change of a
	// host's status file to call it offline (default 3 min: three agent
	// heartbeats). It is measured by the controller's clock from its own
	// observations, so a restarted controller waits OfflineAfter again.
	OfflineAfter time.Duration
	// SummaryInterval is the least time between two rewrites of README.md
	// by the controller's clock (default 30 s; negative: whenever it
	// changed) when only heartbeat counters changed. The summary shows
	// heartbeats, which a thousand agents move every second; the status
	// branch must stay free for their writes. A change held back is written
	// by a later pass. Any other change (phases, pending deletes, errors,
	// epochs, a rejected commit, a host going online or offline) is
	// written at once.
	SummaryInterval time.Duration
	// Clock returns the current time; nil means time.Now. Tests move it.
	Clock func() time.Time
	// Logger receives log lines (component=controller); nil means the
	// standard logrus logger.
	Logger *logrus.Entry
	// Registerer receives the controller's Prometheus metrics; nil means a
	// private registry (see Controller.Registry).
	Registerer prometheus.Registerer
}

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
	log        *logrus.Entry
	clock      func() time.Time
	metrics    *metrics
	reg        *prometheus.Registry

	kick chan struct{}

	mu       sync.Mutex // one pass at a time; guards everything below
	loader   *desired.Loader
	statuses *status.Reader
	live     *liveness
	hashes   map[*desired.VM]string // spec hash of every VM of loadedFleet
	// last good load: the commit and its fleet, so an unchanged head is
	// not loaded again.
	loadedHead  string
	loadedFleet *desired.Fleet
	// ledger cache: the snapshots tip and its parsed ledger.
	ledgerTip string
	ledger    *Ledger
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
	// rejectLogged is the last rejection logged.
	rejectLogged string
}

// PassResult says what one pass observed and did.
type PassResult struct {
	// Head is the desired-state commit the pass read ("" if the fetch
	// failed).
	Head string
	// Rejected is set when the desired state could not be used (invalid
	// objects, a fetch or object error): the last good snapshots stayed.
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
	// Retained lists the objects a history rewrite dropped that this pass
	// kept (never tombstoned); Unretained those desired again on their
	// host. RetainedTotal is the number kept after the pass.
	Retained, Unretained []string
	RetainedTotal        int
	// Repaired lists hosts whose file on the snapshots branch differed from
	// the published one (edited or removed by hand): published again with
	// a new epoch.
	Repaired []string
	// Pending is the number of tombstones pending after the pass.
	Pending int
	// SummaryWritten is true when README.md on the status branch was
	// rewritten.
	SummaryWritten bool
}

// Changed reports whether the pass wrote anything to the snapshots branch.
func (r PassResult) Changed() bool { return len(r.Published) > 0 || len(r.Removed) > 0 }

// New returns a Controller. It opens the repository when cfg.Repo is nil but
// does not fetch; the first Pass does. A configuration that must not run
// (overlapping branches, a path outside the repository) is an error
// wrapping ErrConfig, returned before anything is opened.
func New(cfg Config) (*Controller, error) {
	if cfg.Branch == "" {
		cfg.Branch = DefaultBranch
	}
	if cfg.SnapshotsBranch == "" {
		cfg.SnapshotsBranch = DefaultSnapshotsBranch
	}
	if cfg.StatusBranch == "" {
		cfg.StatusBranch = DefaultStatusBranch
	}
	if cfg.AbandonGrace <= 0 {
		cfg.AbandonGrace = DefaultAbandonGrace
	}
	if cfg.OfflineAfter <= 0 {
		cfg.OfflineAfter = DefaultOfflineAfter
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.SummaryInterval == 0 {
		cfg.SummaryInterval = DefaultSummaryInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	p, err := CleanPath(cfg.Path)
	if err != nil {
		return nil, err
	}
	cfg.Path = p
	if err := distinctBranches(cfg.Branch, cfg.SnapshotsBranch, cfg.StatusBranch); err != nil {
		return nil, err
	}
	c := &Controller{
		cfg:      cfg,
		repo:     cfg.Repo,
		log:      cfg.Logger.WithField("component", "controller"),
		clock:    cfg.Clock,
		kick:     make(chan struct{}, 1),
		loader:   desired.NewLoader(cfg.Path),
		statuses: status.NewReader(),
		hashes:   map[*desired.VM]string{},
	}
	c.live = newLiveness(cfg.Clock(), cfg.OfflineAfter)
	reg := cfg.Registerer
	if reg == nil {
		c.reg = prometheus.NewRegistry()
		reg = c.reg
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	c.metrics = m
	if c.repo == nil {
		if cfg.URL == "" {
			return nil, errors.New("fleet: Config needs Repo or URL")
		}
		repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: cfg.URL, CacheDir: cfg.CacheDir,
			Auth: cfg.Auth, Logger: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", cfg.URL, err)
		}
		c.repo = repo
	}
	c.tips = cfg.TipRepo
	if c.tips == nil {
		c.tips = c.repo
		if cfg.URL != "" {
			if err := c.renewTips(); err != nil {
				return nil, err
			}
		}
	}
	return c, nil
}

// ErrConfig is wrapped by New's errors for a configuration that must not
// run: an objects' path outside the repository, or branches that overlap.
var ErrConfig = errors.New("invalid controller configuration")

// CleanPath normalizes an objects' directory as the loader reads it:
// path.Clean, without leading or trailing slashes, "" for the repository
// root, so "./fleet", "fleet/" and "fleet" are one directory. An absolute
// path or one that climbs out with ".." is an ErrConfig error.
func CleanPath(p string) (string, error) {
	if p == "" {
		return "", nil
	}
	if strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("%w: path %q is absolute; give the objects' directory relative to the repository root", ErrConfig, p)
	}
	c := path.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("%w: path %q leaves the repository", ErrConfig, p)
	}
	if c == "." {
		return "", nil
	}
	return c, nil
}

// distinctBranches refuses a configuration where the desired, snapshots and
// status branches are not three different branches (the controller would
// write its files over the desired state, or over the agents' statuses).
func distinctBranches(desiredBranch, snapshots, statusBranch string) error {
	norm := func(b string) string { return strings.TrimPrefix(b, "refs/heads/") }
	d, sn, st := norm(desiredBranch), norm(snapshots), norm(statusBranch)
	switch {
	case d == sn:
		return fmt.Errorf("%w: the snapshots branch and the desired branch are both %q; they must be different branches", ErrConfig, d)
	case d == st:
		return fmt.Errorf("%w: the status branch and the desired branch are both %q; they must be different branches", ErrConfig, d)
	case sn == st:
		return fmt.Errorf("%w: the snapshots branch and the status branch are both %q; they must be different branches", ErrConfig, sn)
	}
	return nil
}

// tipsRenewal is how long a tip repository opened by the controller is kept
// before it is opened afresh (by the controller's clock).
const tipsRenewal = time.Hour

// renewTips opens a fresh depth-1, in-memory repository for the snapshots
// and status branches.
func (c *Controller) renewTips() error {
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: c.cfg.URL, Auth: c.cfg.Auth,
		Depth: 1, Logger: c.cfg.Logger})
	if err != nil {
		return fmt.Errorf("open %s: %w", c.cfg.URL, err)
	}
	c.tips, c.tipsOpened = repo, c.clock()
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
// default 15 s), whenever the desired branch moves (Watch: polling, and
// fsnotify on a local repository), on Kick, and when the status branch moves
// (at most one such pass per 2 s). A failed pass is logged and retried at
// the next trigger. It returns ctx's error.
func (c *Controller) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		interval = DefaultInterval
	}
	mainCh := c.repo.Watch(ctx, c.cfg.Branch, interval)
	statusCh := c.repo.Watch(ctx, c.cfg.StatusBranch, interval) // resolves heads only: the cache does not grow
	for {
		started := time.Now()
		if _, err := c.Pass(ctx); err != nil && ctx.Err() == nil {
			c.log.WithError(err).Error("pass failed")
		}
		wait := interval/2 + time.Duration(rand.Int64N(int64(interval)+1))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-mainCh:
		case <-c.kick:
		case <-t.C:
		case <-statusCh:
			// Agents write often; a status change waits out the gap so
			// a thousand heartbeats do not become a thousand passes.
			gap := time.NewTimer(time.Until(started.Add(statusGap)))
			select {
			case <-ctx.Done():
				gap.Stop()
				t.Stop()
				return ctx.Err()
			case <-mainCh:
			case <-c.kick:
			case <-gap.C:
			}
			gap.Stop()
		}
		t.Stop()
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
// branch or path) or ErrEpochBound (a status asks for an epoch past
// MaxEpoch), both wrapped with the names a person needs to fix it.
func (c *Controller) Pass(ctx context.Context) (PassResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	start := time.Now()
	res, err := c.pass(ctx)
	c.metrics.observe(res, err, time.Since(start))
	log := c.log.WithField("commit", short(res.Head))
	if res.Head == "" {
		// No commit was read (a failed fetch, a missing branch): name the
		// branch instead of an empty commit.
		log = c.log.WithField("branch", c.cfg.Branch)
	}
	switch {
	case err != nil:
		log.WithError(err).Warn("pass failed")
	case res.Rejected != nil:
		// Once per rejection, not once per pass.
		if key := res.Head + "\x00" + res.Rejected.Error(); key != c.rejectLogged {
			c.rejectLogged = key
			log.WithError(res.Rejected).Error("desired state rejected; the last good snapshots stay")
		}
	case res.Skipped:
		log.Debug("nothing changed")
	case res.Changed():
		log.WithFields(logrus.Fields{"published": len(res.Published), "removed": len(res.Removed),
			"pending": res.Pending, "snapshots": short(res.SnapshotsCommit)}).Info("snapshots published")
	default:
		log.WithFields(logrus.Fields{"pending": res.Pending}).Debug("pass done, nothing to publish")
	}
	return res, err
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// pass is Pass's steps, in order; the first error stops it.
func (c *Controller) pass(ctx context.Context) (PassResult, error) {
	var res PassResult
	now := c.clock()
	if !c.tipsOpened.IsZero() && now.Sub(c.tipsOpened) > tipsRenewal {
		if err := c.renewTips(); err != nil {
			c.log.WithError(err).Warn("renew the tip repository; keeping the old one")
		} else {
			// The ledger cache is keyed by tip and stays valid.
			c.log.Debug("tip repository opened afresh")
		}
	}

	// Step 1: read desired. Any error keeps the last good snapshots.
	head, fl, loadErr := c.readDesired(ctx)
	res.Head = head
	res.Rejected = loadErr

	// Step 2: read the hosts' statuses; a failure disables the sweep.
	statusTip, reports, statusErr := c.readStatuses(ctx)
	statuses := map[string]*status.Status{}
	if statusErr == nil {
		for _, rep := range reports {
			c.live.observe(rep.Host, rep.ID, now)
			if rep.Status != nil {
				statuses[rep.Host] = rep.Status
			} else {
				c.log.WithField("host", rep.Host).WithError(rep.Err).Warn("status file unreadable")
			}
		}
	} else {
		c.log.WithError(statusErr).Warn("read statuses; no delete is finalized this pass")
	}
	if fl != nil {
		for h := range fl.Hosts {
			c.live.watch(h, now)
		}
	}

	// Skip work when nothing observable changed since a pass that left
	// nothing waiting (lastKey, set at the end of a pass).
	// The snapshots tip is in the key too (the ref advertisement only): a
	// hand edit of the snapshots branch is repaired at the next pass.
	snapsTip, _ := c.tips.RemoteHead(ctx, c.cfg.SnapshotsBranch)
	offlineSet := c.live.offlineSet(now)
	keyAt := func(snaps string) string {
		return fmt.Sprintf("%s|%s|%s|%v|%s", head, snaps, statusTip, statusErr == nil, offlineSet)
	}
	key := keyAt(snapsTip)
	if loadErr == nil && statusErr == nil && key == c.lastKey {
		res.Skipped = true
		return res, nil
	}

	// Step 3: compute on the snapshots tip and publish in one CAS commit.
	hashes := c.hashes
	var out *output
	mutate := func(tip string, read func(string) ([]byte, error)) (map[string][]byte, string, error) {
		l, err := c.ledgerAt(tip, read)
		if err != nil {
			return nil, "", err
		}
		verify := read
		if tip != "" && tip == c.verifiedTip {
			verify = nil
		}
		o, err := compute(input{
			branch: c.cfg.Branch, head: head, fleet: fl, loadErr: loadErr,
			path:   c.cfg.Path,
			ledger: l, statuses: statuses, statusOK: statusErr == nil,
			offline: func(h string) (bool, time.Duration) { return c.live.offline(h, now) },
			now:     now, grace: c.cfg.AbandonGrace,
			attribute: func(refs []ref) (map[ref]desired.Tombstone, error) {
				return attribute(c.repo, c.cfg.Path, l.Applied.Commit, head, refs)
			},
			rewritten: func() (bool, error) {
				anc, err := c.repo.IsAncestor(l.Applied.Commit, head)
				return !anc, err
			},
			readTip: verify,
			lastSnapshot: func(host string) (*desired.Snapshot, error) {
				return readSnapshot(c.bounded(tip, read, desired.MaxSnapshotBytes), host)
			},
			specHash: func(vm *desired.VM) string { return hashes[vm] },
		})
		if err != nil {
			return nil, "", err
		}
		out = o
		data, err := o.ledger.marshal()
		if err != nil {
			return nil, "", err
		}
		old, err := read(LedgerPath)
		if err != nil && !errors.Is(err, gitsource.ErrFileNotFound) {
			return nil, "", fmt.Errorf("read %s: %w", LedgerPath, err)
		}
		if len(o.files) == 0 && string(old) == string(data) {
			return nil, "", nil
		}
		files := o.files
		files[LedgerPath] = data
		return files, commitMessage(head, o), nil
	}
	tip, err := c.tips.Update(ctx, c.cfg.SnapshotsBranch, mutate)
	if err != nil {
		return res, fmt.Errorf("publish snapshots: %w", err)
	}
	res.SnapshotsCommit = tip
	if out == nil {
		return res, errors.New("publish snapshots: no computation ran")
	}
	// The written ledger is the ledger at the new tip, and its files are
	// the ones it describes.
	c.ledgerTip, c.ledger, c.verifiedTip = tip, out.ledger, tip
	c.report(&res, out)
	if out.rejected != nil {
		// Refused by the computation: report it like any rejection, and
		// summarize without the refused state.
		res.Rejected, fl = out.rejected, nil
	}

	// Step 4: the summary on the status branch.
	sum := c.summarize(out.ledger, fl, reports, statusErr == nil, now)
	written, err := c.writeSummary(ctx, sum, now)
	if err != nil {
		return res, fmt.Errorf("write summary: %w", err)
	}
	res.SummaryWritten = written
	// The next pass may skip on the same inputs only when this one left
	// nothing waiting: no rejection to retry, no tombstone waiting for an
	// ack or for time to pass, no summary held back, and no summary just
	// written (our write moved the status tip; the next pass reads it).
	c.lastKey = ""
	if res.Rejected == nil && statusErr == nil && len(out.ledger.Tombstones) == 0 && !written && !c.summaryDue {
		c.lastKey = keyAt(tip)
	}
	return res, nil
}

// readDesired fetches the desired branch and loads its tree. The error is
// the reason the desired state is rejected.
func (c *Controller) readDesired(ctx context.Context) (string, *desired.Fleet, error) {
	head, err := c.repo.Fetch(ctx, c.cfg.Branch)
	if errors.Is(err, gitsource.ErrBranchNotFound) {
		return "", nil, fmt.Errorf("the desired branch %q is missing from the repository (deleted, or never pushed): %w", c.cfg.Branch, err)
	}
	if err != nil {
		return "", nil, fmt.Errorf("fetch %s: %w", c.cfg.Branch, err)
	}
	if head == c.loadedHead && c.loadedFleet != nil {
		return head, c.loadedFleet, nil
	}
	tree, err := c.repo.Tree(head, "")
	if err != nil {
		return head, nil, fmt.Errorf("read tree of %s: %w", short(head), err)
	}
	fl, err := c.loader.Load(tree)
	if err != nil {
		return head, nil, err
	}
	c.loadedHead, c.loadedFleet = head, fl
	c.hashes = c.specHashes(fl)
	return head, fl, nil
}

// readStatuses fetches the status branch (absent: no statuses yet) and
// reads every host's status.
func (c *Controller) readStatuses(ctx context.Context) (string, []status.Report, error) {
	tip, err := c.tips.Fetch(ctx, c.cfg.StatusBranch)
	if errors.Is(err, gitsource.ErrBranchNotFound) {
		return "", nil, nil
	}
	if err != nil {
		return "", nil, fmt.Errorf("fetch %s: %w", c.cfg.StatusBranch, err)
	}
	tree, err := c.tips.Tree(tip, "")
	if err != nil {
		return tip, nil, fmt.Errorf("read tree of %s: %w", short(tip), err)
	}
	reps, err := c.statuses.ReadAll(tree)
	if err != nil {
		return tip, nil, err
	}
	return tip, reps, nil
}

// specHashes returns the spec hash of every VM of fl, reusing the hashes of
// objects the Loader kept from the last load. It runs once per loaded
// commit, not once per pass.
func (c *Controller) specHashes(fl *desired.Fleet) map[*desired.VM]string {
	next := make(map[*desired.VM]string, len(fl.VMs))
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

// MaxLedgerBytes is the largest ledger.yaml the controller reads (64 MiB;
// ten thousand objects take a few). A bigger one is refused by its size
// before it is read: the pass fails and says so, as for a ledger that does
// not parse.
const MaxLedgerBytes = 64 << 20

// bounded is read limited to files of max bytes at tip, checked before a
// file is read (gitsource.ErrFileTooLarge); read as it is when the branch
// has no tip yet.
func (c *Controller) bounded(tip string, read func(string) ([]byte, error), max int64) func(string) ([]byte, error) {
	if tip == "" {
		return read
	}
	return func(p string) ([]byte, error) { return c.tips.ReadFileMax(tip, p, max) }
}

// ledgerAt returns the ledger at tip, from the cache when tip is the one
// last written or read.
func (c *Controller) ledgerAt(tip string, read func(string) ([]byte, error)) (*Ledger, error) {
	if tip != "" && tip == c.ledgerTip && c.ledger != nil {
		return c.ledger, nil
	}
	data, err := c.bounded(tip, read, MaxLedgerBytes)(LedgerPath)
	if errors.Is(err, gitsource.ErrFileNotFound) {
		return newLedger(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", LedgerPath, err)
	}
	l, err := parseLedger(data)
	if err != nil {
		return nil, err
	}
	c.ledgerTip, c.ledger = tip, l
	return l, nil
}

// readSnapshot reads host's snapshot at the tip; nil when it has none or it
// cannot be parsed (then a tombstone carries no last spec).
func readSnapshot(read func(string) ([]byte, error), host string) (*desired.Snapshot, error) {
	data, err := read(SnapshotPath(host))
	if errors.Is(err, gitsource.ErrFileNotFound) {
		return nil, nil
	}
	if errors.Is(err, gitsource.ErrFileTooLarge) {
		return nil, nil // refused like one that does not parse
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", SnapshotPath(host), err)
	}
	s, err := desired.ParseSnapshot(data)
	if err != nil {
		return nil, nil
	}
	return s, nil
}

func commitMessage(head string, o *output) string {
	var b strings.Builder
	hosts := make([]string, 0, len(o.published))
	for h := range o.published {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	if len(hosts) > 0 {
		fmt.Fprintf(&b, "Publish %d host snapshot(s) from %s\n\n", len(hosts), short(head))
		for _, h := range hosts {
			fmt.Fprintf(&b, "%s: epoch %d\n", h, o.published[h])
		}
	} else if head != "" {
		fmt.Fprintf(&b, "Update the ledger at %s\n", short(head))
	} else {
		fmt.Fprintf(&b, "Update the ledger: the desired state could not be read\n")
	}
	for _, k := range o.retained {
		fmt.Fprintf(&b, "kept %s after a history rewrite at %s\n", k.ref(), short(k.Commit))
	}
	for _, r := range o.unretained {
		fmt.Fprintf(&b, "%s desired again: no longer kept\n", r)
	}
	for _, h := range o.repaired {
		fmt.Fprintf(&b, "%s: the file on the branch differed from the published one; published again\n", h)
	}
	for _, t := range o.tombstoned {
		fmt.Fprintf(&b, "tombstone %s (removed by %s, %s)\n", t.ref(), short(t.Tombstone.Commit), t.Tombstone.Author)
	}
	for _, r := range o.finalized {
		fmt.Fprintf(&b, "finalized %s (acked)\n", r)
	}
	for _, s := range o.swept {
		fmt.Fprintf(&b, "finalized %s %s on %s (%s)\n", s.Kind, s.Name, s.Host, s.Reason)
	}
	return b.String()
}

func refName(r ref) string { return fmt.Sprintf("%s %s@%s", r.Kind, r.Name, r.Host) }

// report copies the computation's decisions into res and logs them.
func (c *Controller) report(res *PassResult, o *output) {
	res.Published = o.published
	res.FenceJumps = o.fenceJumps
	res.Epochs = make(map[string]uint64, len(o.ledger.Hosts))
	for h, rec := range o.ledger.Hosts {
		res.Epochs[h] = rec.Epoch
	}
	for p, data := range o.files {
		if data == nil {
			if h, ok := status.HostFromPath(p); ok {
				res.Removed = append(res.Removed, h)
			}
		}
	}
	sort.Strings(res.Removed)
	for _, t := range o.tombstoned {
		res.Tombstoned = append(res.Tombstoned, refName(t.ref()))
		c.log.WithFields(logrus.Fields{"host": t.Host, "kind": t.Kind, "name": t.Name,
			"commit": short(t.Tombstone.Commit), "author": t.Tombstone.Author, "rewritten": t.Tombstone.Rewritten}).Info("tombstoned")
	}
	for _, r := range o.undeleted {
		res.Undeleted = append(res.Undeleted, refName(r))
		c.log.WithFields(logrus.Fields{"host": r.Host, "kind": r.Kind, "name": r.Name}).Info("un-deleted")
	}
	for _, r := range o.finalized {
		res.Finalized = append(res.Finalized, refName(r))
		c.log.WithFields(logrus.Fields{"host": r.Host, "kind": r.Kind, "name": r.Name}).Info("delete finalized: acked")
	}
	for _, s := range o.swept {
		res.Swept = append(res.Swept, refName(ref{s.Kind, s.Name, s.Host}))
		c.log.WithFields(logrus.Fields{"host": s.Host, "kind": s.Kind, "name": s.Name}).Warn("delete finalized: " + s.Reason)
	}
	for h, e := range o.fenceJumps {
		c.log.WithFields(logrus.Fields{"host": h, "epoch": e}).Warn("fence recovery: a host saw an epoch above the ledger's; jumping past it")
	}
	for h, e := range o.published {
		c.log.WithFields(logrus.Fields{"host": h, "epoch": e}).Debug("snapshot published")
	}
	for _, k := range o.retained {
		res.Retained = append(res.Retained, refName(k.ref()))
		c.log.WithFields(logrus.Fields{"host": k.Host, "kind": k.Kind, "name": k.Name, "commit": short(k.Commit)}).
			Warn("history rewritten: object absent from the new head kept, not deleted; restore its file, or re-add and delete it in a reviewed commit")
	}
	for _, r := range o.unretained {
		res.Unretained = append(res.Unretained, refName(r))
		c.log.WithFields(logrus.Fields{"host": r.Host, "kind": r.Kind, "name": r.Name}).Info("kept object desired again")
	}
	for _, h := range o.repaired {
		res.Repaired = append(res.Repaired, h)
		c.log.WithFields(logrus.Fields{"host": h, "epoch": o.published[h]}).Warn("snapshot file on the branch differed from the published one; published again")
	}
	res.Pending = len(o.ledger.Tombstones)
	res.RetainedTotal = len(o.ledger.Retained)
}

// summarize builds the README.md summary.
func (c *Controller) summarize(l *Ledger, fl *desired.Fleet, reports []status.Report, statusOK bool, now time.Time) status.Summary {
	s := status.Summary{Branch: c.cfg.Branch}
	if l.Applied != nil {
		s.Applied = l.Applied.Commit
	}
	if l.Rejected != nil {
		s.Rejected = &status.Rejection{Commit: l.Rejected.Commit, At: l.Rejected.At, Reason: l.Rejected.Reason,
			SupersededBy: l.Rejected.Superseded}
	}
	hosts := map[string]*status.HostSummary{}
	get := func(name string) *status.HostSummary {
		h := hosts[name]
		if h == nil {
			h = &status.HostSummary{Name: name}
			hosts[name] = h
		}
		return h
	}
	if fl != nil {
		for name := range fl.Hosts {
			get(name)
		}
	}
	for name, rec := range l.Hosts {
		if rec.Hash != "" || fl == nil {
			get(name) // its epoch is set below, with every host's
		}
	}
	for _, rep := range reports {
		h := get(rep.Host)
		h.Reported = true
		if rep.Err != nil {
			h.StatusError = rep.Err.Error()
			continue
		}
		st := rep.Status
		h.Heartbeat, h.Accel, h.AgentVersion = st.Heartbeat, st.Agent.Accel, st.Agent.Version
		h.LastSeenEpoch, h.FenceViolation, h.VMs = st.LastSeenEpoch, st.FenceViolation, st.VMs
	}
	for _, h := range hosts {
		if rec := l.Hosts[h.Name]; rec != nil {
			h.Epoch = rec.Epoch
		}
		if statusOK && h.Reported {
			off, _ := c.live.offline(h.Name, now)
			h.Online = !off
		}
		s.Hosts = append(s.Hosts, *h)
	}
	sort.Slice(s.Hosts, func(i, j int) bool { return s.Hosts[i].Name < s.Hosts[j].Name })
	for _, t := range l.Tombstones {
		at, _ := time.Parse(time.RFC3339, t.Tombstone.Time)
		s.Pending = append(s.Pending, status.PendingDelete{Kind: string(t.Kind), Name: t.Name, Host: t.Host,
			Commit: t.Tombstone.Commit, Author: t.Tombstone.Author, Time: at, Epoch: t.Tombstone.Epoch,
			Rewritten: t.Tombstone.Rewritten})
	}
	for _, k := range l.Retained {
		s.Retained = append(s.Retained, status.RetainedObject{Kind: string(k.Kind), Name: k.Name, Host: k.Host,
			Commit: k.Commit, Since: k.Since})
	}
	s.Unmanaged = unmanaged(l, fl, reports)
	sweeps := l.Sweeps
	if len(sweeps) > 10 {
		sweeps = sweeps[len(sweeps)-10:]
	}
	for _, w := range sweeps {
		s.Swept = append(s.Swept, status.SweptDelete{Kind: string(w.Kind), Name: w.Name, Host: w.Host,
			Commit: w.Commit, At: w.At, Reason: w.Reason})
	}
	return s
}

// unmanaged lists the VMs hosts report that neither the desired state nor
// the ledger knows on that host (a repository restored from a backup that
// lacks them, say), and every VM a host reports as vanished (dropped from its
// snapshot without a tombstone): the agents keep them, and the summary says
// so.
func unmanaged(l *Ledger, fl *desired.Fleet, reports []status.Report) []status.UnmanagedVM {
	// Every pass renders the summary, so the common case (each reported VM
	// is desired on its host) costs one map lookup per VM; the ledger's
	// lists are only searched for the rare VM the desired state lacks.
	known := func(host, name string) bool {
		if fl != nil {
			if vm, ok := fl.VMs[name]; ok && vm.Spec.Host == host {
				return true
			}
		}
		if rec, ok := l.Hosts[host]; ok && slices.Contains(rec.VMs, name) {
			return true
		}
		for _, t := range l.Tombstones {
			if t.Kind == desired.KindVM && t.Host == host && t.Name == name {
				return true
			}
		}
		for _, k := range l.Retained {
			if k.Kind == desired.KindVM && k.Host == host && k.Name == name {
				return true
			}
		}
		return false
	}
	var out []status.UnmanagedVM
	for _, rep := range reports {
		if rep.Status == nil {
			continue
		}
		for _, vm := range rep.Status.VMs {
			if !known(rep.Host, vm.Name) {
				out = append(out, status.UnmanagedVM{Name: vm.Name, Host: rep.Host, Phase: vm.Phase})
			}
		}
		// A VM the agent's accepted snapshot dropped without a tombstone is
		// reported apart from its VMs, and is kept whatever the ledger says.
		for _, v := range rep.Status.Vanished {
			phase := "vanished, " + v.Power
			if v.Quarantined {
				phase = "vanished, shut down"
			}
			out = append(out, status.UnmanagedVM{Name: v.Name, Host: rep.Host, Phase: phase})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Host != out[j].Host {
			return out[i].Host < out[j].Host
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// writeSummary rewrites README.md on the status branch when its content
// changed, touching no other file.
func (c *Controller) writeSummary(ctx context.Context, s status.Summary, now time.Time) (bool, error) {
	data := status.RenderSummary(s)
	if string(data) == string(c.summary) {
		c.summaryDue = false
		return false, nil
	}
	key := summaryKey(s)
	heartbeatsOnly := string(key) == string(c.summaryKey)
	if heartbeatsOnly && c.cfg.SummaryInterval > 0 && !c.summaryAt.IsZero() && now.Sub(c.summaryAt) < c.cfg.SummaryInterval {
		c.summaryDue = true
		return false, nil
	}
	wrote := false
	_, err := c.tips.Update(ctx, c.cfg.StatusBranch, func(tip string, read func(string) ([]byte, error)) (map[string][]byte, string, error) {
		wrote = false
		old, err := read(status.SummaryPath)
		if err != nil && !errors.Is(err, gitsource.ErrFileNotFound) {
			return nil, "", fmt.Errorf("read %s: %w", status.SummaryPath, err)
		}
		if string(old) == string(data) {
			return nil, "", nil
		}
		wrote = true
		return map[string][]byte{status.SummaryPath: data}, "Update the fleet summary", nil
	})
	if err != nil {
		return false, err
	}
	c.summary, c.summaryKey, c.summaryAt, c.summaryDue = data, key, now, false
	return wrote, nil
}

// summaryKey renders s with its heartbeat-driven fields (the hosts'
// heartbeat counters) blanked: two summaries with equal keys differ only in
// what agents move on every write, which SummaryInterval may hold back.
func summaryKey(s status.Summary) []byte {
	hosts := make([]status.HostSummary, len(s.Hosts))
	copy(hosts, s.Hosts)
	for i := range hosts {
		hosts[i].Heartbeat = 0
	}
	s.Hosts = hosts
	return status.RenderSummary(s)
}
