package agent

import (
	"context"
	"sort"

	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
)

// checkNetworks asks a NetworkHealthReporter what keeps the snapshot's
// host networks' guests from working, logs each change, and keeps the
// answer for Report. A snapshot without host networks clears it.
func (e *Engine) checkNetworks(ctx context.Context, snap *snapshots.Snapshot) {
	hr, ok := e.prov.(NetworkHealthReporter)
	if !ok {
		return
	}
	var health map[string]string
	if len(snap.HostSpec.Networks) > 0 {
		health = hr.NetworkHealth(ctx, snap.HostSpec.Networks)
	}
	e.mu.Lock()
	prev := e.netHealth
	e.netHealth = health
	e.mu.Unlock()
	for _, name := range sortedNames(health) {
		why, was := health[name], prev[name]
		switch {
		case why == was:
		case why == "":
			e.log.WithField("network", name).Info("host network no longer degraded")
		default:
			e.log.WithField("network", name).WithField("reason", why).
				Warn("host network degraded: its guests' traffic does not flow; the guests keep running")
		}
	}
}

// networksLocked is the status's networks from netHealth, and adds to
// each VM row on a degraded network what keeps it from working. Caller
// holds e.mu.
func (e *Engine) networksLocked(st *status.Status) {
	if len(e.netHealth) == 0 {
		return
	}
	for _, name := range sortedNames(e.netHealth) {
		st.Networks = append(st.Networks, status.NetworkHealth{Name: name, Degraded: e.netHealth[name]})
	}
	for i := range st.VMs {
		row := &st.VMs[i]
		rec := e.recs[row.Name]
		if rec == nil || rec.Spec.Network == "" || row.Power != "running" {
			continue
		}
		if why := e.netHealth[rec.Spec.Network]; why != "" {
			row.Message = status.JoinNotes(row.Message, status.DegradedNote(status.NetworkHealth{Name: rec.Spec.Network, Degraded: why}))
		}
	}
}

// sortedNames is m's keys, sorted.
func sortedNames(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
