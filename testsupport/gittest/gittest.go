// Package gittest gives tests real git repositories to work against: bare
// repositories in t.TempDir(), a git smart-HTTP server (git http-backend
// behind net/http/cgi on 127.0.0.1), and helpers that play a person pushing
// commits, merges, renames and force-pushes. It drives the git command line,
// so tests need git (2.38 or newer for Merge) on PATH.
package gittest

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// NeedGit skips the test when no git binary is on PATH.
func NeedGit(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed: these tests drive a real git")
	}
}

// Git runs git with args in dir and returns its trimmed stdout; a failure
// fails the test. The environment is isolated from the user's git config.
func Git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	out, err := run(dir, nil, nil, args...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return out
}

func run(dir string, env []string, stdin []byte, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(baseEnv(), env...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s (in %s): %v: %s", strings.Join(args, " "), dir, err, stderr.String())
	}
	return strings.TrimSpace(stdout.String()), nil
}

// baseEnv is the process environment without the user's git configuration.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "GIT_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0")
}

// NewBare makes a bare repository in a fresh t.TempDir() (default branch
// main, http.receivepack true so Serve accepts pushes) and returns its path.
func NewBare(t testing.TB) string {
	t.Helper()
	NeedGit(t)
	dir := filepath.Join(t.TempDir(), "repo.git")
	Git(t, "", "init", "--quiet", "--bare", "--initial-branch=main", dir)
	Git(t, dir, "config", "http.receivepack", "true")
	return dir
}

// ServeOptions configure ServeWith.
type ServeOptions struct {
	// Username and Password, when set, are required as HTTP basic auth on
	// every request.
	Username, Password string
	// Wrap, when set, wraps the git handler (after the auth check): a
	// test's own misbehaviour in front of a real git.
	Wrap func(http.Handler) http.Handler
	// Account, when set, is called after every request git http-backend
	// answered, with its CPU time (the backend and the git processes it
	// ran); the backend then runs as a CGI program of gittest's own
	// (net/http/cgi hides the child's rusage). It may be called from
	// several goroutines at once.
	Account func(Request)
	// Env is extra environment for git http-backend (GIT_TRACE2_PERF=…).
	Env []string
}

// Serve serves every repository under projectRoot over git's smart HTTP
// protocol (git http-backend behind net/http/cgi, GIT_HTTP_EXPORT_ALL set)
// on 127.0.0.1 until the test ends, and returns the base URL: the
// repository projectRoot/x.git is baseURL + "/x.git".
func Serve(t testing.TB, projectRoot string) string {
	return ServeWith(t, projectRoot, ServeOptions{})
}

// ServeWith is Serve with options (basic auth).
func ServeWith(t testing.TB, projectRoot string, opts ServeOptions) string {
	t.Helper()
	NeedGit(t)
	gitBin, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	backend := &cgi.Handler{
		Path: gitBin,
		Args: []string{"http-backend"},
		Env: []string{
			"GIT_PROJECT_ROOT=" + projectRoot,
			"GIT_HTTP_EXPORT_ALL=1",
			"GIT_CONFIG_NOSYSTEM=1",
			"GIT_CONFIG_GLOBAL=/dev/null",
		},
		// git's complaints (a lost ref-lock race, say) go to the test log.
		Stderr: logWriter{t},
	}
	backend.Env = append(backend.Env, opts.Env...)
	var h http.Handler = backend
	if opts.Account != nil {
		h = &accountingBackend{gitBin: gitBin, env: backend.Env, stderr: backend.Stderr, account: opts.Account}
	}
	git := h
	if opts.Username != "" || opts.Password != "" {
		h = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			u, p, ok := req.BasicAuth()
			if !ok || u != opts.Username || p != opts.Password {
				w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			git.ServeHTTP(w, req)
		})
	}
	if opts.Wrap != nil {
		h = opts.Wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// logWriter sends what it is given to the test log.
type logWriter struct{ t testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Logf("git http-backend: %s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Edit is one commit a test writes to a branch.
type Edit struct {
	// Branch to commit to (created from nothing when absent).
	Branch string
	// Write maps paths (slash-separated, nested allowed) to new contents.
	Write map[string]string
	// Remove lists paths to delete (a directory removes everything below).
	// Renames apply first, then removals, then writes.
	Remove []string
	// Rename maps an old path to a new one, keeping the contents (git sees
	// a rename).
	Rename map[string]string
	// Executable and Symlink list paths of Write to record with mode 100755
	// or 120000 (the contents are the link target).
	Executable, Symlink []string
	// Submodule maps paths to commit hashes recorded as gitlinks (mode
	// 160000); the commits need not exist in the repository.
	Submodule map[string]string
	// Author is "Name <email>"; empty means "Test Person <person@example.com>".
	Author string
	// Message defaults to "test commit".
	Message string
	// Time is the author and commit time; zero means now.
	Time time.Time
	// Parents, when set, replaces the branch tip as the parents (the
	// branch tip is then overwritten, as a force-push would).
	Parents []string
	// Sign, when set, signs the commit as `git -c … commit -S` does
	// (commit-tree -S, git's own signing: gpg or ssh-keygen).
	Sign *Signing
}

// Signing is how git signs a commit: Config are key=value settings given
// as `git -c` (gpg.format=ssh, user.signingkey=FILE, …), Env extra
// variables (GNUPGHOME=…).
type Signing struct {
	Config []string
	Env    []string
}

// Commit writes one commit to a branch of the (bare) repository at dir
// without a worktree, moves the branch to it as a push would, and returns
// its hash. It updates the branch with a compare-and-swap, so it fails
// (rather than losing a commit) if something else moved the branch.
func Commit(t testing.TB, dir string, e Edit) string {
	t.Helper()
	h, err := commit(dir, e)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func commit(dir string, e Edit) (string, error) {
	if e.Branch == "" {
		e.Branch = "main"
	}
	index, err := os.CreateTemp("", "gittest-index-*")
	if err != nil {
		return "", err
	}
	index.Close()
	os.Remove(index.Name())
	defer os.Remove(index.Name())
	env := []string{"GIT_INDEX_FILE=" + index.Name()}
	g := func(stdin []byte, args ...string) (string, error) { return run(dir, env, stdin, args...) }

	ref := "refs/heads/" + e.Branch
	tip, _ := g(nil, "rev-parse", "--verify", "--quiet", ref)
	parents := e.Parents
	if parents == nil && tip != "" {
		parents = []string{tip}
	}
	if len(parents) > 0 {
		_, err = g(nil, "read-tree", parents[0])
	} else {
		_, err = g(nil, "read-tree", "--empty")
	}
	if err != nil {
		return "", err
	}
	remove := func(p string) error {
		ls, err := g(nil, "ls-files", "-z", "--", p)
		if err != nil {
			return err
		}
		// Mode 0 in --index-info removes the path (no worktree needed).
		var info strings.Builder
		for _, f := range strings.Split(ls, "\x00") {
			if f != "" {
				fmt.Fprintf(&info, "0 %s\t%s\n", strings.Repeat("0", 40), f)
			}
		}
		if info.Len() == 0 {
			return nil
		}
		_, err = g([]byte(info.String()), "update-index", "--index-info")
		return err
	}
	olds := make([]string, 0, len(e.Rename))
	for o := range e.Rename {
		olds = append(olds, o)
	}
	sort.Strings(olds)
	for _, old := range olds {
		info, err := g(nil, "ls-files", "-s", "--", old)
		if err != nil {
			return "", err
		}
		f := strings.Fields(info) // mode hash stage\tpath
		if len(f) < 3 {
			return "", fmt.Errorf("rename %s: not in %s", old, e.Branch)
		}
		if err := remove(old); err != nil {
			return "", err
		}
		if _, err := g(nil, "update-index", "--add", "--cacheinfo", f[0]+","+f[1]+","+e.Rename[old]); err != nil {
			return "", err
		}
	}
	for _, p := range e.Remove {
		if err := remove(p); err != nil {
			return "", err
		}
	}
	mode := map[string]string{}
	for _, p := range e.Executable {
		mode[p] = "100755"
	}
	for _, p := range e.Symlink {
		mode[p] = "120000"
	}
	paths := make([]string, 0, len(e.Write))
	for p := range e.Write {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	if len(paths) > 0 {
		// Two git processes for any number of files: hash every blob from
		// a scratch directory, then stage them all at once.
		scratch, err := os.MkdirTemp("", "gittest-blobs-*")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(scratch)
		var list strings.Builder
		for i, p := range paths {
			f := filepath.Join(scratch, fmt.Sprint(i))
			if err := os.WriteFile(f, []byte(e.Write[p]), 0o644); err != nil {
				return "", err
			}
			list.WriteString(f + "\n")
		}
		out, err := g([]byte(list.String()), "hash-object", "-w", "--no-filters", "--stdin-paths")
		if err != nil {
			return "", err
		}
		hashes := strings.Split(out, "\n")
		if len(hashes) != len(paths) {
			return "", fmt.Errorf("hash-object gave %d hashes for %d files", len(hashes), len(paths))
		}
		var info strings.Builder
		for i, p := range paths {
			m := mode[p]
			if m == "" {
				m = "100644"
			}
			fmt.Fprintf(&info, "%s %s\t%s\n", m, hashes[i], p)
		}
		if _, err := g([]byte(info.String()), "update-index", "--add", "--index-info"); err != nil {
			return "", err
		}
	}
	if len(e.Submodule) > 0 {
		var info strings.Builder
		for p, h := range e.Submodule {
			fmt.Fprintf(&info, "160000 %s\t%s\n", h, p)
		}
		if _, err := g([]byte(info.String()), "update-index", "--add", "--index-info"); err != nil {
			return "", err
		}
	}
	tree, err := g(nil, "write-tree")
	if err != nil {
		return "", err
	}
	author := e.Author
	if author == "" {
		author = "Test Person <person@example.com>"
	}
	name, email, ok := strings.Cut(author, "<")
	if !ok {
		return "", fmt.Errorf("author %q is not \"Name <email>\"", author)
	}
	when := e.Time
	if when.IsZero() {
		when = time.Now()
	}
	date := fmt.Sprintf("%d %s", when.Unix(), when.Format("-0700"))
	cenv := append(env,
		"GIT_AUTHOR_NAME="+strings.TrimSpace(name), "GIT_AUTHOR_EMAIL="+strings.TrimSuffix(strings.TrimSpace(email), ">"),
		"GIT_COMMITTER_NAME="+strings.TrimSpace(name), "GIT_COMMITTER_EMAIL="+strings.TrimSuffix(strings.TrimSpace(email), ">"),
		"GIT_AUTHOR_DATE="+date, "GIT_COMMITTER_DATE="+date)
	msg := e.Message
	if msg == "" {
		msg = "test commit"
	}
	args := []string{"commit-tree", tree, "-m", msg}
	for _, p := range parents {
		args = append(args, "-p", p)
	}
	if e.Sign != nil {
		var pre []string
		for _, kv := range e.Sign.Config {
			pre = append(pre, "-c", kv)
		}
		args = append(append(pre, args...), "-S")
		cenv = append(cenv, e.Sign.Env...)
	}
	h, err := run(dir, cenv, nil, args...)
	if err != nil {
		return "", err
	}
	old := tip
	if old == "" {
		old = strings.Repeat("0", 40)
	}
	if _, err := g(nil, "update-ref", "-m", "gittest commit", ref, h, old); err != nil {
		return "", err
	}
	return h, nil
}

// Merge merges branch from into branch into with a real merge commit
// (parents: into's tip, then from's tip) and returns it. A conflict fails
// the test.
func Merge(t testing.TB, dir, into, from, message string) string {
	t.Helper()
	ours := Rev(t, dir, "refs/heads/"+into)
	theirs := Rev(t, dir, "refs/heads/"+from)
	out, err := run(dir, nil, nil, "merge-tree", "--write-tree", ours, theirs)
	if err != nil {
		t.Fatalf("merge %s into %s: %v", from, into, err)
	}
	tree := strings.SplitN(out, "\n", 2)[0]
	if message == "" {
		message = "Merge " + from + " into " + into
	}
	env := []string{
		"GIT_AUTHOR_NAME=Test Person", "GIT_AUTHOR_EMAIL=person@example.com",
		"GIT_COMMITTER_NAME=Test Person", "GIT_COMMITTER_EMAIL=person@example.com",
	}
	h, err := run(dir, env, nil, "commit-tree", tree, "-p", ours, "-p", theirs, "-m", message)
	if err != nil {
		t.Fatal(err)
	}
	Git(t, dir, "update-ref", "refs/heads/"+into, h, ours)
	return h
}

// SetBranch points branch at commit whatever it held before, as a
// force-push does (or creates it).
func SetBranch(t testing.TB, dir, branch, commit string) {
	t.Helper()
	Git(t, dir, "update-ref", "refs/heads/"+branch, commit)
}

// DeleteBranch removes a branch.
func DeleteBranch(t testing.TB, dir, branch string) {
	t.Helper()
	Git(t, dir, "update-ref", "-d", "refs/heads/"+branch)
}

// Rev resolves a revision (a branch, refs/heads/x, a hash, x~1) to a commit
// hash.
func Rev(t testing.TB, dir, rev string) string {
	t.Helper()
	return Git(t, dir, "rev-parse", "--verify", rev+"^{commit}")
}

// Show returns the contents of path at rev (surrounding white space
// trimmed), failing the test if absent.
func Show(t testing.TB, dir, rev, path string) string {
	t.Helper()
	out, err := run(dir, nil, nil, "show", rev+":"+path)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Files lists the paths in the tree of rev, sorted.
func Files(t testing.TB, dir, rev string) []string {
	t.Helper()
	out := Git(t, dir, "ls-tree", "-r", "--name-only", rev)
	if out == "" {
		return nil
	}
	return strings.Split(out, "\n")
}

// Hook installs script (a shell script, "#!/bin/sh" added) as the bare
// repository dir's hook name ("pre-receive", "update"): git runs it
// for every push, over any transport, and a non-zero exit refuses the
// push with what it printed sent to the pusher.
func Hook(t testing.TB, dir, name, script string) {
	t.Helper()
	path := filepath.Join(dir, "hooks", name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}
