package fleet

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// statusFile reads path at the status branch tip; "" when absent.
func (e *env) statusFile(path string) string {
	e.t.Helper()
	for _, f := range gittest.Files(e.t, e.dir, "refs/heads/"+DefaultStatusBranch) {
		if f == path {
			return gittest.Show(e.t, e.dir, "refs/heads/"+DefaultStatusBranch, path)
		}
	}
	return ""
}

// An unreadable or a refused pass is recorded on the status branch —
// controller.yaml and a section of README.md of its own, never as a
// rejected commit — once per distinct cause (a pass failing the same way
// again commits nothing), and the record is removed by the next pass that
// acts. A controller that has not completed a pass since it started
// records nothing: it may not be the one the branches belong to.
func TestFailingPassesAreRecordedApart(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	good := gittest.Rev(t, e.dir, "refs/heads/main")
	statusTip := func() string { return gittest.Rev(t, e.dir, "refs/heads/"+DefaultStatusBranch) }

	check := func(outcome Outcome, reason string) {
		t.Helper()
		before := statusTip()
		res, err := e.c.Pass(context.Background())
		if got := PassOutcome(res, err); got != outcome {
			t.Fatalf("outcome %s (%v), want %s", got, err, outcome)
		}
		f, perr := status.ParsePassFailure(status.ControllerPath, []byte(e.statusFile(status.ControllerPath)))
		if perr != nil || f == nil {
			t.Fatalf("controller.yaml: %v, %+v", perr, f)
		}
		if f.Outcome != string(outcome) || !strings.Contains(f.Reason, reason) || !f.Since.Equal(e.clock.Now()) {
			t.Errorf("recorded %+v, want outcome %s, a reason with %q, since now", f, outcome, reason)
		}
		readme := e.statusFile(status.SummaryPath)
		if !strings.Contains(readme, "## Controller passes failing") || !strings.Contains(readme, "`"+string(outcome)+"`") || !strings.Contains(readme, reason) {
			t.Errorf("README.md does not show the %s pass:\n%s", outcome, readme)
		}
		if strings.Contains(readme, "Last rejected commit") || e.ledger().Rejected != nil {
			t.Errorf("a %s pass is recorded as a rejected commit", outcome)
		}
		if n := gittest.Git(t, e.dir, "rev-list", "--count", before+".."+DefaultStatusBranch); n != "1" {
			t.Errorf("%s commits recorded the failure, want 1", n)
		}
		e.clock.Add(time.Minute)
		after := statusTip()
		if _, err := e.c.Pass(context.Background()); err == nil {
			t.Fatal("the second pass did not fail")
		}
		if statusTip() != after {
			t.Error("a pass failing the same way again wrote to the status branch")
		}
	}

	t.Run("refused", func(t *testing.T) {
		gittest.DeleteBranch(t, e.dir, "main")
		check(OutcomeRefused, "branch not found")

		fresh := e.newController()
		before := statusTip()
		if _, err := fresh.Pass(context.Background()); !errors.Is(err, ErrRefused) {
			t.Fatalf("fresh controller: %v", err)
		}
		if statusTip() != before {
			t.Error("a controller that never completed a pass wrote to the status branch")
		}
		gittest.SetBranch(t, e.dir, "main", good)
		e.pass()
		if got := e.statusFile(status.ControllerPath); got != "" {
			t.Errorf("controller.yaml stays after a pass that acted:\n%s", got)
		}
		if readme := e.statusFile(status.SummaryPath); strings.Contains(readme, "passes failing") {
			t.Errorf("README.md still shows a failure:\n%s", readme)
		}
	})

	t.Run("unreadable", func(t *testing.T) {
		// A commit whose blob is gone from the remote: git cannot
		// serve the desired branch, while the status branch works.
		e.commit(gittest.Edit{Write: map[string]string{"fleet/lost.yaml": "lost: a blob the remote no longer has\n"}})
		blob := gittest.Git(t, e.dir, "rev-parse", "main:fleet/lost.yaml")
		if err := os.Remove(filepath.Join(e.dir, "objects", blob[:2], blob[2:])); err != nil {
			t.Fatal(err)
		}
		check(OutcomeUnreadable, "git failed")
		gittest.SetBranch(t, e.dir, "main", good)
		e.pass()
		if got := e.statusFile(status.ControllerPath); got != "" {
			t.Errorf("controller.yaml stays after a pass that acted:\n%s", got)
		}
	})
}

// The tips clone and the main clone never share a directory.
func TestTipsCacheDirMustDiffer(t *testing.T) {
	dir := t.TempDir()
	_, err := New(Config{URL: dir, CacheDir: dir + "/c", TipsCacheDir: dir + "/c/", Logger: quietLogger()})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("err = %v, want ErrConfig", err)
	}
}
