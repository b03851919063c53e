package gittest_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

func TestCommitEdits(t *testing.T) {
	dir := gittest.NewBare(t)
	assert.Equal(t, "true", gittest.Git(t, dir, "config", "http.receivepack"))
	c1 := gittest.Commit(t, dir, gittest.Edit{
		Write:      map[string]string{"a/b/c.yaml": "c\n", "a/d.yaml": "d\n", "run": "#!/bin/sh\n", "ln": "a/d.yaml"},
		Executable: []string{"run"},
		Symlink:    []string{"ln"},
		Author:     "Grace Hopper <grace@example.com>",
		Message:    "first",
	})
	assert.Equal(t, c1, gittest.Rev(t, dir, "main"))
	assert.Equal(t, []string{"a/b/c.yaml", "a/d.yaml", "ln", "run"}, gittest.Files(t, dir, "main"))
	assert.Equal(t, "Grace Hopper <grace@example.com>", gittest.Git(t, dir, "log", "-1", "--format=%an <%ae>", c1))
	modes := gittest.Git(t, dir, "ls-tree", "-r", "--format=%(objectmode) %(path)", c1)
	assert.Contains(t, modes, "100755 run")
	assert.Contains(t, modes, "120000 ln")

	c2 := gittest.Commit(t, dir, gittest.Edit{Rename: map[string]string{"a/b/c.yaml": "x/c.yaml"}, Remove: []string{"a"}})
	assert.Equal(t, []string{"ln", "run", "x/c.yaml"}, gittest.Files(t, dir, "main"))
	assert.Equal(t, []string{"D\ta/d.yaml", "R100\ta/b/c.yaml\tx/c.yaml"}, strings.Split(gittest.Git(t, dir, "diff", "-M", "--name-status", c1, c2), "\n"))
	assert.Equal(t, c1, gittest.Rev(t, dir, "main~1"))

	// A side branch and a merge.
	gittest.SetBranch(t, dir, "side", c1)
	side := gittest.Commit(t, dir, gittest.Edit{Branch: "side", Write: map[string]string{"s.yaml": "s\n"}})
	m := gittest.Merge(t, dir, "main", "side", "")
	assert.Equal(t, c2+" "+side, gittest.Git(t, dir, "log", "-1", "--format=%P", m))
	assert.Contains(t, gittest.Files(t, dir, m), "s.yaml")

	// A force-push back, and a deletion.
	gittest.SetBranch(t, dir, "main", c1)
	assert.Equal(t, c1, gittest.Rev(t, dir, "main"))
	gittest.DeleteBranch(t, dir, "side")
	assert.Equal(t, "", gittest.Git(t, dir, "branch", "--list", "side"))

	// Explicit parents replace the tip (a rewritten history).
	root := gittest.Commit(t, dir, gittest.Edit{Parents: []string{}, Write: map[string]string{"only": "1"}})
	assert.Equal(t, "", gittest.Git(t, dir, "log", "-1", "--format=%P", root))
}

func TestServe(t *testing.T) {
	dir := gittest.NewBare(t)
	c := gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"a": "1"}})
	url := gittest.Serve(t, filepath.Dir(dir)) + "/" + filepath.Base(dir)
	assert.True(t, strings.HasPrefix(url, "http://127.0.0.1:"))
	assert.Contains(t, gittest.Git(t, "", "ls-remote", url), c+"\trefs/heads/main")

	authURL := gittest.ServeWith(t, filepath.Dir(dir), gittest.ServeOptions{Username: "u", Password: "pw"}) + "/" + filepath.Base(dir)
	res, err := http.Get(authURL + "/info/refs?service=git-upload-pack")
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, res.StatusCode)
	withCreds := strings.Replace(authURL, "http://", "http://u:pw@", 1)
	assert.Contains(t, gittest.Git(t, "", "ls-remote", withCreds), c)

	// A push through the server lands in the bare repository.
	work := t.TempDir()
	gittest.Git(t, "", "clone", "--quiet", url, work)
	gittest.Git(t, work, "-c", "user.name=T", "-c", "user.email=t@example.com", "commit", "--quiet", "--allow-empty", "-m", "pushed")
	gittest.Git(t, work, "push", "--quiet", "origin", "main")
	assert.Equal(t, gittest.Rev(t, work, "HEAD"), gittest.Rev(t, dir, "main"))
}

// Account: git's own clone and push go through the accounting CGI host
// (with basic auth), and every request is reported with its service,
// kind, status and the CPU its git processes used.
func TestServeAccountsEachRequest(t *testing.T) {
	dir := gittest.NewBare(t)
	gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"a.yaml": "a\n"}})
	var mu sync.Mutex
	var got []gittest.Request
	base := gittest.ServeWith(t, filepath.Dir(dir), gittest.ServeOptions{Username: "u", Password: "p",
		Account: func(r gittest.Request) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, r)
		}})
	url := strings.Replace(base, "http://", "http://u:p@", 1) + "/repo.git"
	work := filepath.Join(t.TempDir(), "work")
	gittest.Git(t, "", "clone", "--quiet", url, work)
	require.NoError(t, os.WriteFile(filepath.Join(work, "b.yaml"), []byte("b\n"), 0o644))
	gittest.Git(t, work, "add", "b.yaml")
	gittest.Git(t, work, "-c", "user.name=T", "-c", "user.email=t@example.com", "commit", "--quiet", "-m", "b")
	gittest.Git(t, work, "push", "--quiet", "origin", "HEAD:main")
	assert.Equal(t, gittest.Git(t, work, "rev-parse", "HEAD"), gittest.Rev(t, dir, "main"), "the push landed")
	mu.Lock()
	defer mu.Unlock()
	kinds := map[string]int{}
	for _, r := range got {
		assert.Equal(t, http.StatusOK, r.Status, "%+v", r)
		assert.Positive(t, r.CPU, "%+v", r)
		kind := r.Service + " pack"
		if r.Advertisement {
			kind = r.Service + " refs"
		}
		kinds[kind]++
	}
	// The clone speaks protocol v2 (the Git-Protocol header reaches
	// http-backend): ls-refs and fetch are two POSTs.
	assert.Equal(t, map[string]int{"upload-pack refs": 1, "upload-pack pack": 2, "receive-pack refs": 1, "receive-pack pack": 1}, kinds)
}
