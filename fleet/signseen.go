package fleet

import (
	"errors"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/trust"
)

// A signature counts as its key's validity stands at the time the
// controller first saw the commit, never at the commit date its signer
// writes (docs/DESIGN.md, "Signed desired state"). The controller keeps
// that time in memory for every desired-state commit it verifies (Config
// .Signers) and, when it signs, in the ledger (Ledger.SignaturesSeen),
// which it reads back only from a commit a controller key signed: so a
// commit it saw while its key was valid stays valid after the key's
// valid-before, across restarts and for a second controller; a commit
// first seen after it is refused as expired.

// maxSnapshotsSeen bounds the snapshots commits whose first sight the
// controller keeps (the ledger walk's, see authenticLedger): a few passes'
// walks of MaxLedgerWalk.
const maxSnapshotsSeen = 4 * MaxLedgerWalk

// verifier is compute's signature check of head over l's applied commit,
// nil when verification is off. Each commit checked is judged at the time
// this controller first saw it: its memory (c.seen), or, when trusted
// (l was read from a commit a controller key signed), l's record if
// earlier, or now. It returns the record of the commits checked, for the
// ledger. A verdict (accepted or refused) is kept for the next pass on
// the same pair; a git error is not.
func (c *Controller) verifier(l *snapshots.Ledger, head string, now time.Time, trusted bool) func() ([]snapshots.SeenCommit, error) {
	if c.cfg.Verify == VerifyOff {
		return nil
	}
	return func() ([]snapshots.SeenCommit, error) {
		applied := string(l.AppliedHash())
		key := applied + " " + head
		if key == c.sigKey {
			return c.sigSeen, c.sigErr
		}
		rng, truncated, err := c.appliedRange(l, head)
		if err != nil {
			return nil, err
		}
		if trusted {
			for _, s := range l.SignaturesSeen {
				c.seen.Learn(string(s.Commit), s.At)
			}
		}
		// Every commit the mode checks is seen now, or was earlier: also
		// those above a refused one, which the check stops before.
		checked := []string{head}
		if c.cfg.Verify == VerifyEvery {
			for _, cm := range rng {
				if cm.Hash != head {
					checked = append(checked, cm.Hash)
				}
			}
			if applied != "" && applied != head {
				checked = append(checked, applied)
			}
		}
		for _, commit := range checked {
			c.seen.At(commit, now)
		}
		sigs := Signatures{Mode: c.cfg.Verify, Signers: c.cfg.Signers, Repo: c.repo, FirstSeen: func(commit string) time.Time {
			return c.seen.At(commit, now)
		}}
		err = sigs.VerifyFrom(c.repo, applied, head, rng, truncated)
		if err != nil && !errors.Is(err, trust.ErrSignature) {
			return nil, err
		}
		c.seen.Keep(checked)
		seen := make([]snapshots.SeenCommit, 0, len(checked))
		for _, commit := range checked {
			at, _ := c.seen.Seen(commit)
			seen = append(seen, snapshots.SeenCommit{Commit: desired.Hash(commit), At: at})
		}
		c.sigKey, c.sigErr, c.sigSeen = key, err, seen
		return seen, err
	}
}

// signedLedger reports whether the ledger the pass computes on was read
// from a commit a controller key signed: with a signing key, and not
// adopted (a person checked an adopted ledger, not when it says commits
// were first seen).
func (c *Controller) signedLedger() bool {
	return c.ledgerKeys != nil && (c.ledgerSrc == nil || !c.ledgerSrc.adopted)
}
