package gitsource_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// replaceIf writes path=content, replacing the tip when the tip's message
// is "replaceable".
func replaceIf(path, content, msg string) gitsource.EditFunc {
	return func(tip *gitsource.Commit, _ func(string) ([]byte, error)) (gitsource.Write, error) {
		return gitsource.Write{
			Files:      map[string][]byte{path: []byte(content)},
			Message:    msg,
			ReplaceTip: tip != nil && strings.TrimSpace(tip.Message) == "replaceable",
		}, nil
	}
}

// A Write with ReplaceTip puts the new commit on the tip's parent: the
// replaced tip leaves history, the commit before it stays, and the tree is
// the tip's with the write applied. A branch without a tip is created.
func TestEditReplacesTip(t *testing.T) {
	ctx := context.Background()
	eachTransport(t, func(t *testing.T, rm remote) {
		r := open(t, gitsource.Options{URL: rm.url, Depth: 1})
		branch := "gitfleet/hosts/hv-a"
		first, err := r.Edit(ctx, branch, replaceIf("a", "1", "event"))
		require.NoError(t, err)
		_, err = r.Update(ctx, branch, setFile("b", "kept"))
		require.NoError(t, err)
		second := gittest.Rev(t, rm.dir, branch)
		_, err = r.Edit(ctx, branch, replaceIf("a", "2", "replaceable"))
		require.NoError(t, err)
		third, err := r.Edit(ctx, branch, replaceIf("a", "3", "replaceable"))
		require.NoError(t, err)
		assert.Equal(t, third, gittest.Rev(t, rm.dir, branch))
		assert.Equal(t, second, gittest.Rev(t, rm.dir, branch+"^"), "the replaceable tip was replaced, not followed")
		assert.Equal(t, first, gittest.Rev(t, rm.dir, branch+"^^"))
		assert.Equal(t, "3", gittest.Show(t, rm.dir, branch, "a"))
		assert.Equal(t, "kept", gittest.Show(t, rm.dir, branch, "b"))
		assert.Equal(t, "3", gittest.Git(t, rm.dir, "rev-list", "--count", branch))
	})
}

// A remote that allows only fast-forwards refuses a ReplaceTip write with
// ErrNonFastForward at once (no retries, no lost-race reading), and the
// same write without ReplaceTip goes through.
func TestEditNonFastForwardRefused(t *testing.T) {
	ctx := context.Background()
	rm := transports(t)["http"](t)
	gittest.Git(t, rm.dir, "config", "receive.denyNonFastForwards", "true")
	r := open(t, gitsource.Options{URL: rm.url, Depth: 1})
	branch := "gitfleet/hosts/hv-a"
	_, err := r.Edit(ctx, branch, replaceIf("a", "1", "replaceable"))
	require.NoError(t, err, "a new branch needs no replacement")
	before := gittest.Rev(t, rm.dir, branch)
	start := time.Now()
	_, err = r.Edit(ctx, branch, replaceIf("a", "2", "replaceable"))
	require.ErrorIs(t, err, gitsource.ErrNonFastForward)
	assert.False(t, errors.Is(err, gitsource.ErrConflict), "a refusal is not a lost race: %v", err)
	t.Logf("refused after %v", time.Since(start))
	assert.Equal(t, before, gittest.Rev(t, rm.dir, branch))
	_, err = r.Update(ctx, branch, setFile("a", "2"))
	require.NoError(t, err)
	assert.Equal(t, before, gittest.Rev(t, rm.dir, branch+"^"))
}

// FetchPrefix fetches every branch under the prefix in one fetch, returns
// their tips, leaves other branches alone, and forgets a deleted one.
func TestFetchPrefix(t *testing.T) {
	ctx := context.Background()
	eachTransport(t, func(t *testing.T, rm remote) {
		r := open(t, gitsource.Options{URL: rm.url, Depth: 1})
		tips, err := r.FetchPrefix(ctx, "gitfleet/hosts/")
		require.NoError(t, err, "an empty repository has no such branch")
		assert.Empty(t, tips)
		w := open(t, gitsource.Options{URL: rm.url})
		want := map[string]string{}
		for i := 0; i < 3; i++ {
			b := fmt.Sprintf("gitfleet/hosts/hv-%d", i)
			tip, err := w.Update(ctx, b, setFile("hosts/x.yaml", fmt.Sprint(i)))
			require.NoError(t, err)
			want[b] = tip
		}
		_, err = w.Update(ctx, "gitfleet/status", setFile("README.md", "x"))
		require.NoError(t, err)
		tips, err = r.FetchPrefix(ctx, "gitfleet/hosts/")
		require.NoError(t, err)
		assert.Equal(t, want, tips)
		for b, tip := range tips {
			data, err := r.ReadFile(tip, "hosts/x.yaml")
			require.NoError(t, err)
			assert.Equal(t, b[len(b)-1:], string(data))
		}
		gittest.DeleteBranch(t, rm.dir, "gitfleet/hosts/hv-1")
		delete(want, "gitfleet/hosts/hv-1")
		tips, err = r.FetchPrefix(ctx, "gitfleet/hosts/")
		require.NoError(t, err)
		assert.Equal(t, want, tips, "a deleted branch is pruned")
		_, err = r.FetchPrefix(ctx, "gitfleet/hosts")
		assert.Error(t, err, "a prefix must end in /")
	})
}

// WatchPrefix sends a new value when a branch under the prefix moves, and
// not for other branches.
func TestWatchPrefix(t *testing.T) {
	rm := transports(t)["http"](t)
	w := open(t, gitsource.Options{URL: rm.url})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := w.Update(ctx, "gitfleet/hosts/hv-a", setFile("a", "1"))
	require.NoError(t, err)
	ch := w.WatchPrefix(ctx, "gitfleet/hosts/", 50*time.Millisecond)
	first := <-ch
	_, err = w.Update(ctx, "gitfleet/status", setFile("a", "1"))
	require.NoError(t, err)
	_, err = w.Update(ctx, "gitfleet/hosts/hv-b", setFile("a", "1"))
	require.NoError(t, err)
	second := <-ch
	assert.NotEqual(t, first, second)
	select {
	case v := <-ch:
		t.Fatalf("a value without a change: %s", v)
	case <-time.After(300 * time.Millisecond):
	}
}

// EditOwn builds on the tip the cache last saw; when something else moved
// the branch meanwhile, the push loses the race and the write is redone on
// the fetched tip: nothing is lost.
func TestEditOwnRecoversFromAForeignWrite(t *testing.T) {
	ctx := context.Background()
	rm := transports(t)["path"](t)
	own := open(t, gitsource.Options{URL: rm.url, Depth: 1})
	other := open(t, gitsource.Options{URL: rm.url})
	branch := "gitfleet/hosts/hv-a"
	write := func(path, content string) gitsource.EditFunc {
		return func(*gitsource.Commit, func(string) ([]byte, error)) (gitsource.Write, error) {
			return gitsource.Write{Files: map[string][]byte{path: []byte(content)}, Message: "w"}, nil
		}
	}
	_, err := own.EditOwn(ctx, branch, write("a", "1"))
	require.NoError(t, err)
	_, err = other.Update(ctx, branch, setFile("b", "foreign"))
	require.NoError(t, err)
	tip, err := own.EditOwn(ctx, branch, write("a", "2"))
	require.NoError(t, err)
	assert.Equal(t, tip, gittest.Rev(t, rm.dir, branch))
	assert.Equal(t, "2", gittest.Show(t, rm.dir, branch, "a"))
	assert.Equal(t, "foreign", gittest.Show(t, rm.dir, branch, "b"))
}

// On a local repository the watches read the ref files, and run no git
// process, also while the branch watched does not exist: before any host
// branch was written, every push to main ran one git-upload-pack per
// watch of a missing branch (the controller watches the host branches and
// the status branch). The branches still arrive once written.
func TestWatchMissingLocalBranchRunsNoGit(t *testing.T) {
	dir := gittest.NewBare(t)
	gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"a": "0"}})
	bin := t.TempDir()
	count := filepath.Join(bin, "runs")
	script := "#!/bin/sh\necho run >> " + count + "\nexec git upload-pack \"$@\"\n"
	require.NoError(t, os.WriteFile(filepath.Join(bin, "git-upload-pack"), []byte(script), 0o700))
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	w := open(t, gitsource.Options{URL: dir})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hosts := w.WatchPrefix(ctx, "gitfleet/hosts/", time.Hour)
	status := w.Watch(ctx, "gitfleet/status", time.Hour)
	for i := 1; i <= 3; i++ {
		gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"a": fmt.Sprint(i)}})
		time.Sleep(100 * time.Millisecond) // let the watches wake and read
	}
	tip := gittest.Commit(t, dir, gittest.Edit{Branch: "gitfleet/status", Write: map[string]string{"README.md": "x"}})
	gittest.Commit(t, dir, gittest.Edit{Branch: "gitfleet/hosts/hv-a", Write: map[string]string{"hosts/hv-a.yaml": "x"}})
	assert.Equal(t, tip, <-status, "a branch written later is seen")
	assert.NotEmpty(t, <-hosts, "a host branch written later is seen")
	_, err := os.Stat(count)
	assert.ErrorIs(t, err, fs.ErrNotExist, "no git-upload-pack ran")
}

// reuseOr points the branch at reuse, else (reuse not usable) writes
// path=content on the tip's parent.
func reuseOr(reuse, path, content string) gitsource.EditFunc {
	return func(tip *gitsource.Commit, _ func(string) ([]byte, error)) (gitsource.Write, error) {
		return gitsource.Write{Files: map[string][]byte{path: []byte(content)}, Message: "built " + content,
			ReplaceTip: true, Reuse: reuse}, nil
	}
}

// Write.Reuse points the branch back at a sibling of its tip the cache
// holds (same parent) without building a commit, as a compare-and-swap
// from the tip; the remote's tree is the sibling's. A commit that is no
// sibling (here: the parent itself) or that the cache lacks is not reused:
// the Write is built from its files.
func TestEditReusesASibling(t *testing.T) {
	ctx := context.Background()
	eachTransport(t, func(t *testing.T, rm remote) {
		r := open(t, gitsource.Options{URL: rm.url, Depth: 1})
		branch := "gitfleet/hosts/hv-a"
		event, err := r.Edit(ctx, branch, replaceIf("a", "event", "event"))
		require.NoError(t, err)
		one, err := r.Edit(ctx, branch, replaceIf("a", "1", "replaceable"))
		require.NoError(t, err)
		two, err := r.Edit(ctx, branch, reuseOr("", "a", "2"))
		require.NoError(t, err)
		require.Equal(t, event, gittest.Rev(t, rm.dir, branch+"^"))
		got, err := r.Edit(ctx, branch, reuseOr(one, "a", "unused"))
		require.NoError(t, err)
		assert.Equal(t, one, got, "the sibling is the tip again")
		assert.Equal(t, one, gittest.Rev(t, rm.dir, branch))
		assert.Equal(t, "1", gittest.Show(t, rm.dir, branch, "a"))
		got, err = r.Edit(ctx, branch, reuseOr(two, "a", "unused"))
		require.NoError(t, err)
		assert.Equal(t, two, got)

		for name, reuse := range map[string]string{"not a sibling": event, "not in the cache": strings.Repeat("ab", 20)} {
			got, err = r.Edit(ctx, branch, reuseOr(reuse, "a", name))
			require.NoError(t, err, name)
			assert.NotEqual(t, reuse, got, name)
			assert.Equal(t, name, gittest.Show(t, rm.dir, branch, "a"), "%s: built from its files", name)
			assert.Equal(t, event, gittest.Rev(t, rm.dir, branch+"^"), name)
		}
	})
}
