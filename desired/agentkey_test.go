package desired

import (
	"errors"
	"strings"
	"testing"
)

const testAgentKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMYho+K0VYK4PzBVjogDQiQYyYVZNkhc+WH4UipvMyX2 gitfleet-agent@hv-a"

func agentKeyHost(value string) map[string]string {
	return map[string]string{"hosts/hv-a.yaml": "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec:\n  agentKey: " + value + "\n"}
}

// A Host's spec.agentKey is one SSH public key line; anything else is an
// error at its file, line and column.
func TestHostAgentKey(t *testing.T) {
	f, err := LoadDir(writeTree(t, agentKeyHost(testAgentKey)))
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Hosts["hv-a"].Spec.AgentKey; got != testAgentKey {
		t.Errorf("agentKey = %q", got)
	}
	for _, tc := range []struct{ name, value, want string }{
		{"not base64", "ssh-ed25519 AAAA-not-a-key", `hosts/hv-a.yaml:5:13: spec.agentKey: "ssh-ed25519 AAAA-not-a-k..." is not an SSH public key line`},
		{"an age recipient", "age1qyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqs3290gq", `hosts/hv-a.yaml:5:13: spec.agentKey: "age1qyqszqgpqyqszqgpqyqs..." is not an SSH public key line`},
		{"options", `'restrict ` + testAgentKey + `'`, "hosts/hv-a.yaml:5:13: spec.agentKey: holds options before the key"},
		{"two keys", `"` + testAgentKey + `\n` + testAgentKey + `"`, "hosts/hv-a.yaml:5:13: spec.agentKey: holds more than one key"},
		{"a private key", "'-----BEGIN OPENSSH PRIVATE KEY----- b3BlbnNzaC1rZXktdjEAAAAA'", "hosts/hv-a.yaml:5:13: spec.agentKey: is a private key"},
		{"not a string", "[a, b]", "hosts/hv-a.yaml:5:13: spec.agentKey: must be a string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadDir(writeTree(t, agentKeyHost(tc.value)))
			var list ErrorList
			if !errors.As(err, &list) || len(list) != 1 {
				t.Fatalf("err = %v; want one error", err)
			}
			if !strings.HasPrefix(list[0].Error(), tc.want) {
				t.Errorf("error:\n got %s\nwant %s…", list[0], tc.want)
			}
			if strings.Contains(err.Error(), "b3BlbnNzaC1rZXkt") {
				t.Errorf("the error quotes the private key: %v", err)
			}
		})
	}
}

// plan warns when a Host's agent key is set, changed or removed.
func TestPlanOfAgentKey(t *testing.T) {
	const other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHE+RFQWADQ8ET0erG2aOsfqB3NhBE604r37X2Wn0eo9 gitfleet-agent@hv-a"
	none := map[string]string{"hosts/hv-a.yaml": "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec: {}\n"}
	load := func(files map[string]string) *Fleet {
		t.Helper()
		f, err := LoadDir(writeTree(t, files))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	for _, tc := range []struct {
		name       string
		base, head map[string]string
		want       string
	}{
		{"set", none, agentKeyHost(testAgentKey), AgentKeyWarning},
		{"changed", agentKeyHost(testAgentKey), agentKeyHost(other), AgentKeyWarning},
		{"removed", agentKeyHost(testAgentKey), none, "acks are taken unsigned again"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text := ComputePlan(load(tc.base), load(tc.head), PlanOptions{}).Text()
			if !strings.Contains(text, tc.want) {
				t.Errorf("plan lacks %q:\n%s", tc.want, text)
			}
		})
	}
}
