package fleet

import (
	"sort"
	"strings"
	"sync"
	"time"
)

// liveness judges hosts online or offline by the controller's own clock:
// a host is offline when its status file has not changed for offlineAfter.
// It lives in memory only; a restarted controller starts every host's clock
// afresh, so a restart never makes a host look offline at once.
//
// A host's status may alternate between two files (an unsigned agent's
// two heartbeat commits, status.Writer): a controller that read no status
// for longer than lookGap could have missed an even number of changes and
// see the file it saw before, so when a read comes that late the clock of
// every host seen alternating starts again (look), as at a restart. Run
// passes often enough (every OfflineAfter/6 at most) for that never to
// happen while the statuses can be read.
type liveness struct {
	mu    sync.Mutex
	after time.Duration
	start time.Time
	seen  map[string]sighting
	// looked is when the statuses were last read; signed is the highest
	// heartbeat seen in each host's signed status.
	looked time.Time
	signed map[string]uint64
}

// lookGap is the longest time between two reads of the statuses over
// which the controller still judges quiet: a third of offlineAfter (one
// agent heartbeat, at the defaults).
func (l *liveness) lookGap() time.Duration { return l.after / 3 }

// look records that the statuses were read at now; after a gap longer
// than lookGap the clock of every host seen alternating starts at now.
func (l *liveness) look(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.looked.IsZero() && now.Sub(l.looked) > l.lookGap() {
		for h, s := range l.seen {
			if s.alternates {
				s.since = now
				l.seen[h] = s
			}
		}
	}
	l.looked = now
}

// fresh reports whether a status of host signed by its agentKey with
// heartbeat hb is a heartbeat: its number is above every one seen signed
// for host since the controller started. A forger who can push the branch
// but holds no key can only replay the agent's older commits, whose
// numbers are not.
func (l *liveness) fresh(host string, hb uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.signed == nil {
		l.signed = map[string]uint64{}
	}
	high, ok := l.signed[host]
	if ok && hb <= high {
		return false
	}
	l.signed[host] = hb
	return true
}

// sighting is the last status content seen for a host (its blob hash, "" for
// no file) and when the controller first saw it.
//
// prev is the content seen before id; alternates is set once the host's
// content went back to the one before (id == prev at a change).
type sighting struct {
	id, prev   string
	since      time.Time
	alternates bool
}

func newLiveness(start time.Time, after time.Duration) *liveness {
	return &liveness{after: after, start: start, seen: map[string]sighting{}}
}

// observe records that host's status file has content id at now. The
// clock restarts when the content changed, and starts at the first
// sighting whatever the file says.
func (l *liveness) observe(host, id string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.seen[host]
	if !ok {
		l.seen[host] = sighting{id: id, since: now}
	} else if s.id != id {
		l.seen[host] = sighting{id: id, prev: s.id, since: now, alternates: s.alternates || id == s.prev}
	}
}

// watch starts host's clock at now, with no status file seen, unless the
// host was observed before.
func (l *liveness) watch(host string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[host]; !ok {
		l.seen[host] = sighting{since: now}
	}
}

// offline reports whether host's status has not changed for offlineAfter,
// and for how long it has not. A host never observed counts from the
// controller's start.
func (l *liveness) offline(host string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	since := l.start
	if s, ok := l.seen[host]; ok {
		since = s.since
	}
	quiet := now.Sub(since)
	return quiet >= l.after, quiet
}

// offlineSet lists the offline hosts, for noticing that one changed state.
func (l *liveness) offlineSet(now time.Time) string {
	l.mu.Lock()
	var off []string
	for h, s := range l.seen {
		if now.Sub(s.since) >= l.after {
			off = append(off, h)
		}
	}
	l.mu.Unlock()
	sort.Strings(off)
	return strings.Join(off, ",")
}
