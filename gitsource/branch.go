package gitsource

import (
	"context"
	"errors"
	"fmt"
)

// ErrBranchExists: CreateBranch found the branch on the remote (before
// its push, or created by someone else while it pushed).
var ErrBranchExists = errors.New("branch exists")

// CreateBranch writes a new branch: one commit whose parent is base's tip
// (base is a branch of the remote, fetched now), with mutate's files
// applied to base's tree, pushed as a create (the old value named is
// "none": the remote takes it only if branch does not exist). It returns
// the new commit. It is how a command proposes a change for review
// without touching base itself. Errors: ErrBranchExists when branch is on
// the remote (it is never overwritten, not retried), ErrBranchNotFound
// when base is not, mutate's own error as it is, an error when mutate
// changes nothing (a branch equal to base proposes nothing).
func (r *Repo) CreateBranch(ctx context.Context, branch, base string, mutate Mutation) (string, error) {
	if err := checkBranch(branch); err != nil {
		return "", fmt.Errorf("create branch: %w", err)
	}
	r.updateMu.Lock()
	defer r.updateMu.Unlock()
	tips, err := r.FetchAll(ctx, []string{base, branch}, nil)
	if err != nil {
		return "", fmt.Errorf("create branch %s: %w", branch, err)
	}
	if tip, ok := tips[branch]; ok {
		return "", fmt.Errorf("create branch %s: %w at %s", branch, ErrBranchExists, tip)
	}
	baseTip, ok := tips[base]
	if !ok {
		return "", fmt.Errorf("create branch %s: base %s: %w", branch, base, ErrBranchNotFound)
	}
	p, err := r.prepare(branch, baseTip, mutation(mutate))
	if err != nil {
		return "", fmt.Errorf("create branch %s: %w", branch, err)
	}
	if p.commit.IsZero() {
		return "", fmt.Errorf("create branch %s: the change leaves %s as it is", branch, base)
	}
	pack, err := r.pack(p.written)
	if err != nil {
		return "", err
	}
	up := refUpdate{branch: branch, new: p.commit}
	err = r.remote(ctx, func(ctx context.Context) error { return r.push(ctx, []refUpdate{up}, pack, false) })
	if errors.Is(err, errRejected) {
		return "", fmt.Errorf("create branch %s: %w (created while we pushed): %v", branch, ErrBranchExists, err)
	}
	if err != nil {
		return "", fmt.Errorf("create branch %s: %w", branch, err)
	}
	r.pushed([]refUpdate{up})
	return p.commit.String(), nil
}
