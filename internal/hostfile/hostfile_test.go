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
