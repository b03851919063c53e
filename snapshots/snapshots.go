// Package snapshots owns the gitfleet/snapshots branch (docs/DESIGN.md,
// Branches and files): its name (Branch) and both kinds of file on it,
// written by the controller only:
//
//   - hosts/<host>.yaml at Path(host), one snapshot per host: the types
//     (Snapshot, SnapshotVM, SnapshotVolume, Tombstone), the strict parser
//     ParseSnapshot and the encoder MarshalSnapshot;
//   - ledger.yaml at LedgerPath, the controller's Ledger: ParseLedger and
//     Ledger.Marshal. Every reader of the ledger (the controller, `gitfleet
//     plan`, `gitfleet status`, the demo) reads it with ParseLedger,
//     strictly, through LedgerAt or ReadLedger.
//
// ledger.yaml is JSON (a subset of YAML) with one host, tombstone or sweep
// per line:
//
//	{"version": 1,
//	"applied": {"commit": "<sha>", "branch": "main"},
//	"rejected": {"commit": "<sha>", "reason": "vms/web.yaml:4:3: ...", "at": "...", "superseded": "<sha>"},
//	"hosts": {
//	  "hv-a": {"epoch": 42, "hash": "<content key>", "vms": ["web-01"], "volumes": ["web-01-data"]}},
//	"tombstones": [
//	  {"kind": "VM", "name": "old-01", "host": "hv-a", "spec": {...}, "tombstone": {"commit": "<sha>",
//	   "author": "Ann <ann@example.com>", "time": "...", "epoch": 41}, "publishedAt": "..."}],
//	"sweeps": [{"kind": "VM", "name": "lost-01", "host": "hv-c", "commit": "<sha>", "at": "...", "reason": "host offline: ..."}],
//	"retained": [{"kind": "VM", "name": "web-02", "host": "hv-a", "spec": {...}, "commit": "<rewriting head>", "since": "..."}]}
//
// The meaning of the records (when a tombstone is finalized, what a
// retained object is) is the controller's: see package fleet.
package snapshots

import (
	"context"
	"errors"
	"fmt"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/internal/hostfile"
)

// Branch is the default name of the snapshots branch.
const Branch = "gitfleet/snapshots"

// Path is where host's snapshot lives on the snapshots branch:
// hosts/<host>.yaml.
func Path(host string) string { return hostfile.Path(host) }

// HostFromPath returns the host of a snapshot path hosts/<host>.yaml, and
// false for any other path (ledger.yaml, say).
func HostFromPath(p string) (string, bool) { return hostfile.Host(p) }

// LedgerAt reads the ledger with read (a reader of one tip of the
// snapshots branch, returning an error wrapping gitsource.ErrFileNotFound
// for a missing file): NewLedger when the tip has none, an error when it
// cannot be read or parsed (ParseLedger).
func LedgerAt(read func(path string) ([]byte, error)) (*Ledger, error) {
	data, err := read(LedgerPath)
	if errors.Is(err, gitsource.ErrFileNotFound) {
		return NewLedger(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", LedgerPath, err)
	}
	return ParseLedger(data)
}

// MaxLedgerBytes is the largest ledger.yaml gitfleet reads (64 MiB; ten
// thousand objects take a few). A bigger one is refused by its size before
// it is read: the controller's pass fails and says so, as for a ledger that
// does not parse.
const MaxLedgerBytes = 64 << 20

// ReadLedger reads the ledger at the tip of branch, for the ledger's
// readers (plan, status, the demo; never the controller, its writer): the
// branch on repo's remote, or, when the remote is a local clone without it,
// the clone's remote-tracking copy (gitsource.Repo.ResolveTracking), which
// is all a CI checkout has. It returns a nil ledger and nil error when the
// branch or its ledger does not exist yet (the controller has not
// published), and the tip it read ("" when the branch is missing). Any
// other error is git's, or the ledger's (over MaxLedgerBytes, or
// ParseLedger's), and wraps the branch name.
func ReadLedger(ctx context.Context, repo *gitsource.Repo, branch string) (*Ledger, string, error) {
	tip, _, err := repo.ResolveTracking(ctx, branch)
	if errors.Is(err, gitsource.ErrBranchNotFound) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err // gitsource names the branch
	}
	data, err := repo.ReadFileMax(tip, LedgerPath, MaxLedgerBytes)
	if errors.Is(err, gitsource.ErrFileNotFound) {
		return nil, tip, nil
	}
	if err != nil {
		return nil, tip, fmt.Errorf("read %s on %s: %w", LedgerPath, branch, err)
	}
	l, err := ParseLedger(data)
	if err != nil {
		return nil, tip, fmt.Errorf("%s: %w", branch, err)
	}
	return l, tip, nil
}
