// Package gitsource is everything gitfleet does with git, over go-git: open or
// clone a remote (file, http(s), ssh) into a cache directory, fetch one
// branch, resolve a remote head cheaply, read a tree at a commit without a
// worktree, diff two trees, walk first-parent history, and write one commit
// to one branch by compare-and-swap push (never force), retrying on
// rejection. A git failure is always returned as an error, never as an empty
// tree.
package gitsource

import (
	"context"
	"errors"
	"time"

	"github.com/gitfleet/gitfleet/desired"
)

// Sentinel errors callers test with errors.Is.
var (
	// ErrBranchNotFound: the remote has no such branch (yet).
	ErrBranchNotFound = errors.New("branch not found")
	// ErrFileNotFound: the path does not exist in the tree of that commit.
	// It also matches fs.ErrNotExist.
	ErrFileNotFound = errors.New("file not found")
)

// Auth holds credentials for a remote. Token is sent as HTTP basic auth
// password (user Username, or "git" when empty); Username/Password is plain
// basic auth; SSHKeyFile is a private key for ssh:// and scp-like URLs, checked
// against KnownHostsFile (default ~/.ssh/known_hosts).
type Auth struct {
	Username       string
	Password       string
	Token          string
	SSHKeyFile     string
	KnownHostsFile string
}

// Options configure Open.
type Options struct {
	// URL of the remote: file://, a local path, http(s)://, ssh:// or scp-like.
	URL string
	// CacheDir holds the local bare clone; empty keeps it in memory.
	CacheDir string
	Auth     Auth
	// Depth limits fetches to that many commits per branch (0 = full). Agents
	// use 1 for the snapshots branch.
	Depth int
}

// Commit describes one commit.
type Commit struct {
	Hash    string
	Author  string // "Name <email>"
	Time    time.Time
	Parents []string
	Message string
}

// Change is one path changed between two trees. From is empty for an added
// file, To for a removed one; both are set (and differ) for a rename.
type Change struct {
	From string
	To   string
}

// Mutation computes the files to write on top of tip (the branch tip just
// fetched, empty when the branch does not exist yet); read reads a file at tip
// (ErrFileNotFound when absent). It returns path → new content, where a nil
// content removes the path, and the commit message. An empty map means
// nothing to write. A Mutation may run several times: once per attempt.
type Mutation func(tip string, read func(path string) ([]byte, error)) (map[string][]byte, string, error)

// Repo is one remote and its local cache. Its methods are safe for concurrent
// use.
type Repo struct{}

// Open opens (or clones into opts.CacheDir) the remote. It does not fetch.
func Open(ctx context.Context, opts Options) (*Repo, error) { panic("unimplemented") }

// Fetch fetches branch and returns its tip commit hash.
func (r *Repo) Fetch(ctx context.Context, branch string) (string, error) { panic("unimplemented") }

// RemoteHead resolves branch's tip on the remote without fetching objects.
func (r *Repo) RemoteHead(ctx context.Context, branch string) (string, error) {
	panic("unimplemented")
}

// Tree returns the tree of commit under dir ("" for the root) as a
// desired.Tree, with blob hashes as File.ID.
func (r *Repo) Tree(commit, dir string) (desired.Tree, error) { panic("unimplemented") }

// ReadFile reads path at commit.
func (r *Repo) ReadFile(commit, path string) ([]byte, error) { panic("unimplemented") }

// Diff lists the changed paths from one commit's tree to another's.
func (r *Repo) Diff(from, to string) ([]Change, error) { panic("unimplemented") }

// CommitInfo describes one commit.
func (r *Repo) CommitInfo(hash string) (*Commit, error) { panic("unimplemented") }

// FirstParents walks first-parent history from commit, newest first, calling
// fn until it returns false or history ends.
func (r *Repo) FirstParents(from string, fn func(*Commit) (bool, error)) error {
	panic("unimplemented")
}

// IsAncestor reports whether a is an ancestor of (or equal to) b.
func (r *Repo) IsAncestor(a, b string) (bool, error) { panic("unimplemented") }

// Update writes one commit to branch by compare-and-swap: fetch, apply
// mutate on the tip, push without force; on rejection, fetch again and
// retry with jittered backoff. It returns the new tip (or the unchanged tip
// when mutate had nothing to write).
func (r *Repo) Update(ctx context.Context, branch string, mutate Mutation) (string, error) {
	panic("unimplemented")
}

// Watch sends branch's new tip on the returned channel whenever it changes:
// polling RemoteHead every interval (jittered), and at once on a change of a
// local repository's refs (fsnotify). The channel closes when ctx ends.
func (r *Repo) Watch(ctx context.Context, branch string, interval time.Duration) <-chan string {
	panic("unimplemented")
}
