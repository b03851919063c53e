package status

import (
	"strings"
	"testing"
)

// A degraded network is named in its host's state; a VM's note carries
// what its agent wrote; a healthy network says nothing.
func TestRenderSummaryNamesADegradedNetwork(t *testing.T) {
	h := HostSummary{Name: "hv-a", Reported: true, Online: true,
		Networks: []NetworkHealth{{Name: "lab", Degraded: "table ip filter chain FORWARD on the forward hook has policy drop"}, {Name: "lan"}},
		VMs:      []VM{{Name: "web-01", Phase: PhaseReady, Power: "running", Message: "network lab degraded: table ip filter chain FORWARD on the forward hook has policy drop"}}}
	got := string(RenderSummary(Summary{Hosts: []HostSummary{h}}))
	for _, want := range []string{
		`| hv-a | online, network lab degraded\: table ip filter chain FORWARD on the forward hook has policy drop |`,
		`| web-01 | hv-a | ready | running | - | - | network lab degraded\: table ip filter chain FORWARD`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "network lan") {
		t.Errorf("a healthy network is named:\n%s", got)
	}
	data, err := Marshal(&Status{Host: "hv-a", Networks: h.Networks})
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse("hosts/hv-a.yaml", data)
	if err != nil || len(back.Networks) != 2 || back.Networks[0] != h.Networks[0] || back.Networks[1].Degraded != "" {
		t.Fatalf("networks do not survive a round trip: %v %+v\n%s", err, back, data)
	}
}
