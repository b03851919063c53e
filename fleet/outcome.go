package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/internal/redact"
	"github.com/gitfleet/gitfleet/internal/safetext"
	"github.com/gitfleet/gitfleet/status"
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
//     the git timeout, a cache that could not be repaired or whose disk
//     is full, a write rejected for good). Nothing is said about the
//     commit. Retried with back-off.
//   - OutcomeRefused: the controller will not act on what it read (the
//     desired branch is missing, the ledger belongs to another branch or
//     path, a VM to retain without its last spec, a snapshots branch no
//     controller key signed (ErrUnsignedLedger); an epoch past the bound
//     holds only its host, see PassResult.Held). Fix the configuration or the
//     branch it names. Logged once per distinct cause, retried with
//     back-off.
//
// The last two are recorded on the status branch — controller.yaml and a
// "Controller passes failing" section of README.md, apart from the
// ledger's last rejected commit — once per distinct cause, and removed by
// the next pass that acts (see recordFailure).
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
// a missing desired branch, ErrLedgerMismatch and ErrNoLastSpec
// (ErrEpochBound holds one host only and is no longer a pass's error; it
// stays in the list for errors of older callers).
var ErrRefused = errors.New("refused")

// passError marks a pass error with its outcome.
func passError(err error) error {
	if err == nil || errors.Is(err, ErrRefused) || errors.Is(err, ErrUnreadable) {
		return err
	}
	for _, r := range []error{ErrLedgerMismatch, ErrEpochBound, ErrNoLastSpec, ErrUnsignedLedger} {
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

// recordFailure writes the cause of an unreadable or refused pass to the
// status branch (controller.yaml and README.md), once per distinct
// outcome and reason: a pass that fails the same way every interval
// commits nothing but last-write.yaml's refresh once per SummaryInterval
// (refreshDue). A controller that has not completed a pass since it
// started writes nothing — it may not be the one the branches belong to —
// except the record alone of a pass refused for want of a signed ledger
// (recordBeforeFirstPass), nor does one refused because the ledger names
// another branch or path, nor one whose remote timed out (the write would
// wait on it again). The write is best effort (git may be what failed);
// the next pass that acts removes the record. Caller holds c.mu.
func (c *Controller) recordFailure(ctx context.Context, outcome Outcome, err error) {
	if errors.Is(err, ErrLedgerMismatch) || errors.Is(err, gitsource.ErrTimeout) || ctx.Err() != nil {
		// A stalled remote would stall the record's write too.
		return
	}
	reason := safetext.Lines(redact.Text(err.Error()))
	now := c.clock()
	if c.lastSummary == nil {
		if errors.Is(err, ErrUnsignedLedger) {
			c.recordBeforeFirstPass(ctx, outcome, reason, now)
		}
		return
	}
	if c.sameFailure(outcome, reason) {
		// The same failure: written again only when the status branch
		// is due its refresh (last-write.yaml), so that a controller
		// failing for long is not taken for a stopped one.
		if c.refreshDue(now) {
			s := *c.lastSummary
			s.Failing = c.failing
			if _, werr := c.writeSummary(ctx, s, now); werr != nil {
				c.log.WithError(cleanErr(werr)).Warn("could not refresh the failing pass's record on the status branch")
			}
		}
		return
	}
	c.failing = &status.PassFailure{Outcome: string(outcome), Since: now, Reason: reason}
	// The next pass must not skip on the inputs of the last one that
	// acted: it is the one that removes the record.
	c.lastKey = ""
	s := *c.lastSummary
	s.Failing = c.failing
	if _, werr := c.writeSummary(ctx, s, now); werr != nil {
		c.log.WithError(cleanErr(werr)).Warn("could not record the failing pass on the status branch")
	}
}

// recordBeforeFirstPass writes controller.yaml and last-write.yaml alone,
// the rest of the status branch as it is, for a controller refused since
// its start because no snapshots commit within the walk is signed by a
// controller key (a forged history pushed while it was stopped, or the
// first start with a key): it has no summary of its own to show, but
// without the record `gitfleet status` showed the last view as healthy,
// and after three refresh intervals took the controller for a stopped
// one. The same failure is written again once per refresh interval.
// Caller holds c.mu.
func (c *Controller) recordBeforeFirstPass(ctx context.Context, outcome Outcome, reason string, now time.Time) {
	same := c.sameFailure(outcome, reason)
	if same && now.Sub(c.failingAt) < c.refreshEvery() {
		return
	}
	if !same {
		c.failing = &status.PassFailure{Outcome: string(outcome), Since: now, Reason: reason}
	}
	failing, err := status.MarshalPassFailure(c.failing)
	if err != nil {
		c.log.WithError(err).Warn("could not record the failing pass on the status branch")
		return
	}
	written, err := status.MarshalLastWrite(c.lastWrite(now))
	if err != nil {
		c.log.WithError(err).Warn("could not record the failing pass on the status branch")
		return
	}
	_, err = c.update(ctx, c.hosts, c.cfg.StatusBranch, func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
		return map[string][]byte{status.ControllerPath: failing, status.LastWritePath: written}, "Record the failing pass", nil
	})
	if err != nil {
		c.log.WithError(cleanErr(err)).Warn("could not record the failing pass on the status branch")
		return
	}
	c.failingAt = now
}

// sameFailure reports whether the failure on record (c.failing) is the
// one of outcome and reason.
func (c *Controller) sameFailure(outcome Outcome, reason string) bool {
	f := c.failing
	return f != nil && f.Outcome == string(outcome) && f.Reason == reason
}
