package fleet

import (
	"context"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/trust"
)

// Defaults of Config.
const (
	DefaultBranch          = "main"
	DefaultSnapshotsBranch = snapshots.Branch
	DefaultStatusBranch    = status.Branch
	DefaultAbandonGrace    = 15 * time.Minute
	DefaultOfflineAfter    = 3 * time.Minute // three agent heartbeats of 60 s
	DefaultInterval        = 15 * time.Second
	DefaultSummaryInterval = 10 * time.Minute
)

// Config configures a Controller. Zero values take the defaults above.
type Config struct {
	// Repo is an opened repository; when nil, New opens URL (with Auth,
	// cached in CacheDir, in memory when empty). It serves the desired
	// branch, whose whole history attribution walks.
	Repo *gitsource.Repo
	// TipRepo serves the snapshots and status branches, of which only the
	// tips are read. When nil and URL is set, New opens URL at depth 1 —
	// in TipsCacheDir, or in memory and opened afresh every hour and
	// whenever its object data passes gitsource's bound (16 MiB and four
	// times its fresh clone), so neither the status branch (a commit per
	// agent heartbeat) nor the published ledgers pile up in the
	// controller; when nil without URL, Repo serves them too.
	TipRepo *gitsource.Repo
	// StatusURL, when set and not URL, is the repository of the status
	// branch and the host branches (the agents' statusRepo): the agents'
	// writes and the controller's copies and summary then never touch
	// URL's repository (its hooks, CI triggers, webhooks, protections),
	// which keeps the desired branch and the snapshots branch. It is
	// opened at depth 1 as TipRepo is (in memory, renewed with it), with
	// Auth. StatusRepo, when given, serves those branches instead.
	StatusURL  string
	StatusRepo *gitsource.Repo
	URL        string
	Auth       gitsource.Auth
	CacheDir   string
	// TipsCacheDir keeps the depth-1 clone of the snapshots and status
	// branches on disk (its upkeep bounds it; see gitsource); empty keeps
	// it in memory, where every blob on those branches, a forged one too,
	// costs its size in memory. It must differ from CacheDir.
	TipsCacheDir string
	// GitTimeout bounds each git operation of the repositories New opens
	// (one fetch, ls-remote or push); 0 means gitsource.DefaultTimeout.
	GitTimeout time.Duration
	// Branch holds the desired state; Path is the objects' directory in it
	// ("" for the repository root), normalized by CleanPath ("./fleet",
	// "fleet/" and "fleet" are one directory; an absolute path or one with
	// ".." leaving the repository is an ErrConfig error).
	Branch string
	Path   string
	// SnapshotsBranch receives the host snapshots and ledger.yaml;
	// StatusBranch, which the controller alone writes, holds the README.md
	// summary and a copy of every host's status, read from the host
	// branches (status.HostBranchPrefix) the agents write. Branch,
	// SnapshotsBranch and StatusBranch must be three different branches,
	// none of them a host branch (New returns an ErrConfig error
	// otherwise).
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
	// SummaryInterval is the least time between two writes of the status
	// branch by the controller's clock (default 10 min; negative: whenever
	// it changed) when only heartbeat counters changed, in README.md or in
	// the hosts' status copies. A thousand agents move heartbeats every
	// few milliseconds; the status branch's history must grow with events.
	// A change held back is written by a later pass. Any other change
	// (phases, acks, pending deletes, errors, epochs, a rejected commit, a
	// host going online or offline) is written at once. It is also the
	// longest the controller lets pass without writing the status branch
	// when nothing changed at all (DefaultSummaryInterval when it is
	// negative): status.LastWritePath records each write, and readers call a
	// controller stale after status.StaleRefreshes of them.
	SummaryInterval time.Duration
	// Verify is which desired-state commits must be signed by one of
	// Signers before a head is applied (VerifyOff, the default, VerifyHead
	// or VerifyEvery); a head that is not is rejected like an invalid
	// commit. Signers must be set unless Verify is off (ErrConfig).
	Verify  VerifyMode
	Signers *trust.Signers
	// SigningKey, when set, signs every commit the controller writes on
	// the snapshots branch, and none on the status branch (its tree is
	// anyone's; docs/DESIGN.md, "Signed snapshots") (trust.CommitSigner:
	// an SSH signature in git's gpgsig format, which `git verify-commit`
	// accepts). Agents given the public key (controllerKeys) accept only
	// snapshots signed with it (docs/DESIGN.md, "Signed snapshots"). Nil
	// writes unsigned commits.
	SigningKey gitsource.CommitSigner
	// ControllerKeys are the public keys of other controllers whose
	// snapshots commits this one trusts besides its own, for a second
	// controller or a key rotation (as an agent's controllerKeys, e.g.
	// trust.ParseAllowedSigners of the file agents take as
	// controllerKeysFile). With a SigningKey the controller acts only on the ledger
	// of the newest snapshots commit one of these keys or its own signed
	// (docs/DESIGN.md, "Authentic ledger"). Needs SigningKey.
	ControllerKeys []trust.SSHSigner
	// TrustUnsignedLedgerOnce is the full hash (40 or 64 hex digits) of
	// the snapshots commit whose ledger a person checked: a controller
	// with a SigningKey adopts the ledger at the snapshots tip when no
	// commit within MaxLedgerWalk is signed by a controller key (the
	// first start with a key) and the tip is that commit, until this
	// process has written its first signed commit. Another tip is
	// refused naming both hashes; "" refuses every such branch
	// (ErrUnsignedLedger).
	TrustUnsignedLedgerOnce string
	// MaxDeletes is the mass-delete guard's limit (DeleteGuard): 0 means
	// DefaultMaxDeletes (10), negative turns the guard off.
	MaxDeletes int
	// Clock returns the current time; nil means time.Now. Tests move it.
	Clock func() time.Time
	// Logger receives log lines (component=controller); nil means the
	// standard logrus logger.
	Logger *logrus.Entry
	// Registerer receives the controller's Prometheus metrics; nil means a
	// private registry (see Controller.Registry).
	Registerer prometheus.Registerer
}

// New returns a Controller. It opens the repository when cfg.Repo is nil but
// does not fetch; the first Pass does. It locks the cache directories it
// opens (CacheDir, TipsCacheDir) until Close or the end of the process: one
// held by another controller is an error wrapping ErrCacheInUse. A configuration that must not run
// (overlapping branches, a path outside the repository) is an error
// wrapping ErrConfig, returned before anything is opened.
func New(cfg Config) (*Controller, error) {
	cfg, lkeys, err := validate(withDefaults(cfg))
	if err != nil {
		return nil, err
	}
	locks, err := lockCaches(cfg)
	if err != nil {
		return nil, err
	}
	c := &Controller{
		locks:      locks,
		cfg:        cfg,
		repo:       cfg.Repo,
		log:        cfg.Logger.WithField("component", "controller"),
		clock:      cfg.Clock,
		kick:       make(chan struct{}, 1),
		loader:     desired.NewLoader(cfg.Path),
		statuses:   status.NewReader(),
		live:       newLiveness(cfg.Clock(), cfg.OfflineAfter),
		hashes:     map[*desired.VM]desired.Hash{},
		ignored:    map[string]bool{},
		ledgerKeys: lkeys,
		seen:       trust.NewFirstSeen(snapshots.MaxSignaturesSeen),
		snapSeen:   trust.NewFirstSeen(maxSnapshotsSeen),
		epochs:     openEpochMemory(cfg.CacheDir, cfg.Logger.WithField("component", "controller")),
	}
	for _, open := range []func() error{c.registerMetrics, c.openRepo, c.openTips} {
		if err := open(); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// withDefaults is cfg with every zero value that has a default (see
// Config) set to it.
func withDefaults(cfg Config) Config {
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
	if cfg.MaxDeletes == 0 {
		cfg.MaxDeletes = DefaultMaxDeletes
	}
	return cfg
}

// validate refuses a configuration that must not run (an error wrapping
// ErrConfig) and returns it with Verify parsed and Path cleaned
// (CleanPath), with the keys whose snapshots commits the controller trusts
// (ledgerKeys; nil without a signing key).
func validate(cfg Config) (Config, *trust.Signers, error) {
	mode, err := ParseVerifyMode(string(cfg.Verify))
	if err != nil {
		return cfg, nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	cfg.Verify = mode
	if mode != VerifyOff && cfg.Signers == nil {
		return cfg, nil, fmt.Errorf("%w: verifying signatures (%s) needs allowed signers: an allowed-signers file or an OpenPGP keyring", ErrConfig, mode)
	}
	lkeys, err := ledgerKeys(cfg)
	if err != nil {
		return cfg, nil, err
	}
	if cfg.Path, err = CleanPath(cfg.Path); err != nil {
		return cfg, nil, err
	}
	if err := distinctBranches(cfg.Branch, cfg.SnapshotsBranch, cfg.StatusBranch); err != nil {
		return cfg, nil, err
	}
	if cfg.TipsCacheDir != "" && filepath.Clean(cfg.TipsCacheDir) == filepath.Clean(cfg.CacheDir) {
		return cfg, nil, fmt.Errorf("%w: the tips cache and the cache are both %s; one directory holds one clone", ErrConfig, cfg.CacheDir)
	}
	return cfg, lkeys, nil
}

// lockCaches locks the cache directories New opens: CacheDir unless Repo
// is given, TipsCacheDir unless TipRepo is (lockCache). It holds all of
// them or, with an error, none.
func lockCaches(cfg Config) ([]*cacheLock, error) {
	var locks []*cacheLock
	for _, dir := range []string{cfg.CacheDir, cfg.TipsCacheDir} {
		if dir == "" || (dir == cfg.CacheDir && cfg.Repo != nil) || (dir == cfg.TipsCacheDir && cfg.TipRepo != nil) {
			continue // no cache, or not one New opens
		}
		l, err := lockCache(dir)
		if err != nil {
			for _, held := range locks {
				held.release()
			}
			return nil, err
		}
		locks = append(locks, l)
	}
	return locks, nil
}

// registerMetrics registers the controller's metrics with
// Config.Registerer, or with a private registry (Registry) when it is nil.
func (c *Controller) registerMetrics() error {
	reg := c.cfg.Registerer
	if reg == nil {
		c.reg = prometheus.NewRegistry()
		reg = c.reg
	}
	m, err := newMetrics(reg)
	if err != nil {
		return err
	}
	c.metrics = m
	return nil
}

// openRepo opens Config.URL as the desired branch's repository, unless
// Config.Repo is given. It does not fetch.
func (c *Controller) openRepo() error {
	if c.repo != nil {
		return nil
	}
	cfg := c.cfg
	if cfg.URL == "" {
		return errors.New("fleet: Config needs Repo or URL")
	}
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: cfg.URL, CacheDir: cfg.CacheDir,
		Auth: cfg.Auth, Timeout: cfg.GitTimeout, Logger: cfg.Logger})
	if err != nil {
		return err // "open git source URL: …"
	}
	c.repo = repo
	return nil
}

// openTips sets the repository of the snapshots and status branches:
// Config.TipRepo when given, else a depth-1 clone of Config.URL
// (renewTips), else the desired branch's repository.
func (c *Controller) openTips() error {
	if c.tips = c.cfg.TipRepo; c.tips != nil {
		return c.openHosts()
	}
	c.tips = c.repo
	if c.cfg.URL == "" {
		return c.openHosts()
	}
	return c.renewTips()
}

// openHosts sets the repository of the status and host branches:
// Config.StatusRepo when given, else Config.StatusURL's at depth 1 when
// it is set and not URL (renewed with the tips), else the tip repository.
func (c *Controller) openHosts() error {
	switch {
	case c.cfg.StatusRepo != nil:
		c.hosts = c.cfg.StatusRepo
	case c.splitStatus():
		repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: c.cfg.StatusURL, Auth: c.cfg.Auth,
			Depth: 1, Timeout: c.cfg.GitTimeout, Logger: c.cfg.Logger})
		if err != nil {
			return fmt.Errorf("status repository: %w", err)
		}
		c.hosts = repo
	default:
		c.hosts = c.tips
	}
	c.hostTrees = nil
	return nil
}

// splitStatus reports whether the status and host branches are in a
// repository of their own, opened from Config.StatusURL.
func (c *Controller) splitStatus() bool {
	return c.cfg.StatusURL != "" && c.cfg.StatusURL != c.cfg.URL
}

// repoOf is the repository that holds branch: the status branch is the
// hosts', every other gitfleet branch the tips'.
func (c *Controller) repoOf(branch string) *gitsource.Repo {
	if branch == c.cfg.StatusBranch {
		return c.hosts
	}
	return c.tips
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
	for _, b := range []string{d, sn, st} {
		if strings.HasPrefix(b, status.HostBranchPrefix) {
			return fmt.Errorf("%w: branch %q is under %s, where each host's agent writes its own status", ErrConfig, b, status.HostBranchPrefix)
		}
	}
	return nil
}
