package status

import (
	"strings"
	"testing"
)

// liveness.yaml carries the Hosts table's state of every host, retired ones
// marked, and reads back as written; the table and the VM rows say what the
// state means for a person reading them.
func TestLivenessAndHostNotes(t *testing.T) {
	s := Summary{Hosts: []HostSummary{
		{Name: "hv-a", Reported: true, Online: true, VMs: []VM{{Name: "web-01", Phase: PhaseReady, Power: "running"}}},
		{Name: "hv-b", Reported: true, Online: true, Suspended: &Suspension{Epoch: 3, Reason: "kernel upgrade"},
			VMs: []VM{{Name: "web-02", Phase: PhaseReady, Power: "running"}}},
		{Name: "hv-c", Reported: true, Retired: true, VMs: []VM{{Name: "web-03", Phase: PhaseReady, Power: "running"}}},
		{Name: "hv-d"},
		{Name: "hv-e", Reported: true, StatusError: "empty file"},
	}}
	data, err := Liveness(s)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseLiveness(LivenessPath, data)
	if err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	want := map[string]HostState{
		"hv-a": {Host: "hv-a", State: StateOnline},
		"hv-b": {Host: "hv-b", State: StateOnline},
		"hv-c": {Host: "hv-c", State: StateOffline, Retired: true},
		"hv-d": {Host: "hv-d", State: StateNoStatus},
		"hv-e": {Host: "hv-e", State: StateUnreadable},
	}
	for host, w := range want {
		if got[host] != w {
			t.Errorf("%s: %+v, want %+v", host, got[host], w)
		}
	}

	readme := string(RenderSummary(s))
	for _, line := range []string{
		"| hv-c | offline, retired\\: no Host object; listed until it acks the deletes delivered to it |",
		"| web-02 | hv-b | ready | running | - | - | host suspended\\: changes wait |",
		"| web-03 | hv-c | ready | running | - | - | host offline\\: as last reported |",
		"| web-01 | hv-a | ready | running | - | - | - |",
	} {
		if !strings.Contains(readme, line) {
			t.Errorf("README lacks %q:\n%s", line, readme)
		}
	}

	for _, bad := range []string{"hosts: [{host: hv-a, state: asleep}]", "hosts: [{state: online}]", "hosts: [{host: a, state: online, extra: 1}]"} {
		if _, err := ParseLiveness(LivenessPath, []byte(bad)); err == nil || !strings.Contains(err.Error(), LivenessPath) {
			t.Errorf("%q: %v, want an error naming %s", bad, err, LivenessPath)
		}
	}
}
