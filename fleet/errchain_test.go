package fleet

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/internal/errchain"
	"github.com/gitfleet/gitfleet/snapshots"
)

// Git's failures reach the controller's pass, and plan's and status'
// ledger reader, as one chain: gitsource names the operation, the branch
// and the remote once; no caller says "fetch main" again.
func TestGitFailuresReadAsOneChain(t *testing.T) {
	e := newEnv(t, map[string]string{"hosts/hv-a.yaml": hostYAML("hv-a"), "vms/web-01.yaml": vmYAML("web-01", "hv-a", 1)})
	e.pass()
	reader, err := gitsource.Open(context.Background(), gitsource.Options{URL: e.url, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(e.dir, e.dir+".gone"); err != nil {
		t.Fatal(err)
	}
	_, passErr := e.c.Pass(context.Background())
	_, _, ledgerErr := snapshots.ReadLedger(context.Background(), reader, snapshots.Branch)
	_, openErr := New(Config{URL: "ftp://fleet.invalid/repo.git", Clock: e.clock.Now, Logger: quietLogger(), SummaryInterval: -1})
	for what, err := range map[string]error{"pass": passErr, "ledger": ledgerErr, "open": openErr} {
		if err == nil {
			t.Errorf("%s: no error with the remote gone", what)
			continue
		}
		if r := errchain.Repeat(err.Error()); r != "" {
			t.Errorf("%s: %q repeats %q", what, err, r)
		}
		if strings.Count(err.Error(), e.dir) > 1 || strings.Count(err.Error(), "fleet.invalid") > 1 {
			t.Errorf("%s: %q names the remote twice", what, err)
		}
		t.Logf("%s: %v", what, err)
	}
}
