package fleet

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/internal/errchain"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
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

// A commit that defines a VM's name a second time is rejected with the
// error at the file it added, relative to the applied commit: not at
// whichever of the two paths sorts later.
func TestADuplicateIsReportedAtTheFileTheChangeAdded(t *testing.T) {
	e := newEnv(t, map[string]string{"hosts/hv-a.yaml": hostYAML("hv-a"), "vms/zz-web.yaml": vmYAML("web-01", "hv-a", 1)})
	e.pass()
	e.commit(gittest.Edit{Write: map[string]string{"vms/aa-copy.yaml": vmYAML("web-01", "hv-a", 1)}})
	res := e.pass()
	if res.Rejected == nil {
		t.Fatal("a duplicate name was not rejected")
	}
	wantAtCopy(t, res.Rejected.Error())

	// The same after a rejected commit in between: the loader's last
	// tree is then not the applied one, and is no baseline.
	e = newEnv(t, map[string]string{"hosts/hv-a.yaml": hostYAML("hv-a"), "vms/zz-web.yaml": vmYAML("web-01", "hv-a", 1)})
	e.pass()
	e.commit(gittest.Edit{Write: map[string]string{"vms/broken.yaml": "kind: [\n"}})
	if res := e.pass(); res.Rejected == nil {
		t.Fatal("a broken file was not rejected")
	}
	e.commit(gittest.Edit{Write: map[string]string{"vms/aa-copy.yaml": vmYAML("web-01", "hv-a", 1)}, Remove: []string{"vms/broken.yaml"}})
	if res = e.pass(); res.Rejected == nil {
		t.Fatal("a duplicate name was not rejected")
	}
	wantAtCopy(t, res.Rejected.Error())
}

// wantAtCopy checks that msg reports VM web-01 at vms/aa-copy.yaml, the
// file the change added, naming vms/zz-web.yaml as the existing one.
func wantAtCopy(t *testing.T, msg string) {
	t.Helper()
	if !strings.Contains(msg, `vms/aa-copy.yaml:`) || !strings.Contains(msg, `VM "web-01" is also defined in vms/zz-web.yaml:`) ||
		!strings.Contains(msg, "defined before this change") {
		t.Errorf("rejected with %q; want it at vms/aa-copy.yaml, naming vms/zz-web.yaml as the existing definition", msg)
	}
}
