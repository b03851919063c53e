package desired

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

// golden compares got with testdata/<name>, or rewrites it under -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	p := filepath.Join("testdata", name)
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

// TestLoadGolden loads each fleet under testdata/load/ and pins its whole
// error output in testdata/load/<name>.golden.
func TestLoadGolden(t *testing.T) {
	for _, name := range []string{"cross", "partial", "tree"} {
		t.Run(name, func(t *testing.T) {
			_, err := LoadDir(filepath.Join("testdata", "load", name))
			var list ErrorList
			if !errors.As(err, &list) {
				t.Fatalf("err = %v; want an ErrorList", err)
			}
			golden(t, filepath.Join("load", name+".golden"), []byte(list.Error()+"\n"))
		})
	}
}
