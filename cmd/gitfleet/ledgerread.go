package main

import (
	"context"
	"fmt"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/trust"
)

// controllerLedger is the controller's ledger as plan and status read it;
// each says in its own words what the reading means for its output.
type controllerLedger struct {
	// ledger is nil when the branch holds none, or, with keys, when no
	// commit within fleet.MaxLedgerWalk of the tip is signed.
	ledger *snapshots.Ledger
	// tip is the branch's tip ("" when there is no branch).
	tip string
	// walk is the walk back from a tip no controller key signed (with
	// keys only; walk.Signed is "" when no signed commit was found); nil
	// when the ledger was read at the tip.
	walk *fleet.LedgerWalk
}

// readControllerLedger reads the ledger on branch. Anyone who can push
// the branch can write a ledger there: without keys (the controller's
// public keys) it is read at the tip, unverified; with them it is read as
// the controller reads it (fleet.WalkToSigned, docs/DESIGN.md "Authentic
// ledger"): at the tip when a controller key signed it, else at the
// newest signed first-parent commit, and not at all when there is none
// within fleet.MaxLedgerWalk. The error is a ledger that cannot be read
// (the tip is still set) or a failed walk.
func readControllerLedger(ctx context.Context, repo *gitsource.Repo, branch string, keys *trust.Signers) (controllerLedger, error) {
	l, tip, err := snapshots.ReadLedger(ctx, repo, branch)
	if tip == "" || keys == nil {
		return controllerLedger{ledger: l, tip: tip}, err
	}
	walk, werr := fleet.WalkToSigned(repo, tip, keys, nil)
	if werr != nil {
		return controllerLedger{tip: tip}, fmt.Errorf("walk %s back to a commit signed by a controller key: %w", branch, werr)
	}
	if walk.Signed == tip {
		return controllerLedger{ledger: l, tip: tip}, err
	}
	r := controllerLedger{tip: tip, walk: &walk}
	if walk.Signed == "" {
		return r, nil
	}
	if r.ledger, err = snapshots.LedgerAt(func(p string) ([]byte, error) { return repo.ReadFileMax(walk.Signed, p, snapshots.MaxLedgerBytes) }); err != nil {
		return r, fmt.Errorf("ledger of the signed commit %s: %w", desired.Hash(walk.Signed).Short(), err)
	}
	return r, nil
}
