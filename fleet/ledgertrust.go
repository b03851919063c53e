package fleet

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/trust"
)

// MaxLedgerWalk bounds the first-parent commits of the snapshots branch a
// controller with a signing key walks back from the tip to find the
// newest commit a controller key signed (docs/DESIGN.md, "Authentic
// ledger"). A branch with no such commit within it is refused
// (ErrUnsignedLedger).
const MaxLedgerWalk = 200

// ErrUnsignedLedger is wrapped by the refusal of a pass whose snapshots
// branch holds no commit signed by a controller key within MaxLedgerWalk
// first-parent commits of its tip: the ledger there is no record of what
// a controller wrote. The message names TrustUnsignedLedgerOnceFlag.
var ErrUnsignedLedger = errors.New("no snapshots commit signed by a controller key")

// TrustUnsignedLedgerOnceFlag is the controller flag that lets it adopt
// an unsigned ledger the first time it signs (Config.TrustUnsignedLedgerOnce).
const TrustUnsignedLedgerOnceFlag = "--trust-unsigned-ledger-once"

// ForgedCommit is a commit on the snapshots branch above the newest one a
// controller key signed: the controller read the ledger of Signed instead,
// and writes its next commit on top of Commit, repairing every host file
// that differs from what it computes.
type ForgedCommit struct {
	Commit, Signed, Reason string
}

// ledgerSource is the ledger a pass computes on and where it was read:
// tip is the snapshots branch tip, from the commit whose ledger and host
// files are authentic (== tip without a signing key, when the tip is
// signed, or adopted); read reads files at from; forged are the commits
// above from, newest first, and changed the paths they changed (both
// sides of a rename), sorted.
type ledgerSource struct {
	tip, from string
	ledger    *snapshots.Ledger
	read      func(string) ([]byte, error)
	forged    []ForgedCommit
	changed   []string
	// adopted is set when the unsigned ledger at tip was adopted
	// (TrustUnsignedLedgerOnce).
	adopted bool
}

// ledgerKeys builds the keys whose snapshots commits the controller
// trusts: the public half of its SigningKey (when it has one, as
// trust.CommitSigner does) and ControllerKeys. Nil without a SigningKey:
// the ledger at the tip is read as it is.
func ledgerKeys(cfg Config) (*trust.Signers, error) {
	if cfg.SigningKey == nil {
		if len(cfg.ControllerKeys) > 0 {
			return nil, fmt.Errorf("%w: controller keys are given but no signing key: the ledger is checked only by a controller that signs its own commits", ErrConfig)
		}
		if cfg.TrustUnsignedLedgerOnce {
			return nil, fmt.Errorf("%w: %s needs a signing key", ErrConfig, TrustUnsignedLedgerOnceFlag)
		}
		return nil, nil
	}
	keys := append([]trust.SSHSigner(nil), cfg.ControllerKeys...)
	if own, ok := cfg.SigningKey.(interface{ AuthorizedKey() string }); ok {
		mine, err := trust.ParseKeys("this controller's signing key", []string{own.AuthorizedKey() + " this-controller"})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		keys = append(keys, mine...)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: the signing key gives no public key; list it in the controller keys", ErrConfig)
	}
	s, err := trust.New(keys, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return s, nil
}

// authenticLedger returns the ledger the pass may act on at tip, the
// snapshots branch tip read reads at. Without ledger keys it is the
// ledger at tip. With them it is the ledger of the newest first-parent
// commit from tip that a controller key signed, the commits above it
// reported as forged; none within MaxLedgerWalk is ErrUnsignedLedger,
// unless Config.TrustUnsignedLedgerOnce lets this process adopt the tip
// until it has written its first signed commit.
func (c *Controller) authenticLedger(ctx context.Context, tip string, read func(string) ([]byte, error)) (*ledgerSource, error) {
	atTip := func() (*ledgerSource, error) {
		l, err := snapshots.LedgerAt(c.bounded(tip, read, snapshots.MaxLedgerBytes))
		if err != nil {
			return nil, err
		}
		return &ledgerSource{tip: tip, from: tip, ledger: l, read: c.bounded(tip, read, snapshots.MaxSnapshotBytes)}, nil
	}
	if c.ledgerKeys == nil || tip == "" {
		return atTip()
	}
	sc, err := c.tips.Signed(tip)
	if err != nil {
		return nil, fmt.Errorf("read the signature of %s@%s: %w", c.cfg.SnapshotsBranch, desired.Hash(tip).Short(), err)
	}
	if _, verr := c.ledgerKeys.Verify(sc); verr == nil {
		return atTip()
	}
	hist, err := c.ledgerHistory(ctx)
	if err != nil {
		return nil, err
	}
	var (
		forged []ForgedCommit
		from   string
	)
	werr := hist.FirstParents(tip, func(cm *gitsource.Commit) (bool, error) {
		if len(forged) == MaxLedgerWalk {
			return false, nil
		}
		sc, err := hist.Signed(cm.Hash)
		if err != nil {
			return false, fmt.Errorf("read the signature of %s: %w", desired.Hash(cm.Hash).Short(), err)
		}
		_, verr := c.ledgerKeys.Verify(sc)
		if verr == nil {
			from = cm.Hash
			return false, nil
		}
		if !errors.Is(verr, trust.ErrSignature) {
			return false, verr
		}
		forged = append(forged, ForgedCommit{Commit: cm.Hash, Reason: verr.Error()})
		return true, nil
	})
	if werr != nil && !errors.Is(werr, gitsource.ErrShallowHistory) {
		return nil, fmt.Errorf("walk %s back to a commit signed by a controller key: %w", c.cfg.SnapshotsBranch, werr)
	}
	if from == "" {
		if c.cfg.TrustUnsignedLedgerOnce && !c.signedOnce {
			c.log.WithField("commit", desired.Hash(tip).Short()).Warn("no snapshots commit is signed by a controller key; adopting the unsigned ledger at the tip once (" + TrustUnsignedLedgerOnceFlag + "); remove the flag once this controller has published")
			src, err := atTip()
			if err == nil {
				src.adopted = true // recorded: written over at once, signed
			}
			return src, err
		}
		return nil, fmt.Errorf("%w: none of the newest %d first-parent commits of %s from %s is signed by a controller key (this controller's signing key or --controller-keys): the ledger there may be anyone's, refusing to act on it; if this is the first start with a signing key, check %s@%s by hand and start the controller once with %s",
			ErrUnsignedLedger, len(forged), c.cfg.SnapshotsBranch, desired.Hash(tip).Short(), snapshots.LedgerPath, desired.Hash(tip).Short(), TrustUnsignedLedgerOnceFlag)
	}
	for i := range forged {
		forged[i].Signed = from
	}
	readFrom := func(p string) ([]byte, error) {
		max := int64(snapshots.MaxSnapshotBytes)
		if p == snapshots.LedgerPath {
			max = snapshots.MaxLedgerBytes
		}
		return hist.ReadFileMax(from, p, max)
	}
	l, err := snapshots.LedgerAt(readFrom)
	if err != nil {
		return nil, fmt.Errorf("ledger of the signed commit %s: %w", desired.Hash(from).Short(), err)
	}
	changes, err := hist.Diff(from, tip)
	if err != nil {
		return nil, fmt.Errorf("list what the commits above the signed %s changed: %w", desired.Hash(from).Short(), err)
	}
	c.log.WithFields(logrus.Fields{"commit": desired.Hash(tip).Short(), "signed": desired.Hash(from).Short(), "forged": len(forged)}).
		Warn("snapshots branch tip not signed by a controller key: acting on the ledger of the newest signed commit and repairing over the tip")
	return &ledgerSource{tip: tip, from: from, ledger: l, read: readFrom, forged: forged, changed: changedPaths(changes)}, nil
}

// changedPaths is the sorted set of paths changes name, both sides.
func changedPaths(changes []gitsource.Change) []string {
	set := make(map[string]bool, 2*len(changes))
	for _, ch := range changes {
		for _, p := range []string{ch.From, ch.To} {
			if p != "" {
				set[p] = true
			}
		}
	}
	paths := make([]string, 0, len(set))
	for p := range set {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	return paths
}

// restore adds to files, for every path the unsigned commits above the
// signed one changed and files does not already write, that path's
// content at the signed commit (nil, a removal, where it had none). A
// commit the controller signs vouches for its whole tree, and agents
// check only the tip's signature: without this, a pass that writes only
// the ledger (a rejected desired state, a held host) would sign a forged
// host file into acceptance.
func (s *ledgerSource) restore(files map[string][]byte) error {
	for _, p := range s.changed {
		if _, ok := files[p]; ok {
			continue
		}
		data, err := s.read(p)
		switch {
		case errors.Is(err, gitsource.ErrFileNotFound):
			files[p] = nil
		case err != nil:
			return fmt.Errorf("restore %s from the signed commit %s: %w", p, desired.Hash(s.from).Short(), err)
		default:
			files[p] = data
		}
	}
	return nil
}

// ledgerHistory is a repository holding the snapshots branch's history to
// MaxLedgerWalk commits: the tip repository when it is the caller's own
// (Config.TipRepo, read in full), else a fresh in-memory fetch at that
// depth (the tip repository is shallow, depth 1).
func (c *Controller) ledgerHistory(ctx context.Context) (*gitsource.Repo, error) {
	if c.cfg.URL == "" {
		return c.tips, nil
	}
	if c.history != nil {
		c.history.Close()
		c.history = nil
	}
	repo, err := gitsource.Open(ctx, gitsource.Options{URL: c.cfg.URL, Auth: c.cfg.Auth, Depth: MaxLedgerWalk + 1,
		Timeout: c.cfg.GitTimeout, Logger: c.cfg.Logger})
	if err != nil {
		return nil, err
	}
	if _, err := repo.Fetch(ctx, c.cfg.SnapshotsBranch); err != nil {
		repo.Close()
		return nil, fmt.Errorf("fetch %s's history: %w", c.cfg.SnapshotsBranch, err)
	}
	c.history = repo
	return repo, nil
}
