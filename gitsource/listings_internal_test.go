package gitsource

import (
	"testing"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/gitfleet/gitfleet/desired"
)

// The listing cache holds at most two generations of listingBudget files:
// a listing used in the last generation survives a turn, one unused for a
// whole generation is dropped, and one too big is never held.
func TestListingsStayWithinTheirBudget(t *testing.T) {
	var l listings
	key := func(i int) listingKey { return listingKey{tree: plumbing.Hash{byte(i), byte(i >> 8)}, prefix: "d/"} }
	files := make([]desired.File, 1024)
	n := listingBudget / len(files) // listings a generation holds

	l.put(key(0), files)
	for i := 1; i < n; i++ {
		l.put(key(i), files)
	}
	// A turn: key(0) is still there (previous generation) and, used,
	// moves into the new one.
	l.put(key(n), files)
	if _, ok := l.get(key(0)); !ok {
		t.Fatal("a listing of the previous generation was dropped")
	}
	for i := n + 1; i < 2*n+1; i++ {
		l.put(key(i), files)
	}
	if _, ok := l.get(key(1)); ok {
		t.Error("a listing unused for a whole generation is still held")
	}
	if _, ok := l.get(key(0)); !ok {
		t.Error("a listing used in the last generation was dropped")
	}
	held := 0
	for _, m := range []map[listingKey][]desired.File{l.cur, l.prev} {
		for _, f := range m {
			held += len(f)
		}
	}
	if held > 2*listingBudget {
		t.Errorf("%d files held, the bound is %d", held, 2*listingBudget)
	}
	l.put(key(-1), make([]desired.File, listingBudget/2+1))
	if _, ok := l.get(key(-1)); ok {
		t.Error("a listing bigger than half the budget was cached")
	}
}
