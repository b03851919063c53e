package status

import (
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/testsupport/golden"
)

// A failing pass gets a section of its own, above and apart from the last
// rejected commit, saying which outcome, since when, and why; its reason
// cannot close the code block or render markdown.
func TestRenderSummaryFailing(t *testing.T) {
	at := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)
	s := Summary{
		Branch:   "main",
		Applied:  "0123456789abcdef0123456789abcdef01234567",
		Failing:  &PassFailure{Outcome: FailureRefused, Since: at, Reason: "refused: host hv-a asks for epoch 9007199254740993 ```<b>x</b>"},
		Rejected: &Rejection{Commit: "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", At: at, Reason: "fleet/a.yaml:1: bad", SupersededBy: "0123456789abcdef0123456789abcdef01234567"},
	}
	got := RenderSummary(s)
	golden.Check(t, "summary-failing.md", got)
	text := string(got)
	if !strings.Contains(text, "## Controller passes failing") || !strings.Contains(text, "every pass is `refused`") {
		t.Errorf("no failing section:\n%s", text)
	}
	if strings.Index(text, "## Controller passes failing") > strings.Index(text, "## Last rejected commit") {
		t.Error("the failing section is not first")
	}
	if strings.Count(text, "```") != 4 {
		t.Errorf("a reason closed its code block:\n%s", text)
	}
	s.Failing.Outcome = FailureUnreadable
	if !strings.Contains(string(RenderSummary(s)), "every pass is `unreadable`: git failed") {
		t.Error("an unreadable pass is not named")
	}
}

// controller.yaml round-trips, is absent-safe, and is bounded and strict.
func TestParsePassFailure(t *testing.T) {
	f := &PassFailure{Outcome: FailureUnreadable, Since: time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC), Reason: "git failed"}
	data, err := MarshalPassFailure(f)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParsePassFailure(ControllerPath, data)
	if err != nil || *got != *f {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if got, err := ParsePassFailure(ControllerPath, nil); err != nil || got != nil {
		t.Errorf("empty file: %+v, %v", got, err)
	}
	for name, bad := range map[string]string{
		"outcome":  "failing: {outcome: rejected, since: 2026-11-30T14:00:00Z, reason: x}\n",
		"unknown":  "failing: {outcome: refused, since: 2026-11-30T14:00:00Z, reason: x, extra: 1}\n",
		"too big":  "failing: {outcome: refused, reason: " + strings.Repeat("x", MaxControllerBytes) + "}\n",
		"not yaml": "failing: [\n",
	} {
		if _, err := ParsePassFailure(ControllerPath, []byte(bad)); err == nil || !strings.Contains(err.Error(), ControllerPath) {
			t.Errorf("%s: %v, want an error naming the file", name, err)
		}
	}
}
