package desired

import (
	"errors"
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

	// The tree of the last Load as the baseline reports the same, for
	// trees with content IDs (git's) and without (a directory).
	for name, trees := range map[string][2]Tree{
		"directory": {DirTree(before), DirTree(after)},
		"git-like": {newMemTree(map[string]string{"hv-a.yaml": host, "b.yaml": vm("web-01"), "a.yaml": vm("db-01")}, nil),
			newMemTree(map[string]string{"hv-a.yaml": host, "b.yaml": vm("web-01"), "a.yaml": vm("web-01")}, nil)},
	} {
		t.Run(name, func(t *testing.T) {
			l := NewLoader("")
			if l.SetBaselineLast() {
				t.Fatal("SetBaselineLast before any Load: true, want false")
			}
			if _, err := l.Load(trees[0]); err != nil {
				t.Fatal(err)
			}
			if !l.SetBaselineLast() {
				t.Fatal("SetBaselineLast after a Load: false")
			}
			if _, err := l.Load(trees[1]); err == nil || err.Error() != want {
				t.Errorf("with the last tree as baseline: %v\nwant %s", err, want)
			}
		})
	}
}

// A Load that could not read every file leaves no tree to take as the
// baseline: SetBaselineLast refuses rather than compare with part of one.
func TestSetBaselineLastAfterAFailedRead(t *testing.T) {
	l := NewLoader("")
	if _, err := l.Load(newMemTree(goodFleet, nil)); err != nil {
		t.Fatal(err)
	}
	broken := newMemTree(goodFleet, nil)
	broken.files = append(broken.files, File{Path: "vms/unreadable.yaml", Mode: Regular, ID: "x",
		Read: func() ([]byte, error) { return nil, errors.New("disk gone") }})
	if _, err := l.Load(broken); err == nil {
		t.Fatal("Load of a tree with an unreadable file succeeded")
	}
	if l.SetBaselineLast() {
		t.Error("SetBaselineLast after a failed read: true, want false")
	}
}

// hidden is true when any element of the path starts with a dot.
func TestHidden(t *testing.T) {
	for p, want := range map[string]bool{
		"vms/web.yaml": false, "a./b.yaml": false, "vms/web.yaml.": false, "x/y..z/w.yaml": false,
		".gitfleet/schema.json": true, "vms/.draft/web.yaml": true, "vms/.web.yaml": true, ".web.yaml": true,
	} {
		if got := hidden(p); got != want {
			t.Errorf("hidden(%q) = %v, want %v", p, got, want)
		}
	}
}
