package fleet

import (
	"errors"
	"fmt"
	"time"
)

// Outcome names what one pass came to. The three ways a pass can leave the
// last good snapshots as they were are kept apart, in logs, metrics, the
// ledger, README.md and `gitfleet status`, because each asks something
// else of a person:
//
//   - OutcomeRejected: the desired-state commit is invalid (a bad file, a
//     conflict with a retained object). Fix the commit. Recorded in the
//     ledger and the summary as the last rejected commit.
//   - OutcomeUnreadable: git failed (the remote unreachable or stalled past
//     the git timeout, a cache that could not be repaired, a write
//     rejected for good). Nothing is said about the commit; nothing is
//     recorded on a branch. Retried with back-off.
//   - OutcomeRefused: the controller will not act on what it read (the
//     desired branch is missing, the ledger belongs to another branch or
//     path, an epoch past the bound, a VM to retain without its last
//     spec). Fix the configuration or the
//     branch it names. Logged once per distinct cause, retried with
//     back-off.
type Outcome string

// The outcomes of a pass.
const (
	OutcomePublished  Outcome = "published"
	OutcomeUnchanged  Outcome = "unchanged"
	OutcomeSkipped    Outcome = "skipped"
	OutcomeRejected   Outcome = "rejected"
	OutcomeUnreadable Outcome = "unreadable"
	OutcomeRefused    Outcome = "refused"
)

// ErrUnreadable is matched by a pass error that is git's failure.
var ErrUnreadable = errors.New("git failed")

// ErrRefused is matched by a pass error that is the controller's refusal:
// a missing desired branch, ErrLedgerMismatch, ErrEpochBound and
// ErrNoLastSpec.
var ErrRefused = errors.New("refused")

// passError marks a pass error with its outcome.
func passError(err error) error {
	if err == nil || errors.Is(err, ErrRefused) || errors.Is(err, ErrUnreadable) {
		return err
	}
	for _, r := range []error{ErrLedgerMismatch, ErrEpochBound, ErrNoLastSpec} {
		if errors.Is(err, r) {
			return fmt.Errorf("%w: %w", ErrRefused, err)
		}
	}
	return fmt.Errorf("%w: %w", ErrUnreadable, err)
}

// PassOutcome is the outcome of a pass that returned res and err.
func PassOutcome(res PassResult, err error) Outcome {
	switch {
	case errors.Is(err, ErrRefused):
		return OutcomeRefused
	case err != nil:
		return OutcomeUnreadable
	case res.Rejected != nil:
		return OutcomeRejected
	case res.Skipped:
		return OutcomeSkipped
	case res.Changed():
		return OutcomePublished
	}
	return OutcomeUnchanged
}

// maxBackoff caps the wait of Run after passes that failed or refused.
const maxBackoff = 5 * time.Minute

// backoff is the wait after n passes in a row that were unreadable or
// refused: interval doubled per pass, at most maxBackoff (and never less
// than interval).
func backoff(interval time.Duration, n int) time.Duration {
	d := interval
	for i := 0; i < n && d < maxBackoff; i++ {
		d *= 2
	}
	return max(min(d, maxBackoff), interval)
}
