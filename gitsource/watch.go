package gitsource

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Watch sends branch's new tip on the returned channel whenever it changes:
// polling RemoteHead every interval (jittered), and at once on a change of a
// local repository's refs (fsnotify). The channel closes when ctx ends.
//
// The first value is the tip as first seen; after that only changes are
// sent. The channel holds one value: a reader that falls behind gets the
// latest tip, not every intermediate one. A branch that does not exist (yet)
// sends nothing; errors of RemoteHead are logged and retried at the next
// tick. An interval <= 0 means 15 s. Each wait is random in
// [interval/2, interval·3/2].
//
// On a local repository the tip is read from the repository's ref files
// (loose, then packed-refs), and git is asked only when its refs are not
// files (a reftable repository): every change of its refs (a push of
// another branch, the controller's own writes) wakes the watch, and a git
// process each time cost more than the pass it started — also when the
// branch does not exist (no host branch yet: each push to main ran one
// git-upload-pack per watch of a missing branch).
func (r *Repo) Watch(ctx context.Context, branch string, interval time.Duration) <-chan string {
	dir := r.localPath()
	return r.watch(ctx, branch, interval, func(ctx context.Context) (string, error) {
		if dir != "" {
			if tips, ok := localBranches(dir, branch, true); ok {
				return tips[branch], nil
			}
			if filesRefs(dir) {
				return "", fmt.Errorf("%w: %s", ErrBranchNotFound, branch)
			}
		}
		return r.RemoteHead(ctx, branch)
	})
}

// WatchPrefix is Watch for every branch whose name starts with prefix
// ("gitfleet/hosts/", say): it sends a digest of their names and tips (a
// hex string, equal for equal sets) whenever one of them moves, appears or
// goes, polling one ref advertisement every interval. No matching branch
// sends nothing.
// On a local repository the branches are read from its ref files, as
// Watch reads them.
func (r *Repo) WatchPrefix(ctx context.Context, prefix string, interval time.Duration) <-chan string {
	dir := r.localPath()
	return r.watch(ctx, prefix+"*", interval, func(ctx context.Context) (string, error) {
		if dir != "" {
			if tips, ok := localBranches(dir, prefix, false); ok {
				return prefixDigest(tips, prefix), nil
			}
			if filesRefs(dir) {
				return "", fmt.Errorf("%w: no %s*", ErrBranchNotFound, prefix)
			}
		}
		return r.remotePrefixDigest(ctx, prefix)
	})
}

// watch is Watch over resolve, which names what is watched by a string
// that changes when it does (ErrBranchNotFound: nothing there yet).
func (r *Repo) watch(ctx context.Context, branch string, interval time.Duration, resolve func(context.Context) (string, error)) <-chan string {
	if interval <= 0 {
		interval = 15 * time.Second
	}
	out := make(chan string, 1)
	poke := make(chan struct{}, 1)
	if dir := r.localPath(); dir != "" {
		r.watchFiles(ctx, dir, poke)
	}
	go func() {
		defer close(out)
		log := r.log.WithField("branch", branch)
		last := ""
		for {
			tip, err := resolve(ctx)
			switch {
			case ctx.Err() != nil:
				return
			case errors.Is(err, ErrBranchNotFound):
			case err != nil:
				log.WithError(err).Warn("watch: resolve remote head")
			case tip != last:
				last = tip
				deliver(out, tip)
			}
			wait := interval/2 + time.Duration(rand.Int64N(int64(interval)+1))
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-poke:
				t.Stop()
			case <-t.C:
			}
		}
	}()
	return out
}

// deliver puts tip in out (capacity 1), replacing a value not yet read.
func deliver(out chan string, tip string) {
	for {
		select {
		case out <- tip:
			return
		default:
		}
		select {
		case <-out:
		default:
		}
	}
}

// watchFiles pokes whenever the refs of the local repository at dir change:
// loose refs under refs/heads (every level; branch names may hold slashes)
// and packed-refs in the git directory. Without fsnotify the poll still
// notices, only later.
func (r *Repo) watchFiles(ctx context.Context, dir string, poke chan<- struct{}) {
	gitDir := dir
	if st, err := os.Stat(filepath.Join(dir, ".git")); err == nil && st.IsDir() {
		gitDir = filepath.Join(dir, ".git")
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		r.log.WithError(err).Warn("watch: fsnotify unavailable; polling only")
		return
	}
	addTree := func(root string) {
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				if err := w.Add(p); err != nil {
					r.log.WithError(err).WithField("dir", p).Debug("watch: add")
				}
			}
			return nil
		})
	}
	if err := w.Add(gitDir); err != nil {
		r.log.WithError(err).WithField("dir", gitDir).Warn("watch: fsnotify; polling only")
		_ = w.Close()
		return
	}
	addTree(filepath.Join(gitDir, "refs"))
	go func() {
		defer w.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if ev.Has(fsnotify.Create) {
					if st, err := os.Stat(ev.Name); err == nil && st.IsDir() {
						addTree(ev.Name)
					}
				}
				select {
				case poke <- struct{}{}:
				default:
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				r.log.WithError(err).Debug("watch: fsnotify")
			}
		}
	}()
}
