package desired

import (
	"bytes"
	"reflect"
	"testing"
)

func TestComputeSnapshotsRoundTrip(t *testing.T) {
	f, err := LoadDir(writeTree(t, goodFleet))
	if err != nil {
		t.Fatal(err)
	}
	snaps := ComputeSnapshots(f)
	if len(snaps) != 2 {
		t.Fatalf("got %d snapshots, want one per host (2)", len(snaps))
	}
	a := snaps["hv-a"]
	if len(a.VMs) != 2 || a.VMs[0].Name != "web-01" || a.VMs[1].Name != "web-02" {
		t.Fatalf("hv-a VMs = %+v, want web-01, web-02 in order", a.VMs)
	}
	if a.VMs[0].SpecHash != SpecHash(f.VMs["web-01"].Spec) || len(a.VMs[0].SpecHash) != 64 {
		t.Errorf("web-01 specHash = %q", a.VMs[0].SpecHash)
	}
	if len(a.Volumes) != 1 || a.Volumes[0] != (SnapshotVolume{Name: "web-01-data", SizeGB: 50}) {
		t.Errorf("hv-a volumes = %+v", a.Volumes)
	}
	if a.HostSpec.Networks["lan"].Bridge != "br0" {
		t.Errorf("hv-a hostSpec = %+v", a.HostSpec)
	}
	for _, s := range snaps {
		s.Epoch, s.Source = 7, SnapshotSource{Commit: "0123abcd", Branch: "main"}
		data, err := MarshalSnapshot(s)
		if err != nil {
			t.Fatal(err)
		}
		again, err := MarshalSnapshot(s)
		if err != nil || !bytes.Equal(data, again) {
			t.Fatalf("MarshalSnapshot is not deterministic")
		}
		back, err := ParseSnapshot(data)
		if err != nil {
			t.Fatalf("ParseSnapshot(MarshalSnapshot(%s)): %v\n%s", s.Host, err, data)
		}
		if !reflect.DeepEqual(back, s) {
			t.Errorf("round trip of %s:\n got %+v\nwant %+v", s.Host, back, s)
		}
	}
}
