package gitsource_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

func TestShallowFetch(t *testing.T) {
	ctx := context.Background()
	eachTransport(t, func(t *testing.T, rm remote) {
		c1 := gittest.Commit(t, rm.dir, gittest.Edit{Write: map[string]string{"hosts/a.yaml": "1\n"}})
		gittest.Commit(t, rm.dir, gittest.Edit{Write: map[string]string{"hosts/a.yaml": "2\n"}})
		c3 := gittest.Commit(t, rm.dir, gittest.Edit{Write: map[string]string{"hosts/b.yaml": "3\n"}})
		cache := t.TempDir()
		r := open(t, gitsource.Options{URL: rm.url, CacheDir: cache, Depth: 1})
		tip, err := r.Fetch(ctx, "main")
		require.NoError(t, err)
		require.Equal(t, c3, tip)
		contents, _ := walk(t, mustTree(t, r, tip, ""))
		assert.Equal(t, map[string]string{"hosts/a.yaml": "2\n", "hosts/b.yaml": "3\n"}, contents)

		// The older history is not there, and says so.
		_, err = r.CommitInfo(c1)
		assert.ErrorIs(t, err, gitsource.ErrObjectMissing)
		var seen []string
		err = r.FirstParents(tip, func(c *gitsource.Commit) (bool, error) {
			seen = append(seen, c.Hash)
			return true, nil
		})
		assert.ErrorIs(t, err, gitsource.ErrShallowHistory)
		assert.Equal(t, []string{c3}, seen)
		_, err = r.IsAncestor(c1, tip)
		assert.ErrorIs(t, err, gitsource.ErrShallowHistory)

		// Later commits arrive, and a write on the shallow cache works.
		c4 := gittest.Commit(t, rm.dir, gittest.Edit{Write: map[string]string{"hosts/c.yaml": "4\n"}})
		tip, err = r.Fetch(ctx, "main")
		require.NoError(t, err)
		require.Equal(t, c4, tip)
		c5, err := r.Update(ctx, "main", setFile("hosts/d.yaml", "5\n"))
		require.NoError(t, err)
		assert.Equal(t, []string{c4}, mustInfo(t, r, c5).Parents)
		assert.Equal(t, []string{"hosts/a.yaml", "hosts/b.yaml", "hosts/c.yaml", "hosts/d.yaml"}, gittest.Files(t, rm.dir, "main"))
		gittest.Git(t, rm.dir, "fsck", "--strict", "--no-dangling")

		// Reopening the shallow cache keeps working.
		r2 := open(t, gitsource.Options{URL: rm.url, CacheDir: cache, Depth: 1})
		tip, err = r2.Fetch(ctx, "main")
		require.NoError(t, err)
		assert.Equal(t, c5, tip)
	})
}

func mustTree(t *testing.T, r *gitsource.Repo, commit, dir string) desired.Tree {
	t.Helper()
	tr, err := r.Tree(commit, dir)
	require.NoError(t, err)
	return tr
}

// TestReopenCache: a second Open of the same cache directory finds what the
// first fetched, even with the remote gone.
func TestReopenCache(t *testing.T) {
	ctx := context.Background()
	rm := gittest.NewBare(t)
	c1 := gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"a": "1"}})
	cache := t.TempDir()
	r := open(t, gitsource.Options{URL: rm, CacheDir: cache})
	_, err := r.Fetch(ctx, "main")
	require.NoError(t, err)

	r2 := open(t, gitsource.Options{URL: rm, CacheDir: cache})
	data, err := r2.ReadFile(c1, "a")
	require.NoError(t, err)
	assert.Equal(t, "1", string(data))
	c2 := gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"a": "2"}})
	tip, err := r2.Fetch(ctx, "main")
	require.NoError(t, err)
	assert.Equal(t, c2, tip)

	// A cache of another remote is re-pointed, not mixed up.
	other := gittest.NewBare(t)
	o1 := gittest.Commit(t, other, gittest.Edit{Write: map[string]string{"b": "1"}})
	r3 := open(t, gitsource.Options{URL: other, CacheDir: cache})
	tip, err = r3.Fetch(ctx, "main")
	require.NoError(t, err)
	assert.Equal(t, o1, tip)
}

// TestOpenRefusesForeignDir: a non-empty directory that is not a cache is
// never used (a repair could delete it).
func TestOpenRefusesForeignDir(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "precious.txt"), []byte("x"), 0o644))
	_, err := gitsource.Open(context.Background(), gitsource.Options{URL: gittest.NewBare(t), CacheDir: dir})
	assert.Error(t, err)
	_, err = os.Stat(filepath.Join(dir, "precious.txt"))
	assert.NoError(t, err)
}

// TestCacheDirThroughASymlink: a cache path that is a symlink to a
// directory (systemd's CacheDirectory= with DynamicUser=yes makes one) is
// that directory: the link is kept, the clone lives behind it, and a second
// Open reuses it. A dangling link is still damage, moved aside.
func TestCacheDirThroughASymlink(t *testing.T) {
	ctx := context.Background()
	bare := gittest.NewBare(t)
	tip := gittest.Commit(t, bare, gittest.Edit{Write: map[string]string{"hosts/a.yaml": "a\n"}})
	root := t.TempDir()
	target := filepath.Join(root, "private", "cache")
	require.NoError(t, os.MkdirAll(target, 0o700))
	link := filepath.Join(root, "cache")
	require.NoError(t, os.Symlink(target, link))
	for i := 0; i < 2; i++ {
		r := open(t, gitsource.Options{URL: bare, CacheDir: link})
		got, err := r.Fetch(ctx, "main")
		require.NoError(t, err)
		assert.Equal(t, tip, got)
		fi, err := os.Lstat(link)
		require.NoError(t, err)
		assert.NotZero(t, fi.Mode()&os.ModeSymlink, "the link is kept")
		assert.DirExists(t, filepath.Join(target, "objects"), "the clone is behind the link")
	}
	ents, err := os.ReadDir(root)
	require.NoError(t, err)
	assert.Len(t, ents, 2, "nothing moved aside next to the link")

	dangling := filepath.Join(root, "dangling")
	require.NoError(t, os.Symlink(filepath.Join(root, "nowhere"), dangling))
	r := open(t, gitsource.Options{URL: bare, CacheDir: dangling})
	_, err = r.Fetch(ctx, "main")
	require.NoError(t, err)
	assert.DirExists(t, filepath.Join(dangling, "objects"), "a fresh cache where the dangling link was")
}

// TestMissingObjectIsAnError: objects deleted from the cache make reads
// fail (never an empty or smaller tree); Fetch repairs the cache.
func TestMissingObjectIsAnError(t *testing.T) {
	ctx := context.Background()
	eachTransport(t, func(t *testing.T, rm remote) {
		gittest.Commit(t, rm.dir, gittest.Edit{Write: map[string]string{"hosts/a.yaml": "a\n", "hosts/b.yaml": "b\n"}})
		cache := t.TempDir()
		r := open(t, gitsource.Options{URL: rm.url, CacheDir: cache})
		// Update writes loose objects into the cache: the new blob among them.
		tip, err := r.Update(ctx, "main", setFile("hosts/c.yaml", "c\n"))
		require.NoError(t, err)
		blob := gittest.Git(t, rm.dir, "rev-parse", tip+":hosts/c.yaml")
		loose := filepath.Join(cache, "objects", blob[:2], blob[2:])
		require.FileExists(t, loose)
		require.NoError(t, os.Remove(loose))

		tr, err := r.Tree(tip, "hosts")
		require.NoError(t, err)
		n := 0
		err = tr.Walk(func(desired.File) error { n++; return nil })
		assert.ErrorIs(t, err, gitsource.ErrObjectMissing)
		assert.Zero(t, n, "a damaged tree yields no files at all")
		_, err = r.ReadFile(tip, "hosts/c.yaml")
		assert.ErrorIs(t, err, gitsource.ErrObjectMissing)
		assert.NotErrorIs(t, err, gitsource.ErrFileNotFound)

		got, err := r.Fetch(ctx, "main")
		require.NoError(t, err)
		assert.Equal(t, tip, got)
		contents, _ := walk(t, mustTree(t, r, tip, "hosts"))
		assert.Equal(t, map[string]string{"a.yaml": "a\n", "b.yaml": "b\n", "c.yaml": "c\n"}, contents)

		// The whole object store gone: the same.
		require.NoError(t, os.RemoveAll(filepath.Join(cache, "objects")))
		require.NoError(t, os.MkdirAll(filepath.Join(cache, "objects", "pack"), 0o755))
		r = open(t, gitsource.Options{URL: rm.url, CacheDir: cache})
		_, err = r.Tree(tip, "")
		assert.ErrorIs(t, err, gitsource.ErrObjectMissing)
		got, err = r.Fetch(ctx, "main")
		require.NoError(t, err)
		assert.Equal(t, tip, got)
		contents, _ = walk(t, mustTree(t, r, tip, "hosts"))
		assert.Len(t, contents, 3)
	})
}

// TestRemoteMissingObject: a remote that lost an object fails the fetch.
func TestRemoteMissingObject(t *testing.T) {
	rm := gittest.NewBare(t)
	c := gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"a": "precious\n"}})
	blob := gittest.Git(t, rm, "rev-parse", c+":a")
	require.NoError(t, os.Remove(filepath.Join(rm, "objects", blob[:2], blob[2:])))
	r := open(t, gitsource.Options{URL: rm})
	_, err := r.Fetch(context.Background(), "main")
	require.Error(t, err)
	assert.NotErrorIs(t, err, gitsource.ErrBranchNotFound)
	_, err = r.Tree(c, "")
	assert.Error(t, err)
}

func TestAuthOverHTTP(t *testing.T) {
	ctx := context.Background()
	dir := gittest.NewBare(t)
	gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"a": "1"}})
	base := gittest.ServeWith(t, filepath.Dir(dir), gittest.ServeOptions{Username: "git", Password: "s3cret-token"})
	url := base + "/" + filepath.Base(dir)
	for _, tc := range []struct {
		name string
		auth gitsource.Auth
		ok   bool
	}{
		{"token", gitsource.Auth{Token: "s3cret-token"}, true},
		{"basic", gitsource.Auth{Username: "git", Password: "s3cret-token"}, true},
		{"none", gitsource.Auth{}, false},
		{"wrong token", gitsource.Auth{Token: "nope"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := gittest.Rev(t, dir, "main")
			r := open(t, gitsource.Options{URL: url, Auth: tc.auth})
			tip, err := r.Fetch(ctx, "main")
			head, herr := r.RemoteHead(ctx, "main")
			_, uerr := r.Update(ctx, "main", setFile(tc.name, "x"))
			if tc.ok {
				require.NoError(t, err)
				require.NoError(t, herr)
				require.NoError(t, uerr)
				assert.Equal(t, want, tip)
				assert.Equal(t, want, head)
				return
			}
			for _, e := range []error{err, herr, uerr} {
				require.Error(t, e)
				assert.NotErrorIs(t, e, gitsource.ErrBranchNotFound)
				assert.NotContains(t, e.Error(), "s3cret")
			}
		})
	}
	assert.Equal(t, []string{"a", "basic", "token"}, gittest.Files(t, dir, "main"), "only authenticated writes landed")
}

// TestShallowCacheDeepened: a cache left shallow by an earlier Depth is not
// trusted for full history: reopened with Depth 0 it is cloned afresh.
func TestShallowCacheDeepened(t *testing.T) {
	ctx := context.Background()
	rm := gittest.NewBare(t)
	var commits []string
	for i := 0; i < 3; i++ {
		commits = append(commits, gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"a": fmt.Sprint(i)}}))
	}
	cache := t.TempDir()
	r := open(t, gitsource.Options{URL: rm, CacheDir: cache, Depth: 1})
	_, err := r.Fetch(ctx, "main")
	require.NoError(t, err)
	require.NoError(t, r.Close())

	r = open(t, gitsource.Options{URL: rm, CacheDir: cache})
	tip, err := r.Fetch(ctx, "main")
	require.NoError(t, err)
	var walked []string
	require.NoError(t, r.FirstParents(tip, func(c *gitsource.Commit) (bool, error) {
		walked = append(walked, c.Hash)
		return true, nil
	}))
	assert.Equal(t, []string{commits[2], commits[1], commits[0]}, walked)
}

// TestHistoryHoleRepaired: a commit missing in the middle of fetched
// history fails the walk (never ends it early) and the next Fetch brings it
// back.
func TestHistoryHoleRepaired(t *testing.T) {
	ctx := context.Background()
	rm := gittest.NewBare(t)
	gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"a": "0"}})
	cache := t.TempDir()
	r := open(t, gitsource.Options{URL: rm, CacheDir: cache})
	var ours []string
	for i := 1; i <= 3; i++ {
		tip, err := r.Update(ctx, "main", setFile("a", fmt.Sprint(i)))
		require.NoError(t, err)
		ours = append(ours, tip)
	}
	hole := ours[1]
	require.NoError(t, os.Remove(filepath.Join(cache, "objects", hole[:2], hole[2:])))

	count := func() (int, error) {
		n := 0
		err := r.FirstParents(ours[2], func(*gitsource.Commit) (bool, error) { n++; return true, nil })
		return n, err
	}
	n, err := count()
	assert.ErrorIs(t, err, gitsource.ErrObjectMissing)
	assert.Equal(t, 1, n)
	ok, err := r.IsAncestor(ours[0], ours[2])
	assert.ErrorIs(t, err, gitsource.ErrObjectMissing)
	assert.False(t, ok)

	tip, err := r.Fetch(ctx, "main")
	require.NoError(t, err)
	assert.Equal(t, ours[2], tip)
	n, err = count()
	require.NoError(t, err)
	assert.Equal(t, 4, n)
	ok, err = r.IsAncestor(ours[0], ours[2])
	require.NoError(t, err)
	assert.True(t, ok)
}
