package gitsource_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// cacheDamage is one way a cache on disk is found broken after a crash, a
// full disk or a hand: each class of error go-git's filesystem storage can
// report (storage/filesystem/dotgit, plumbing/format/packfile, idxfile,
// objfile, the config decoder, plumbing.ErrObjectNotFound).
type cacheDamage struct {
	name   string
	damage func(t *testing.T, cache string)
}

// cacheDamages lists them, for the tracking ref of main. Every one must be
// repaired by the next Open and Fetch, without a person.
func cacheDamages() []cacheDamage { return cacheDamagesOf("refs/remotes/origin/main") }

// cacheDamagesOf lists them with tracking as the tracking ref damaged.
func cacheDamagesOf(tracking string) []cacheDamage {
	write := func(rel, data string) func(t *testing.T, cache string) {
		return func(t *testing.T, cache string) {
			p := filepath.Join(cache, rel)
			require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
			require.NoError(t, os.WriteFile(p, []byte(data), 0o644))
		}
	}
	remove := func(rel string) func(t *testing.T, cache string) {
		return func(t *testing.T, cache string) { require.NoError(t, os.RemoveAll(filepath.Join(cache, rel))) }
	}
	eachPackFile := func(ext string, fn func(t *testing.T, path string)) func(t *testing.T, cache string) {
		return func(t *testing.T, cache string) {
			ms, err := filepath.Glob(filepath.Join(cache, "objects", "pack", "*"+ext))
			require.NoError(t, err)
			require.NotEmpty(t, ms, "the cache has no %s file to damage", ext)
			for _, m := range ms {
				fn(t, m)
			}
		}
	}
	truncateHalf := func(t *testing.T, p string) {
		fi, err := os.Stat(p)
		require.NoError(t, err)
		require.NoError(t, os.Truncate(p, fi.Size()/2))
	}
	return []cacheDamage{
		{"empty ref file", write(tracking, "")},
		{"garbage ref file", write(tracking, "not a hash at all\n")},
		{"ref to a missing object", write(tracking, strings.Repeat("ab", 20)+"\n")},
		{"symbolic ref to nowhere", write(tracking, "ref: refs/remotes/origin/nowhere\n")},
		{"ref path is a directory", func(t *testing.T, cache string) {
			remove(tracking)(t, cache)
			write(tracking+"/x", strings.Repeat("ab", 20)+"\n")(t, cache)
		}},
		{"packed-refs shadowing a missing ref", func(t *testing.T, cache string) {
			remove(tracking)(t, cache)
			write("packed-refs", "# pack-refs with: peeled fully-peeled sorted \n"+strings.Repeat("cd", 20)+" "+tracking+"\n")(t, cache)
		}},
		{"garbage packed-refs", write("packed-refs", "this is not\na packed-refs file\n")},
		{"lock file left behind", func(t *testing.T, cache string) {
			write(tracking+".lock", "")(t, cache)
			write("packed-refs.lock", "")(t, cache)
			write("config.lock", "")(t, cache)
			write("objects/pack/tmp_pack_123456", "PACK partial")(t, cache)
		}},
		{"pack truncated to half", eachPackFile(".pack", truncateHalf)},
		{"pack index truncated to half", eachPackFile(".idx", truncateHalf)},
		{"pack deleted, index kept", eachPackFile(".pack", func(t *testing.T, p string) { require.NoError(t, os.Remove(p)) })},
		{"index deleted, pack kept", eachPackFile(".idx", func(t *testing.T, p string) { require.NoError(t, os.Remove(p)) })},
		{"pack overwritten with garbage", eachPackFile(".pack", func(t *testing.T, p string) {
			require.NoError(t, os.WriteFile(p, []byte(strings.Repeat("garbage ", 64)), 0o644))
		})},
		{"garbage config", write("config", "[remote \"origin\n\tthis is = = not ini\n")},
		{"empty config", write("config", "")},
		{"missing config", remove("config")},
		{"missing HEAD", remove("HEAD")},
		{"garbage HEAD", write("HEAD", "\x00\x01garbage")},
		{"missing refs", remove("refs")},
		{"missing objects", remove("objects")},
		{"garbage shallow list", write("shallow", "zz not a hash\n")},
		{"cache path is a file", func(t *testing.T, cache string) {
			require.NoError(t, os.RemoveAll(cache))
			require.NoError(t, os.WriteFile(cache, []byte("oops"), 0o644))
		}},
	}
}

// TestCacheDamageRepaired: after each kind of damage, the next Open and
// Fetch of the same cache succeed and read the remote's tip whole, for a
// full cache (the controller's) and a shallow one (the agent's). With -v
// it prints the time each repair took.
func TestCacheDamageRepaired(t *testing.T) {
	ctx := context.Background()
	for _, depth := range []int{0, 1} {
		for _, d := range cacheDamages() {
			t.Run(d.name+map[int]string{0: "", 1: " (shallow)"}[depth], func(t *testing.T) {
				rm := gittest.NewBare(t)
				gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"hosts/a.yaml": "a\n"}})
				c2 := gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"hosts/b.yaml": "b\n"}})
				cache := filepath.Join(t.TempDir(), "cache")
				opts := gitsource.Options{URL: rm, CacheDir: cache, Depth: depth}
				r := open(t, opts)
				_, err := r.Fetch(ctx, "main")
				require.NoError(t, err)
				require.NoError(t, r.Close())

				d.damage(t, cache)

				start := time.Now()
				r, err = gitsource.Open(ctx, opts)
				require.NoError(t, err, "open a damaged cache")
				defer r.Close()
				tip, err := r.Fetch(ctx, "main")
				require.NoError(t, err, "fetch into a damaged cache")
				assert.Equal(t, c2, tip)
				t.Logf("%s: detected and repaired within the first open and fetch, %v", d.name, time.Since(start).Round(time.Millisecond))
				contents, _ := walk(t, mustTree(t, r, tip, "hosts"))
				assert.Equal(t, map[string]string{"a.yaml": "a\n", "b.yaml": "b\n"}, contents)
				// And the cache stays usable for writes.
				_, err = r.Update(ctx, "main", setFile("hosts/c.yaml", "c\n"))
				assert.NoError(t, err)
			})
		}
	}
}

// TestSHA256RepositoryNamed: a repository in an object format go-git
// cannot read gives a clear error naming the format, on every transport,
// and is not taken for cache damage (no repair, no fresh clone).
func TestSHA256RepositoryNamed(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	dir := filepath.Join(root, "sha256.git")
	gittest.Git(t, "", "init", "--quiet", "--bare", "--object-format=sha256", "--initial-branch=main", dir)
	tree := gittest.Git(t, dir, "mktree")
	c := gittest.Git(t, dir, "-c", "user.name=a", "-c", "user.email=a@example.com", "commit-tree", "-m", "first", tree)
	gittest.Git(t, dir, "update-ref", "refs/heads/main", c)
	for name, url := range map[string]string{"file": "file://" + dir, "http": gittest.Serve(t, root) + "/sha256.git"} {
		t.Run(name, func(t *testing.T) {
			r := open(t, gitsource.Options{URL: url, CacheDir: t.TempDir()})
			_, err := r.Fetch(ctx, "main")
			require.ErrorIs(t, err, gitsource.ErrObjectFormat)
			assert.Contains(t, err.Error(), "sha256")
			assert.NotContains(t, err.Error(), "repair")
			_, err = r.RemoteHead(ctx, "main")
			assert.ErrorIs(t, err, gitsource.ErrObjectFormat)
		})
	}
}

// A blob whose bytes in the cache's pack are damaged while its index
// entry stands (zlib's "invalid header") fails the read as a missing
// object, and the next Fetch repairs it: the object is read whole before
// it counts as present again, so an index entry alone does not hide it.
func TestUnreadableBlobIsRepairedByTheNextFetch(t *testing.T) {
	gittest.NeedGit(t)
	ctx := context.Background()
	rm := gittest.NewBare(t)
	content := strings.Repeat("a blob long enough to be deflated apart ", 20)
	tip := gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"vms/a.yaml": content}})
	blob := strings.TrimSpace(gittest.Git(t, rm, "rev-parse", tip+":vms/a.yaml"))
	cache := filepath.Join(t.TempDir(), "cache")
	r := open(t, gitsource.Options{URL: rm, CacheDir: cache})
	_, err := r.Fetch(ctx, "main")
	require.NoError(t, err)
	require.NoError(t, r.Close())

	// Overwrite the blob's compressed bytes in place, where git
	// verify-pack says the object starts.
	idx, err := filepath.Glob(filepath.Join(cache, "objects", "pack", "*.idx"))
	require.NoError(t, err)
	require.Len(t, idx, 1)
	var offset int64 = -1
	for _, line := range strings.Split(gittest.Git(t, cache, "verify-pack", "-v", idx[0]), "\n") {
		if f := strings.Fields(line); len(f) >= 5 && f[0] == blob {
			offset, err = strconv.ParseInt(f[4], 10, 64)
			require.NoError(t, err)
		}
	}
	require.GreaterOrEqual(t, offset, int64(0), "the blob is in the cache's pack")
	f, err := os.OpenFile(strings.TrimSuffix(idx[0], ".idx")+".pack", os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{0xff, 0xff, 0xff, 0xff}, offset+2)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	r, err = gitsource.Open(ctx, gitsource.Options{URL: rm, CacheDir: cache})
	require.NoError(t, err)
	defer r.Close()
	_, err = r.ReadFile(tip, "vms/a.yaml")
	require.ErrorIs(t, err, gitsource.ErrObjectMissing, "the damaged blob cannot be read")
	_, err = r.Fetch(ctx, "main")
	require.NoError(t, err, "the fetch after the read repairs the cache")
	data, err := r.ReadFile(tip, "vms/a.yaml")
	require.NoError(t, err)
	require.Equal(t, content, string(data))
}
