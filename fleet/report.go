package fleet

import (
	"fmt"
	"sort"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
)

// commitMessage is the message of the snapshots commit of a pass over head:
// the hosts published with their epochs, then every decision, one a line.
func commitMessage(head string, o *output) string {
	var b strings.Builder
	hosts := make([]string, 0, len(o.published))
	for h := range o.published {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	if len(hosts) > 0 {
		fmt.Fprintf(&b, "Publish %d host snapshot(s) from %s\n\n", len(hosts), desired.Hash(head).Short())
		for _, h := range hosts {
			fmt.Fprintf(&b, "%s: epoch %d\n", h, o.published[h])
		}
	} else if head != "" {
		fmt.Fprintf(&b, "Update the ledger at %s\n", desired.Hash(head).Short())
	} else {
		fmt.Fprintf(&b, "Update the ledger: the desired state could not be read\n")
	}
	for _, k := range o.retained {
		fmt.Fprintf(&b, "kept %s after a history rewrite at %s\n", k.Ref(), k.Commit.Short())
	}
	for _, r := range o.unretained {
		fmt.Fprintf(&b, "%s desired again: no longer kept\n", r)
	}
	for _, h := range o.repaired {
		fmt.Fprintf(&b, "%s: the file on the branch differed from the snapshot computed for it; published again\n", h)
	}
	for _, t := range o.tombstoned {
		fmt.Fprintf(&b, "tombstone %s (removed by %s, %s)\n", t.Ref(), t.Tombstone.Commit.Short(), t.Tombstone.Author)
	}
	for _, r := range o.finalized {
		fmt.Fprintf(&b, "finalized %s (acked)\n", r)
	}
	for _, r := range o.confirmed {
		fmt.Fprintf(&b, "confirm the delete of %s (the host's quarantine nonce)\n", r)
	}
	for _, s := range o.swept {
		fmt.Fprintf(&b, "finalized %s %s on %s (%s)\n", s.Kind, s.Name, s.Host, s.Reason)
	}
	return b.String()
}

func refName(r ref) string { return r.Key() }

// report copies the computation's decisions into res and logs them.
func (c *Controller) report(res *PassResult, o *output) {
	res.Published = o.published
	res.FenceJumps = o.fenceJumps
	res.Epochs = make(map[string]uint64, len(o.ledger.Hosts))
	for h, rec := range o.ledger.Hosts {
		res.Epochs[h] = rec.Epoch
	}
	for p, data := range o.files {
		if data == nil {
			if h, ok := snapshots.HostFromPath(p); ok {
				res.Removed = append(res.Removed, h)
			}
		}
	}
	sort.Strings(res.Removed)
	for _, t := range o.tombstoned {
		res.Tombstoned = append(res.Tombstoned, refName(t.Ref()))
		c.log.WithFields(logrus.Fields{"host": t.Host, "kind": t.Kind, "name": t.Name,
			"commit": t.Tombstone.Commit.Short(), "author": t.Tombstone.Author, "rewritten": t.Tombstone.Rewritten}).Info("tombstoned")
	}
	for _, r := range o.undeleted {
		res.Undeleted = append(res.Undeleted, refName(r))
		c.log.WithFields(logrus.Fields{"host": r.Host, "kind": r.Kind, "name": r.Name}).Info("un-deleted")
	}
	for _, r := range o.finalized {
		res.Finalized = append(res.Finalized, refName(r))
		c.log.WithFields(logrus.Fields{"host": r.Host, "kind": r.Kind, "name": r.Name}).Info("delete finalized: acked")
	}
	for _, r := range o.confirmed {
		res.Confirmed = append(res.Confirmed, refName(r))
		c.log.WithFields(logrus.Fields{"host": r.Host, "kind": r.Kind, "name": r.Name}).Info("delete confirmed: the host's quarantine nonce is published in its tombstone")
	}
	for _, s := range o.swept {
		res.Swept = append(res.Swept, refName(ref{Kind: s.Kind, Name: s.Name, Host: s.Host}))
		c.log.WithFields(logrus.Fields{"host": s.Host, "kind": s.Kind, "name": s.Name}).Warn("delete finalized: " + s.Reason)
	}
	for h, e := range o.fenceJumps {
		c.log.WithFields(logrus.Fields{"host": h, "epoch": e}).Warn("fence recovery: a host saw an epoch above the ledger's; jumping past it")
	}
	for h, e := range o.published {
		c.log.WithFields(logrus.Fields{"host": h, "epoch": e}).Debug("snapshot published")
	}
	for _, k := range o.retained {
		res.Retained = append(res.Retained, refName(k.Ref()))
		c.log.WithFields(logrus.Fields{"host": k.Host, "kind": k.Kind, "name": k.Name, "commit": k.Commit.Short()}).
			Warn("history rewritten: object absent from the new head kept, not deleted; restore its file, or re-add and delete it in a reviewed commit")
	}
	for _, r := range o.unretained {
		res.Unretained = append(res.Unretained, refName(r))
		c.log.WithFields(logrus.Fields{"host": r.Host, "kind": r.Kind, "name": r.Name}).Info("kept object desired again")
	}
	for _, h := range o.repaired {
		res.Repaired = append(res.Repaired, h)
		c.log.WithFields(logrus.Fields{"host": h, "epoch": o.published[h]}).Warn("snapshot file on the branch differed from the snapshot computed for it; published again")
	}
	res.Held = o.held
	hosts := make([]string, 0, len(o.held))
	for h := range o.held {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		c.log.WithField("host", h).Error("snapshot held, the other hosts published: " + o.held[h])
	}
	c.reportUnfollowed(res, o)
	res.ForgedAcks = o.forgedAcks
	for _, f := range o.forgedAcks {
		c.log.WithFields(logrus.Fields{"object": f.Ref, "commit": desired.Hash(f.Commit).Short()}).Debug("forged ack not acted on: " + f.Reason)
	}
	res.ForgedCommits = o.forgedCommits
	for _, f := range o.forgedCommits {
		if f.Signed == "" {
			c.log.WithField("commit", desired.Hash(f.Commit).Short()).
				Error("snapshots branch content not acted on (check who can push to the snapshots branch): " + f.Reason)
			continue
		}
		c.log.WithFields(logrus.Fields{"commit": desired.Hash(f.Commit).Short(), "signed": desired.Hash(f.Signed).Short()}).
			Error("snapshots commit not signed by a controller key: its ledger and files were not acted on, and are repaired (check who can push to the snapshots branch): " + f.Reason)
	}
	res.IgnoredStatuses = o.ignored
	c.reportIgnored(o.ignored)
	res.Pending = len(o.ledger.Tombstones)
	res.RetainedTotal = len(o.ledger.Retained)
}

// maxIgnoredLogged bounds the hosts whose ignored status is remembered as
// logged: a branch of forged statuses costs no more than this.
const maxIgnoredLogged = 1000

// reportIgnored logs each host whose status was ignored once per process
// (the first maxIgnoredLogged of them by name, then once how many more).
func (c *Controller) reportIgnored(hosts []string) {
	more := 0
	for _, h := range hosts {
		if c.ignored[h] {
			continue
		}
		if len(c.ignored) >= maxIgnoredLogged {
			more++
			continue
		}
		c.ignored[h] = true
		c.log.WithField("host", h).Warn("status of a host that is not in the desired state ignored: it creates no ledger record and moves no epoch; " +
			"add a Host object named " + h + ", or stop the agent configured with host: " + h + " and delete its branch " + status.HostBranch(h) +
			" (or, written by an agent of an earlier release, " + status.Path(h) + " on the status branch)")
	}
	if more > 0 && !c.ignored["\x00more"] {
		c.ignored["\x00more"] = true
		c.log.WithField("count", more).Warn("more statuses of hosts not in the desired state ignored")
	}
}
