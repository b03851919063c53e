package fleet

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/peakrss"
)

// statusFleetScale is the shape of BenchmarkStatusFleet, from the
// environment (defaults in brackets: a run that fits go test -bench):
//
//	GITFLEET_BENCH_HOSTS     simulated hosts [20]
//	GITFLEET_BENCH_DURATION  how long the hosts write [15s]
//	GITFLEET_BENCH_HEARTBEAT each host's heartbeat [2s]
//	GITFLEET_BENCH_EVENT     each host's real change (a VM message) [6s]
//	GITFLEET_BENCH_DELETES   reviewed deletes during the run, each acked [5]
//
// The fleet to measure is 1,000 hosts for 11 minutes at a 60 s heartbeat
// with one change per host every 10 minutes:
//
//	GITFLEET_BENCH_HOSTS=1000 GITFLEET_BENCH_DURATION=11m GITFLEET_BENCH_HEARTBEAT=60s \
//	GITFLEET_BENCH_EVENT=10m go test ./fleet -run '^$' -bench StatusFleet -benchtime 1x -timeout 60m
type statusFleetScale struct {
	hosts, deletes             int
	duration, heartbeat, event time.Duration
}

func statusFleetScaleFromEnv(b *testing.B) statusFleetScale {
	s := statusFleetScale{hosts: 20, deletes: 5, duration: 15 * time.Second, heartbeat: 2 * time.Second, event: 6 * time.Second}
	if v := os.Getenv("GITFLEET_BENCH_HOSTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("GITFLEET_BENCH_HOSTS=%q: want a positive number", v)
		}
		s.hosts = n
	}
	if v := os.Getenv("GITFLEET_BENCH_DELETES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			b.Fatalf("GITFLEET_BENCH_DELETES=%q: want a number, 0 or more", v)
		}
		s.deletes = n
	}
	s.deletes = min(s.deletes, s.hosts)
	for name, d := range map[string]*time.Duration{
		"GITFLEET_BENCH_DURATION": &s.duration, "GITFLEET_BENCH_HEARTBEAT": &s.heartbeat, "GITFLEET_BENCH_EVENT": &s.event,
	} {
		if v := os.Getenv(name); v != "" {
			p, err := time.ParseDuration(v)
			if err != nil || p <= 0 {
				b.Fatalf("%s=%q: want a positive duration", name, v)
			}
			*d = p
		}
	}
	return s
}

// simHost is one simulated host: the agents' real status writer on its own
// depth-1 clone, writing a heartbeat every heartbeat and a real change
// (its VM's message) every event.
type simHost struct {
	name   string
	writer *status.Writer
	st     status.Status
	// events is the number of changes written; heartbeat the heartbeat of
	// the last write that succeeded.
	events    int
	heartbeat uint64
	failed    int
	// wrote is when the last write that succeeded started.
	wrote time.Time
	// tombstones takes the epoch of the snapshot that tombstoned the
	// host's second VM (hosts with one to delete only): the host writes
	// its destroy ack at once, as an agent does after the destroy.
	tombstones chan uint64
}

// doomedVM is the second VM of a host the benchmark deletes: a reviewed
// delete whose destroy the host acks.
func doomedVM(host string) string { return "gone-" + host }

// BenchmarkStatusFleet runs many simulated hosts, each writing its own
// host branch with status.Writer in its own goroutine, against git
// http-backend, while a controller runs passes over all their statuses as
// Run does (one at least every 2 s). It prints the p99 status write
// latency, lost updates (a host branch, or its copy on the status branch,
// without the host's last write or a change missing from history: must be
// 0), commits kept per host per day (extrapolated, events only), the
// status branch's commits, the controller's pass times over N statuses and
// the peak RSS of this process (hosts, controller and all). Reviewed
// deletes are pushed during the run (GITFLEET_BENCH_DELETES, one commit
// each); the host acks each tombstone at once, and the benchmark fails
// unless every ack is finalized by the first controller pass that starts
// after the ack's write returned (it prints the most passes any took).
// Shape: statusFleetScale. Run it with -benchtime 1x.
func BenchmarkStatusFleet(b *testing.B) {
	scale := statusFleetScaleFromEnv(b)
	for i := 0; i < b.N; i++ {
		runStatusFleet(b, scale)
	}
}

func runStatusFleet(b *testing.B, scale statusFleetScale) {
	dir := fleetRepo(b, scale.hosts)
	// The hosts whose second VM is deleted during the run, spread over
	// the fleet; each delete is its own reviewed commit.
	doomed := make([]string, scale.deletes)
	add := map[string]string{}
	for k := range doomed {
		doomed[k] = fmt.Sprintf("hv-%04d", k*scale.hosts/max(scale.deletes, 1))
		add["vms/"+doomedVM(doomed[k])+".yaml"] = vmYAML(doomedVM(doomed[k]), doomed[k], 1)
	}
	if len(add) > 0 {
		gittest.Commit(b, dir, gittest.Edit{Branch: "main", Write: add, Message: "VMs to delete"})
	}
	tally := newServerTally()
	base := gittest.ServeWith(b, filepath.Dir(dir), gittest.ServeOptions{
		Wrap:    func(h http.Handler) http.Handler { return tagClients(workerPool(serverWorkers)(h)) },
		Account: tally.add,
	})
	url := base + "/" + filepath.Base(dir)
	ctx := context.Background()
	c, err := New(Config{URL: base + "/controller/" + filepath.Base(dir), Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := c.Pass(ctx); err != nil {
		b.Fatal(err)
	}

	hosts := make([]*simHost, scale.hosts)
	for i := range hosts {
		name := fmt.Sprintf("hv-%04d", i)
		repo, err := gitsource.Open(ctx, gitsource.Options{URL: url, Depth: 1, Logger: quietLogger()})
		if err != nil {
			b.Fatal(err)
		}
		hosts[i] = &simHost{name: name, writer: &status.Writer{Repo: repo, Host: name},
			st: status.Status{Host: name, Agent: status.AgentInfo{Version: "bench", BootID: "b", Accel: "tcg"},
				VMs: []status.VM{{Name: "vm-" + name, Phase: status.PhaseReady, Power: "running"}}},
			tombstones: make(chan uint64, 1)}
	}
	byName := map[string]*simHost{}
	for _, h := range hosts {
		byName[h.name] = h
	}
	for _, name := range doomed {
		h := byName[name]
		h.st.VMs = append(h.st.VMs, status.VM{Name: doomedVM(name), Phase: status.PhaseReady, Power: "running"})
	}
	// Every host writes once, spread over one heartbeat (and at least
	// 50 ms a host, as a fleet's agents start over time), before the
	// measurement starts: the first commit of a branch is no growth.
	var wg sync.WaitGroup
	ramp := max(scale.heartbeat, time.Duration(scale.hosts)*50*time.Millisecond)
	for _, h := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(rand.N(ramp))
			if err := h.write(ctx, nil); err != nil {
				b.Error(err)
			}
		}()
	}
	wg.Wait()
	if b.Failed() {
		return
	}
	keptBefore := keptCommits(b, dir)
	statusBefore := countCommits(b, dir, DefaultStatusBranch)

	var mu sync.Mutex
	var latencies []time.Duration
	record := func(d time.Duration) {
		mu.Lock()
		latencies = append(latencies, d)
		mu.Unlock()
	}
	// acked is host → when its destroy ack's write returned.
	acked := map[string]time.Time{}
	ackDone := func(host string) {
		mu.Lock()
		acked[host] = time.Now()
		mu.Unlock()
	}
	cli := newCLIPusher(b, dir, base+"/cli/"+filepath.Base(dir))
	runCtx, stop := context.WithTimeout(ctx, scale.duration)
	defer stop()
	self0, git0 := cpuTimes()
	tally0 := tally.snapshot()
	start := time.Now()
	// The git CLI pushes the same shape of commit to the same server
	// beside the hosts, for the ratio of the server's CPU per write.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for runCtx.Err() == nil {
			if err := cli.push(ctx); err != nil {
				b.Error(err)
				return
			}
			select {
			case <-runCtx.Done():
			case <-time.After(cliEvery):
			}
		}
	}()
	for _, h := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.run(runCtx, scale, record, ackDone)
		}()
	}
	var passes []time.Duration
	var passErrs int
	acks := newAckTracker(doomed)
	nextDelete := 0
	for runCtx.Err() == nil {
		// The deletes are spread over the run: one reviewed commit each,
		// with the trailer the mass-delete guard asks for (one of the
		// host's two VMs is half of them).
		if nextDelete < len(doomed) && time.Since(start) >= scale.duration*time.Duration(nextDelete+1)/time.Duration(len(doomed)+2) {
			name := doomed[nextDelete]
			gittest.Commit(b, dir, gittest.Edit{Branch: "main", Remove: []string{"vms/" + doomedVM(name) + ".yaml"},
				Message: "delete " + doomedVM(name) + "\n\n" + AllowDeletesTrailer + ": 1"})
			nextDelete++
		}
		t0 := time.Now()
		res, err := c.Pass(ctx)
		if err != nil {
			passErrs++
			b.Logf("pass: %v", err)
		}
		mu.Lock()
		acks.pass(res, t0, acked, byName)
		mu.Unlock()
		passes = append(passes, time.Since(t0))
		select {
		case <-runCtx.Done():
		case <-time.After(time.Until(t0.Add(statusGap))):
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	self1, git1 := cpuTimes()
	served := tallySince(tally0, tally.snapshot())
	// One more pass sees every last write; a change is copied at once.
	t0 := time.Now()
	final, err := c.Pass(ctx)
	if err != nil {
		b.Fatal(err)
	}
	finalPass := time.Since(t0)
	acks.pass(final, t0, acked, byName)
	// A tombstone published by the last passes is acked now, as its
	// agent would, and followed to its finalize.
	for range 3 {
		n := 0
		for _, name := range doomed {
			select {
			case epoch := <-byName[name].tombstones:
				byName[name].ack(context.Background(), epoch, record, ackDone)
				n++
			default:
			}
		}
		if n == 0 {
			break
		}
		t0 := time.Now()
		if final, err = c.Pass(ctx); err != nil {
			b.Fatal(err)
		}
		acks.pass(final, t0, acked, byName)
	}

	garbage := serverGarbage(b, dir)
	lost := lostUpdates(b, dir, hosts)
	keptAfter := keptCommits(b, dir)
	statusAfter := countCommits(b, dir, DefaultStatusBranch)
	writes, failed, events := len(latencies), 0, 0
	for _, h := range hosts {
		failed += h.failed
		events += h.events
	}
	perDay := float64(24*time.Hour) / float64(elapsed)
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	sort.Slice(passes, func(i, j int) bool { return passes[i] < passes[j] })
	rss, _ := peakrss.Self()
	b.ReportMetric(float64(scale.hosts), "hosts")
	b.ReportMetric(ms(percentile(latencies, 0.99)), "p99-write-ms")
	b.ReportMetric(ms(percentile(latencies, 0.50)), "p50-write-ms")
	b.ReportMetric(float64(lost), "lost-updates")
	b.ReportMetric(float64(keptAfter-keptBefore)/float64(scale.hosts)*perDay, "kept-commits/host/day")
	b.ReportMetric(float64(statusAfter-statusBefore)*perDay, "status-commits/day")
	b.ReportMetric(ms(percentile(passes, 0.50)), "p50-pass-ms")
	b.ReportMetric(ms(percentile(passes, 1)), "max-pass-ms")
	b.ReportMetric(float64(rss)/1024, "peak-rss-MB")
	b.ReportMetric(float64(len(acks.finalizedIn)), "acks-finalized")
	b.ReportMetric(float64(acks.maxPasses()), "max-passes-to-finalize")
	perWrite := func(d time.Duration) float64 { return ms(d) / float64(max(writes, 1)) }
	b.ReportMetric(perWrite(git1-git0), "git-cpu-ms/write")
	b.ReportMetric(perWrite(self1-self0), "self-cpu-ms/write")
	b.Logf("command: GITFLEET_BENCH_HOSTS=%d GITFLEET_BENCH_DURATION=%v GITFLEET_BENCH_HEARTBEAT=%v GITFLEET_BENCH_EVENT=%v GITFLEET_BENCH_DELETES=%d go test ./fleet -run '^$' -bench StatusFleet -benchtime 1x -timeout 60m",
		scale.hosts, scale.duration, scale.heartbeat, scale.event, scale.deletes)
	b.Logf("%d hosts for %v (heartbeat %v, a change every %v): %d writes (%d failed), %d changes; p50 %.0f ms, p99 %.0f ms, max %.0f ms per write",
		scale.hosts, elapsed.Round(time.Second), scale.heartbeat, scale.event, writes, failed, events,
		ms(percentile(latencies, 0.5)), ms(percentile(latencies, 0.99)), ms(percentile(latencies, 1)))
	b.Logf("lost updates: %d; commits kept on the host branches: %d → %d (%.1f per host per day); status branch: %d → %d commits (%.0f per day)",
		lost, keptBefore, keptAfter, float64(keptAfter-keptBefore)/float64(scale.hosts)*perDay, statusBefore, statusAfter, float64(statusAfter-statusBefore)*perDay)
	b.Logf("CPU per status write: %.1f ms in git (http-backend and the git it runs), %.1f ms in this process (hosts and controller); the machine's load average when done: %s",
		perWrite(git1-git0), perWrite(self1-self0), loadAverage())
	agentCPU, cliCPU, ctlCPU := tallyTotal(served, "agent"), tallyTotal(served, "cli"), tallyTotal(served, "controller")
	agentPer := ms(agentCPU.cpu) / float64(max(writes, 1))
	cliPer := ms(cliCPU.cpu) / float64(max(cli.pushes, 1))
	b.ReportMetric(agentPer, "server-cpu-ms/write")
	b.ReportMetric(cliPer, "server-cpu-ms/cli-push")
	b.ReportMetric(agentPer/max(cliPer, 0.001), "server-cpu-ratio-to-cli")
	b.ReportMetric(ms(ctlCPU.cpu)/float64(max(len(passes), 1)), "server-cpu-ms/pass")
	b.Logf("git http-backend CPU (wait4 of each request): %.1f ms per status write (%.2f requests each), %.1f ms per git CLI push of the same commit shape (%d pushes): ratio %.2f; the controller's fetches %.1f ms per pass (%d passes)",
		agentPer, float64(agentCPU.requests)/float64(max(writes, 1)), cliPer, cli.pushes, agentPer/max(cliPer, 0.001),
		ms(ctlCPU.cpu)/float64(max(len(passes), 1)), len(passes))
	logTally(b, served)
	// The git CLI baseline replaces its tip on every push: 4 objects each
	// are its own, not the hosts'.
	hostsGarbage := max(0, garbage.unreachable-4*cli.pushes)
	b.ReportMetric(float64(hostsGarbage)/float64(scale.hosts)*perDay, "unreachable-objects/host/day")
	b.ReportMetric(float64(hostsGarbage)/float64(max(events, 1)), "unreachable-objects/change")
	b.ReportMetric(float64(garbage.sizeKiB)/1024, "server-repo-MB")
	b.Logf("git server after the run: %d unreachable objects, %d of them the hosts' (%.0f per host per day, extrapolated; %.1f per change written), %d the git CLI baseline's; %d loose objects, %d packs, %.1f MB on disk (loose %d KiB, packs %d KiB)",
		garbage.unreachable, hostsGarbage, float64(hostsGarbage)/float64(scale.hosts)*perDay, float64(hostsGarbage)/float64(max(events, 1)),
		garbage.unreachable-hostsGarbage, garbage.loose, garbage.packs, float64(garbage.sizeKiB)/1024, garbage.looseKiB, garbage.packKiB)
	b.Logf("controller: %d passes over %d statuses (%d failed): p50 %.0f ms, max %.0f ms; final pass %.0f ms (status branch written: %v); peak RSS of the process %d MB",
		len(passes), scale.hosts, passErrs, ms(percentile(passes, 0.5)), ms(percentile(passes, 1)), ms(finalPass), final.SummaryWritten, rss/1024)
	b.Logf("deletes: %d committed, %d tombstoned, %d acked, %d finalized; passes from an ack's write to its finalize: at most %d (want 1)",
		nextDelete, len(acks.epoch), len(acked), len(acks.finalizedIn), acks.maxPasses())
	if lost > 0 || failed > 0 {
		b.Errorf("%d lost updates, %d failed writes", lost, failed)
	}
	if missing := acks.unfinalized(doomed[:nextDelete]); len(missing) > 0 {
		b.Errorf("deletes not finalized at the end: %s", strings.Join(missing, ", "))
	}
	if n := acks.maxPasses(); n > 1 {
		b.Errorf("an ack took %d controller passes to finalize; want 1", n)
	}
}

// ackTracker follows BenchmarkStatusFleet's deletes from tombstone to
// finalize: it hands each tombstone's epoch to its host, which acks at
// once, and counts the controller passes that started after the ack's
// write returned, up to the one that finalized it.
type ackTracker struct {
	doomed map[string]bool
	// epoch is host → epoch of the snapshot that tombstoned its VM.
	epoch map[string]uint64
	// since is host → passes started after its ack returned, so far.
	since map[string]int
	// finalizedIn is host → passes it took (0: a pass already under way).
	finalizedIn map[string]int
}

func newAckTracker(doomed []string) *ackTracker {
	t := &ackTracker{doomed: map[string]bool{}, epoch: map[string]uint64{}, since: map[string]int{}, finalizedIn: map[string]int{}}
	for _, h := range doomed {
		t.doomed[h] = true
	}
	return t
}

// pass takes one pass's result (started at started; res is the zero
// value when it failed); acked is host → when its ack's write returned.
func (t *ackTracker) pass(res PassResult, started time.Time, acked map[string]time.Time, hosts map[string]*simHost) {
	for host, at := range acked {
		if _, done := t.finalizedIn[host]; !done && at.Before(started) {
			t.since[host]++
		}
	}
	for _, r := range res.Tombstoned {
		for host := range t.doomed {
			if _, seen := t.epoch[host]; !seen && r == "VM "+doomedVM(host)+"@"+host {
				t.epoch[host] = res.Published[host]
				hosts[host].tombstones <- res.Published[host]
			}
		}
	}
	for _, r := range res.Finalized {
		for host := range t.doomed {
			if _, done := t.finalizedIn[host]; !done && r == "VM "+doomedVM(host)+"@"+host {
				t.finalizedIn[host] = t.since[host]
			}
		}
	}
}

func (t *ackTracker) maxPasses() int {
	n := 0
	for _, p := range t.finalizedIn {
		n = max(n, p)
	}
	return n
}

// unfinalized lists the hosts of deletes committed but not finalized.
func (t *ackTracker) unfinalized(committed []string) []string {
	var out []string
	for _, h := range committed {
		if _, done := t.finalizedIn[h]; !done {
			out = append(out, h)
		}
	}
	return out
}

// serverWorkers is how many git requests the benchmark's server runs at
// once; the others wait their turn, as behind a git host's worker pool.
// Unbounded, a thousand agents start a thousand git processes at once on
// a machine of two cores, and every one of them times out.
const serverWorkers = 8

// cliEvery is how often BenchmarkStatusFleet's git CLI baseline pushes.
const cliEvery = 3 * time.Second

// workerPool lets n requests through at a time.
func workerPool(n int) func(http.Handler) http.Handler {
	slots := make(chan struct{}, n)
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case slots <- struct{}{}:
			case <-r.Context().Done():
				http.Error(w, "gave up waiting", http.StatusServiceUnavailable)
				return
			}
			defer func() { <-slots }()
			h.ServeHTTP(w, r)
		})
	}
}

// write writes h's status once (an event when event is set), recording
// its latency.
func (h *simHost) write(ctx context.Context, record func(time.Duration)) error {
	h.st.Heartbeat = h.heartbeat + 1
	h.st.ObservedAt = time.Now().UTC().Truncate(time.Second)
	t0 := time.Now()
	out, err := h.writer.Write(ctx, &h.st)
	if record != nil {
		record(time.Since(t0))
	}
	if err != nil {
		h.failed++
		return fmt.Errorf("%s: %w", h.name, err)
	}
	h.heartbeat = out.Heartbeat
	h.wrote = t0
	return nil
}

// run writes h's heartbeats and changes until ctx ends. A write under way
// when it ends is finished (its outcome counts), not cut short.
func (h *simHost) run(ctx context.Context, scale statusFleetScale, record func(time.Duration), acked func(host string)) {
	nextEvent := time.Now().Add(rand.N(scale.event))
	// The first heartbeat keeps the phase of the host's write before the
	// run, as an agent's does: a fleet's agents started over time, so
	// their heartbeats are spread over the interval, not all due at once.
	next := h.wrote.Add(scale.heartbeat)
	for {
		select {
		case <-ctx.Done():
			return
		case epoch := <-h.tombstones:
			h.ack(context.Background(), epoch, record, acked)
			continue
		case <-time.After(time.Until(next)):
		}
		if !time.Now().Before(nextEvent) {
			h.events++
			h.st.VMs[0].Message = fmt.Sprintf("change %d", h.events)
			nextEvent = nextEvent.Add(scale.event)
		}
		_ = h.write(context.Background(), record)
		next = time.Now().Add(scale.heartbeat*9/10 + rand.N(scale.heartbeat/5+1))
	}
}

// ack writes the destroy ack of h's second VM, tombstoned at epoch: the
// VM leaves the status and its name is listed as destroyed, with the
// epoch seen, as an agent writes it after the destroy.
func (h *simHost) ack(ctx context.Context, epoch uint64, record func(time.Duration), acked func(host string)) {
	gone := h.st.VMs[1].Name
	h.st.VMs = h.st.VMs[:1]
	h.st.Destroyed = append(h.st.Destroyed, gone)
	h.st.LastSeenEpoch = max(h.st.LastSeenEpoch, epoch)
	h.events++
	if h.write(ctx, record) == nil {
		acked(h.name)
	}
}

// lostUpdates counts hosts whose branch tip is not their last write,
// whose copy on the status branch differs from it in more than the
// heartbeat, or whose branch's history lacks one of their changes.
func lostUpdates(b *testing.B, dir string, hosts []*simHost) int {
	lost := 0
	statusTip := gittest.Rev(b, dir, "refs/heads/"+DefaultStatusBranch)
	messages := branchMessages(b, dir)
	for _, h := range hosts {
		tip, err := status.Parse(h.name, []byte(gittest.Show(b, dir, "refs/heads/"+status.HostBranch(h.name), status.Path(h.name))+"\n"))
		if err != nil {
			b.Fatal(err)
		}
		cp, err := status.Parse(h.name, []byte(gittest.Show(b, dir, statusTip, status.Path(h.name))+"\n"))
		if err != nil {
			b.Fatal(err)
		}
		// The whole status, not one field: an ack, a destroyed list or
		// an epoch lost on the way is a lost update too. The copy may lag
		// the heartbeat (held back), nothing else.
		switch {
		case tip.Heartbeat != h.heartbeat || !status.SameExceptHeartbeat(tip, &h.st):
			b.Logf("%s: branch has heartbeat %d %+v, last write %d %+v", h.name, tip.Heartbeat, tip, h.heartbeat, h.st)
			lost++
		case !status.SameExceptHeartbeat(cp, &h.st):
			b.Logf("%s: status branch copy %+v, last write %+v", h.name, cp, h.st)
			lost++
		case messages[h.name].events != h.events+1:
			b.Logf("%s: %d changes in history, want %d and the first write", h.name, messages[h.name].events-1, h.events)
			lost++
		}
	}
	return lost
}

// hostHistory counts one host branch's commits: events (no heartbeat
// trailer) and heartbeat-only ones, and whether its tip is heartbeat-only.
type hostHistory struct {
	events, heartbeats int
	tipHeartbeat       bool
}

// branchMessages reads the history of every host branch with one git log.
func branchMessages(b *testing.B, dir string) map[string]*hostHistory {
	out := map[string]*hostHistory{}
	refs := gittest.Git(b, dir, "for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads/"+status.HostBranchPrefix)
	tips := map[string]bool{}
	for _, line := range strings.Split(refs, "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			tips[f[1]] = true
		}
	}
	log := gittest.Git(b, dir, "log", "--branches="+status.HostBranchPrefix+"*", "--format=%H%x00%s%x00%b%x01")
	for _, rec := range strings.Split(log, "\x01") {
		f := strings.Split(strings.TrimSpace(rec), "\x00")
		if len(f) != 3 {
			continue
		}
		subject := strings.Fields(f[1]) // status: HOST heartbeat N
		if len(subject) < 2 {
			continue
		}
		host := subject[1]
		hh := out[host]
		if hh == nil {
			hh = &hostHistory{}
			out[host] = hh
		}
		if status.IsHeartbeatOnly(f[2]) {
			hh.heartbeats++
			hh.tipHeartbeat = hh.tipHeartbeat || tips[f[0]]
		} else {
			hh.events++
		}
	}
	return out
}

// keptCommits is the number of commits the host branches' histories keep:
// all but a heartbeat-only tip (the next write replaces it).
func keptCommits(b *testing.B, dir string) int {
	n := 0
	for _, hh := range branchMessages(b, dir) {
		n += hh.events + hh.heartbeats
		if hh.tipHeartbeat {
			n--
		}
	}
	return n
}

func countCommits(b *testing.B, dir, branch string) int {
	n, err := strconv.Atoi(gittest.Git(b, dir, "rev-list", "--count", "refs/heads/"+branch))
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// repoGarbage is what a bare repository holds: objects no ref reaches,
// loose objects and packs, and their size on disk.
type repoGarbage struct {
	unreachable, loose, packs  int
	looseKiB, packKiB, sizeKiB int
}

// serverGarbage reads git count-objects -v and git fsck --unreachable
// (no reflogs: a bare repository keeps none) of dir. The unreachable
// count includes the git CLI baseline's replaced commits (4 objects per
// push).
func serverGarbage(b *testing.B, dir string) repoGarbage {
	var g repoGarbage
	for _, line := range strings.Split(gittest.Git(b, dir, "count-objects", "-v"), "\n") {
		k, v, _ := strings.Cut(line, ": ")
		n, _ := strconv.Atoi(v)
		switch k {
		case "count":
			g.loose = n
		case "size":
			g.looseKiB = n
		case "packs":
			g.packs = n
		case "size-pack":
			g.packKiB = n
		}
	}
	g.sizeKiB = g.looseKiB + g.packKiB
	if out := gittest.Git(b, dir, "fsck", "--unreachable", "--no-reflogs", "--no-progress"); out != "" {
		g.unreachable = len(strings.Split(out, "\n"))
	}
	return g
}

// loadAverage is the first three fields of /proc/loadavg.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// percentile is the p-th (0..1) of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// fleetRepo makes a bare repository whose main branch holds hosts Host
// objects and one VM on each, in one commit (git fast-import).
func fleetRepo(b testing.TB, hosts int) string {
	b.Helper()
	dir := gittest.NewBare(b)
	var s bytes.Buffer
	s.WriteString("commit refs/heads/main\ncommitter Bench <bench@example.com> 1764471600 +0000\ndata 11\nbig fleet\n\n")
	file := func(p, content string) {
		fmt.Fprintf(&s, "M 100644 inline %s\ndata %d\n%s\n", p, len(content), content)
	}
	for h := 0; h < hosts; h++ {
		name := fmt.Sprintf("hv-%04d", h)
		file("hosts/"+name+".yaml", hostYAML(name))
		file("vms/vm-"+name+".yaml", vmYAML("vm-"+name, name, 1))
	}
	cmd := exec.Command("git", "fast-import", "--quiet")
	cmd.Dir = dir
	cmd.Stdin = &s
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("fast-import: %v\n%s", err, out)
	}
	return dir
}

// BenchmarkStatusPass is the controller's pass over the statuses of many
// hosts (GITFLEET_BENCH_HOSTS, default 1,000), each on its own host
// branch, served by git http-backend: the first pass, which copies every
// status to the status branch; a pass after a heartbeat of every host
// (read, held back: no commit); and a pass after one host's change (read
// and copied at once). The host branches are written with git fast-import,
// not by simulated agents, so the figure is the controller's alone; it
// prints each pass's wall time with the load average, its CPU time in
// this process (the controller) and in git http-backend (the remote:
// its CGI processes are this process's children), and the peak RSS of
// the process. The passes after the first carry the profile label
// pass=steady (go tool pprof -tagfocus pass=steady).
func BenchmarkStatusPass(b *testing.B) {
	hosts := 1000
	if v := os.Getenv("GITFLEET_BENCH_HOSTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("GITFLEET_BENCH_HOSTS=%q: want a positive number", v)
		}
		hosts = n
	}
	dir := fleetRepo(b, hosts)
	url := gittest.Serve(b, filepath.Dir(dir)) + "/" + filepath.Base(dir)
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		writeHostBranches(b, dir, hosts, uint64(1+2*i), "")
		c, err := New(Config{URL: url, Logger: quietLogger()})
		if err != nil {
			b.Fatal(err)
		}
		timed := func(what string, steady, wantWritten bool) {
			s0, k0 := cpuTimes()
			t0 := time.Now()
			var res PassResult
			var err error
			if steady {
				res, err = steadyPass(c)
			} else {
				res, err = c.Pass(ctx)
			}
			wall := time.Since(t0)
			s1, k1 := cpuTimes()
			if err != nil {
				b.Fatal(err)
			}
			if res.SummaryWritten != wantWritten {
				b.Fatalf("%s: status branch written %v, want %v", what, res.SummaryWritten, wantWritten)
			}
			b.Logf("%s over %d statuses: %v wall (load %s), CPU %v controller, %v git http-backend",
				what, hosts, wall.Round(time.Millisecond), loadAverage(), (s1 - s0).Round(time.Millisecond), (k1 - k0).Round(time.Millisecond))
		}
		timed("first pass (publish, copy every status)", false, true)
		timed("pass on its own write", true, false)
		writeHostBranches(b, dir, hosts, uint64(2+2*i), "")
		timed("pass after a heartbeat of every host (held back)", true, false)
		writeHostBranches(b, dir, 1, uint64(3+2*i), "changed")
		timed("pass after one host's change (copied)", true, true)
		c.Close()
	}
	rss, _ := peakrss.Self()
	b.ReportMetric(float64(rss)/1024, "peak-rss-MB")
}

// writeHostBranches writes the first n hosts' statuses, with heartbeat hb
// and message on their VM, as one commit on each host branch (one git
// fast-import).
func writeHostBranches(b *testing.B, dir string, n int, hb uint64, message string) {
	b.Helper()
	var s bytes.Buffer
	for h := 0; h < n; h++ {
		name := fmt.Sprintf("hv-%04d", h)
		data, err := status.Marshal(&status.Status{Host: name, Heartbeat: hb, ObservedAt: time.Unix(int64(hb), 0).UTC(),
			VMs: []status.VM{{Name: "vm-" + name, Phase: status.PhaseReady, Power: "running", Message: message}}})
		if err != nil {
			b.Fatal(err)
		}
		ref := "refs/heads/" + status.HostBranch(name)
		fmt.Fprintf(&s, "commit %s\ncommitter Bench <bench@example.com> %d +0000\ndata 7\nstatus\n", ref, 1764471600+hb)
		if hb > 1 {
			fmt.Fprintf(&s, "from %s^0\n", ref)
		}
		fmt.Fprintf(&s, "M 100644 inline %s\ndata %d\n%s\n\n", status.Path(name), len(data), data)
	}
	cmd := exec.Command("git", "fast-import", "--quiet", "--force")
	cmd.Dir = dir
	cmd.Stdin = &s
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("fast-import: %v\n%s", err, out)
	}
}
