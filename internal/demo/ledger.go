package demo

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/gitsource"
)

// ledgerWatch reports what the controller did with the pushes: the
// desired-state commit it applied and the last commit it rejected, read
// from ledger.yaml on the snapshots branch.
type ledgerWatch struct {
	repo     *gitsource.Repo
	applied  string
	rejected string
}

// ledgerPath is the controller's ledger on the snapshots branch.
const ledgerPath = "ledger.yaml"

// read fetches the snapshots branch and returns the lines to print for
// what changed since the last read: "applied <commit>" and "rejected
// <commit>: <reason>". A branch not written yet or a failed read prints
// nothing (the controller's log has the details).
func (lw *ledgerWatch) read(ctx context.Context) []string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tip, err := lw.repo.Fetch(ctx, fleet.DefaultSnapshotsBranch)
	if err != nil {
		return nil
	}
	data, err := lw.repo.ReadFile(tip, ledgerPath)
	if err != nil {
		return nil
	}
	var l fleet.Ledger
	if err := yaml.Unmarshal(data, &l); err != nil {
		return nil
	}
	return lw.changes(&l)
}

// changes compares l with what was seen before.
func (lw *ledgerWatch) changes(l *fleet.Ledger) []string {
	var out []string
	if l.Applied != nil && l.Applied.Commit != lw.applied {
		lw.applied = l.Applied.Commit
		out = append(out, fmt.Sprintf("controller applied %s at %s: snapshots published", l.Applied.Branch, short(l.Applied.Commit)))
	}
	rej := ""
	if l.Rejected != nil && l.Rejected.Superseded == "" {
		rej = l.Rejected.Commit + "\x00" + l.Rejected.Reason
	}
	if rej != lw.rejected {
		lw.rejected = rej
		if rej != "" {
			reason := strings.ReplaceAll(strings.TrimSpace(l.Rejected.Reason), "\n", "\n           ")
			out = append(out, fmt.Sprintf("controller REJECTED %s; the last good state stays. Fix it and push again:\n           %s",
				short(l.Rejected.Commit), reason))
		}
	}
	return out
}

func short(commit string) string {
	if commit == "" {
		return "(fetch failed)"
	}
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}
