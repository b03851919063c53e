package gitsource_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// A pack cut short keeps its index whole: every object still looks
// present, and only reading one past the cut fails. The first Open, Fetch
// and read of every file of the tip succeed all the same (a one-shot run,
// `gitfleet controller --once`, has no second pass to repair in), for
// packs cut at several points and for full and shallow caches.
func TestTruncatedPackRepairedAtOpen(t *testing.T) {
	ctx := context.Background()
	rm := gittest.NewBare(t)
	files := map[string]string{}
	for i := range 60 {
		files[fmt.Sprintf("vms/vm-%02d.yaml", i)] = fmt.Sprintf("name: vm-%02d\nnote: %0200d\n", i, i)
	}
	gittest.Commit(t, rm, gittest.Edit{Write: files})
	tip := gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"hosts/a.yaml": "a\n"}})
	for _, depth := range []int{0, 1} {
		for _, keep := range []int64{2, 4, 10} { // keep (keep-1)/keep of the pack
			t.Run(fmt.Sprintf("depth %d, cut at %d/%d", depth, keep-1, keep), func(t *testing.T) {
				cache := filepath.Join(t.TempDir(), "cache")
				opts := gitsource.Options{URL: rm, CacheDir: cache, Depth: depth}
				r := open(t, opts)
				_, err := r.Fetch(ctx, "main")
				require.NoError(t, err)
				require.NoError(t, r.Close())
				packs, err := filepath.Glob(filepath.Join(cache, "objects", "pack", "*.pack"))
				require.NoError(t, err)
				require.NotEmpty(t, packs)
				for _, p := range packs {
					fi, err := os.Stat(p)
					require.NoError(t, err)
					require.NoError(t, os.Truncate(p, fi.Size()*(keep-1)/keep))
				}

				r = open(t, opts)
				defer r.Close()
				got, err := r.Fetch(ctx, "main")
				require.NoError(t, err)
				assert.Equal(t, tip, got)
				contents, _ := walk(t, mustTree(t, r, got, ""))
				assert.Len(t, contents, len(files)+1)
				assert.Equal(t, files["vms/vm-59.yaml"], contents["vms/vm-59.yaml"])
			})
		}
	}
}
