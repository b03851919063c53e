package snapshots

import (
	"path/filepath"
	"reflect"
	"testing"

	"github.com/gitfleet/gitfleet/desired"
)

// FuzzParseSnapshot checks that the snapshot parser never panics or hangs
// and that what it accepts encodes and parses back to the same value.
func FuzzParseSnapshot(f *testing.F) {
	fl, err := desired.LoadDir(filepath.Join("..", "examples", "fleet"))
	if err != nil {
		f.Fatal(err)
	}
	for name, vm := range fl.VMs {
		s := &Snapshot{Host: vm.Spec.Host, Epoch: 3, VMs: []SnapshotVM{{Name: name, SpecHash: desired.SpecHash(vm.Spec), Spec: vm.Spec}},
			Volumes: []SnapshotVolume{}}
		b, err := MarshalSnapshot(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("host: hv-a\nvms: []\nvolumes: []\n"))
	f.Add([]byte("host: hv-a\nepoch: 18446744073709551615\nvms: []\nvolumes: [{name: a, sizeGB: 1, tombstoned: true, tombstone: {commit: c, author: a, time: t, epoch: 2}}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseSnapshot(data)
		if err != nil {
			return
		}
		out, err := MarshalSnapshot(s)
		if err != nil {
			t.Fatalf("MarshalSnapshot of a parsed snapshot: %v", err)
		}
		back, err := ParseSnapshot(out)
		if err != nil {
			t.Fatalf("ParseSnapshot(MarshalSnapshot(s)): %v\n%s", err, out)
		}
		if !reflect.DeepEqual(back, s) {
			t.Fatalf("round trip changed the snapshot:\n got %+v\nwant %+v", back, s)
		}
	})
}
