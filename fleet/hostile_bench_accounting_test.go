package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// TestHostileLostUpdatesSeesALostAckCopy: BenchmarkStatusFleet's
// lostUpdates must count a host whose status-branch copy lacks its last
// change. Here the last change is a destroy ack (its second VM gone,
// listed as destroyed) that no controller pass copied: the copy on the
// status branch still shows the VM running. lostUpdates compares the
// copy's first VM message alone, so it reports 0 lost updates.
func TestHostileLostUpdatesSeesALostAckCopy(t *testing.T) {
	gittest.NeedGit(t)
	var lost int
	done := false
	res := testing.Benchmark(func(b *testing.B) {
		if b.N > 1 {
			return
		}
		ctx := context.Background()
		dir := fleetRepo(b, 1)
		c, err := New(Config{URL: dir, Logger: quietLogger()})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Pass(ctx); err != nil {
			b.Fatal(err)
		}
		repo, err := gitsource.Open(ctx, gitsource.Options{URL: dir, Depth: 1, Logger: quietLogger()})
		if err != nil {
			b.Fatal(err)
		}
		name := "hv-0000"
		h := &simHost{name: name, writer: &status.Writer{Repo: repo, Host: name},
			st: status.Status{Host: name, Agent: status.AgentInfo{Version: "bench", BootID: "b", Accel: "tcg"},
				VMs: []status.VM{{Name: "vm-" + name, Phase: status.PhaseReady, Power: "running"},
					{Name: doomedVM(name), Phase: status.PhaseReady, Power: "running"}}},
			tombstones: make(chan uint64, 1)}
		if err := h.write(ctx, nil); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Pass(ctx); err != nil { // copies the first write
			b.Fatal(err)
		}
		acked := false
		h.ack(ctx, 1, func(time.Duration) {}, func(string) { acked = true })
		if !acked {
			b.Fatal("ack not written")
		}
		// No pass: the status branch's copy lacks the ack.
		cp, err := status.Parse(name, []byte(gittest.Show(b, dir, "refs/heads/"+DefaultStatusBranch, status.Path(name))+"\n"))
		if err != nil {
			b.Fatal(err)
		}
		if len(cp.VMs) != 2 {
			b.Fatalf("the copy has %d VMs: the set-up did not leave it behind", len(cp.VMs))
		}
		lost = lostUpdates(b, dir, []*simHost{h})
		done = !b.Failed()
	})
	_ = res
	if !done {
		t.Fatal("set-up failed")
	}
	if lost != 1 {
		t.Fatalf("lostUpdates = %d for a host whose status-branch copy lacks its destroy ack, want 1", lost)
	}
}
