package gitsource

import (
	"github.com/go-git/go-git/v5/plumbing"

	"github.com/gitfleet/gitfleet/desired"
)

// listingBudget bounds the files one generation of a listing cache holds
// (the cache holds two): some 64 bytes each, plus their paths.
const listingBudget = 1 << 16

// listingKey names the listing of one tree object whose files' paths
// start with prefix.
type listingKey struct {
	tree   plumbing.Hash
	prefix string
}

// listings caches the files under tree objects, as Tree's Walk lists them,
// by tree hash and path prefix: a tree object's contents never change, so
// a walk of a commit that differs from the last one in one file lists the
// directories on that file's path again and takes every other directory
// from here. It is bounded by files, in two generations: a listing used
// in the current generation stays, one unused for a whole generation is
// dropped. Caller holds Repo.mu.
type listings struct {
	cur, prev map[listingKey][]desired.File
	files     int // in cur
}

// get returns the listing of key, nil and false when it is not cached.
func (l *listings) get(key listingKey) ([]desired.File, bool) {
	if files, ok := l.cur[key]; ok {
		return files, true
	}
	files, ok := l.prev[key]
	if ok {
		l.put(key, files)
	}
	return files, ok
}

// put caches files, which the caller no longer changes, as key's
// listing. A listing bigger than half the budget is not cached.
func (l *listings) put(key listingKey, files []desired.File) {
	if len(files) > listingBudget/2 {
		return
	}
	if l.cur == nil || l.files+len(files) > listingBudget {
		l.prev, l.cur, l.files = l.cur, map[listingKey][]desired.File{}, 0
	}
	l.cur[key] = files
	l.files += len(files)
}

// reset drops every listing (a fresh store: a listing's blobs need not
// be in it).
func (l *listings) reset() { *l = listings{} }
