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
type liveness struct {
	mu    sync.Mutex
	after time.Duration
	start time.Time
	seen  map[string]sighting
}

// sighting is the last status content seen for a host (its blob hash, "" for
// no file) and when the controller first saw it.
type sighting struct {
	id    string
	since time.Time
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
	if s, ok := l.seen[host]; !ok || s.id != id {
		l.seen[host] = sighting{id: id, since: now}
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
