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
// a location, and that an accepted VM's spec survives the round trip a
// snapshot puts it through (Encode, then Decode) unchanged.
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
		type entry struct {
			Spec VMSpec `yaml:"spec"`
		}
		in := entry{Spec: obj.vm.Spec}
		out, err := Encode(&in)
		if err != nil {
			t.Fatalf("encode spec: %v", err)
		}
		var back entry
		if err := DecodeStrict("", out, &back); err != nil {
			t.Fatalf("DecodeStrict(encoded spec): %v\n%s", err, out)
		}
		if !reflect.DeepEqual(back, in) {
			t.Fatalf("round trip changed the VM:\n got %+v\nwant %+v", back.Spec, in.Spec)
		}
	})
}
