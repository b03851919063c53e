package status

import (
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/internal/golden"
)

// Objects kept after a history rewrite and VMs on a host that the desired
// state lacks each get their own section, with the words a person acts on.
func TestRenderSummaryKept(t *testing.T) {
	at := time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)
	s := Summary{
		Branch:  "main",
		Applied: "0123456789abcdef0123456789abcdef01234567",
		Retained: []RetainedObject{
			{Kind: "VM", Name: "web-02", Host: "hv-a", Commit: "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", Since: at},
			{Kind: "Volume", Name: "web-02-data", Host: "hv-a", Commit: "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", Since: at},
		},
		Unmanaged: []UnmanagedVM{{Name: "old|01", Host: "hv-b", Phase: PhaseReady}},
	}
	got := RenderSummary(s)
	golden.Check(t, "summary-kept.md", got)
	for _, want := range []string{
		"kept after a history rewrite at `eeeeeeeeeeee`: restore the file, or re-add and delete it in a reviewed commit",
		"| old\\|01 | hv-b | ready | on host, not in the desired state: kept |",
	} {
		if !strings.Contains(string(got), want) {
			t.Errorf("summary lacks %q", want)
		}
	}
	if empty := string(RenderSummary(Summary{})); strings.Contains(empty, "history rewrite") || strings.Contains(empty, "not in the desired state") {
		t.Error("an empty summary shows the kept sections")
	}
}

// Acks the controller did not act on get their own section, with the
// commit and why; a summary without any has none.
func TestRenderSummaryForgedAcks(t *testing.T) {
	s := Summary{
		Branch:  "main",
		Applied: "0123456789abcdef0123456789abcdef01234567",
		ForgedAcks: []ForgedAck{
			{Ref: "VM old-01@hv-a", Commit: "abcdefabcdefabcdefabcdefabcdefabcdefabcd", Reason: "not signed by the key the Host's spec.agentKey names (commit abcdefabcdef carries no signature)"},
			{Ref: "Volume scratch@hv-b", Reason: "the status was read from gitfleet/status (the old layout), which the host's agent does not sign"},
		},
	}
	got := RenderSummary(s)
	golden.Check(t, "summary-forged.md", got)
	for _, want := range []string{"## Forged acks", "| VM old-01\\@hv-a | `abcdefabcdef` | not signed by", "| Volume scratch\\@hv-b | - | the status was read"} {
		if !strings.Contains(string(got), want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(string(RenderSummary(Summary{})), "Forged acks") {
		t.Error("an empty summary shows the forged acks section")
	}
}
