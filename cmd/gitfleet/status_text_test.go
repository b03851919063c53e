package main

import (
	"context"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/gitsource"
)

// A forged status file cannot drive the terminal of whoever runs gitfleet
// status: escape sequences, carriage returns, bells, newlines and
// bidirectional overrides in its free text are printed as escapes, so the
// table keeps one row per VM and shows what the file says.
func TestStatusPrintsNoControlCharacters(t *testing.T) {
	dir := cliFleet(t)
	if code, out := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once"); code != 0 {
		t.Fatal(out)
	}
	forged := "host: hv-a\nheartbeat: 1\nlastSeenEpoch: 1\nagent: {version: \"x\", bootID: \"b\", accel: \"tcg\\e[31m\"}\n" +
		"vms:\n  - name: web-01\n    phase: failed\n    power: running\n" +
		"    lastError: \"\\e[2J\\e[31mFAKE\\rOVERWRITE\\e]0;title\\a\\nsecond row\\u202Eevil\"\n"
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Update(context.Background(), fleet.DefaultStatusBranch, func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
		return map[string][]byte{"hosts/hv-a.yaml": []byte(forged)}, "forged", nil
	}); err != nil {
		t.Fatal(err)
	}
	code, out := runCLI(t, "status", "--repo", dir)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, bad := range []string{"\x1b", "\r", "\a", "\u202e"} {
		if strings.Contains(out, bad) {
			t.Errorf("status printed %q raw:\n%q", bad, out)
		}
	}
	if !strings.Contains(out, `\x1b[2J`) || !strings.Contains(out, `FAKE\rOVERWRITE`) {
		t.Errorf("the forged text is not shown escaped:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "second row") {
			t.Errorf("a newline in lastError started a row of its own:\n%s", out)
		}
	}
}
