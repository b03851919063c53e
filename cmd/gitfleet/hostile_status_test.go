package main

import (
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/status"
)

// TestHostileStatusRetiredUnsignedHost: what the controller writes for a
// host retired with nothing delivered to it whose branch then gets an
// unsigned status (fleet's TestHostileRetiredHostUnsignedCopyIsMarked):
// its copy, a VM "claimed" running, is on the status branch; liveness.yaml
// has no row for it. `gitfleet status` must still not show the claimed
// VM as the host's own, unmarked: liveness.yaml lists no such host, so
// the row says the controller neither verifies nor acts on it.
func TestHostileStatusRetiredUnsignedHost(t *testing.T) {
	rep := statusReport{
		Hosts: []*status.Status{
			{Host: "hv-a", VMs: []status.VM{{Name: "web-01", Phase: status.PhaseReady, Power: "running"}}},
			{Host: "hv-d", VMs: []status.VM{{Name: "claimed", Phase: status.PhaseReady, Power: "running"}}},
		},
		Liveness: map[string]status.HostState{
			"hv-a": {Host: "hv-a", State: status.StateOnline},
		},
	}
	var b strings.Builder
	if err := writeHostsAndVMs(&b, rep); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(b.String(), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "claimed" && !strings.Contains(line, notInFleetNote) {
			t.Errorf("the claimed VM of hv-d's unsigned status is shown unmarked: %s\n%s", line, b.String())
		}
	}
}
