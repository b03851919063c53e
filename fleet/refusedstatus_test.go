package fleet

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// A live host whose status writes the remote refuses (a real pre-receive
// hook declining its branch) is, for the controller, a host that sent no
// status: the README says "offline: no status since" its last status,
// which is all it can know; past the abandon grace its pending delete is
// swept like any offline host's, and the tombstone stays delivered in
// its snapshot, so the host's agent, which still reads the snapshots,
// goes on with the delete itself and nothing else is removed.
func TestRefusedStatusWritesReadAsNoStatusSince(t *testing.T) {
	e := newEnv(t, baseFleet())
	e.pass()
	last := time.Date(2026, 11, 30, 3, 0, 30, 0, time.UTC)
	writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: 1, ObservedAt: last})
	writeStatus(t, e.url, &status.Status{Host: "hv-b", Heartbeat: 1, LastSeenEpoch: 1, ObservedAt: last})
	e.commit(gittest.Edit{Remove: []string{"vms/web-01.yaml"}})
	if res := e.pass(); len(res.Tombstoned) != 1 {
		t.Fatalf("result = %+v", res)
	}

	gittest.Hook(t, e.dir, "pre-receive", `while read old new ref; do
  [ "$ref" = refs/heads/gitfleet/hosts/hv-a ] && { echo "hv-a may not write: branch protected" >&2; exit 1; }
done; exit 0`)
	hb := uint64(1)
	var refused error
	var swept []string
	for _, d := range []time.Duration{time.Minute, 3 * time.Minute, 10 * time.Minute} {
		e.clock.Add(d)
		hb++
		writeStatus(t, e.url, &status.Status{Host: "hv-b", Heartbeat: hb, LastSeenEpoch: 2, ObservedAt: e.clock.Now()})
		refused = putStatus(e.openAs("hv-a"), &status.Status{Host: "hv-a", Heartbeat: hb, LastSeenEpoch: 2, ObservedAt: e.clock.Now()})
		swept = append(swept, e.pass().Swept...)
	}
	if len(swept) != 0 {
		t.Fatalf("swept before the abandon grace: %v", swept)
	}
	if !errors.Is(refused, gitsource.ErrPushRefused) || !strings.Contains(refused.Error(), "hv-a may not write: branch protected") {
		t.Fatalf("hv-a's write: %v, want refused with the hook's message", refused)
	}
	sum := e.summary()
	if want := `| hv-a | offline\: no status since 2026-11-30T03\:00\:30Z`; !strings.Contains(sum, want) {
		t.Errorf("README lacks %q:\n%s", want, sum)
	}
	if strings.Contains(sum, `| hv-b | offline`) {
		t.Errorf("hv-b reports and reads offline:\n%s", sum)
	}

	e.clock.Add(2 * time.Minute) // 16 minutes pending, past the abandon grace
	res := e.pass()
	if len(res.Swept) != 1 || res.Swept[0] != "VM web-01@hv-a" {
		t.Fatalf("swept = %v, want web-01 on hv-a, whose writes are refused", res.Swept)
	}
	snap := e.snapshot("hv-a")
	if vm := snap.VM("web-01"); vm == nil || !vm.Tombstoned {
		t.Error("the swept tombstone left hv-a's snapshot: its agent would keep the VM as vanished")
	}
	for _, vm := range snap.VMs {
		if vm.Name != "web-01" && vm.Tombstoned {
			t.Errorf("%s tombstoned by the sweep", vm.Name)
		}
	}
}

// openAs opens the fleet repository as host's agent would.
func (e *env) openAs(host string) *gitsource.Repo {
	e.t.Helper()
	repo, err := gitsource.Open(e.t.Context(), gitsource.Options{URL: e.url, Logger: quietLogger(), Committer: "agent " + host + " <agent@" + host + ">"})
	if err != nil {
		e.t.Fatal(err)
	}
	return repo
}
