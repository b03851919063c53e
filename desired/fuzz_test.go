package desired

import (
	"encoding/json"
	"errors"
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
		profileFile("p", baseProfile), profileFile("p", "  host: x\n  kernel: {cmdline: a}\n"),
		vmFile("a", "  profile: p\n  host: hv-a\n  kernel: {cmdline: b}\n  network:\n"),
	} {
		f.Add([]byte(s))
	}
}

// FuzzParseFile checks that the decoder never panics or hangs, that it
// returns an object exactly when it reports no error, that every error has
// a location, and that an accepted VM's spec survives the round trip a
// snapshot puts it through (Encode, then Decode) unchanged. A Profile, or
// a VM that names one, is loaded with a VM naming it or the profile it
// names: the merge holds to the same rules, its errors located in one of
// the files, and an effective spec round-trips.
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
		switch {
		case obj == nil:
		case obj.kind == KindProfile || obj.kind == KindVM && obj.vm.Profile != "":
			fuzzProfiled(t, data, obj)
		case obj.kind == KindVM:
			roundTrip(t, obj.vm.Spec)
		}
	})
}

// fuzzProfiled loads obj (the file data) with what completes it: a VM
// naming the profile, or the profile the VM names.
func fuzzProfiled(t *testing.T, data []byte, obj *object) {
	files := map[string]string{"f.yaml": string(data), "h.yaml": profileHost}
	if obj.kind == KindProfile {
		files["vm.yaml"] = vmFile("fuzzed", "  profile: "+obj.name+"\n  host: hv-a\n")
	} else {
		files["p.yaml"] = profileFile(obj.vm.Profile, baseProfile)
	}
	fl, err := NewLoader("").Load(newMemTree(files, nil))
	var list ErrorList
	switch {
	case errors.As(err, &list):
		for _, e := range list {
			if _, ok := files[e.File]; !ok || e.Line < 1 || e.Col < 1 || e.Msg == "" {
				t.Fatalf("error without a location or message: %+v", e)
			}
		}
	case err != nil:
		t.Fatalf("Load: %v", err)
	default:
		for _, vm := range fl.VMs {
			roundTrip(t, vm.Spec)
		}
	}
}

// roundTrip checks that spec survives Encode and DecodeStrict unchanged,
// as a snapshot carries it: the same spec, up to an empty list written as
// [] (which Encode leaves out, and which decodes as no list: the spec's
// JSON and its SpecHash are the same).
func roundTrip(t *testing.T, spec VMSpec) {
	type entry struct {
		Spec VMSpec `yaml:"spec"`
	}
	in := entry{Spec: spec}
	out, err := Encode(&in)
	if err != nil {
		t.Fatalf("encode spec: %v", err)
	}
	var back entry
	if err := DecodeStrict("", out, &back); err != nil {
		t.Fatalf("DecodeStrict(encoded spec): %v\n%s", err, out)
	}
	if !reflect.DeepEqual(back, in) && !reflect.DeepEqual(specJSON(t, back.Spec), specJSON(t, in.Spec)) {
		t.Fatalf("round trip changed the VM:\n got %+v\nwant %+v", back.Spec, in.Spec)
	}
}

func specJSON(t *testing.T, spec VMSpec) string {
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
