// Package golden compares test output with golden files under testdata/
// and rewrites them when the test binary runs with -update. It registers
// the -update flag, so only test code imports it, and a package that does
// defines no -update flag of its own.
package golden

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

// Update reports whether the test binary runs with -update, for a test that
// rewrites a generated file outside testdata/ itself.
func Update() bool { return *update }

// Check compares got with the file testdata/<name> (name uses slashes), or
// writes got there under -update. A missing file or a difference fails t
// with both texts and the command that rewrites the file.
func Check(t testing.TB, name string, got []byte) {
	t.Helper()
	p := filepath.Join("testdata", filepath.FromSlash(name))
	if *update {
		if err := os.WriteFile(p, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if string(got) != string(want) {
		t.Errorf("output differs from %s (go test -update rewrites it):\n--- got\n%s--- want\n%s", p, got, want)
	}
}
