package main

import (
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/peakrss"
)

// BenchmarkPassPeakRSS prints the peak resident memory of one controller
// pass (`controller --once`, the clone on disk as the shipped unit keeps
// it, and with no --cache-dir) and of one agent pass (`agent --once`,
// memory backend: the snapshot fetch, the reconcile, the status write),
// each over a repository with and without a 100 MB incompressible blob
// that neither reads (outside --path and on the status branch; beside the
// host's snapshot). Each op
// is one fresh process whose own VmHWM is the figure; run with
// -benchtime=1x:
//
//	go test ./cmd/gitfleet -run '^$' -bench PassPeakRSS -benchtime=1x
func BenchmarkPassPeakRSS(b *testing.B) {
	gittest.NeedGit(b)
	blob := make([]byte, 100<<20)
	if _, err := rand.Read(blob); err != nil {
		b.Fatal(err)
	}
	spec := agenttest.Spec("hv-a")
	snap, err := snapshots.MarshalSnapshot(&snapshots.Snapshot{Host: "hv-a", Epoch: 1,
		VMs:     []snapshots.SnapshotVM{{Name: "web-01", SpecHash: desired.SpecHash(spec), Spec: spec}},
		Volumes: []snapshots.SnapshotVolume{}})
	if err != nil {
		b.Fatal(err)
	}
	for _, big := range []bool{false, true} {
		name := map[bool]string{false: "without", true: "with100MB"}[big]
		fleetFiles := map[string]string{
			"fleet/hv-a.yaml":   testHost,
			"fleet/web-01.yaml": cliVM("web-01", "hv-a", "1"),
		}
		snapFiles := map[string]string{"hosts/hv-a.yaml": string(snap)}
		if big {
			fleetFiles["assets/disk.img"] = string(blob)
			snapFiles["hosts/disk.img"] = string(blob)
		}
		ctl := gittest.NewBare(b)
		gittest.Commit(b, ctl, gittest.Edit{Write: fleetFiles})
		if big {
			gittest.Commit(b, ctl, gittest.Edit{Branch: "gitfleet/status", Write: map[string]string{"hosts/disk.img": string(blob)}})
		}
		agent := gittest.NewBare(b)
		gittest.Commit(b, agent, gittest.Edit{Branch: "gitfleet/snapshots", Write: snapFiles})

		b.Run("controller/disk/"+name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.ReportMetric(cliPeakRSS(b, "controller", "--repo", ctl, "--path", "fleet", "--cache-dir", filepath.Join(b.TempDir(), "cache"), "--once"), "MB-peak-RSS")
			}
		})
		b.Run("controller/default/"+name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.ReportMetric(cliPeakRSS(b, "controller", "--repo", ctl, "--path", "fleet", "--once"), "MB-peak-RSS")
			}
		})
		b.Run("agent/"+name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				cfg := filepath.Join(b.TempDir(), "agent.yaml")
				body := "repo: {url: " + agent + "}\nhost: hv-a\nstateDir: " + filepath.Join(b.TempDir(), "state") +
					"\nbackend: memory\nintervals: {heartbeat: 30s}\ngraces: {tombstone: 1m}\nlogLevel: warn\n"
				if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(cliPeakRSS(b, "agent", "--config", cfg, "--once"), "MB-peak-RSS")
			}
		})
	}
}

// cliPeakRSS runs the command line args in a child process
// (TestHelperCLIPeakRSS) and returns its peak RSS in MB.
func cliPeakRSS(tb testing.TB, args ...string) float64 {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperCLIPeakRSS$")
	cmd.Env = append(os.Environ(), "GITFLEET_RSS_ARGS="+strings.Join(args, "\x1f"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		tb.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	kib, err := peakrss.Parse(out)
	if err != nil {
		tb.Fatalf("%v\n%s", err, out)
	}
	return float64(kib) / 1024
}

// TestHelperCLIPeakRSS runs the command line in GITFLEET_RSS_ARGS (unit-
// separator separated), prints its peak RSS and exits with its code; it
// does nothing in a normal run.
func TestHelperCLIPeakRSS(t *testing.T) {
	args := os.Getenv("GITFLEET_RSS_ARGS")
	if args == "" {
		return
	}
	code := run(strings.Split(args, "\x1f"))
	if err := peakrss.Print(os.Stdout); err != nil {
		t.Fatal(err)
	}
	os.Exit(code)
}
