package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
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

// Source reads one host's snapshot from the snapshots branch of a
// repository. It parses a tip once: fetching the same tip again returns the
// same answer without reading the file. Safe for concurrent use.
type Source struct {
	repo   *gitsource.Repo
	host   string
	branch string

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

// Fetch fetches the branch and returns the host's snapshot at its tip and
// the tip. It returns a nil snapshot and nil error when the branch or the
// host's file does not exist yet ("no snapshot yet": the agent does nothing
// new); an error wrapping ErrSnapshotInvalid when the file does not parse or
// belongs to another host; any other error is git's (unreachable remote,
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
	path := snapshots.Path(s.host)
	data, err := s.repo.ReadFileMax(tip, path, snapshots.MaxSnapshotBytes)
	if errors.Is(err, gitsource.ErrFileNotFound) {
		return nil, nil
	}
	if errors.Is(err, gitsource.ErrFileTooLarge) {
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
