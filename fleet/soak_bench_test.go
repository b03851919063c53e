package fleet

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	rtmetrics "runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// BenchmarkPublishSoak is a long-running controller over many publishing
// passes (GITFLEET_SOAK_PASSES, default 1,000) on the big fleet (10,000
// VMs on 1,000 hosts: a ledger of about 300 KB) served by git
// http-backend, with 50 deletes pending that no host acks: every pass
// follows a one-file commit and publishes one snapshot and the ledger.
// The controller runs in a child process (TestHelperPublishSoak) so that
// the figure is its own, not the repository set-up's or git's: the child
// reads its VmRSS from /proc/self/status after a pass, every 50 passes,
// without forcing a collection (the memory an operator sees, the figure
// of a leak report), and the live heap the last collection left
// (runtime/metrics), which says whether a growth is retained objects or
// the collector's slack. It prints the RSS after warm-up (the first 10%
// of the passes, at least 100), at the end and the highest after
// warm-up, and their ratios; it fails when the highest is more than 20%
// above the first.
//
// Two shapes: "disk", the clones on disk as `gitfleet controller` keeps
// them (Config.CacheDir and TipsCacheDir), and "memory", both in memory
// (the Config defaults). Run it with -benchtime 1x:
//
//	go test ./fleet -run '^$' -bench PublishSoak -benchtime 1x -timeout 60m
func BenchmarkPublishSoak(b *testing.B) {
	passes := 1000
	if v := os.Getenv("GITFLEET_SOAK_PASSES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 200 {
			b.Fatalf("GITFLEET_SOAK_PASSES=%q: want a number of at least 200", v)
		}
		passes = n
	}
	for _, store := range []string{"disk", "memory"} {
		b.Run(store, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				runPublishSoak(b, store, passes)
			}
		})
	}
}

// soakSample is one line the child prints: RSS and live heap in KiB
// after a pass.
type soakSample struct {
	pass           int
	rss, heap      int64
	ledgerKiB      int64
	passMillis     float64
	pending, epoch int
}

func runPublishSoak(b *testing.B, store string, passes int) {
	dir := bigRepo(b)
	// 50 VMs deleted before the controller first runs: their tombstones
	// are published at its first pass and stay pending (no host acks).
	var gone []string
	for v := 0; v < 50; v++ {
		n := 200 + 7*v
		gone = append(gone, fmt.Sprintf("vms/%02d/vm-%05d.yaml", n%100, n))
	}
	url := gittest.Serve(b, filepath.Dir(dir)) + "/" + filepath.Base(dir)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperPublishSoak$", "-test.v", "-test.timeout=0")
	cmd.Env = append(os.Environ(), "GITFLEET_HELPER_SOAK="+strings.Join([]string{url, dir, strconv.Itoa(passes), store, strings.Join(gone, ",")}, "\x1f"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	var samples []soakSample
	var log []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		var s soakSample
		if _, err := fmt.Sscanf(line, "soak pass=%d rss-kib=%d heap-live-kib=%d ledger-kib=%d pass-ms=%g pending=%d epoch=%d",
			&s.pass, &s.rss, &s.heap, &s.ledgerKiB, &s.passMillis, &s.pending, &s.epoch); err == nil {
			samples = append(samples, s)
			continue
		}
		log = append(log, line)
	}
	if err := cmd.Wait(); err != nil {
		b.Fatalf("the controller's process: %v\n%s\n%s", err, strings.Join(log, "\n"), stderr.String())
	}
	elapsed := time.Since(start)
	warm := max(passes/10, 100)
	var first, last, top soakSample
	for _, s := range samples {
		if s.pass < warm {
			continue
		}
		if first.pass == 0 {
			first = s
		}
		if s.rss > top.rss {
			top = s
		}
		last = s
	}
	if first.pass == 0 || last.pass != passes {
		b.Fatalf("samples %+v: want one at %d passes or later and one at the end (%d)", samples, warm, passes)
	}
	mb := func(kib int64) float64 { return float64(kib) / 1024 }
	ratio := func(a, z int64) float64 { return float64(z) / float64(a) }
	b.ReportMetric(float64(passes), "passes")
	b.ReportMetric(mb(first.rss), "first-rss-MB")
	b.ReportMetric(mb(last.rss), "last-rss-MB")
	b.ReportMetric(mb(top.rss), "max-rss-MB")
	b.ReportMetric(ratio(first.rss, last.rss), "last/first")
	b.ReportMetric(ratio(first.rss, top.rss), "max/first")
	b.Logf("%s clones, %d publishing passes in %v (ledger %d KiB, %d deletes pending): RSS after %d passes %.1f MB, at the end %.1f MB (×%.2f), highest %.1f MB at pass %d (×%.2f); live heap %.1f → %.1f MB",
		store, passes, elapsed.Round(time.Second), last.ledgerKiB, last.pending, first.pass, mb(first.rss), mb(last.rss), ratio(first.rss, last.rss),
		mb(top.rss), top.pass, ratio(first.rss, top.rss), mb(first.heap), mb(last.heap))
	var took []float64
	for _, s := range samples {
		took = append(took, s.passMillis)
	}
	slices.Sort(took)
	b.Logf("pass time at the samples: median %.0f ms, max %.0f ms; load average when done %s", took[len(took)/2], took[len(took)-1], loadAverage())
	var curve []string
	for _, s := range samples {
		curve = append(curve, fmt.Sprintf("%d:%.0f/%.0f", s.pass, mb(s.rss), mb(s.heap)))
	}
	b.Logf("pass:RSS/live heap MB: %s", strings.Join(curve, " "))
	if ratio(first.rss, top.rss) > 1.2 {
		b.Errorf("RSS grew from %.1f MB to %.1f MB over %d passes: more than 20%%", mb(first.rss), mb(top.rss), passes)
	}
}

// TestHelperPublishSoak is BenchmarkPublishSoak's controller, in a
// process of its own; it does nothing in a normal run. Its input,
// unit-separated in GITFLEET_HELPER_SOAK: the URL and the bare
// repository's directory, the number of passes, "disk" or "memory", and
// the comma-separated paths to delete before the first pass is measured.
func TestHelperPublishSoak(t *testing.T) {
	args := strings.Split(os.Getenv("GITFLEET_HELPER_SOAK"), "\x1f")
	if len(args) != 5 {
		return
	}
	url, dir, store, gone := args[0], args[1], args[3], strings.Split(args[4], ",")
	passes, err := strconv.Atoi(args[2])
	if err != nil {
		t.Fatal(err)
	}
	// The 50 deletes are one reviewed commit: past the mass-delete guard.
	cfg := Config{URL: url, Logger: quietLogger(), MaxDeletes: -1}
	if store == "disk" {
		cfg.CacheDir, cfg.TipsCacheDir = filepath.Join(t.TempDir(), "cache"), filepath.Join(t.TempDir(), "tips")
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	gittest.Commit(t, dir, gittest.Edit{Remove: gone, Message: "retire 50 VMs"})
	res, err := c.Pass(ctx)
	if err != nil || len(res.Tombstoned) != len(gone) {
		t.Fatalf("the deletes: %v, tombstoned %d, want %d", err, len(res.Tombstoned), len(gone))
	}
	heap := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}}
	for i := 1; i <= passes; i++ {
		fastCommit(t, dir, map[string]string{"vms/07/vm-00007.yaml": vmYAML("vm-00007", "hv-0007", 3+i%2)}, nil, "resize vm-00007")
		t0 := time.Now()
		res, err := c.Pass(ctx)
		took := time.Since(t0)
		if err != nil || len(res.Published) != 1 || res.Pending != len(gone) {
			t.Fatalf("pass %d: %v, published %v, %d pending; want one snapshot and %d pending", i, err, res.Published, res.Pending, len(gone))
		}
		if i%50 != 0 && i != passes {
			continue
		}
		rss, err := vmRSS()
		if err != nil {
			t.Fatal(err)
		}
		rtmetrics.Read(heap)
		ledger := gittest.Show(t, dir, "refs/heads/"+DefaultSnapshotsBranch, snapshots.LedgerPath)
		fmt.Printf("soak pass=%d rss-kib=%d heap-live-kib=%d ledger-kib=%d pass-ms=%g pending=%d epoch=%d\n",
			i, rss, int64(heap[0].Value.Uint64()>>10), len(ledger)>>10, float64(took.Microseconds())/1000, res.Pending, res.Epochs["hv-0007"])
	}
}

// fastCommit commits on main of the bare repository dir, as a push
// would, with one git fast-import: write (path → content) and remove
// (paths) on main's tip. It returns the new commit. (gittest.Commit runs
// git seven times through an index: seconds on a loaded machine.)
func fastCommit(t testing.TB, dir string, write map[string]string, remove []string, msg string) string {
	t.Helper()
	marks := filepath.Join(t.TempDir(), "marks")
	var s bytes.Buffer
	fmt.Fprintf(&s, "commit refs/heads/main\nmark :1\ncommitter Test Person <person@example.com> %d +0000\ndata %d\n%s\nfrom refs/heads/main^0\n",
		time.Now().Unix(), len(msg), msg)
	for _, p := range remove {
		fmt.Fprintf(&s, "D %s\n", p)
	}
	for p, content := range write {
		fmt.Fprintf(&s, "M 100644 inline %s\ndata %d\n%s\n", p, len(content), content)
	}
	s.WriteString("\n")
	cmd := exec.Command("git", "fast-import", "--quiet", "--export-marks="+marks)
	cmd.Dir = dir
	cmd.Stdin = &s
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("fast-import: %v\n%s", err, out)
	}
	data, err := os.ReadFile(marks)
	if err != nil {
		t.Fatal(err)
	}
	mark, commit, ok := strings.Cut(strings.TrimSpace(string(data)), " ")
	if !ok || mark != ":1" {
		t.Fatalf("fast-import marks: %q", data)
	}
	return commit
}

// vmRSS is this process's resident memory now (VmRSS in
// /proc/self/status), in KiB.
func vmRSS() (int64, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/self/status")
}
