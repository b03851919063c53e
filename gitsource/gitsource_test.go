package gitsource_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// remote is one bare repository reachable through one transport.
type remote struct {
	dir string // the bare repository on disk
	url string // how a Repo reaches it
}

// transports returns a fresh bare repository per transport: a local path,
// a file:// URL, and git http-backend over HTTP.
func transports(t *testing.T) map[string]func(t *testing.T) remote {
	return map[string]func(t *testing.T) remote{
		"path": func(t *testing.T) remote {
			dir := gittest.NewBare(t)
			return remote{dir: dir, url: dir}
		},
		"file": func(t *testing.T) remote {
			dir := gittest.NewBare(t)
			return remote{dir: dir, url: "file://" + dir}
		},
		"http": func(t *testing.T) remote {
			dir := gittest.NewBare(t)
			base := gittest.Serve(t, filepath.Dir(dir))
			return remote{dir: dir, url: base + "/" + filepath.Base(dir)}
		},
	}
}

// eachTransport runs fn once per transport in a subtest.
func eachTransport(t *testing.T, fn func(t *testing.T, rm remote)) {
	for name, mk := range transports(t) {
		t.Run(name, func(t *testing.T) { fn(t, mk(t)) })
	}
}

func open(t *testing.T, opts gitsource.Options) *gitsource.Repo {
	t.Helper()
	r, err := gitsource.Open(context.Background(), opts)
	require.NoError(t, err)
	return r
}

// walk collects a tree as path → contents, and path → file.
func walk(t *testing.T, tr desired.Tree) (map[string]string, map[string]desired.File) {
	t.Helper()
	contents := map[string]string{}
	files := map[string]desired.File{}
	require.NoError(t, tr.Walk(func(f desired.File) error {
		files[f.Path] = f
		if f.Mode == desired.Submodule {
			return nil
		}
		data, err := f.Read()
		if err != nil {
			return err
		}
		contents[f.Path] = string(data)
		return nil
	}))
	return contents, files
}

func TestFetchReadTree(t *testing.T) {
	ctx := context.Background()
	eachTransport(t, func(t *testing.T, rm remote) {
		c1 := gittest.Commit(t, rm.dir, gittest.Edit{
			Write: map[string]string{
				"fleet/hosts/hv-a.yaml": "kind: Host\n",
				"fleet/vms/web-01.yaml": "kind: VM\n",
				"fleet/run.sh":          "#!/bin/sh\n",
				"fleet/link":            "vms/web-01.yaml",
				"README.md":             "hello\n",
			},
			Executable: []string{"fleet/run.sh"},
			Symlink:    []string{"fleet/link"},
			Author:     "Ada Lovelace <ada@example.com>",
			Message:    "first",
		})
		for _, cache := range []string{"", t.TempDir()} {
			r := open(t, gitsource.Options{URL: rm.url, CacheDir: cache})
			tip, err := r.Fetch(ctx, "main")
			require.NoError(t, err)
			assert.Equal(t, c1, tip)

			head, err := r.RemoteHead(ctx, "main")
			require.NoError(t, err)
			assert.Equal(t, c1, head)

			tr, err := r.Tree(tip, "fleet")
			require.NoError(t, err)
			contents, files := walk(t, tr)
			assert.Equal(t, map[string]string{
				"hosts/hv-a.yaml": "kind: Host\n",
				"vms/web-01.yaml": "kind: VM\n",
				"run.sh":          "#!/bin/sh\n",
				"link":            "vms/web-01.yaml",
			}, contents)
			assert.Equal(t, desired.Executable, files["run.sh"].Mode)
			assert.Equal(t, desired.Symlink, files["link"].Mode)
			assert.Equal(t, desired.Regular, files["hosts/hv-a.yaml"].Mode)
			assert.EqualValues(t, len("kind: Host\n"), files["hosts/hv-a.yaml"].Size)
			assert.Equal(t, gittest.Git(t, rm.dir, "rev-parse", tip+":fleet/hosts/hv-a.yaml"), files["hosts/hv-a.yaml"].ID)

			data, err := r.ReadFile(tip, "README.md")
			require.NoError(t, err)
			assert.Equal(t, "hello\n", string(data))

			_, err = r.ReadFile(tip, "nope.yaml")
			assert.ErrorIs(t, err, gitsource.ErrFileNotFound)
			assert.ErrorIs(t, err, fs.ErrNotExist)
			_, err = r.Tree(tip, "nope")
			assert.ErrorIs(t, err, gitsource.ErrFileNotFound)

			info, err := r.CommitInfo(tip)
			require.NoError(t, err)
			assert.Equal(t, "Ada Lovelace <ada@example.com>", info.Author)
			assert.Equal(t, "first\n", info.Message)
			assert.Empty(t, info.Parents)
		}
	})
}

func TestBranchNotFound(t *testing.T) {
	ctx := context.Background()
	eachTransport(t, func(t *testing.T, rm remote) {
		r := open(t, gitsource.Options{URL: rm.url})
		// An empty repository has no branches at all.
		_, err := r.Fetch(ctx, "main")
		assert.ErrorIs(t, err, gitsource.ErrBranchNotFound)
		_, err = r.RemoteHead(ctx, "main")
		assert.ErrorIs(t, err, gitsource.ErrBranchNotFound)

		gittest.Commit(t, rm.dir, gittest.Edit{Write: map[string]string{"a": "1"}})
		_, err = r.Fetch(ctx, "gitfleet/status")
		assert.ErrorIs(t, err, gitsource.ErrBranchNotFound)
		_, err = r.RemoteHead(ctx, "gitfleet/status")
		assert.ErrorIs(t, err, gitsource.ErrBranchNotFound)
	})
}

func TestDiffAndHistory(t *testing.T) {
	ctx := context.Background()
	eachTransport(t, func(t *testing.T, rm remote) {
		base := gittest.Commit(t, rm.dir, gittest.Edit{Write: map[string]string{
			"vms/a.yaml": "kind: VM\nmetadata: {name: a}\nspec: {host: hv-a, cpus: 2, memoryMB: 2048}\n",
			"vms/b.yaml": "kind: VM\nmetadata: {name: b}\n",
			"vms/c.yaml": "kind: VM\nmetadata: {name: c}\n",
		}})
		// A side branch deletes c; main renames a and edits b; then merge.
		gittest.SetBranch(t, rm.dir, "side", base)
		side := gittest.Commit(t, rm.dir, gittest.Edit{Branch: "side", Remove: []string{"vms/c.yaml"}, Message: "drop c"})
		renamed := gittest.Commit(t, rm.dir, gittest.Edit{Rename: map[string]string{"vms/a.yaml": "vms/hv-a/a.yaml"}, Message: "move a"})
		edited := gittest.Commit(t, rm.dir, gittest.Edit{Write: map[string]string{"vms/b.yaml": "kind: VM\nmetadata: {name: b}\nspec: {}\n"}, Message: "edit b"})
		merge := gittest.Merge(t, rm.dir, "main", "side", "merge side")

		r := open(t, gitsource.Options{URL: rm.url, CacheDir: t.TempDir()})
		tip, err := r.Fetch(ctx, "main")
		require.NoError(t, err)
		require.Equal(t, merge, tip)

		changes, err := r.Diff(base, renamed)
		require.NoError(t, err)
		assert.Equal(t, []gitsource.Change{{From: "vms/a.yaml", To: "vms/hv-a/a.yaml"}}, changes)

		changes, err = r.Diff(renamed, merge)
		require.NoError(t, err)
		sortChanges(changes)
		assert.Equal(t, []gitsource.Change{{From: "vms/b.yaml", To: "vms/b.yaml"}, {From: "vms/c.yaml"}}, changes)

		changes, err = r.Diff("", base)
		require.NoError(t, err)
		sortChanges(changes)
		assert.Equal(t, []gitsource.Change{{To: "vms/a.yaml"}, {To: "vms/b.yaml"}, {To: "vms/c.yaml"}}, changes)

		// First-parent history of the merge skips the side branch.
		var walked []string
		require.NoError(t, r.FirstParents(tip, func(c *gitsource.Commit) (bool, error) {
			walked = append(walked, c.Hash)
			return true, nil
		}))
		assert.Equal(t, []string{merge, edited, renamed, base}, walked)
		info, err := r.CommitInfo(merge)
		require.NoError(t, err)
		assert.Equal(t, []string{edited, side}, info.Parents)

		// Stopping early.
		walked = nil
		require.NoError(t, r.FirstParents(tip, func(c *gitsource.Commit) (bool, error) {
			walked = append(walked, c.Hash)
			return len(walked) < 2, nil
		}))
		assert.Equal(t, []string{merge, edited}, walked)
		stop := errors.New("stop")
		assert.ErrorIs(t, r.FirstParents(tip, func(*gitsource.Commit) (bool, error) { return true, stop }), stop)

		for _, tc := range []struct {
			name string
			a, b string
			want bool
		}{
			{"self", merge, merge, true},
			{"first parent", base, merge, true},
			{"side branch", side, merge, true},
			{"newer is not ancestor of older", merge, base, false},
			{"side is not ancestor of main before merge", side, edited, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ok, err := r.IsAncestor(tc.a, tc.b)
				require.NoError(t, err)
				assert.Equal(t, tc.want, ok)
			})
		}
	})
}

func sortChanges(cs []gitsource.Change) {
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].From+cs[i].To != cs[j].From+cs[j].To {
			return cs[i].From+"\x00"+cs[i].To < cs[j].From+"\x00"+cs[j].To
		}
		return false
	})
}

func TestUpdateCreatesBranchAndEdits(t *testing.T) {
	ctx := context.Background()
	eachTransport(t, func(t *testing.T, rm remote) {
		r := open(t, gitsource.Options{URL: rm.url, CacheDir: t.TempDir(), Committer: "ctl <ctl@example.com>"})
		tip, err := r.Update(ctx, "gitfleet/status", func(tip string, read func(string) ([]byte, error)) (map[string][]byte, string, error) {
			assert.Empty(t, tip)
			_, err := read("hosts/a.yaml")
			assert.ErrorIs(t, err, gitsource.ErrFileNotFound)
			return map[string][]byte{"hosts/a.yaml": []byte("a: 1\n"), "README.md": []byte("# fleet\n")}, "status of a", nil
		})
		require.NoError(t, err)
		assert.Equal(t, tip, gittest.Rev(t, rm.dir, "gitfleet/status"))
		assert.Equal(t, "a: 1", gittest.Show(t, rm.dir, tip, "hosts/a.yaml"))
		info, err := r.CommitInfo(tip)
		require.NoError(t, err)
		assert.Equal(t, "ctl <ctl@example.com>", info.Author)
		assert.Empty(t, info.Parents, "the first commit of a branch is a root commit")

		// Edit one, add a nested one, remove README.
		tip2, err := r.Update(ctx, "gitfleet/status", func(tip string, read func(string) ([]byte, error)) (map[string][]byte, string, error) {
			old, err := read("hosts/a.yaml")
			require.NoError(t, err)
			assert.Equal(t, "a: 1\n", string(old))
			return map[string][]byte{
				"hosts/a.yaml":        append(old, "b: 2\n"...),
				"hosts/deep/x/y.yaml": []byte("y\n"),
				"README.md":           nil,
			}, "second", nil
		})
		require.NoError(t, err)
		assert.Equal(t, []string{tip}, mustInfo(t, r, tip2).Parents)
		assert.Equal(t, []string{"hosts/a.yaml", "hosts/deep/x/y.yaml"}, gittest.Files(t, rm.dir, tip2))
		gittest.Git(t, rm.dir, "fsck", "--strict", "--no-dangling")

		// Removing the only file of a directory removes the directory.
		tip3, err := r.Update(ctx, "gitfleet/status", func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
			return map[string][]byte{"hosts/deep/x/y.yaml": nil, "hosts/gone.yaml": nil}, "third", nil
		})
		require.NoError(t, err)
		assert.Equal(t, []string{"hosts/a.yaml"}, gittest.Files(t, rm.dir, tip3))

		// Writing what is already there writes no commit; neither does an
		// empty mutation.
		for _, files := range []map[string][]byte{{"hosts/a.yaml": []byte("a: 1\nb: 2\n")}, {"nothing.yaml": nil}, nil} {
			same, err := r.Update(ctx, "gitfleet/status", func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
				return files, "noop", nil
			})
			require.NoError(t, err)
			assert.Equal(t, tip3, same)
		}
		assert.Equal(t, tip3, gittest.Rev(t, rm.dir, "gitfleet/status"))
		gittest.Git(t, rm.dir, "fsck", "--strict", "--no-dangling")
	})
}

func mustInfo(t *testing.T, r *gitsource.Repo, h string) *gitsource.Commit {
	t.Helper()
	c, err := r.CommitInfo(h)
	require.NoError(t, err)
	return c
}

func TestWatchSeesPush(t *testing.T) {
	eachTransport(t, func(t *testing.T, rm remote) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		c1 := gittest.Commit(t, rm.dir, gittest.Edit{Write: map[string]string{"a": "1"}})
		r := open(t, gitsource.Options{URL: rm.url})
		// A long interval: for a local repository fsnotify reports the push;
		// over HTTP a short poll does.
		interval := time.Hour
		if rm.url[:4] == "http" {
			interval = 50 * time.Millisecond
		}
		ch := r.Watch(ctx, "main", interval)
		require.Equal(t, c1, <-ch)
		c2 := gittest.Commit(t, rm.dir, gittest.Edit{Write: map[string]string{"a": "2"}})
		require.Equal(t, c2, <-ch)

		// A branch that does not exist yet is reported once it appears
		// (the directory refs/heads/gitfleet/ is new, too).
		status := r.Watch(ctx, "gitfleet/status", interval)
		s1 := gittest.Commit(t, rm.dir, gittest.Edit{Branch: "gitfleet/status", Write: map[string]string{"hosts/a.yaml": "1"}})
		require.Equal(t, s1, <-status)
		s2 := gittest.Commit(t, rm.dir, gittest.Edit{Branch: "gitfleet/status", Write: map[string]string{"hosts/a.yaml": "2"}})
		require.Equal(t, s2, <-status)

		// A force-push back is a change too.
		gittest.SetBranch(t, rm.dir, "main", c1)
		require.Equal(t, c1, <-ch)
		cancel()
		for range ch {
		}
		for range status {
		}
	})
}

// TestSubmoduleEntry: a gitlink shows as a Submodule entry (its commit is
// not in this repository and is not needed), and is not a file to read.
func TestSubmoduleEntry(t *testing.T) {
	ctx := context.Background()
	rm := gittest.NewBare(t)
	other := "0123456789abcdef0123456789abcdef01234567"
	c := gittest.Commit(t, rm, gittest.Edit{
		Write:     map[string]string{"vms/a.yaml": "a\n"},
		Submodule: map[string]string{"vms/vendored": other},
	})
	r := open(t, gitsource.Options{URL: rm, CacheDir: t.TempDir()})
	tip, err := r.Fetch(ctx, "main")
	require.NoError(t, err)
	require.Equal(t, c, tip)
	tr, err := r.Tree(tip, "vms")
	require.NoError(t, err)
	_, files := walk(t, tr)
	require.Contains(t, files, "vendored")
	assert.Equal(t, desired.Submodule, files["vendored"].Mode)
	assert.Equal(t, other, files["vendored"].ID)
	_, err = files["vendored"].Read()
	assert.Error(t, err)
	_, err = r.ReadFile(tip, "vms/vendored")
	assert.Error(t, err)
	assert.NotErrorIs(t, err, gitsource.ErrFileNotFound)
}

// Walks of commits that each change one file, add one or remove a
// directory list exactly the files git lists, with their blob IDs: the
// listings of unchanged directories are taken from the cache, the rest
// is listed afresh.
func TestTreeWalksFollowEachCommit(t *testing.T) {
	ctx := context.Background()
	dir := gittest.NewBare(t)
	files := map[string]string{}
	for d := 0; d < 5; d++ {
		for f := 0; f < 4; f++ {
			files[fmt.Sprintf("vms/%02d/vm-%d.yaml", d, f)] = fmt.Sprintf("vm %d %d\n", d, f)
		}
	}
	files["hosts/hv-a.yaml"] = "host\n"
	gittest.Commit(t, dir, gittest.Edit{Write: files})
	r := open(t, gitsource.Options{URL: dir})
	check := func(what string) {
		t.Helper()
		tip, err := r.Fetch(ctx, "main")
		require.NoError(t, err)
		tr, err := r.Tree(tip, "")
		require.NoError(t, err)
		_, got := walk(t, tr)
		want := gittest.Files(t, dir, tip)
		assert.Len(t, got, len(want), what)
		for _, p := range want {
			f, ok := got[p]
			if assert.True(t, ok, "%s: %s not listed", what, p) {
				assert.Equal(t, gittest.Git(t, dir, "rev-parse", tip+":"+p), f.ID, "%s: %s", what, p)
			}
		}
	}
	check("first commit")
	check("the same commit again")
	gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"vms/03/vm-1.yaml": "changed\n"}})
	check("one file changed")
	gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"vms/05/vm-0.yaml": "new\n"}})
	check("a directory added")
	gittest.Commit(t, dir, gittest.Edit{Remove: []string{"vms/01"}})
	check("a directory removed")
}
