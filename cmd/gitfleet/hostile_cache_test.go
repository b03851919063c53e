package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// A controller run once over a cache (--cache-dir) whose pack was cut
// short, or that holds a file someone left there, publishes: each of
// those once failed every --once run, since only a later pass of a
// looping controller repaired the first, and nothing ever accepted the
// second.
func TestControllerOnceOverADamagedCacheDir(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, cache string)
	}{
		{"pack cut to half", func(t *testing.T, cache string) {
			packs, err := filepath.Glob(filepath.Join(cache, "objects", "pack", "*.pack"))
			if err != nil || len(packs) == 0 {
				t.Fatalf("no pack in the cache (%v)", err)
			}
			for _, p := range packs {
				fi, err := os.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Truncate(p, fi.Size()/2); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"a stray file", func(t *testing.T, cache string) {
			if err := os.WriteFile(filepath.Join(cache, "README.txt"), []byte("the controller's clone\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := gittest.NewBare(t)
			files := map[string]string{"fleet/hv-a.yaml": strings.Replace(testHost, "vcpus: 2", "vcpus: 100", 1)}
			for i := range 40 {
				name := fmt.Sprintf("vm-%02d", i)
				files["fleet/"+name+".yaml"] = cliVM(name, "hv-a", "1")
			}
			gittest.Commit(t, dir, gittest.Edit{Write: files})
			cache := filepath.Join(t.TempDir(), "cache")
			args := []string{"controller", "--repo", dir, "--path", "fleet", "--cache-dir", cache, "--once"}
			if code, out, errOut := runCLIStderr(t, args...); code != 0 {
				t.Fatalf("first run: exit %d, %q\n%s", code, out, errOut)
			}
			tc.damage(t, cache)
			gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"fleet/vm-00.yaml": cliVM("vm-00", "hv-a", "2")}})
			code, out, errOut := runCLIStderr(t, args...)
			if code != 0 || !strings.Contains(out, "1 snapshot(s) published") {
				t.Fatalf("run over the damaged cache: exit %d, %q\n%s", code, out, errOut)
			}
		})
	}
}
