package demo

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
)

// ledgerWatch reports what the controller did, read from ledger.yaml on the
// snapshots branch: the desired-state commit it applied and whether that
// published a host snapshot (a new epoch) or only recorded the commit, the
// last commit it rejected, and each delete it published, finalized or
// cancelled.
type ledgerWatch struct {
	repo     *gitsource.Repo
	applied  desired.Hash
	rejected string
	// epochs is host → last epoch seen published.
	epochs map[string]uint64
	// tombstones are the pending deletes seen, by tombKey.
	tombstones map[string]*snapshots.TombstoneRecord
	// sweeps is the number of sweep records seen.
	sweeps int
	// forced is the agent epoch a read was last forced for (see due).
	forced uint64
}

// fetch reads the ledger at the snapshots branch's tip, as strictly as the
// controller does; nil when the branch is not written yet or cannot be read
// (the controller's log has the details).
func (lw *ledgerWatch) fetch(ctx context.Context) *snapshots.Ledger {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l, _, err := snapshots.ReadLedger(ctx, lw.repo, snapshots.Branch)
	if err != nil {
		return nil
	}
	return l
}

// baseline reads the ledger as the last run left it, before the controller
// starts, so that what is already there is not told as news. It returns
// a line describing it, or "" when there is no ledger yet.
func (lw *ledgerWatch) baseline(ctx context.Context) string {
	l := lw.fetch(ctx)
	if l == nil {
		return ""
	}
	lw.changes(l)
	if l.Applied == nil {
		return ""
	}
	return fmt.Sprintf("snapshots: %s at %s, applied by the last run; published%s", l.Applied.Branch, shownCommit(l.Applied.Commit), epochList(l, hostNames(l)))
}

// read fetches the ledger and returns the lines to print for what changed
// since the last read.
func (lw *ledgerWatch) read(ctx context.Context) []string {
	l := lw.fetch(ctx)
	if l == nil {
		return nil
	}
	return lw.changes(l)
}

// due reports whether the agent, at agentEpoch for host, has accepted a
// snapshot newer than the ledger told so far: reading the ledger now prints
// the controller's lines before the agent's lines they caused. It is true
// once per new agent epoch, so a ledger that cannot be read is not fetched
// on every tick.
func (lw *ledgerWatch) due(host string, agentEpoch uint64) bool {
	if agentEpoch <= lw.epochs[host] || agentEpoch == lw.forced {
		return false
	}
	lw.forced = agentEpoch
	return true
}

func tombKey(t *snapshots.TombstoneRecord) string {
	return string(t.Kind) + " " + t.Name + "@" + t.Host
}

// changes compares l with what was seen before and returns, in order: the
// applied commit (with the snapshots it published, or none), the rejected
// commit, then each delete published, cancelled or finalized, then a
// publish no applied commit explains (a delete moved).
func (lw *ledgerWatch) changes(l *snapshots.Ledger) []string {
	if lw.epochs == nil {
		lw.epochs = map[string]uint64{}
		lw.tombstones = map[string]*snapshots.TombstoneRecord{}
	}
	var published []string
	for _, h := range hostNames(l) {
		if e := l.Hosts[h].Epoch; e > lw.epochs[h] {
			published = append(published, h)
			lw.epochs[h] = e
		}
	}
	var out []string
	appliedMoved := l.Applied != nil && l.Applied.Commit != lw.applied
	if appliedMoved {
		lw.applied = l.Applied.Commit
		what := "no host's snapshot changed, only the ledger records the commit"
		if len(published) > 0 {
			what = "snapshot published" + epochList(l, published)
		}
		out = append(out, fmt.Sprintf("controller applied %s at %s: %s", l.Applied.Branch, shownCommit(l.Applied.Commit), what))
	}
	rej := ""
	if l.Rejected != nil && l.Rejected.Superseded == "" {
		rej = string(l.Rejected.Commit) + "\x00" + l.Rejected.Reason
	}
	if rej != lw.rejected {
		lw.rejected = rej
		if rej != "" {
			reason := strings.ReplaceAll(strings.TrimSpace(l.Rejected.Reason), "\n", "\n           ")
			out = append(out, fmt.Sprintf("controller REJECTED %s; the last good state stays. Fix it and push again:\n           %s",
				shownCommit(l.Rejected.Commit), reason))
		}
	}
	now := map[string]*snapshots.TombstoneRecord{}
	for _, t := range l.Tombstones {
		k := tombKey(t)
		now[k] = t
		if lw.tombstones[k] == nil {
			out = append(out, fmt.Sprintf("controller published the delete of %s %s on %s (removed by %s): shut down now, destroyed after the agent's grace",
				t.Kind, t.Name, t.Host, shownCommit(t.Tombstone.Commit)))
		}
	}
	sweeps := l.Sweeps
	if len(sweeps) < lw.sweeps {
		lw.sweeps = 0 // the list is bounded: the oldest fell off
	}
	swept := map[string]snapshots.SweepRecord{}
	for _, s := range sweeps[min(lw.sweeps, len(sweeps)):] {
		swept[string(s.Kind)+" "+s.Name+"@"+s.Host] = s
	}
	lw.sweeps = len(sweeps)
	gone := make([]string, 0, len(lw.tombstones))
	for k := range lw.tombstones {
		if now[k] == nil {
			gone = append(gone, k)
		}
	}
	sort.Strings(gone)
	for _, k := range gone {
		t := lw.tombstones[k]
		switch s, ok := swept[k]; {
		case ok:
			out = append(out, fmt.Sprintf("controller finalized the delete of %s %s on %s itself: %s", t.Kind, t.Name, t.Host, s.Reason))
		case desiredOn(l, t):
			out = append(out, fmt.Sprintf("controller cancelled the delete of %s %s on %s: its file is back", t.Kind, t.Name, t.Host))
		default:
			out = append(out, fmt.Sprintf("controller finalized the delete of %s %s on %s: the agent destroyed it", t.Kind, t.Name, t.Host))
		}
	}
	lw.tombstones = now
	if !appliedMoved && len(published) > 0 {
		out = append(out, "controller: snapshot published"+epochList(l, published))
	}
	return out
}

// desiredOn reports whether the ledger lists t's object on its host again.
func desiredOn(l *snapshots.Ledger, t *snapshots.TombstoneRecord) bool {
	h := l.Hosts[t.Host]
	if h == nil {
		return false
	}
	if t.Kind == desired.KindVolume {
		return slices.Contains(h.Volumes, t.Name)
	}
	return slices.Contains(h.VMs, t.Name)
}

func hostNames(l *snapshots.Ledger) []string {
	hosts := make([]string, 0, len(l.Hosts))
	for h, rec := range l.Hosts {
		if rec != nil {
			hosts = append(hosts, h)
		}
	}
	sort.Strings(hosts)
	return hosts
}

// epochList is " for demo (epoch 3)", or " for a (epoch 2), b (epoch 5)";
// "" for no host.
func epochList(l *snapshots.Ledger, hosts []string) string {
	if len(hosts) == 0 {
		return ""
	}
	parts := make([]string, len(hosts))
	for i, h := range hosts {
		parts[i] = fmt.Sprintf("%s (epoch %d)", h, l.Hosts[h].Epoch)
	}
	return " for " + strings.Join(parts, ", ")
}

// shownCommit names a commit for the demo's narration: abbreviated, and
// "(fetch failed)" for none.
func shownCommit(commit desired.Hash) string {
	if commit == "" {
		return "(fetch failed)"
	}
	return commit.Short()
}
