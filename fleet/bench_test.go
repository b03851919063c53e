package fleet

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"syscall"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// Fleet size of the benchmarks: 10,000 VMs on 1,000 hosts.
const (
	benchHosts = 1000
	benchVMs   = 10000
)

// bigRepo makes a bare repository whose main branch holds benchHosts Host
// objects and benchVMs VM objects, written in one commit with git
// fast-import (a process per file would take minutes), the VMs sharded in
// 100 directories (vms/NN/vm-NNNNN.yaml).
func bigRepo(b testing.TB) string {
	b.Helper()
	return bigRepoLayout(b, false)
}

// vmPath is where bigRepoLayout puts VM v: vms/NN/vm-NNNNN.yaml, or
// vms/vm-NNNNN.yaml when flat (one directory of benchVMs files, as most
// repositories are written).
func vmPath(v int, flat bool) string {
	if flat {
		return fmt.Sprintf("vms/vm-%05d.yaml", v)
	}
	return fmt.Sprintf("vms/%02d/vm-%05d.yaml", v%100, v)
}

// bigRepoLayout is bigRepo, with every VM in one flat vms/ directory when
// flat is set.
func bigRepoLayout(b testing.TB, flat bool) string {
	b.Helper()
	dir := gittest.NewBare(b)
	var s bytes.Buffer
	s.WriteString("commit refs/heads/main\ncommitter Bench <bench@example.com> 1764471600 +0000\ndata 11\nbig fleet\n\n")
	file := func(p, content string) {
		fmt.Fprintf(&s, "M 100644 inline %s\ndata %d\n%s\n", p, len(content), content)
	}
	for h := 0; h < benchHosts; h++ {
		file(fmt.Sprintf("hosts/hv-%04d.yaml", h), hostYAML(fmt.Sprintf("hv-%04d", h)))
	}
	for v := 0; v < benchVMs; v++ {
		file(vmPath(v, flat), vmYAML(fmt.Sprintf("vm-%05d", v), fmt.Sprintf("hv-%04d", v%benchHosts), 1+v%2))
	}
	cmd := exec.Command("git", "fast-import", "--quiet")
	cmd.Dir = dir
	cmd.Stdin = &s
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("fast-import: %v\n%s", err, out)
	}
	return dir
}

func benchController(b testing.TB, dir string, clk *clock) *Controller {
	b.Helper()
	c, err := New(Config{URL: dir, Clock: clk.Now, Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkFirstPass is a new controller's first pass over the big fleet:
// clone, load 11,000 files, publish 1,000 snapshots and the ledger.
func BenchmarkFirstPass(b *testing.B) {
	template := bigRepo(b)
	clk := benchClock()
	var cpu time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		dir := filepath.Join(b.TempDir(), "repo.git")
		if out, err := exec.Command("cp", "-a", template, dir).CombinedOutput(); err != nil {
			b.Fatalf("copy: %v %s", err, out)
		}
		c := benchController(b, dir, clk)
		b.StartTimer()
		before := cpuTime()
		res, err := c.Pass(context.Background())
		cpu += cpuTime() - before
		if err != nil || res.Rejected != nil || len(res.Published) != benchHosts {
			b.Fatalf("first pass: %v, %v, published %d", err, res.Rejected, len(res.Published))
		}
	}
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
}

// BenchmarkOneFileCommitPass is the steady state: a commit changing one VM
// file, and the pass that publishes it (goal: under 100 ms), with the VMs
// sharded in 100 directories and in one flat vms/ directory.
func BenchmarkOneFileCommitPass(b *testing.B) {
	b.Run("sharded", func(b *testing.B) { oneFileCommitPass(b, false) })
	b.Run("flat", func(b *testing.B) { oneFileCommitPass(b, true) })
}

func oneFileCommitPass(b *testing.B, flat bool) {
	dir := bigRepoLayout(b, flat)
	clk := benchClock()
	c := benchController(b, dir, clk)
	if _, err := c.Pass(context.Background()); err != nil {
		b.Fatal(err)
	}
	var cpu, git time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		gittest.Commit(b, dir, gittest.Edit{Write: map[string]string{vmPath(7, flat): vmYAML("vm-00007", "hv-0007", 3+i%2)}})
		b.StartTimer()
		s0, k0 := cpuTimes()
		res, err := steadyPass(c)
		s1, k1 := cpuTimes()
		cpu += s1 - s0
		git += k1 - k0
		if err != nil || len(res.Published) != 1 {
			b.Fatalf("pass: %v, result %+v", err, res)
		}
	}
	// CPU per pass does not depend on what else the machine runs:
	// cpu-ms/op is the controller's, git-cpu-ms/op the remote's (the
	// git-upload-pack and git-receive-pack processes of the file
	// transport and what they run, all waited for within the pass).
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(git.Milliseconds())/float64(b.N), "git-cpu-ms/op")
	// The remote runs seven git processes per pass (upload-pack and its
	// pack-objects; receive-pack, unpack-objects, the connectivity
	// check's rev-list and its for-each-ref, gc --auto: GIT_TRACE2_PERF
	// lists them), each waited for in turn. git-start-ms is what starting
	// one costs on this machine, doing nothing: a floor of the pass that
	// no change to the controller moves.
	b.StopTimer()
	b.ReportMetric(float64(gitStart(b).Microseconds())/1000, "git-start-ms")
}

// gitStart is the mean wall time of `git --version` over 20 runs: the
// cost of starting a git process on this machine.
func gitStart(b *testing.B) time.Duration {
	t0 := time.Now()
	for range 20 {
		if out, err := exec.Command("git", "--version").CombinedOutput(); err != nil {
			b.Fatalf("git --version: %v %s", err, out)
		}
	}
	return time.Since(t0) / 20
}

// BenchmarkIdlePass is a pass with nothing new: the poll's cost.
func BenchmarkIdlePass(b *testing.B) {
	dir := bigRepo(b)
	c := benchController(b, dir, benchClock())
	for i := 0; i < 2; i++ {
		if _, err := c.Pass(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := steadyPass(c); err != nil {
			b.Fatal(err)
		}
	}
}

// steadyPass is c.Pass with the profile label pass=steady, so that a CPU
// profile of a benchmark (-cpuprofile) can be cut to the passes it times:
// go tool pprof -tagfocus pass=steady.
func steadyPass(c *Controller) (PassResult, error) {
	var res PassResult
	var err error
	pprof.Do(context.Background(), pprof.Labels("pass", "steady"), func(ctx context.Context) {
		res, err = c.Pass(ctx)
	})
	return res, err
}

// cpuTime is the CPU time (user and system) used so far by this process
// and by the git processes it waited for (the file transport runs
// git-upload-pack and git-receive-pack).
func cpuTime() time.Duration {
	self, kids := cpuTimes()
	return self + kids
}

func cpuTimes() (self, kids time.Duration) {
	var s, k syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &s)
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &k)
	tv := func(t syscall.Timeval) time.Duration { return time.Duration(t.Nano()) }
	return tv(s.Utime) + tv(s.Stime), tv(k.Utime) + tv(k.Stime)
}

// benchClock stands still, as a controller's clock does within a few
// seconds: README.md is written by the first pass and then held back for
// SummaryInterval, as in production.
func benchClock() *clock {
	return &clock{now: time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)}
}
