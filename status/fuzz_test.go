package status

import (
	"reflect"
	"testing"
)

// FuzzParse: any input either fails to parse or parses into a status that
// survives Marshal and Parse unchanged.
func FuzzParse(f *testing.F) {
	seed, _ := Marshal(sampleStatus())
	f.Add(seed)
	f.Add([]byte("host: hv-a\n"))
	f.Add([]byte("host: hv-a\nvms: [{name: x, phase: ready}]\ndestroyed: [a, b]\n"))
	f.Add([]byte("host: [\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := Parse("fuzz.yaml", data)
		if err != nil {
			return
		}
		out, err := Marshal(st)
		if err != nil {
			t.Fatalf("marshal a parsed status: %v", err)
		}
		back, err := Parse("fuzz.yaml", out)
		if err != nil {
			t.Fatalf("reparse:\n%s\n%v", out, err)
		}
		normalize(st)
		normalize(back)
		if !reflect.DeepEqual(st, back) {
			t.Fatalf("round trip changed the status:\n%+v\n%+v", st, back)
		}
	})
}

// normalize reads nil and empty lists alike: Marshal writes both as [].
func normalize(st *Status) {
	if len(st.VMs) == 0 {
		st.VMs = nil
	}
	if len(st.Quarantined) == 0 {
		st.Quarantined = nil
	}
	if len(st.Destroyed) == 0 {
		st.Destroyed = nil
	}
	if len(st.Volumes) == 0 {
		st.Volumes = nil
	}
	if len(st.Orphans) == 0 {
		st.Orphans = nil
	}
}
