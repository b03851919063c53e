package gitsource_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// A file or directory someone left in a cache (notes, an editor's backup,
// a lost+found of the cache's own filesystem) is not the cache's: it is
// ignored and kept, through a repair that clones afresh too, and every
// start uses the cache. A directory with nothing of a git cache in it is
// still refused, and nothing in it is touched.
func TestStrayFileInCacheIsKept(t *testing.T) {
	ctx := context.Background()
	rm := gittest.NewBare(t)
	tip := gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"hosts/a.yaml": "a\n"}})
	cache := filepath.Join(t.TempDir(), "cache")
	opts := gitsource.Options{URL: rm, CacheDir: cache}
	r := open(t, opts)
	_, err := r.Fetch(ctx, "main")
	require.NoError(t, err)
	require.NoError(t, r.Close())

	require.NoError(t, os.WriteFile(filepath.Join(cache, "NOTES.txt"), []byte("why this cache is here\n"), 0o600))
	require.NoError(t, os.Mkdir(filepath.Join(cache, "lost+found"), 0o700))
	for _, repair := range []bool{false, true} {
		if repair {
			// Damage that only a fresh clone mends.
			require.NoError(t, os.RemoveAll(filepath.Join(cache, "objects")))
		}
		r, err = gitsource.Open(ctx, opts)
		require.NoError(t, err, "open a cache holding a stray file")
		got, err := r.Fetch(ctx, "main")
		require.NoError(t, err)
		assert.Equal(t, tip, got)
		require.NoError(t, r.Close())
		data, err := os.ReadFile(filepath.Join(cache, "NOTES.txt"))
		require.NoError(t, err, "the stray file is kept (repair %v)", repair)
		assert.Equal(t, "why this cache is here\n", string(data))
		assert.DirExists(t, filepath.Join(cache, "lost+found"))
	}

	notOurs := filepath.Join(t.TempDir(), "home")
	require.NoError(t, os.MkdirAll(filepath.Join(notOurs, "src"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(notOurs, "NOTES.txt"), []byte("mine\n"), 0o600))
	_, err = gitsource.Open(ctx, gitsource.Options{URL: rm, CacheDir: notOurs})
	require.Error(t, err, "a directory that holds nothing of a cache is refused")
	assert.Contains(t, err.Error(), "neither empty nor a git cache")
	assert.FileExists(t, filepath.Join(notOurs, "NOTES.txt"))
	assert.DirExists(t, filepath.Join(notOurs, "src"))
}
