package fleet

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// haDuration is how long TestTwoControllers pushes: GITFLEET_HA_DURATION
// (a Go duration), 2 minutes by default. The test takes about a minute
// more: convergence and the walk of the history.
func haDuration(t *testing.T) time.Duration {
	d := 2 * time.Minute
	if v := os.Getenv("GITFLEET_HA_DURATION"); v != "" {
		p, err := time.ParseDuration(v)
		if err != nil || p <= 0 {
			t.Fatalf("GITFLEET_HA_DURATION=%q: want a positive duration", v)
		}
		d = p
	}
	return d
}

// haHosts are the hosts of TestTwoControllers.
var haHosts = []string{"hv-a", "hv-b", "hv-c"}

// TestTwoControllers runs two controllers (Run, each with its own clone)
// against one repository served by git http-backend, for haDuration: a
// pusher adds, edits, deletes and re-adds VMs on main every second or so;
// one simulated agent per host (the agents' status.Writer on its own
// clone) accepts its snapshot under the epoch fence, destroys tombstoned
// VMs and acks them; the server of controller A stalls its requests now
// and then for up to 8 s, so A often publishes from a head it read before
// B moved on (the race of docs/DESIGN.md, "Two controllers"). Then the
// pusher stops, and both controllers and the agents run until every push
// is applied and every delete finalized. Every commit of the snapshots
// branch's first-parent history is then checked (checkHAHistory): no
// epoch regression, no applied commit moving backwards, no tombstone
// finalized twice, no finalized VM live again unless main re-added it;
// the last state is main's last commit, nothing pending (no lost update).
func TestTwoControllers(t *testing.T) {
	duration := haDuration(t)
	root := t.TempDir()
	dir := filepath.Join(root, "fleet.git")
	gittest.Git(t, "", "init", "--quiet", "--bare", "--initial-branch=main", dir)
	gittest.Git(t, dir, "config", "http.receivepack", "true")
	slow := gittest.ServeFaulty(t, root)
	plain := gittest.Serve(t, root) + "/fleet.git"

	p := newHAPusher(t, dir)
	var wg sync.WaitGroup
	defer wg.Wait() // after stop, on a failure too
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	run := func(f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f()
		}()
	}
	// Each controller's log is kept: the lost races are counted.
	logs := map[string]*logtest.Hook{}
	for name, url := range map[string]string{"A": slow.HTTPURL + "/fleet.git", "B": plain} {
		logger, hook := logtest.NewNullLogger()
		logs[name] = hook
		// Deletes are finalized by acks only (no host goes offline for
		// an hour), and the mass-delete guard is off: a controller that
		// fell behind by ten deletes would rightly hold them.
		c, err := New(Config{URL: url, Logger: logrus.NewEntry(logger), GitTimeout: 30 * time.Second,
			AbandonGrace: time.Hour, OfflineAfter: time.Hour, SummaryInterval: -1, MaxDeletes: -1})
		if err != nil {
			t.Fatalf("controller %s: %v", name, err)
		}
		t.Cleanup(func() { c.Close() })
		run(func() { _ = c.Run(ctx, time.Second) })
	}
	agents := make([]*haAgent, len(haHosts))
	for i, h := range haHosts {
		agents[i] = newHAAgent(t, plain, h)
		run(func() { agents[i].run(ctx) })
	}
	// Delays: A's server stalls every request for 0.5–8 s, every 1–4 s.
	stalls := 0
	run(func() {
		for ctx.Err() == nil {
			if !sleepCtx(ctx, time.Second+rand.N(3*time.Second)) {
				return
			}
			slow.Set(gittest.Stall, 0)
			stalls++
			sleepCtx(ctx, 500*time.Millisecond+rand.N(7500*time.Millisecond))
			slow.Set(gittest.NoFault, 0)
		}
	})

	start := time.Now()
	for time.Since(start) < duration {
		p.step()
		time.Sleep(300*time.Millisecond + rand.N(1200*time.Millisecond))
	}
	pushed := time.Since(start)

	// Convergence: main's last commit applied, every delete finalized.
	last := p.commits[len(p.commits)-1]
	// A bound against a hang, not a speed target.
	deadline := time.Now().Add(10 * time.Minute)
	for {
		l := haLedger(t, dir)
		if l != nil && l.Applied != nil && string(l.Applied.Commit) == last && len(l.Tombstones) == 0 {
			break
		}
		if time.Now().After(deadline) {
			applied := "none"
			if l != nil && l.Applied != nil {
				applied = string(l.Applied.Commit)
			}
			t.Fatalf("10 minutes after the last push, the ledger applies %s (main is at %s) with tombstones %v", applied, last, haTombstones(l))
		}
		time.Sleep(500 * time.Millisecond)
	}
	converged := time.Since(start) - pushed
	stop()
	wg.Wait()

	for _, a := range agents {
		if a.fenced > 0 {
			t.Errorf("agent %s was offered a snapshot below an epoch it had accepted %d times", a.host, a.fenced)
		}
		if a.failed > 0 {
			t.Logf("agent %s: %d status writes failed (retried)", a.host, a.failed)
		}
	}
	lost := map[string]int{}
	for name, hook := range logs {
		for _, e := range hook.AllEntries() {
			if e.Message == "reading the desired branch again" {
				lost[name]++
			}
		}
	}
	st := checkHAHistory(t, dir, p)
	t.Logf("%v of pushes (%d commits on main: %d adds, %d edits, %d deletes, %d re-adds), A stalled %d times; converged %v after the last push",
		pushed.Round(time.Second), len(p.commits), p.adds, p.edits, p.deletes, p.readds, stalls, converged.Round(time.Second))
	t.Logf("races lost to the other controller (the desired branch read again before publishing): A %d, B %d", lost["A"], lost["B"])
	t.Logf("checked %d snapshots commits: %d snapshot files published, %d tombstones, %d finalized, %d undeleted by a re-add; %d distinct applied commits",
		st.commits, st.published, st.tombstoned, st.finalized, st.undeleted, st.applied)
}

// sleepCtx sleeps d, or less when ctx ends first; it reports whether ctx
// is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// haVM is one VM of the pusher's model of main.
type haVM struct {
	host  string
	vcpus int
}

// haGone is a VM the pusher deleted: a re-add puts it back on its host.
type haGone struct{ name, host string }

// haPusher writes main: one change per commit. commits[i] is main's i-th
// commit (main is linear: the pusher is its only writer) and states[i]
// the VMs its tree holds.
type haPusher struct {
	t       *testing.T
	dir     string
	vms     map[string]haVM
	gone    []haGone // deleted VMs, for re-adds
	next    int
	commits []string
	states  []map[string]haVM
	// counts of each kind of change
	adds, edits, deletes, readds int
}

func newHAPusher(t *testing.T, dir string) *haPusher {
	p := &haPusher{t: t, dir: dir, vms: map[string]haVM{}}
	files := map[string]string{}
	for _, h := range haHosts {
		files["hosts/"+h+".yaml"] = hostYAML(h)
		for i := 0; i < 3; i++ {
			name := p.newName()
			p.vms[name] = haVM{host: h, vcpus: 1}
			files["vms/"+name+".yaml"] = vmYAML(name, h, 1)
		}
	}
	p.record(gittest.Commit(t, dir, gittest.Edit{Write: files, Message: "initial fleet"}))
	return p
}

func (p *haPusher) newName() string {
	p.next++
	return fmt.Sprintf("vm-%03d", p.next)
}

func (p *haPusher) record(commit string) {
	p.commits = append(p.commits, commit)
	state := make(map[string]haVM, len(p.vms))
	for n, vm := range p.vms {
		state[n] = vm
	}
	p.states = append(p.states, state)
}

// step pushes one change: an edit, an add, a delete or a re-add of a
// deleted name (on its host). The fleet stays between 5 and 15 VMs, within
// any host's capacity.
func (p *haPusher) step() {
	names := make([]string, 0, len(p.vms))
	for n := range p.vms {
		names = append(names, n)
	}
	slices.Sort(names)
	var e gittest.Edit
	switch r := rand.N(10); {
	case r < 4 && len(names) > 0:
		n := names[rand.N(len(names))]
		vm := p.vms[n]
		vm.vcpus = 3 - vm.vcpus
		p.vms[n] = vm
		e = gittest.Edit{Write: map[string]string{"vms/" + n + ".yaml": vmYAML(n, vm.host, vm.vcpus)}, Message: "resize " + n}
		p.edits++
	case (r < 7 || len(names) >= 15) && len(names) > 4:
		n := names[rand.N(len(names))]
		p.gone = append(p.gone, haGone{n, p.vms[n].host})
		delete(p.vms, n)
		e = gittest.Edit{Remove: []string{"vms/" + n + ".yaml"}, Message: "retire " + n}
		p.deletes++
	default:
		n, vm := p.newName(), haVM{host: haHosts[rand.N(len(haHosts))], vcpus: 1}
		if r == 9 && len(p.gone) > 0 {
			i := rand.N(len(p.gone))
			n, vm.host = p.gone[i].name, p.gone[i].host
			p.gone = slices.Delete(p.gone, i, i+1)
			p.readds++
		} else {
			p.adds++
		}
		p.vms[n] = vm
		e = gittest.Edit{Write: map[string]string{"vms/" + n + ".yaml": vmYAML(n, vm.host, vm.vcpus)}, Message: "add " + n}
	}
	p.record(fastCommit(p.t, p.dir, e.Write, e.Remove, e.Message))
}

// haAgent plays one host's agent: it reads its snapshot from the
// snapshots tip (its own depth-1 clone), accepts it when its epoch is not
// below the last accepted (the fence), destroys the tombstoned VMs and
// acks them in its status (status.Writer on its host branch) for as long
// as the snapshot names them. It writes on every change and every 5 s.
type haAgent struct {
	t        *testing.T
	host     string
	repo     *gitsource.Repo
	writer   *status.Writer
	accepted uint64
	vms      map[string]bool
	acks     []string
	st       status.Status
	// fenced counts snapshots below the accepted epoch; failed the
	// status writes that failed.
	fenced, failed int
}

func newHAAgent(t *testing.T, url, host string) *haAgent {
	ctx := context.Background()
	tips, err := gitsource.Open(ctx, gitsource.Options{URL: url, Depth: 1, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	own, err := gitsource.Open(ctx, gitsource.Options{URL: url, Depth: 1, Logger: quietLogger(),
		Committer: "agent " + host + " <agent@" + host + ">"})
	if err != nil {
		t.Fatal(err)
	}
	return &haAgent{t: t, host: host, repo: tips, writer: &status.Writer{Repo: own, Host: host},
		vms: map[string]bool{}, st: status.Status{Host: host}}
}

func (a *haAgent) run(ctx context.Context) {
	var wrote time.Time
	for sleepCtx(ctx, 200*time.Millisecond+rand.N(600*time.Millisecond)) {
		changed := a.read(ctx)
		if !changed && time.Since(wrote) < 5*time.Second {
			continue
		}
		st := a.st
		st.LastSeenEpoch, st.Destroyed = a.accepted, slices.Clone(a.acks)
		st.Heartbeat++
		st.VMs = nil
		for n := range a.vms {
			st.VMs = append(st.VMs, status.VM{Name: n, Phase: status.PhaseReady, Power: "running"})
		}
		slices.SortFunc(st.VMs, func(x, y status.VM) int { return strings.Compare(x.Name, y.Name) })
		out, err := a.writer.Write(ctx, &st)
		if err != nil {
			if ctx.Err() == nil {
				a.failed++
			}
			continue
		}
		a.st.Heartbeat, wrote = out.Heartbeat, time.Now()
	}
}

// read fetches the snapshots tip and applies the host's snapshot; it
// reports whether the status to write changed.
func (a *haAgent) read(ctx context.Context) bool {
	tip, err := a.repo.Fetch(ctx, snapshots.Branch)
	if err != nil {
		return false // not published yet, or the test is ending
	}
	data, err := a.repo.ReadFile(tip, snapshots.Path(a.host))
	if err != nil {
		return false
	}
	snap, err := snapshots.ParseSnapshot(data)
	if err != nil {
		a.t.Errorf("agent %s: snapshot at %s: %v", a.host, tip, err)
		return false
	}
	if snap.Epoch < a.accepted {
		a.fenced++
		return false
	}
	if snap.Epoch == a.accepted {
		return false
	}
	a.accepted = snap.Epoch
	var acks []string
	for _, vm := range snap.VMs {
		if vm.Tombstoned {
			delete(a.vms, vm.Name) // destroyed (again: idempotent)
			acks = append(acks, vm.Name)
			continue
		}
		a.vms[vm.Name] = true
	}
	for n := range a.vms {
		if snap.VM(n) == nil {
			// Dropped without a tombstone: kept, as the agent keeps a
			// vanished VM. A finalized tombstone leaves the snapshot
			// after its ack.
			if !slices.Contains(a.acks, n) {
				a.t.Errorf("agent %s: %s left the snapshot at epoch %d without a tombstone", a.host, n, snap.Epoch)
			}
			delete(a.vms, n)
		}
	}
	a.acks = acks
	return true
}

// haLedger is the ledger at the snapshots tip of the bare repository dir;
// nil before the first publish.
func haLedger(t *testing.T, dir string) *snapshots.Ledger {
	out := catFiles(t, dir, []string{"refs/heads/" + DefaultSnapshotsBranch + ":" + snapshots.LedgerPath})
	data := out[0]
	if data == nil {
		return nil
	}
	l, err := snapshots.ParseLedger(data)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func haTombstones(l *snapshots.Ledger) []string {
	if l == nil {
		return nil
	}
	var out []string
	for _, tb := range l.Tombstones {
		out = append(out, tb.Name+"@"+tb.Host)
	}
	return out
}

// catFiles reads many objects ("rev:path") with one git cat-file
// --batch; a missing one is nil.
func catFiles(t *testing.T, dir string, specs []string) [][]byte {
	t.Helper()
	cmd := exec.Command("git", "cat-file", "--batch")
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader(strings.Join(specs, "\n") + "\n")
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("git cat-file: %v", err)
	}
	r := bufio.NewReader(bytes.NewReader(raw))
	out := make([][]byte, len(specs))
	for i := range specs {
		header, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("git cat-file: answer %d of %d: %v", i, len(specs), err)
		}
		f := strings.Fields(header)
		if len(f) == 2 && f[1] == "missing" {
			continue
		}
		if len(f) != 3 {
			t.Fatalf("git cat-file: header %q", header)
		}
		n, err := strconv.Atoi(f[2])
		if err != nil {
			t.Fatalf("git cat-file: header %q", header)
		}
		out[i] = make([]byte, n+1)
		if _, err := io.ReadFull(r, out[i]); err != nil {
			t.Fatalf("git cat-file: %v", err)
		}
		out[i] = out[i][:n]
	}
	return out
}

// haStats are checkHAHistory's counts.
type haStats struct {
	commits, published, tombstoned, finalized, undeleted, applied int
}

// checkHAHistory walks the first-parent history of the snapshots branch,
// oldest first, and checks on every commit against the pusher's record
// of main:
//   - the ledger's applied commit is a commit of main, the same as or a
//     descendant of the previous commit's (main is linear, so: not
//     earlier in it);
//   - every host's snapshot file that changed has an epoch above every
//     epoch published for that host before, and the ledger's epochs
//     never go down;
//   - a tombstone that leaves the ledger is either finalized (its name
//     not desired on its host at the applied commit) or undeleted (main
//     added it back); one finalized twice must have been added back and
//     deleted again on main in between;
//   - a VM live in a snapshot is desired on that host at the applied
//     commit, and a finalized VM is never live again unless main added it
//     back after its finalize; a tombstoned one is not desired there;
//   - at the tip, the applied commit is main's last, no tombstone is
//     pending and every host's snapshot holds main's VMs with their
//     specs (no lost update).
func checkHAHistory(t *testing.T, dir string, p *haPusher) haStats {
	t.Helper()
	pos := map[string]int{}
	for i, c := range p.commits {
		pos[c] = i
	}
	if got := gittest.Git(t, dir, "rev-list", "--first-parent", "--count", "main"); got != strconv.Itoa(len(p.commits)) {
		t.Fatalf("main holds %s commits, the pusher wrote %d", got, len(p.commits))
	}
	commits := strings.Fields(gittest.Git(t, dir, "rev-list", "--first-parent", "--reverse", "refs/heads/"+DefaultSnapshotsBranch))
	var specs []string
	for _, c := range commits {
		specs = append(specs, c+":"+snapshots.LedgerPath)
		for _, h := range haHosts {
			specs = append(specs, c+":"+snapshots.Path(h))
		}
	}
	blobs := catFiles(t, dir, specs)
	// desiredAt reports whether name is on host in main's i-th commit.
	desiredAt := func(i int, name, host string) bool {
		vm, ok := p.states[i][name]
		return ok && vm.host == host
	}
	// addedBack reports whether name is desired on main somewhere in
	// commits (from, to].
	addedBack := func(from, to int, name string) bool {
		for i := from + 1; i <= to; i++ {
			if _, ok := p.states[i][name]; ok {
				return true
			}
		}
		return false
	}
	var st haStats
	applied := -1
	prevBlob := map[string]string{}
	topEpoch := map[string]uint64{}
	ledgerEpoch := map[string]uint64{}
	prevTombs := map[snapshots.Ref]bool{}
	finalizedAt := map[string]int{} // name → applied position of its last finalize
	var last *snapshots.Ledger
	lastSnaps := map[string]*snapshots.Snapshot{}
	for i, c := range commits {
		at := func(format string, args ...any) {
			t.Errorf("snapshots commit %s (%d of %d): %s", desired.Hash(c).Short(), i+1, len(commits), fmt.Sprintf(format, args...))
		}
		group := blobs[i*(1+len(haHosts)):]
		if group[0] == nil {
			continue // before the first ledger
		}
		st.commits++
		l, err := snapshots.ParseLedger(group[0])
		if err != nil {
			t.Fatalf("snapshots commit %s: %v", c, err)
		}
		last = l
		if l.Applied == nil {
			at("no applied commit")
			continue
		}
		cur, ok := pos[string(l.Applied.Commit)]
		if !ok {
			at("applies %s, which is no commit of main", l.Applied.Commit.Short())
			continue
		}
		if cur < applied {
			at("the applied commit went backwards: main's commit %d after %d", cur, applied)
		}
		if cur != applied {
			st.applied++
		}
		applied = cur
		for h, rec := range l.Hosts {
			if rec.Epoch < ledgerEpoch[h] {
				at("the ledger's epoch of %s went down from %d to %d", h, ledgerEpoch[h], rec.Epoch)
			}
			ledgerEpoch[h] = max(ledgerEpoch[h], rec.Epoch)
		}
		for j, h := range haHosts {
			data := group[1+j]
			if data == nil {
				continue
			}
			snap, err := snapshots.ParseSnapshot(data)
			if err != nil {
				t.Fatalf("snapshots commit %s, %s: %v", c, snapshots.Path(h), err)
			}
			lastSnaps[h] = snap
			if string(data) != prevBlob[h] {
				prevBlob[h] = string(data)
				st.published++
				if snap.Epoch <= topEpoch[h] {
					at("%s published at epoch %d, not above %d published before", h, snap.Epoch, topEpoch[h])
				}
				topEpoch[h] = max(topEpoch[h], snap.Epoch)
			}
			for _, vm := range snap.VMs {
				switch {
				case vm.Tombstoned && desiredAt(cur, vm.Name, h):
					at("%s tombstoned on %s, but main's commit %d desires it there", vm.Name, h, cur)
				case !vm.Tombstoned && !desiredAt(cur, vm.Name, h):
					at("%s live on %s, but main's commit %d does not desire it there", vm.Name, h, cur)
				case !vm.Tombstoned:
					if f, ok := finalizedAt[vm.Name]; ok && !addedBack(f, cur, vm.Name) {
						at("%s live on %s again after its finalize at main's commit %d, and main never added it back", vm.Name, h, f)
					}
					if want := p.states[cur][vm.Name].vcpus; vm.Spec.VCPUs != want {
						at("%s has %d vCPUs on %s, main's commit %d says %d", vm.Name, vm.Spec.VCPUs, h, cur, want)
					}
				}
			}
		}
		tombs := map[snapshots.Ref]bool{}
		for _, tb := range l.Tombstones {
			tombs[tb.Ref()] = true
			if !prevTombs[tb.Ref()] {
				st.tombstoned++
				if f, ok := finalizedAt[tb.Name]; ok && !addedBack(f, cur, tb.Name) {
					at("%s tombstoned again after its finalize at main's commit %d, and main never added it back", tb.Ref(), f)
				}
			}
		}
		for r := range prevTombs {
			if tombs[r] {
				continue
			}
			if desiredAt(cur, r.Name, r.Host) {
				st.undeleted++
				continue
			}
			if f, ok := finalizedAt[r.Name]; ok && !addedBack(f, cur, r.Name) {
				at("%s finalized again (first at main's commit %d), and main never added it back in between", r, f)
			}
			finalizedAt[r.Name] = cur
			st.finalized++
		}
		prevTombs = tombs
	}
	if last == nil || applied != len(p.commits)-1 || len(last.Tombstones) > 0 {
		t.Fatalf("the snapshots tip applies main's commit %d of %d with tombstones %v", applied, len(p.commits)-1, haTombstones(last))
	}
	final := p.states[len(p.states)-1]
	for _, h := range haHosts {
		var got, want []string
		for _, vm := range lastSnaps[h].VMs {
			got = append(got, fmt.Sprintf("%s/%d", vm.Name, vm.Spec.VCPUs))
		}
		for n, vm := range final {
			if vm.host == h {
				want = append(want, fmt.Sprintf("%s/%d", n, vm.vcpus))
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s's last snapshot holds %v, main's last commit %v", h, got, want)
		}
	}
	return st
}
