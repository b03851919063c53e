package trust

import (
	"sync"
	"time"
)

// FirstSeen records when a verifier first saw each commit, by its own
// clock: the time Verify judges a key's validity at, which no signer can
// choose (a commit's own dates are its signer's to write). A record
// learned from a store the verifier trusts (Learn: a signed ledger, a
// file of its own) keeps the earlier of the two times. It holds at most
// limit commits: past it the most recently first seen is forgotten first,
// so a flood of new commits (forgeries pushed to a branch) never costs an
// old one its record; a commit forgotten is judged afresh when seen
// again, which refuses more, never less. Safe for concurrent use.
type FirstSeen struct {
	mu  sync.Mutex
	at  map[string]time.Time
	max int
}

// NewFirstSeen returns an empty record of at most limit commits (limit
// < 1 means 1).
func NewFirstSeen(limit int) *FirstSeen {
	return &FirstSeen{at: map[string]time.Time{}, max: max(limit, 1)}
}

// At returns when commit was first seen, recording now when it has no
// record yet.
func (f *FirstSeen) At(commit string, now time.Time) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t, ok := f.at[commit]; ok {
		return t
	}
	f.put(commit, now)
	return now
}

// Seen returns commit's record, and whether it has one.
func (f *FirstSeen) Seen(commit string) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.at[commit]
	return t, ok
}

// Learn records that commit was seen at at, unless it has an earlier
// record. A zero at is ignored.
func (f *FirstSeen) Learn(commit string, at time.Time) {
	if at.IsZero() {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if t, ok := f.at[commit]; ok && !at.Before(t) {
		return
	}
	f.put(commit, at)
}

// Keep forgets every record but those of commits.
func (f *FirstSeen) Keep(commits []string) {
	keep := make(map[string]bool, len(commits))
	for _, c := range commits {
		keep[c] = true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.at {
		if !keep[c] {
			delete(f.at, c)
		}
	}
}

// Len is the number of commits recorded.
func (f *FirstSeen) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.at)
}

// put records commit at t, first forgetting the most recently seen
// commit when the record is full. Caller holds f.mu.
func (f *FirstSeen) put(commit string, t time.Time) {
	if _, ok := f.at[commit]; !ok && len(f.at) >= f.max {
		newest, newestAt := "", time.Time{}
		for c, at := range f.at {
			if newest == "" || at.After(newestAt) {
				newest, newestAt = c, at
			}
		}
		delete(f.at, newest)
	}
	f.at[commit] = t
}
