package golden

import (
	"os"
	"path/filepath"
	"testing"
)

// recorder is a testing.TB that records failures instead of stopping the
// test, so Check's verdicts can be asserted.
type recorder struct {
	testing.TB
	failed bool
}

func (r *recorder) Helper()               {}
func (r *recorder) Errorf(string, ...any) { r.failed = true }
func (r *recorder) Fatalf(string, ...any) { r.failed = true; panic(r) }
func (r *recorder) Fatal(...any)          { r.failed = true; panic(r) }

func check(t *testing.T, name string, got []byte) (failed bool) {
	r := &recorder{TB: t}
	defer func() {
		if p := recover(); p != nil && p != r {
			panic(p)
		}
		failed = r.failed
	}()
	Check(r, name, got)
	return r.failed
}

func TestCheck(t *testing.T) {
	if Update() {
		t.Skip("-update rewrites files instead of comparing them")
	}
	t.Chdir(t.TempDir())
	if err := os.MkdirAll(filepath.Join("testdata", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("testdata", "sub", "a.txt"), []byte("same\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, file, got string
		fails           bool
	}{
		{"equal", "sub/a.txt", "same\n", false},
		{"different", "sub/a.txt", "other\n", true},
		{"missing", "sub/b.txt", "same\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := check(t, tc.file, []byte(tc.got)); got != tc.fails {
				t.Errorf("Check failed = %v; want %v", got, tc.fails)
			}
		})
	}
}
