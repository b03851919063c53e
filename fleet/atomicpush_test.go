package fleet

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/trusttest"
	"github.com/gitfleet/gitfleet/trust"
)

// pushCount serves e's repository over git http-backend (the controller's
// URL from now on) and counts its receive-pack runs; before, when set,
// runs before each reaches git (n counts from 1).
type pushCount struct {
	n      atomic.Int32
	before func(n int32)
}

func (e *env) serveCounted() *pushCount {
	e.t.Helper()
	pc := &pushCount{}
	base := gittest.ServeWith(e.t, filepath.Dir(e.dir), gittest.ServeOptions{Wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/git-receive-pack") {
				n := pc.n.Add(1)
				if pc.before != nil {
					pc.before(n)
				}
			}
			h.ServeHTTP(w, req)
		})
	}})
	e.url = base + "/" + filepath.Base(e.dir)
	return pc
}

// signedAt reports whether branch's tip is signed by key.
func (e *env) signedAt(branch string, key trusttest.SSHKey) bool {
	e.t.Helper()
	ctx := context.Background()
	repo, err := gitsource.Open(ctx, gitsource.Options{URL: e.dir, Logger: quietLogger()})
	if err != nil {
		e.t.Fatal(err)
	}
	tip, err := repo.Fetch(ctx, branch)
	if err != nil {
		e.t.Fatal(err)
	}
	sc, err := repo.Signed(tip)
	if err != nil {
		e.t.Fatal(err)
	}
	keys, err := trust.ParseKeys("test", []string{key.Public})
	if err != nil {
		e.t.Fatal(err)
	}
	s, err := trust.New(keys, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	_, err = s.Verify(sc, time.Now())
	return err == nil
}

// growDBAndPass commits db-01 at 4 vCPUs and passes; the pass must
// publish and write the summary.
func (e *env) growDBAndPass() PassResult {
	e.t.Helper()
	e.commit(growDB())
	res := e.pass()
	if len(res.Published) == 0 || !res.SummaryWritten {
		e.t.Fatalf("pass %+v: want a publish and a summary", res)
	}
	return res
}

// A pass that publishes and writes the summary moves both branches in
// one receive-pack, the snapshots commit alone signed with the
// controller's key.
func TestPassWritesBothBranchesInOnePush(t *testing.T) {
	e := newEnv(t, baseFleet())
	pc := e.serveCounted()
	key := trusttest.NewSSHKey(t, "gitfleet-controller")
	c, err := e.signingController(key, "")
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	e.pass()
	pc.n.Store(0)
	snaps, stat := e.snapshotsTip(), gittest.Rev(t, e.dir, DefaultStatusBranch)
	e.growDBAndPass()
	if n := pc.n.Load(); n != 1 {
		t.Errorf("%d receive-pack runs, want 1 for both branches", n)
	}
	if got := gittest.Rev(t, e.dir, DefaultSnapshotsBranch+"^"); got != snaps {
		t.Errorf("snapshots commit on %s, want on %s", got, snaps)
	}
	if got := gittest.Rev(t, e.dir, DefaultStatusBranch+"^"); got != stat {
		t.Errorf("status commit on %s, want on %s", got, stat)
	}
	// Only snapshots commits carry the controller's signature: a signed
	// status commit replayed on the snapshots branch would pass for one.
	if !e.signedAt(DefaultSnapshotsBranch, key) {
		t.Errorf("%s tip not signed by the controller key", DefaultSnapshotsBranch)
	}
	if e.signedAt(DefaultStatusBranch, key) {
		t.Errorf("%s tip signed by the controller key", DefaultStatusBranch)
	}
}

// A concurrent move of either branch, between the push's advertisement
// and git's update, refuses the whole push: neither branch takes that
// attempt's commit, and the pass computes again on the new tips and
// writes both.
func TestPassLostRaceOnEitherBranch(t *testing.T) {
	for _, moved := range []string{DefaultSnapshotsBranch, DefaultStatusBranch} {
		t.Run(filepath.Base(moved), func(t *testing.T) {
			e := newEnv(t, baseFleet())
			pc := e.serveCounted()
			e.c = e.newController()
			e.pass()
			pc.n.Store(0)
			snaps, stat := e.snapshotsTip(), gittest.Rev(t, e.dir, DefaultStatusBranch)
			var foreign string
			pc.before = func(n int32) {
				if n == 1 {
					foreign = e.commit(gittest.Edit{Branch: moved, Write: map[string]string{"foreign.txt": "x"}, Message: "concurrent"})
				}
			}
			e.growDBAndPass()
			if n := pc.n.Load(); n != 2 {
				t.Errorf("%d receive-pack runs, want 2 (the refused one, the retry)", n)
			}
			if moved == DefaultSnapshotsBranch {
				snaps = foreign
			} else {
				stat = foreign
			}
			if got := gittest.Rev(t, e.dir, DefaultSnapshotsBranch+"^"); got != snaps {
				t.Errorf("snapshots commit on %s, want one commit on %s", got, snaps)
			}
			if got := gittest.Rev(t, e.dir, DefaultStatusBranch+"^"); got != stat {
				t.Errorf("status commit on %s, want one commit on %s", got, stat)
			}
			if got := gittest.Show(t, e.dir, moved, "foreign.txt"); got != "x" {
				t.Errorf("the concurrent commit's file: %q", got)
			}
			if vm := e.snapshot("hv-b").VM("db-01"); vm == nil || vm.Spec.VCPUs != 4 {
				t.Errorf("db-01 in hv-b's snapshot: %+v, want 4 vCPUs", vm)
			}
		})
	}
}

// A remote that takes no atomic pushes gets one push per branch, as
// before, with the same result.
func TestPassWithoutAtomicPushes(t *testing.T) {
	e := newEnv(t, baseFleet())
	gittest.Git(t, e.dir, "config", "receive.advertiseAtomic", "false")
	pc := e.serveCounted()
	e.c = e.newController()
	e.pass()
	pc.n.Store(0)
	res := e.growDBAndPass()
	if n := pc.n.Load(); n != 2 {
		t.Errorf("%d receive-pack runs, want 2 (one per branch)", n)
	}
	if !strings.Contains(e.summary(), res.Head[:12]) {
		t.Errorf("summary does not name the head %s:\n%s", res.Head, e.summary())
	}
	if vm := e.snapshot("hv-b").VM("db-01"); vm == nil || vm.Spec.VCPUs != 4 {
		t.Errorf("db-01 in hv-b's snapshot: %+v, want 4 vCPUs", vm)
	}
}
