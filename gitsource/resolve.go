package gitsource

import (
	"context"
	"errors"
	"fmt"
	"regexp"

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
	err := r.remote(ctx, func(ctx context.Context) error {
		return r.repo.FetchContext(ctx, &git.FetchOptions{
			RemoteName: remoteName,
			RefSpecs:   []config.RefSpec{"+refs/*:refs/resolve/*", "+HEAD:refs/resolve/HEAD"},
			Depth:      r.opts.Depth,
			Auth:       r.auth,
			Tags:       git.NoTags,
			// ProxyOptions: the ssh deadline (see sshdeadline.go).
			ProxyOptions: r.proxyOptions(),
		})
	})
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
