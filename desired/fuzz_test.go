package desired

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// fuzzSeeds are object files: the test fleet, the example fleet and a few
// hostile shapes.
func fuzzSeeds(f *testing.F) {
	for _, c := range goodFleet {
		f.Add([]byte(c))
	}
	examples, _ := filepath.Glob(filepath.Join("..", "examples", "fleet", "*", "*.yaml"))
	for _, p := range examples {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{
		"", "---\n", "\xEF\xBB\xBF" + vm(vmBody), strings.ReplaceAll(vm(vmBody), "\n", "\r\n"),
		vm(vmBody) + "---\n" + vm(vmBody), vm(vmBody+"  volumes: &a [x]\n") + bomb,
		"a: &a [*a]\n", "{a: [[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]}\n", vm("\tvcpus: 1\n"),
		vm(vmBody + "  <<: {power: stopped}\n"), "\xFF\xFEa\x00", vm(vmBody + "  power: !!str on\n"),
		vm("\t\n" + vmBody + "\t# c\n  cloudInit:\n    userData: |\n      a\n      \t\n\t\n      b\n \t\n"),
	} {
		f.Add([]byte(s))
	}
}

// FuzzParseFile checks that the decoder never panics or hangs, that it
// returns an object exactly when it reports no error, that every error has
// a location, and that an accepted VM survives the snapshot round trip
// unchanged.
func FuzzParseFile(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		obj, errs := parseFile("f.yaml", data)
		if (obj == nil) == (len(errs) == 0) {
			t.Fatalf("object %v with %d errors", obj, len(errs))
		}
		for _, e := range errs {
			if e.File != "f.yaml" || e.Line < 1 || e.Col < 1 || e.Msg == "" {
				t.Fatalf("error without a location or message: %+v", e)
			}
		}
		if obj == nil || obj.kind != KindVM {
			return
		}
		s := &Snapshot{Host: "hv-a", Epoch: 1, VMs: []SnapshotVM{{Name: obj.name, SpecHash: SpecHash(obj.vm.Spec), Spec: obj.vm.Spec}}, Volumes: []SnapshotVolume{}}
		out, err := MarshalSnapshot(s)
		if err != nil {
			t.Fatalf("MarshalSnapshot: %v", err)
		}
		back, err := ParseSnapshot(out)
		if err != nil {
			t.Fatalf("ParseSnapshot(MarshalSnapshot(s)): %v\n%s", err, out)
		}
		if !reflect.DeepEqual(back, s) {
			t.Fatalf("snapshot round trip changed the VM:\n got %+v\nwant %+v", back.VMs[0].Spec, s.VMs[0].Spec)
		}
	})
}

// FuzzParseSnapshot checks that the snapshot parser never panics or hangs
// and that what it accepts encodes and parses back to the same value.
func FuzzParseSnapshot(f *testing.F) {
	fl, err := LoadDir(filepath.Join("..", "examples", "fleet"))
	if err != nil {
		f.Fatal(err)
	}
	for name, vm := range fl.VMs {
		s := &Snapshot{Host: vm.Spec.Host, Epoch: 3, VMs: []SnapshotVM{{Name: name, SpecHash: SpecHash(vm.Spec), Spec: vm.Spec}},
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
