package gitsource

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
)

// BranchEdit is one branch of an EditMany: Edit runs on Branch's tip.
// When Known, the first attempt builds on Tip (a full hash the caller just
// fetched; "" when the branch was absent) without fetching, as EditAt's
// does; otherwise, and in every later attempt, the branch is fetched.
type BranchEdit struct {
	Branch string
	Tip    string
	Known  bool
	Edit   EditFunc
}

// EditMany is Edit for several branches written together: each attempt
// runs the edits in order (a later one may use what an earlier one
// computed), builds their commits, and pushes every commit in one
// receive-pack with git's atomic push, naming each branch's tip as the
// value it must still have. The remote takes all the updates or none: when
// any branch moved, the whole push is refused as a lost race, and the next
// attempt fetches every branch and runs every edit again. It returns the
// branches' new tips, in the order of edits (a branch with nothing to
// write keeps its tip).
//
// A remote that does not advertise the atomic capability (git before 2.4,
// receive.advertiseAtomic false, some git hosts) gets one compare-and-swap
// push per branch, in order, as Edit's: a refusal of a later one leaves
// the earlier ones written, and the retry runs every edit again on the
// branches' new tips. The Repo remembers such a remote and does not ask
// again. Errors are Edit's: ErrConflict after Options.UpdateAttempts lost
// races, ErrNonFastForward for a refused ReplaceTip, an edit's own error as
// it is. Edit, Update and EditMany calls on one Repo run one at a time.
func (r *Repo) EditMany(ctx context.Context, edits []BranchEdit) ([]string, error) {
	seen := map[string]bool{}
	for _, e := range edits {
		if err := checkBranch(e.Branch); err != nil {
			return nil, fmt.Errorf("update: %w", err)
		}
		if seen[e.Branch] {
			return nil, fmt.Errorf("update: branch %s given twice", e.Branch)
		}
		seen[e.Branch] = true
	}
	r.updateMu.Lock()
	defer r.updateMu.Unlock()
	return r.updateLoop(ctx, edits)
}

// attemptMany runs the edits on tips, builds their commits and pushes
// them: in one atomic push when the remote takes one, else one by one.
func (r *Repo) attemptMany(ctx context.Context, edits []BranchEdit, tips []string) ([]string, error) {
	newTips := append([]string(nil), tips...)
	var ups []refUpdate
	var replacing []bool
	var written [][]plumbing.Hash
	var objects []plumbing.Hash
	inPack := map[plumbing.Hash]bool{}
	for i, e := range edits {
		p, err := r.prepare(e.Branch, tips[i], e.Edit)
		if err != nil {
			return nil, err
		}
		if p.commit.IsZero() {
			continue
		}
		newTips[i] = p.commit.String()
		ups = append(ups, refUpdate{branch: e.Branch, old: tips[i], new: p.commit})
		replacing = append(replacing, p.replace && tips[i] != "")
		written = append(written, p.written)
		for _, h := range p.written {
			if !inPack[h] { // a pack holds each object once
				inPack[h] = true
				objects = append(objects, h)
			}
		}
	}
	if len(ups) == 0 {
		return newTips, nil
	}
	nonFastForward := func(err error, what string, replaced ...bool) error {
		for _, rp := range replaced {
			if rp && refusedNonFastForward(err) {
				return fmt.Errorf("%w: %s: %v", ErrNonFastForward, what, err)
			}
		}
		return err
	}
	if len(ups) > 1 && !r.noAtomic.Load() {
		pack, err := r.pack(objects)
		if err != nil {
			return nil, err
		}
		err = r.remote(ctx, func(ctx context.Context) error { return r.push(ctx, ups, pack, true) })
		if err == nil {
			r.pushed(ups)
			r.maintain(ctx, refSet{branches: branchesOf(ups)})
			return newTips, nil
		}
		if !errors.Is(err, errNoAtomic) {
			return nil, nonFastForward(err, strings.Join(branchesOf(ups), ", "), replacing...)
		}
		r.noAtomic.Store(true)
		r.log.Info("the remote takes no atomic pushes: writing one branch per push")
	}
	// One compare-and-swap push per branch, each with its commit's
	// objects.
	for i, u := range ups {
		pack, err := r.pack(written[i])
		if err != nil {
			return nil, err
		}
		if err := r.remote(ctx, func(ctx context.Context) error { return r.push(ctx, []refUpdate{u}, pack, false) }); err != nil {
			return nil, nonFastForward(err, u.branch, replacing[i])
		}
		r.pushed([]refUpdate{u})
	}
	r.maintain(ctx, refSet{branches: branchesOf(ups)})
	return newTips, nil
}

// editedBranches names the branches of edits.
func editedBranches(edits []BranchEdit) []string {
	out := make([]string, len(edits))
	for i, e := range edits {
		out[i] = e.Branch
	}
	return out
}

// branchesOf names the branches of ups.
func branchesOf(ups []refUpdate) []string {
	out := make([]string, len(ups))
	for i, u := range ups {
		out[i] = u.branch
	}
	return out
}
