package status

import (
	"strings"
	"testing"
	"time"
)

// last-write.yaml round-trips, says stale only past StaleRefreshes
// intervals, and a file without a time or an interval is an error naming
// it, never a fresh write.
func TestLastWrite(t *testing.T) {
	at := time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC)
	data, err := MarshalLastWrite(LastWrite{At: at.Add(400 * time.Millisecond), RefreshSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	w, err := ParseLastWrite(LastWritePath, data)
	if err != nil || !w.At.Equal(at) || w.Refresh() != 10*time.Minute {
		t.Fatalf("round trip of %s = %+v, %v", data, w, err)
	}
	for age, stale := range map[time.Duration]bool{0: false, 10 * time.Minute: false, 30 * time.Minute: false, 30*time.Minute + time.Second: true, 5 * time.Hour: true} {
		if got := w.Stale(at.Add(age)); got != stale {
			t.Errorf("%s after the write: stale %v, want %v", age, got, stale)
		}
	}
	if got := w.Age(at.Add(-time.Minute)); got != 0 {
		t.Errorf("a reader's clock behind the controller's reads age %s, want 0", got)
	}
	if _, err := ParseLastWrite(LastWritePath, append(data, "later: field\n"...)); err != nil {
		t.Errorf("a field of a later release: %v", err)
	}
	for _, bad := range []string{"", "refreshSeconds: 600\n", "at: 2026-12-01T02:00:00Z\n", "at: 2026-12-01T02:00:00Z\nrefreshSeconds: -1\n", "at: yesterday\nrefreshSeconds: 600\n", strings.Repeat("#", MaxLastWriteBytes+1)} {
		if _, err := ParseLastWrite(LastWritePath, []byte(bad)); err == nil || !strings.Contains(err.Error(), LastWritePath) {
			t.Errorf("ParseLastWrite(%.40q) = %v, want an error naming %s", bad, err, LastWritePath)
		}
	}
}
