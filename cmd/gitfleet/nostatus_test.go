package main

import (
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/status"
)

// An offline host's row says since when no status came (its status'
// observedAt) and that nothing here tells why; an online one's does not.
func TestStatusOfflineHostSaysNoStatusSince(t *testing.T) {
	at := time.Date(2026, 12, 2, 9, 30, 0, 0, time.UTC)
	rep := statusReport{
		Hosts: []*status.Status{
			{Host: "hv-a", ObservedAt: at, VMs: []status.VM{{Name: "web-01", Phase: status.PhaseReady, Power: "running"}}},
			{Host: "hv-b", ObservedAt: at},
		},
		Liveness: map[string]status.HostState{
			"hv-a": {Host: "hv-a", State: status.StateOffline},
			"hv-b": {Host: "hv-b", State: status.StateOnline},
		},
	}
	var b strings.Builder
	if err := writeHostsAndVMs(&b, rep); err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, line := range strings.Split(b.String(), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			rows[f[0]] = line
		}
	}
	if want := "offline: no status since 2026-12-02T09:30:00Z (down, cut off from git, or its writes refused"; !strings.Contains(rows["hv-a"], want) {
		t.Errorf("hv-a's row lacks %q:\n%s", want, b.String())
	}
	if strings.Contains(rows["hv-b"], "no status since") {
		t.Errorf("an online host says it sent no status:\n%s", b.String())
	}
	if !strings.Contains(rows["web-01"], "host offline: as last reported") {
		t.Errorf("the offline host's VM is not marked:\n%s", b.String())
	}
}

// A degraded network is in its host's note.
func TestStatusHostNoteNamesADegradedNetwork(t *testing.T) {
	st := &status.Status{Host: "hv-a", Networks: []status.NetworkHealth{{Name: "lab", Degraded: "bridge gf-lab is missing"}, {Name: "lan"}}}
	if got := hostNote(st); got != "network lab degraded: bridge gf-lab is missing" {
		t.Errorf("note = %q", got)
	}
}
