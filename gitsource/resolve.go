package gitsource

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
)

// hexPrefix matches a full or abbreviated commit hash.
var hexPrefix = regexp.MustCompile(`^[0-9a-f]{4,40}$`)

// ErrUnknownRevision: Resolve found neither a branch nor a commit of that
// name on the remote.
var ErrUnknownRevision = errors.New("unknown revision")

// Resolve turns rev into a commit hash and makes sure the commit is in the
// cache: rev is a branch name on the remote (fetched as Fetch does) or a
// full or abbreviated (at least 4 hex digits) commit hash reachable from any
// of the remote's refs or its HEAD (all are fetched, under refs/resolve/, to
// find it: a pull request's head is often on no branch). Neither gives an
// error matching ErrUnknownRevision; network failures are returned as they
// are.
func (r *Repo) Resolve(ctx context.Context, rev string) (string, error) {
	hexRev := hexPrefix.MatchString(rev)
	if checkBranch(rev) == nil {
		tip, err := r.Fetch(ctx, rev)
		if err == nil {
			return tip, nil
		}
		if !errors.Is(err, ErrBranchNotFound) || !hexRev {
			if errors.Is(err, ErrBranchNotFound) {
				return "", fmt.Errorf("resolve %q: %w: no branch of that name on %s, and not a commit hash", rev, ErrUnknownRevision, redactURL(r.url))
			}
			return "", fmt.Errorf("resolve %q: %w", rev, err)
		}
	}
	if !hexRev {
		return "", fmt.Errorf("resolve %q: %w: not a branch name or a commit hash", rev, ErrUnknownRevision)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	fetch := func(specs ...config.RefSpec) error {
		return r.remote(ctx, func(ctx context.Context) error {
			return r.repo.FetchContext(ctx, &git.FetchOptions{
				RemoteName: remoteName,
				RefSpecs:   specs,
				Depth:      r.opts.Depth,
				Auth:       r.auth,
				Tags:       git.NoTags,
				// ProxyOptions: the ssh deadline (see sshdeadline.go).
				ProxyOptions: r.proxyOptions(),
			})
		})
	}
	err := fetch("+refs/*:refs/resolve/*", "+HEAD:refs/resolve/HEAD")
	if errors.Is(err, git.NoMatchingRefSpecError{}) {
		// The remote's HEAD names a branch not born yet (a fresh `git
		// init` with remotes added): every other ref still counts.
		err = fetch("+refs/*:refs/resolve/*")
	}
	if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
		return "", fmt.Errorf("resolve %q: fetch all branches from %s: %w", rev, redactURL(r.url), err)
	}
	h, err := r.repo.ResolveRevision(plumbing.Revision(rev))
	if err != nil {
		return "", fmt.Errorf("resolve %q: %w: %v", rev, ErrUnknownRevision, err)
	}
	if err := r.verifyCommit(*h); err != nil {
		return "", fmt.Errorf("resolve %q: %w", rev, err)
	}
	return h.String(), nil
}

// ResolveExpr turns rev into a commit hash as Resolve does, and also accepts
// any git revision expression (HEAD, HEAD~1, main~1, origin/main, a tag, an
// abbreviated hash) when the remote is a local repository: rev is resolved
// there first with go-git's Repository.ResolveRevision (the path names the
// repository itself: a working tree's top or a bare repository), then the
// commit is made readable through Resolve. A network remote, or a local one where the
// expression does not resolve, goes to Resolve alone. An unknown revision
// gives an error matching ErrUnknownRevision.
func (r *Repo) ResolveExpr(ctx context.Context, rev string) (string, error) {
	dir := r.localPath()
	if dir == "" {
		return r.Resolve(ctx, rev)
	}
	local, err := git.PlainOpen(dir)
	if err != nil {
		return r.Resolve(ctx, rev)
	}
	h, lerr := local.ResolveRevision(plumbing.Revision(rev))
	if lerr != nil {
		commit, err := r.Resolve(ctx, rev)
		if errors.Is(err, ErrUnknownRevision) {
			return "", fmt.Errorf("resolve %q: %w: %s has no branch, tag or commit of that name and the expression does not resolve there", rev, ErrUnknownRevision, dir)
		}
		return commit, err
	}
	return r.Resolve(ctx, h.String())
}

// ResolveTracking resolves branch as Fetch does and returns its tip and the
// ref it came from (refs/heads/<branch> on the remote). When the remote is
// a local clone without that branch, as `git clone` and actions/checkout
// leave one (the branch exists there only as refs/remotes/<remote>/<branch>),
// it resolves the clone's remote-tracking copy instead: remote "origin"'s,
// else the only remote's that has one, and returns that ref. An error
// matching ErrBranchNotFound means neither exists; with several remotes
// holding copies and none named origin, the error names them.
//
// For readers of a branch someone else writes (plan reading the
// controller's snapshots branch in a pull request's checkout). A tracking
// copy is as fresh as the clone's last fetch, and is never a writer's base.
func (r *Repo) ResolveTracking(ctx context.Context, branch string) (tip, ref string, err error) {
	tip, err = r.Fetch(ctx, branch)
	if err == nil || !errors.Is(err, ErrBranchNotFound) {
		return tip, plumbing.NewBranchReferenceName(branch).String(), err
	}
	dir := r.localPath()
	if dir == "" {
		return "", "", err
	}
	local, lerr := git.PlainOpen(dir)
	if lerr != nil {
		return "", "", err
	}
	remotes, lerr := local.Remotes()
	if lerr != nil {
		return "", "", fmt.Errorf("%w; list the remotes of %s: %v", err, dir, lerr)
	}
	var found []*plumbing.Reference
	for _, rem := range remotes {
		name := plumbing.NewRemoteReferenceName(rem.Config().Name, branch)
		tracking, rerr := local.Reference(name, true)
		if rerr != nil {
			continue
		}
		if rem.Config().Name == git.DefaultRemoteName {
			found = []*plumbing.Reference{tracking}
			break
		}
		found = append(found, tracking)
	}
	switch len(found) {
	case 0:
		return "", "", err
	case 1:
	default:
		var names []string
		for _, f := range found {
			names = append(names, f.Name().String())
		}
		sort.Strings(names)
		return "", "", fmt.Errorf("%w; the clone has %d remote-tracking copies (%s) and no remote named origin, so which one to read is unknown", err, len(found), strings.Join(names, ", "))
	}
	tip, err = r.Resolve(ctx, found[0].Hash().String())
	if err != nil {
		return "", "", fmt.Errorf("resolve %s of %s: %w", found[0].Name(), dir, err)
	}
	return tip, found[0].Name().String(), nil
}
