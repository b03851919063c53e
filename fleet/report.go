package fleet

import (
	"fmt"
	"maps"
	"slices"
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
	hosts := slices.Sorted(maps.Keys(o.published))
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
	fillResult(res, o)
	c.logDeletes(o)
	c.logSnapshots(o)
	c.logForgeries(o)
	c.reportUnfollowed(res, o)
	c.reportIgnored(o.ignored)
}

// fillResult copies o's decisions into res, each object named as
// "Kind name@host" (refName).
func fillResult(res *PassResult, o *output) {
	res.Published, res.FenceJumps, res.Held = o.published, o.fenceJumps, o.held
	res.Epochs = make(map[string]uint64, len(o.ledger.Hosts))
	for h, rec := range o.ledger.Hosts {
		res.Epochs[h] = rec.Epoch
	}
	for p, data := range o.files {
		if h, ok := snapshots.HostFromPath(p); ok && data == nil {
			res.Removed = append(res.Removed, h)
		}
	}
	sort.Strings(res.Removed)
	for _, t := range o.tombstoned {
		res.Tombstoned = append(res.Tombstoned, refName(t.Ref()))
	}
	res.Undeleted, res.Finalized, res.Confirmed = refNames(o.undeleted), refNames(o.finalized), refNames(o.confirmed)
	for _, s := range o.swept {
		res.Swept = append(res.Swept, refName(ref{Kind: s.Kind, Name: s.Name, Host: s.Host}))
	}
	for _, k := range o.retained {
		res.Retained = append(res.Retained, refName(k.Ref()))
	}
	res.Unretained = refNames(o.unretained)
	res.Repaired = append(res.Repaired, o.repaired...)
	res.ForgedAcks, res.ForgedCommits = o.forgedAcks, o.forgedCommits
	res.IgnoredStatuses = o.ignored
	res.Pending = len(o.ledger.Tombstones)
	res.RetainedTotal = len(o.ledger.Retained)
}

// refNames are the names of refs (refName); nil when there are none.
func refNames(refs []ref) []string {
	var names []string
	for _, r := range refs {
		names = append(names, refName(r))
	}
	return names
}

// refLog is the controller's logger with the fields of r.
func (c *Controller) refLog(r ref) *logrus.Entry {
	return c.log.WithFields(logrus.Fields{"host": r.Host, "kind": r.Kind, "name": r.Name})
}

// logRefs logs msg at Info for each of refs.
func (c *Controller) logRefs(refs []ref, msg string) {
	for _, r := range refs {
		c.refLog(r).Info(msg)
	}
}

// logDeletes logs every delete the pass moved: tombstoned, un-deleted,
// finalized (acked), confirmed, or swept.
func (c *Controller) logDeletes(o *output) {
	for _, t := range o.tombstoned {
		c.refLog(t.Ref()).WithFields(logrus.Fields{"commit": t.Tombstone.Commit.Short(), "author": t.Tombstone.Author,
			"rewritten": t.Tombstone.Rewritten}).Info("tombstoned")
	}
	c.logRefs(o.undeleted, "un-deleted")
	c.logRefs(o.finalized, "delete finalized: acked")
	c.logRefs(o.confirmed, "delete confirmed: the host's quarantine nonce is published in its tombstone")
	for _, s := range o.swept {
		c.refLog(ref{Kind: s.Kind, Name: s.Name, Host: s.Host}).Warn("delete finalized: " + s.Reason)
	}
}

// logSnapshots logs what the pass did to the hosts' snapshots: fence
// jumps, publishes, objects kept after a history rewrite or desired again,
// files repaired, and hosts held (by name).
func (c *Controller) logSnapshots(o *output) {
	for h, e := range o.fenceJumps {
		c.log.WithFields(logrus.Fields{"host": h, "epoch": e}).Warn("fence recovery: a host saw an epoch above the ledger's; jumping past it")
	}
	for h, e := range o.published {
		c.log.WithFields(logrus.Fields{"host": h, "epoch": e}).Debug("snapshot published")
	}
	for _, k := range o.retained {
		c.refLog(k.Ref()).WithField("commit", k.Commit.Short()).
			Warn("history rewritten: object absent from the new head kept, not deleted; restore its file, or re-add and delete it in a reviewed commit")
	}
	c.logRefs(o.unretained, "kept object desired again")
	for _, h := range o.repaired {
		c.log.WithFields(logrus.Fields{"host": h, "epoch": o.published[h]}).Warn("snapshot file on the branch differed from the snapshot computed for it; published again")
	}
	for _, h := range slices.Sorted(maps.Keys(o.held)) {
		c.log.WithField("host", h).Error("snapshot held, the other hosts published: " + o.held[h])
	}
}

// logForgeries logs the acks and the snapshots commits the pass did not
// act on.
func (c *Controller) logForgeries(o *output) {
	for _, f := range o.forgedAcks {
		c.log.WithFields(logrus.Fields{"object": f.Ref, "commit": desired.Hash(f.Commit).Short()}).Debug("forged ack not acted on: " + f.Reason)
	}
	for _, f := range o.forgedCommits {
		if f.Signed == "" {
			c.log.WithField("commit", desired.Hash(f.Commit).Short()).
				Error("snapshots branch content not acted on (check who can push to the snapshots branch): " + f.Reason)
			continue
		}
		c.log.WithFields(logrus.Fields{"commit": desired.Hash(f.Commit).Short(), "signed": desired.Hash(f.Signed).Short()}).
			Error("snapshots commit not signed by a controller key: its ledger and files were not acted on, and are repaired (check who can push to the snapshots branch): " + f.Reason)
	}
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
