package hostfile

import "testing"

func TestHost(t *testing.T) {
	for in, want := range map[string]string{
		Path("hv-a"): "hv-a", "hosts/.yaml": "", "README.md": "", "ledger.yaml": "", "hosts/x/y.yaml": "", "hv-a.yaml": "",
	} {
		got, ok := Host(in)
		if got != want || ok != (want != "") {
			t.Errorf("Host(%q) = %q, %v", in, got, ok)
		}
	}
}

func TestEntry(t *testing.T) {
	type vm struct{ Name, Phase string }
	list := []vm{{"a", "ready"}, {"b", "booting"}}
	name := func(v *vm) string { return v.Name }
	if e := Entry(list, "b", name); e == nil || e != &list[1] {
		t.Errorf("Entry(b) = %v, want a pointer to list[1]", e)
	}
	if e := Entry(list, "c", name); e != nil {
		t.Errorf("Entry(c) = %v, want nil", e)
	}
	if e := Entry([]vm(nil), "a", name); e != nil {
		t.Errorf("Entry in a nil list = %v", e)
	}
}
