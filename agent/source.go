package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/trust"
)

// Branches the agent reads and writes by default (docs/DESIGN.md, Branches
// and files), as their owners name them.
const (
	SnapshotsBranch = snapshots.Branch
	StatusBranch    = status.Branch
)

// ErrSnapshotInvalid: the host's snapshot file exists but does not parse or
// names another host. It is refused and reported, never read as an empty
// desired state.
var ErrSnapshotInvalid = errors.New("snapshot refused")

// ErrSnapshotSignature: the snapshots commit is not signed by a controller
// key the agent trusts (unsigned, signed by another key, or a signature
// that does not verify). It wraps ErrSnapshotInvalid: the snapshot is
// refused like a fence violation, nothing acts on it, and the status says
// whose key and which commit.
var ErrSnapshotSignature = fmt.Errorf("%w: not signed by the controller", ErrSnapshotInvalid)

// CommitVerifier checks a commit's signature against the keys it trusts,
// judging a key's validity (an allowed-signers valid-before=) at at, when
// the agent first saw the commit; *trust.Signers is one. Its refusals wrap
// trust.ErrSignature and name the commit and the key.
type CommitVerifier interface {
	Verify(c *gitsource.SignedCommit, at time.Time) (trust.Signer, error)
}

// SeenStore keeps, across restarts, the snapshots commit whose signature
// the agent last accepted and when it first saw it; *Store is one.
type SeenStore interface {
	SignatureSeen() (commit string, at time.Time, err error)
	SaveSignatureSeen(commit string, at time.Time) error
}

// maxSeenTips bounds the snapshots tips whose first sight a Source keeps
// in memory (a forger pushing tip after tip costs no more).
const maxSeenTips = 64

// Source reads one host's snapshot from the snapshots branch of a
// repository. It parses a tip once: fetching the same tip again returns the
// same answer without reading the file. Safe for concurrent use.
type Source struct {
	repo   *gitsource.Repo
	host   string
	branch string
	// verify, when set, checks the tip's signature before the snapshot
	// is read, judging the key at the time the tip was first seen (seen,
	// by now; the accepted tip's also in store across restarts).
	verify CommitVerifier
	seen   *trust.FirstSeen
	store  SeenStore
	now    func() time.Time

	mu      sync.Mutex
	tip     string
	snap    *snapshots.Snapshot
	snapErr error
}

// NewSource reads host's snapshot from branch of repo (SnapshotsBranch when
// empty). Open repo with Depth 1: only the tip is read.
func NewSource(repo *gitsource.Repo, host, branch string) *Source {
	if branch == "" {
		branch = SnapshotsBranch
	}
	return &Source{repo: repo, host: host, branch: branch}
}

// Verified makes s accept a tip only when verify accepts its commit's
// signature (the controller signs every snapshots commit; docs/DESIGN.md,
// "Signed snapshots"), judged at the time s first saw the tip by now (nil:
// time.Now): a controller key's valid-before counts against that, never
// against the commit date its signer wrote. store (nil: none) keeps the
// accepted tip's first sight across restarts, so a tip accepted while its
// key was valid stays accepted after the key's bound. nil verify verifies
// nothing. It returns s.
func (s *Source) Verified(verify CommitVerifier, store SeenStore, now func() time.Time) *Source {
	if now == nil {
		now = time.Now
	}
	s.verify, s.store, s.now = verify, store, now
	s.seen = trust.NewFirstSeen(maxSeenTips)
	if store != nil {
		if commit, at, err := store.SignatureSeen(); err == nil && commit != "" {
			s.seen.Learn(commit, at)
		}
	}
	return s
}

// Fetch fetches the branch and returns the host's snapshot at its tip and
// the tip. It returns a nil snapshot and nil error when the branch or the
// host's file does not exist yet ("no snapshot yet": the agent does nothing
// new); an error wrapping ErrSnapshotInvalid when the file does not parse or
// belongs to another host, or ErrSnapshotSignature when the tip is not
// signed by a trusted key (checked first: an unsigned tip is refused
// whatever it holds); any other error is git's (unreachable remote,
// missing objects) and says nothing about the desired state.
func (s *Source) Fetch(ctx context.Context) (*snapshots.Snapshot, string, error) {
	tip, err := s.repo.Fetch(ctx, s.branch)
	if errors.Is(err, gitsource.ErrBranchNotFound) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err // gitsource names the branch and the remote
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if tip == s.tip {
		return s.snap, tip, s.snapErr
	}
	snap, err := s.read(tip)
	if err != nil && !errors.Is(err, ErrSnapshotInvalid) {
		return nil, tip, err // a read failure is retried, not cached
	}
	s.tip, s.snap, s.snapErr = tip, snap, err
	return snap, tip, err
}

func (s *Source) read(tip string) (*snapshots.Snapshot, error) {
	if err := s.checkSignature(tip); err != nil {
		return nil, err
	}
	path := snapshots.Path(s.host)
	data, err := s.repo.ReadFileMax(tip, path, snapshots.MaxSnapshotBytes)
	if errors.Is(err, gitsource.ErrFileNotFound) {
		return nil, nil
	}
	if errors.Is(err, gitsource.ErrFileTooLarge) || errors.Is(err, gitsource.ErrNotAFile) {
		// Refused like a fence violation: nothing acts on it, and the
		// status says why.
		return nil, fmt.Errorf("%w: %s@%.12s: %w", ErrSnapshotInvalid, path, tip, err)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s at %.12s: %w", path, tip, err)
	}
	snap, err := snapshots.ParseSnapshot(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %s@%.12s: %v", ErrSnapshotInvalid, path, tip, err)
	}
	if snap.Host != s.host {
		return nil, fmt.Errorf("%w: %s@%.12s: host is %q, not %q", ErrSnapshotInvalid, path, tip, snap.Host, s.host)
	}
	return snap, nil
}

// checkSignature refuses tip unless s.verify accepts its signature (no
// verifier: every tip passes). A commit that cannot be read is git's error,
// retried; a refused signature wraps ErrSnapshotSignature.
func (s *Source) checkSignature(tip string) error {
	if s.verify == nil {
		return nil
	}
	c, err := s.repo.Signed(tip)
	if err != nil {
		return fmt.Errorf("read the signature of %s@%.12s: %w", s.branch, tip, err)
	}
	at := s.seen.At(tip, s.now())
	if _, err := s.verify.Verify(c, at); err != nil {
		if !errors.Is(err, trust.ErrSignature) {
			return fmt.Errorf("verify %s@%.12s: %w", s.branch, tip, err)
		}
		return fmt.Errorf("%w: %s@%.12s: %w; refused; the last accepted snapshot stays in force until one signed by a key of controllerKeys is published", ErrSnapshotSignature, s.branch, tip, err)
	}
	if s.store != nil {
		if old, oldAt, err := s.store.SignatureSeen(); err != nil || old != tip || !oldAt.Equal(at) {
			if err := s.store.SaveSignatureSeen(tip, at); err != nil {
				return fmt.Errorf("record when %s@%.12s was first seen: %w", s.branch, tip, err)
			}
		}
	}
	return nil
}
