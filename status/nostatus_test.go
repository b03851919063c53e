package status

import (
	"strings"
	"testing"
	"time"
)

// An offline host's state says since when no status came, and that the
// controller cannot tell why; an online host's last status time is not
// shown, so its heartbeats do not change the summary.
func TestRenderSummaryOfflineHostSaysNoStatusSince(t *testing.T) {
	at := time.Date(2026, 12, 2, 9, 30, 0, 0, time.UTC)
	offline := string(RenderSummary(Summary{Hosts: []HostSummary{{Name: "hv-a", Reported: true, LastStatus: at}}}))
	want := `| hv-a | offline\: no status since 2026-12-02T09\:30\:00Z \(down, cut off from git, or its writes refused\: its agent's log and /healthz say which\) |`
	if !strings.Contains(offline, want) {
		t.Errorf("summary lacks %q:\n%s", want, offline)
	}
	online := func(at time.Time) string {
		return string(RenderSummary(Summary{Hosts: []HostSummary{{Name: "hv-a", Reported: true, Online: true, LastStatus: at}}}))
	}
	if a, b := online(at), online(at.Add(time.Minute)); a != b || strings.Contains(a, "no status since") {
		t.Errorf("an online host's last status time shows:\n%s\n%s", a, b)
	}
}
