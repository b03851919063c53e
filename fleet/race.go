package fleet

import (
	"context"
	"errors"
	"fmt"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
)

// errStaleHead is a publish that lost a race with another controller: the
// ledger on the snapshots tip applies a desired commit that is not an
// ancestor of the head this pass read, and the desired branch has moved
// since this pass read it. Publishing would move the applied commit
// backwards (un-deleting what the other controller tombstoned, or worse);
// the pass reads the desired branch again instead.
var errStaleHead = errors.New("lost a race with another controller: the desired branch moved since this pass read it")

// checkHead refuses to publish head over a ledger l whose applied commit
// is not an ancestor of head, unless the desired branch's tip on the remote
// is still head (then the history was rewritten: a force-push or a reset,
// which compute handles by retaining what it dropped). It returns
// errStaleHead (wrapped, naming the commits) for a lost race; git's error
// when the remote cannot be asked.
func (c *Controller) checkHead(ctx context.Context, head string, l *snapshots.Ledger) error {
	if head == "" || l.Applied == nil || string(l.Applied.Commit) == head {
		return nil
	}
	applied := string(l.Applied.Commit)
	if anc, err := c.repo.IsAncestor(applied, head); err == nil && anc {
		return nil
	}
	remote, err := c.repo.RemoteHead(ctx, c.cfg.Branch)
	if err != nil {
		return fmt.Errorf("re-check %s before publishing over %s: %w", c.cfg.Branch, desired.Hash(applied).Short(), err)
	}
	if remote == head {
		return nil
	}
	return fmt.Errorf("%w: read %s, %s is at %s now, and the snapshots already apply %s",
		errStaleHead, desired.Hash(head).Short(), c.cfg.Branch, desired.Hash(remote).Short(), desired.Hash(applied).Short())
}
