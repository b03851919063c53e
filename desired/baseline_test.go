package desired

import (
	"strings"
	"testing"
)

// With a baseline, a duplicate name is reported at the file whose content
// the change made: a new path, or an existing file edited to reuse a name.
func TestDuplicateReportedAtTheFileTheChangeMade(t *testing.T) {
	host := "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec: {}\n"
	vm := func(name string) string {
		return "apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata: {name: " + name + "}\nspec:\n  host: hv-a\n  vcpus: 1\n  memoryMB: 128\n  diskGB: 1\n" +
			"  kernel: {url: https://images.example/k, sha256: " + strings.Repeat("a", 64) + "}\n"
	}
	before := writeTree(t, map[string]string{"hv-a.yaml": host, "b.yaml": vm("web-01"), "a.yaml": vm("db-01")})
	// a.yaml, which sorts first, is edited to define web-01 too.
	after := writeTree(t, map[string]string{"hv-a.yaml": host, "b.yaml": vm("web-01"), "a.yaml": vm("web-01")})
	want := `a.yaml:3:18: metadata.name: VM "web-01" is also defined in b.yaml:3:18, defined before this change; names are unique per kind`

	l := NewLoader("")
	if err := l.SetBaseline(DirTree(before)); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Load(DirTree(after)); err == nil || err.Error() != want {
		t.Errorf("with a baseline: %v\nwant %s", err, want)
	}
	// Without one, the later path is reported.
	if _, err := NewLoader("").Load(DirTree(after)); err == nil || !strings.HasPrefix(err.Error(), "b.yaml:3:18:") {
		t.Errorf("without a baseline: %v", err)
	}
}
