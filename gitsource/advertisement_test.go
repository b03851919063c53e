package gitsource

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// A remote whose ref advertisement is larger than the bound fails the
// fetch with ErrTooManyRefs over http and the file transport, before the
// whole list is in memory; it is a git failure, not cache damage, so the
// cache keeps what it had, and the next fetch after the refs are gone
// works.
func TestRefAdvertisementIsBounded(t *testing.T) {
	ctx := context.Background()
	dir := gittest.NewBare(t)
	first := gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"fleet/a.yaml": "kind: VM\n"}})
	url := gittest.Serve(t, filepath.Dir(dir)) + "/" + filepath.Base(dir)

	old := maxAdvertisement
	maxAdvertisement = 64 << 10
	t.Cleanup(func() { maxAdvertisement = old })

	for _, remote := range []struct{ name, url string }{{"file", dir}, {"http", url}} {
		t.Run(remote.name, func(t *testing.T) {
			r, err := Open(ctx, Options{URL: remote.url, CacheDir: filepath.Join(t.TempDir(), "cache")})
			require.NoError(t, err)
			defer r.Close()
			tip, err := r.Fetch(ctx, "main")
			require.NoError(t, err)
			require.Equal(t, first, tip)

			// 3,000 tags: about 180 KB of advertisement.
			var packed strings.Builder
			packed.WriteString("# pack-refs with: peeled fully-peeled sorted \n")
			for i := 0; i < 3000; i++ {
				fmt.Fprintf(&packed, "%s refs/tags/t%05d\n", first, i)
			}
			require.NoError(t, os.WriteFile(filepath.Join(dir, "packed-refs"), []byte(packed.String()), 0o644))
			_, err = r.Fetch(ctx, "main")
			require.ErrorIs(t, err, ErrTooManyRefs)
			require.Contains(t, err.Error(), "more than 64 KiB of ref advertisement", "the bound is named")
			got, err := r.ReadFile(first, "fleet/a.yaml")
			require.NoError(t, err, "the cache keeps what it had")
			require.Equal(t, "kind: VM\n", string(got))

			require.NoError(t, os.Remove(filepath.Join(dir, "packed-refs")))
			tip, err = r.Fetch(ctx, "main")
			require.NoError(t, err)
			require.Equal(t, first, tip)
		})
	}
}
