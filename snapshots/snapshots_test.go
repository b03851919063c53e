package snapshots

import (
	"context"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

func TestPathAndHostFromPath(t *testing.T) {
	if got, ok := HostFromPath(Path("hv-a")); got != "hv-a" || !ok {
		t.Errorf("HostFromPath(Path(hv-a)) = %q, %v", got, ok)
	}
	for _, p := range []string{LedgerPath, "hosts/.yaml", "hosts/x/y.yaml", "hv-a.yaml", "hosts/hv-a.yml"} {
		if h, ok := HostFromPath(p); ok {
			t.Errorf("HostFromPath(%q) = %q, want no host", p, h)
		}
	}
}

// ReadLedger reads a real branch: nothing before the controller published,
// the ledger after, and a ledger the controller would refuse is an error
// naming the file and the branch, never a lenient read.
func TestReadLedger(t *testing.T) {
	ctx := context.Background()
	dir := gittest.NewBare(t)
	gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"README.md": "fleet\n"}})
	repo, err := gitsource.Open(ctx, gitsource.Options{URL: dir})
	if err != nil {
		t.Fatal(err)
	}
	const branch = "fleet/snaps"
	if l, tip, err := ReadLedger(ctx, repo, branch); l != nil || tip != "" || err != nil {
		t.Fatalf("no branch: %v, %q, %v", l, tip, err)
	}
	first := gittest.Commit(t, dir, gittest.Edit{Branch: branch, Write: map[string]string{Path("hv-a"): "host: hv-a\n"}})
	if l, tip, err := ReadLedger(ctx, repo, branch); l != nil || tip != first || err != nil {
		t.Fatalf("no ledger: %v, %q, %v", l, tip, err)
	}
	good := `{"version": 1, "applied": {"commit": "abc", "branch": "main"}, "hosts": {"hv-a": {"epoch": 2}}, "tombstones": []}`
	second := gittest.Commit(t, dir, gittest.Edit{Branch: branch, Write: map[string]string{LedgerPath: good}})
	l, tip, err := ReadLedger(ctx, repo, branch)
	if err != nil || tip != second || l.Applied.Commit != "abc" || l.Hosts["hv-a"].Epoch != 2 {
		t.Fatalf("ledger: %+v, %q, %v", l, tip, err)
	}
	gittest.Commit(t, dir, gittest.Edit{Branch: branch, Write: map[string]string{LedgerPath: "version: 1\nhosts: {}\nsurprise: 1\n"}})
	if l, _, err := ReadLedger(ctx, repo, branch); err == nil || l != nil || !strings.Contains(err.Error(), LedgerPath) || !strings.Contains(err.Error(), branch) {
		t.Fatalf("a ledger with an unknown field: %+v, %v", l, err)
	}
}

// LedgerAt reads a tip through its reader: a fresh ledger when the tip has
// none, the reader's other errors returned.
func TestLedgerAt(t *testing.T) {
	l, err := LedgerAt(func(p string) ([]byte, error) { return nil, gitsource.ErrFileNotFound })
	if err != nil || l.Version != ledgerVersion || len(l.Hosts) != 0 || l.Applied != nil {
		t.Fatalf("no ledger: %+v, %v", l, err)
	}
	if _, err := LedgerAt(func(p string) ([]byte, error) { return nil, context.DeadlineExceeded }); err == nil {
		t.Fatal("a read error gave a ledger")
	}
}
