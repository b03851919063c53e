package fleet

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

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
// the unsigned ledger of one named snapshots commit the first time it
// signs (Config.TrustUnsignedLedgerOnce).
const TrustUnsignedLedgerOnceFlag = "--trust-unsigned-ledger-once"

// fullHash is a full commit hash, SHA-1 or SHA-256: what
// TrustUnsignedLedgerOnce takes. A prefix is refused: a forger who can
// push can make a commit whose hash starts with any 7 or 10 hex digits.
var fullHash = regexp.MustCompile(`^([0-9a-fA-F]{40}|[0-9a-fA-F]{64})$`)

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
		if cfg.TrustUnsignedLedgerOnce != "" {
			return nil, fmt.Errorf("%w: %s needs a signing key", ErrConfig, TrustUnsignedLedgerOnceFlag)
		}
		return nil, nil
	}
	if h := cfg.TrustUnsignedLedgerOnce; h != "" && !fullHash.MatchString(h) {
		return nil, fmt.Errorf("%w: %s=%q: give the full hash (40 or 64 hex digits) of the snapshots commit whose %s was checked", ErrConfig, TrustUnsignedLedgerOnceFlag, h, snapshots.LedgerPath)
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

// LedgerWalk is what WalkToSigned found on the snapshots branch.
type LedgerWalk struct {
	// Signed is the newest first-parent commit from the tip signed by a
	// controller key ("" when none was found).
	Signed string
	// Forged are the commits above Signed (all the walk read when Signed
	// is ""), newest first, at most MaxLedgerWalk; their Signed is Signed
	// and their Reason why their signature was refused.
	Forged []ForgedCommit
	// More is set when the walk stopped before it found a signed commit
	// or the root: at MaxLedgerWalk, or at the boundary of a shallow
	// history. Forged is then not all there is.
	More bool
}

// WalkToSigned walks the first-parent history of repo from tip, newest
// first, to the newest commit keys verify, reading at most MaxLedgerWalk
// unsigned commits (docs/DESIGN.md, "Authentic ledger"). It is the one
// walk the controller and `gitfleet plan` make. firstSeen returns when
// the caller first saw a commit, the time a key's validity is judged at
// (a controller key's valid-before in --controller-keys); nil judges each
// at the current time. A commit it cannot read is an error; a signature
// keys refuse (trust.ErrSignature) makes the commit forged; an error of
// keys of another kind is returned as it is.
func WalkToSigned(repo *gitsource.Repo, tip string, keys *trust.Signers, firstSeen func(commit string) time.Time) (LedgerWalk, error) {
	if firstSeen == nil {
		firstSeen = func(string) time.Time { return time.Now() }
	}
	var w LedgerWalk
	err := repo.FirstParents(tip, func(cm *gitsource.Commit) (bool, error) {
		if len(w.Forged) == MaxLedgerWalk {
			w.More = true
			return false, nil
		}
		sc, err := repo.Signed(cm.Hash)
		if err != nil {
			return false, fmt.Errorf("read the signature of %s: %w", desired.Hash(cm.Hash).Short(), err)
		}
		_, verr := keys.Verify(sc, firstSeen(cm.Hash))
		if verr == nil {
			w.Signed = cm.Hash
			return false, nil
		}
		if !errors.Is(verr, trust.ErrSignature) {
			return false, verr
		}
		w.Forged = append(w.Forged, ForgedCommit{Commit: cm.Hash, Reason: verr.Error()})
		return true, nil
	})
	if errors.Is(err, gitsource.ErrShallowHistory) {
		w.More, err = true, nil
	}
	if err != nil {
		return LedgerWalk{}, err
	}
	for i := range w.Forged {
		w.Forged[i].Signed = w.Signed
	}
	return w, nil
}

// signedLedger is the last snapshots commit a controller key signed that
// this process wrote or verified at the tip, with its ledger: the
// fallback of a walk that finds no signed commit (lastSigned). Its
// objects are read from repo, the tip repository that fetched or wrote
// it: kept when the controller opens a fresh one (tipsRenewal), which
// holds only the tip it fetched.
type signedLedger struct {
	commit string
	ledger *snapshots.Ledger
	repo   *gitsource.Repo
}

// authenticLedger returns the ledger the pass may act on at tip, the
// snapshots branch tip read reads at. Without ledger keys it is the
// ledger at tip. With them it is the ledger of the newest first-parent
// commit from tip that a controller key signed, the commits above it
// reported as forged. None within MaxLedgerWalk (a deep or an orphan
// forgery) falls back to the last signed commit this process wrote or
// verified (lastSigned); without one it is ErrUnsignedLedger, unless
// Config.TrustUnsignedLedgerOnce names tip and this process has not yet
// written its first signed commit.
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
	if _, verr := c.ledgerKeys.Verify(sc, c.snapSeen.At(tip, c.clock())); verr == nil {
		if c.cfg.TrustUnsignedLedgerOnce != "" && !c.trustFlagIgnored {
			c.trustFlagIgnored = true
			c.log.WithField("commit", tip).Warn(TrustUnsignedLedgerOnceFlag + " is set but the snapshots tip is signed by a controller key: the flag does nothing; remove it")
		}
		src, err := atTip()
		if err != nil {
			return nil, err
		}
		if why := c.rolledBack(src.ledger); why != "" {
			return c.rollBackSource(ctx, tip, []ForgedCommit{{Commit: tip, Reason: "signed by a controller key, but " + why}})
		}
		c.lastSigned = &signedLedger{commit: tip, ledger: src.ledger, repo: c.tips}
		return src, nil
	}
	hist, err := c.ledgerHistory(ctx)
	if err != nil {
		return nil, err
	}
	now := c.clock()
	walk, err := WalkToSigned(hist, tip, c.ledgerKeys, func(commit string) time.Time { return c.snapSeen.At(commit, now) })
	if err != nil {
		return nil, fmt.Errorf("walk %s back to a commit signed by a controller key: %w", c.cfg.SnapshotsBranch, err)
	}
	if walk.Signed == "" {
		if c.lastSigned != nil {
			return c.lastSignedSource(ctx, tip, walk)
		}
		return c.adoptOrRefuse(tip, walk, atTip)
	}
	from := walk.Signed
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
	if why := c.rolledBack(l); why != "" {
		forged := append(walk.Forged, ForgedCommit{Commit: from, Reason: "signed by a controller key, but " + why})
		return c.rollBackSource(ctx, tip, forged)
	}
	changes, err := hist.Diff(from, tip)
	if err != nil {
		return nil, fmt.Errorf("list what the commits above the signed %s changed: %w", desired.Hash(from).Short(), err)
	}
	c.log.WithFields(logrus.Fields{"commit": desired.Hash(tip).Short(), "signed": desired.Hash(from).Short(), "forged": len(walk.Forged)}).
		Warn("snapshots branch tip not signed by a controller key: acting on the ledger of the newest signed commit and repairing over the tip")
	return &ledgerSource{tip: tip, from: from, ledger: l, read: readFrom, forged: walk.Forged, changed: changedPaths(changes)}, nil
}

// lastSignedSource is the ledger source of a tip whose walk found no
// signed commit (walk), when this process wrote or verified one
// (c.lastSigned): someone pushed more than MaxLedgerWalk unsigned commits
// on top of it, or a history that does not hold it. The pass acts on
// that commit's ledger and restores every path that differs between it
// and tip, as over a signed commit the walk found: this process wrote or
// verified it, so it needs no person to vouch for it. Its objects are
// read from the tip repository that held it (last.repo): when the
// controller has opened a fresh one since (tipsRenewal, while someone
// kept pushing forgeries), that one fetches the tip too. When neither
// holds them (a clone from a restart), the pass is refused
// (ErrUnsignedLedger) and says so.
func (c *Controller) lastSignedSource(ctx context.Context, tip string, walk LedgerWalk) (*ledgerSource, error) {
	forged := walk.Forged
	if len(forged) > 0 {
		// The tip's record carries the count: the list is bounded.
		forged[0].Reason += fmt.Sprintf(" (%s unsigned commits walked from the tip without reaching a signed one; the last signed commit this controller wrote or verified is %s)",
			walkedCount(walk), desired.Hash(c.lastSigned.commit).Short())
	}
	src, err := c.fromLastSigned(ctx, tip, forged)
	if err != nil {
		return nil, fmt.Errorf("%w: none of the %s first-parent commits of %s from %s is signed by a controller key, and %w",
			ErrUnsignedLedger, walkedCount(walk), c.cfg.SnapshotsBranch, desired.Hash(tip).Short(), err)
	}
	return src, nil
}

// rolledBack says why l, the ledger of a commit a controller key signed,
// is older than the last one this process wrote or verified
// (c.lastSigned), "" when it is not: a host's epoch in it is below the
// one there. Epochs only rise, so such a ledger is an old, genuine one
// pushed back (the branch reset to an older signed commit, or a forged
// merge whose first parent is one). Acted on, it would compute anew from
// its old applied commit: what a force-push of the desired branch
// dropped since (retained) would be tombstoned.
func (c *Controller) rolledBack(l *snapshots.Ledger) string {
	if c.lastSigned == nil {
		return ""
	}
	hosts := make([]string, 0, len(c.lastSigned.ledger.Hosts))
	for h := range c.lastSigned.ledger.Hosts {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		if r := l.Hosts[h]; r != nil && r.Epoch < c.lastSigned.ledger.Hosts[h].Epoch {
			return fmt.Sprintf("its ledger is older than the last signed commit this controller wrote or verified, %s (host %s at epoch %d there, %d here): the branch was reset to an older signed commit",
				desired.Hash(c.lastSigned.commit).Short(), h, c.lastSigned.ledger.Hosts[h].Epoch, r.Epoch)
		}
	}
	return ""
}

// rollBackSource is fromLastSigned for a tip whose signed ledger is older
// than c.lastSigned (rolledBack); a refusal names ErrUnsignedLedger.
func (c *Controller) rollBackSource(ctx context.Context, tip string, forged []ForgedCommit) (*ledgerSource, error) {
	src, err := c.fromLastSigned(ctx, tip, forged)
	if err != nil {
		return nil, fmt.Errorf("%w: the ledger signed at or below %s is older than this controller's, and %w", ErrUnsignedLedger, desired.Hash(tip).Short(), err)
	}
	return src, nil
}

// fromLastSigned is the ledger source of tip read at c.lastSigned, the
// commits forged listed above it: every path that differs between the two
// is restored by the pass.
func (c *Controller) fromLastSigned(ctx context.Context, tip string, forged []ForgedCommit) (*ledgerSource, error) {
	last := c.lastSigned
	repo := c.tips
	changes, err := repo.Diff(last.commit, tip)
	if err != nil && last.repo != nil && last.repo != c.tips {
		repo = last.repo
		if _, ferr := repo.Fetch(ctx, c.cfg.SnapshotsBranch); ferr != nil {
			return nil, fmt.Errorf("fetch %s into the copy that holds the last signed commit %s: %w", c.cfg.SnapshotsBranch, desired.Hash(last.commit).Short(), ferr)
		}
		changes, err = repo.Diff(last.commit, tip)
	}
	if err != nil {
		return nil, fmt.Errorf("the last signed commit this controller wrote or verified, %s, is no longer in its local copy (%v): refusing to act on the ledger at the tip; push %s back onto %s if a clone still holds it, or check %s@%s by hand and restart the controller once with %s=%s",
			last.commit, err, last.commit, c.cfg.SnapshotsBranch, snapshots.LedgerPath, desired.Hash(tip).Short(), TrustUnsignedLedgerOnceFlag, tip)
	}
	read := func(p string) ([]byte, error) {
		max := int64(snapshots.MaxSnapshotBytes)
		if p == snapshots.LedgerPath {
			max = snapshots.MaxLedgerBytes
		}
		return repo.ReadFileMax(last.commit, p, max)
	}
	for i := range forged {
		forged[i].Signed = last.commit
	}
	c.log.WithFields(logrus.Fields{"commit": desired.Hash(tip).Short(), "signed": desired.Hash(last.commit).Short(), "forged": len(forged)}).
		Error("the snapshots tip is not acted on as it stands (no signed commit within reach, or an older signed ledger): acting on the ledger of the last signed commit this controller wrote or verified and repairing over the tip")
	return &ledgerSource{tip: tip, from: last.commit, ledger: last.ledger, read: read, forged: forged, changed: changedPaths(changes)}, nil
}

// walkedCount is the number of unsigned commits walk read, "and more"
// when it stopped before the end of the history.
func walkedCount(walk LedgerWalk) string {
	if walk.More {
		return fmt.Sprintf("%d and more", len(walk.Forged))
	}
	return fmt.Sprint(len(walk.Forged))
}

// adoptOrRefuse is the ledger source of a tip whose walk found no signed
// commit when this process has none to fall back to: the ledger at tip
// (atTip) when Config.TrustUnsignedLedgerOnce names tip and this process
// has not yet written a signed commit, else ErrUnsignedLedger naming the
// flag and the tip's full hash, for a person to copy once they checked
// the ledger there.
func (c *Controller) adoptOrRefuse(tip string, walk LedgerWalk, atTip func() (*ledgerSource, error)) (*ledgerSource, error) {
	named := c.cfg.TrustUnsignedLedgerOnce
	if named != "" && !c.signedOnce {
		if !strings.EqualFold(named, tip) {
			return nil, fmt.Errorf("%w: %s=%s names a commit that is not the tip of %s, %s: the branch moved since it was checked; refusing to adopt a ledger no person checked. Check %s@%s by hand and restart with %s=%s",
				ErrUnsignedLedger, TrustUnsignedLedgerOnceFlag, named, c.cfg.SnapshotsBranch, tip, snapshots.LedgerPath, desired.Hash(tip).Short(), TrustUnsignedLedgerOnceFlag, tip)
		}
		// A tip without a ledger is no controller's commit: adopting it
		// would start from an empty ledger and drop every pending
		// delete and retained object the branch's history holds.
		if _, err := c.tips.ReadFileMax(tip, snapshots.LedgerPath, snapshots.MaxLedgerBytes); errors.Is(err, gitsource.ErrFileNotFound) {
			return nil, fmt.Errorf("%w: %s=%s names a commit that holds no %s: no controller wrote it, and adopting it would drop every pending delete; push the last signed snapshots commit back instead (docs/operating.md, \"Forged snapshots commits\")",
				ErrUnsignedLedger, TrustUnsignedLedgerOnceFlag, named, snapshots.LedgerPath)
		}
		c.log.WithField("commit", tip).Warn("no snapshots commit is signed by a controller key; adopting the unsigned ledger at the tip named by " + TrustUnsignedLedgerOnceFlag + " once; remove the flag once this controller has published")
		src, err := atTip()
		if err == nil {
			src.adopted = true // recorded: written over at once, signed
		}
		return src, err
	}
	return nil, fmt.Errorf("%w: none of the newest %s first-parent commits of %s from %s is signed by a controller key (this controller's signing key or --controller-keys): the ledger there may be anyone's, refusing to act on it; if this is the first start with a signing key, check %s@%s by hand and start the controller once with %s=%s; if a controller signed this branch before, it was forged: push the last signed commit back instead (docs/operating.md, \"Forged snapshots commits\")",
		ErrUnsignedLedger, walkedCount(walk), c.cfg.SnapshotsBranch, desired.Hash(tip).Short(), snapshots.LedgerPath, desired.Hash(tip).Short(), TrustUnsignedLedgerOnceFlag, tip)
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
