package fleet

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/testsupport/peakrss"
)

// BenchmarkPushToPublish is the latency a person sees: on the big fleet
// (10,000 VMs on 1,000 hosts, a file remote), a long-running controller
// (Run, watching the desired branch) and 20 one-file commits pushed with
// git push from a clone, one at a time; for each, the time from git push
// returning to the snapshots branch moving (goal: median under 150 ms).
// It prints the median and the slowest, the CPU per push of the
// controller, of its remote and of the benchmark's own git, and the peak
// RSS of this process (controller and all; goal under 300 MB). Run it with -benchtime 1x; the
// pass's own wall time is BenchmarkOneFileCommitPass's ns/op.
func BenchmarkPushToPublish(b *testing.B) {
	for _, layout := range []struct {
		name string
		flat bool
	}{{"sharded", false}, {"flat", true}} {
		b.Run(layout.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				runPushToPublish(b, 20, layout.flat)
			}
		})
	}
}

func runPushToPublish(b *testing.B, pushes int, flat bool) {
	dir := bigRepoLayout(b, flat)
	work := filepath.Join(b.TempDir(), "work")
	// harness is the CPU of this benchmark's own git commits and pushes
	// (and the receive-pack each push runs), to tell them from the
	// controller's git processes.
	var harness time.Duration
	git := func(args ...string) string {
		b.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = work
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=Bench", "GIT_AUTHOR_EMAIL=bench@example.com",
			"GIT_COMMITTER_NAME=Bench", "GIT_COMMITTER_EMAIL=bench@example.com")
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("git %v: %v\n%s", args, err, out)
		}
		harness += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		return strings.TrimSpace(string(out))
	}
	if out, err := exec.Command("git", "clone", "--quiet", dir, work).CombinedOutput(); err != nil {
		b.Fatalf("clone: %v\n%s", err, out)
	}
	c, err := New(Config{URL: dir, Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, time.Minute) }()
	defer func() {
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			b.Error(err)
		}
	}()
	snaps := func() string { return snapshotsRef(b, dir) }
	waitMoved := func(from string, limit time.Duration) (string, time.Duration) {
		t0 := time.Now()
		for time.Since(t0) < limit {
			if now := snaps(); now != from {
				return now, time.Since(t0)
			}
			time.Sleep(time.Millisecond)
		}
		b.Fatalf("the snapshots branch did not move from %s within %v", from, limit)
		return "", 0
	}
	tip, _ := waitMoved("", 10*time.Minute) // the first pass publishes everything
	// Let the first passes' summary writes settle.
	time.Sleep(3 * time.Second)
	tip = snaps()

	var lat, pushWall []time.Duration
	self0, kids0 := cpuTimes()
	harness = 0
	for i := 0; i < pushes; i++ {
		path := vmPath(7, flat)
		if err := os.WriteFile(filepath.Join(work, path), []byte(vmYAML("vm-00007", "hv-0007", 3+i%2)), 0o644); err != nil {
			b.Fatal(err)
		}
		git("commit", "--quiet", "-am", "resize vm-00007")
		t0 := time.Now()
		git("push", "--quiet", "origin", "HEAD:main")
		pushWall = append(pushWall, time.Since(t0))
		var d time.Duration
		tip, d = waitMoved(tip, time.Minute)
		lat = append(lat, d)
	}
	sort.Slice(pushWall, func(i, j int) bool { return pushWall[i] < pushWall[j] })
	self1, kids1 := cpuTimes()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	rss, _ := peakrss.Self()
	b.ReportMetric(ms(percentile(lat, 0.5)), "median-push-to-publish-ms")
	b.ReportMetric(ms(percentile(lat, 1)), "max-push-to-publish-ms")
	b.ReportMetric(float64(rss)/1024, "peak-rss-MB")
	b.ReportMetric(ms(percentile(pushWall, 0.5)), "median-git-push-ms")
	b.ReportMetric(float64(percentile(lat, 0.5))/float64(max(percentile(pushWall, 0.5), 1)), "publish-to-push-ratio")
	// CPU per push: the controller's (this process, its polling of the
	// snapshots ref aside), its remote's (the git processes of the file
	// transport) and this benchmark's own git commit and push.
	perPush := func(d time.Duration) float64 { return ms(d) / float64(pushes) }
	remote := kids1 - kids0 - harness
	b.ReportMetric(perPush(self1-self0), "cpu-ms/push")
	b.ReportMetric(perPush(remote), "git-cpu-ms/push")
	layout := "sharded vms/NN/"
	if flat {
		layout = "flat vms/"
	}
	b.Logf("%s, %d pushes, git push returning → snapshots moved: median %.0f ms, max %.0f ms (all: %v); the git push itself: median %.0f ms (ratio %.2f); peak RSS %d MB; load average %s",
		layout, pushes, ms(percentile(lat, 0.5)), ms(percentile(lat, 1)), lat, ms(percentile(pushWall, 0.5)),
		float64(percentile(lat, 0.5))/float64(max(percentile(pushWall, 0.5), 1)), rss/1024, loadAverage())
	b.Logf("CPU per push: controller %.0f ms, its remote (git upload-pack and receive-pack) %.0f ms, the benchmark's git commit and push %.0f ms",
		perPush(self1-self0), perPush(remote), perPush(harness))
}

// snapshotsRef reads the snapshots branch's tip in the bare repository
// dir without running git: the loose ref, else its line in packed-refs;
// "" when there is none.
func snapshotsRef(b *testing.B, dir string) string {
	ref := "refs/heads/" + DefaultSnapshotsBranch
	if data, err := os.ReadFile(filepath.Join(dir, ref)); err == nil {
		return strings.TrimSpace(string(data))
	}
	data, err := os.ReadFile(filepath.Join(dir, "packed-refs"))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[1] == ref {
			return f[0]
		}
	}
	return ""
}
