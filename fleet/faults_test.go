package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// TestControllerUnderGitFaults: the controller against a server that
// accepts and stalls, one that stalls after N bytes, one that resets
// mid-pack (over http and over the file transport through a wrapper
// git-upload-pack), and against a damaged cache (the empty ref file of a
// crash between creating and writing it). Each faulty pass is unreadable
// (never rejected), ends within the git timeout, and tombstones, finalizes
// or sweeps nothing; the snapshots branch is untouched. Once the fault is
// removed, the next pass applies the pending commit. With -v it prints
// the time to detection and to recovery of each fault.
func TestControllerUnderGitFaults(t *testing.T) {
	root := t.TempDir()
	srv := gittest.ServeFaulty(t, root)
	files := baseFleet()
	files["vms/old-01.yaml"] = vmYAML("old-01", "hv-a", 1)

	type fault struct {
		name   string
		inject func(cache string)
		remove func()
		damage bool // cache damage: repaired within the pass
	}
	var faults []fault
	for _, f := range []gittest.Fault{gittest.Stall, gittest.StallAfter, gittest.Reset} {
		f := f
		faults = append(faults, fault{name: f.String(),
			inject: func(string) { srv.Set(f, 32<<10) }, remove: func() { srv.Set(gittest.NoFault, 0) }})
	}
	faults = append(faults, fault{name: "empty ref file in the cache",
		inject: func(cache string) {
			if err := os.WriteFile(filepath.Join(cache, "refs", "remotes", "origin", "main"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		},
		remove: func() {}, damage: true})

	for _, transport := range []string{"http", "file"} {
		for _, f := range faults {
			if f.damage && transport == "http" {
				continue // the cache is the same whatever the transport
			}
			t.Run(transport+"/"+f.name, func(t *testing.T) {
				bare, err := os.MkdirTemp(root, "fleet-*.git")
				if err != nil {
					t.Fatal(err)
				}
				gittest.Git(t, "", "init", "--quiet", "--bare", "--initial-branch=main", bare)
				gittest.Git(t, bare, "config", "http.receivepack", "true")
				gittest.Commit(t, bare, gittest.Edit{Write: files})
				url := map[string]string{"http": srv.HTTPURL + "/" + filepath.Base(bare), "file": "file://" + bare}[transport]
				t.Cleanup(f.remove)
				cache := t.TempDir()
				clk := &clock{now: time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)}
				c, err := New(Config{URL: url, CacheDir: cache, GitTimeout: 3 * time.Second,
					Clock: clk.Now, Logger: quietLogger(), SummaryInterval: -1})
				if err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				if _, err := c.Pass(ctx); err != nil {
					t.Fatal(err)
				}
				// A reviewed delete waits, with a pack past the fault's
				// 32 KiB, and the host has acked nothing.
				gittest.Commit(t, bare, gittest.Edit{Remove: []string{"vms/old-01.yaml"}, Write: map[string]string{"blob.bin": noise(t, 256<<10)}})
				writeStatus(t, bare, &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: 1})
				before := gittest.Rev(t, bare, "refs/heads/"+DefaultSnapshotsBranch)

				f.inject(cache)
				start := time.Now()
				res, err := c.Pass(ctx)
				detect := time.Since(start)
				outcome := PassOutcome(res, err)
				if f.damage {
					// Repaired within the pass: it goes on as usual.
					if err != nil {
						t.Fatalf("a damaged cache was not repaired: %v", err)
					}
				} else if outcome != OutcomeUnreadable || !errors.Is(err, ErrUnreadable) {
					t.Fatalf("outcome = %s (%v), want unreadable", outcome, err)
				}
				if f.damage {
					if len(res.Tombstoned) != 1 || len(res.Finalized)+len(res.Swept) != 0 {
						t.Fatalf("after a repair: %+v, want just the reviewed delete", res)
					}
					t.Logf("%s over %s: repaired within the pass (%v); only the reviewed delete tombstoned, nothing finalized or destroyed",
						f.name, transport, detect.Round(time.Millisecond))
					return
				}
				if res.Rejected != nil || len(res.Tombstoned)+len(res.Finalized)+len(res.Swept) != 0 || res.Changed() {
					t.Fatalf("a faulty pass acted: %+v", res)
				}
				if got := gittest.Rev(t, bare, "refs/heads/"+DefaultSnapshotsBranch); got != before {
					t.Fatal("an unreadable pass wrote the snapshots branch")
				}
				t.Logf("%s over %s: %s after %v: %v; nothing tombstoned, finalized or destroyed",
					f.name, transport, outcome, detect.Round(time.Millisecond), err)

				f.remove()
				start = time.Now()
				res, err = c.Pass(ctx)
				if err != nil || res.Rejected != nil {
					t.Fatalf("after the fault: %v %v", err, res.Rejected)
				}
				if len(res.Tombstoned) != 1 || res.Tombstoned[0] != "VM old-01@hv-a" {
					t.Fatalf("after the fault: tombstoned %v, want the reviewed delete", res.Tombstoned)
				}
				t.Logf("%s over %s: recovered %v after the fault was removed", f.name, transport, time.Since(start).Round(time.Millisecond))
			})
		}
	}
}

// noise is n bytes that do not compress.
func noise(t testing.TB, n int) string {
	b := make([]byte, n/2)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// TestControllerOnFullDisk: a commit larger than the space left under the
// cache dir makes the pass unreadable at once (not at the git deadline,
// which is an hour here), with an error naming the cache, and tombstones,
// finalizes or sweeps nothing; once space is freed the next pass applies
// the commit. The cache is a 1 MB tmpfs in a mount namespace of the
// test's own (it runs itself again under unshare), so no mount outlives
// it. With -v it prints the time to detection and to recovery. Needs
// root and unshare(1).
func TestControllerOnFullDisk(t *testing.T) {
	if os.Getenv("FLEET_OWN_MOUNTS") == "" {
		if os.Geteuid() != 0 {
			t.Skip("mounting a small tmpfs needs root")
		}
		unshare, err := exec.LookPath("unshare")
		if err != nil {
			t.Skip("unshare(1) is not installed (util-linux)")
		}
		cmd := exec.Command(unshare, "--mount", "--propagation", "private", os.Args[0], "-test.run=^TestControllerOnFullDisk$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "FLEET_OWN_MOUNTS=1")
		out, err := cmd.CombinedOutput()
		if err != nil && strings.Contains(string(out), "unshare failed") {
			t.Skipf("no mount namespace here: %s", out)
		}
		t.Logf("in its own mount namespace:\n%s", out)
		if err != nil || !strings.Contains(string(out), "--- PASS: TestControllerOnFullDisk") {
			t.Fatalf("%v", err)
		}
		return
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", mnt).Run() })
	files := baseFleet()
	files["vms/old-01.yaml"] = vmYAML("old-01", "hv-a", 1)
	e := newEnv(t, files)
	cache := filepath.Join(mnt, "cache")
	clk := &clock{now: time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)}
	c, err := New(Config{URL: e.url, CacheDir: cache, GitTimeout: time.Hour, Clock: clk.Now, Logger: quietLogger(), SummaryInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	e.commit(gittest.Edit{Remove: []string{"vms/old-01.yaml"}, Write: map[string]string{"blob.bin": noise(t, 4<<20)}})
	writeStatus(t, e.dir, &status.Status{Host: "hv-a", Heartbeat: 1, LastSeenEpoch: 1})
	before := e.snapshotsTip()

	start := time.Now()
	res, err := c.Pass(ctx)
	detect := time.Since(start)
	if PassOutcome(res, err) != OutcomeUnreadable || !errors.Is(err, gitsource.ErrCacheUnwritable) || !strings.Contains(err.Error(), cache) {
		t.Fatalf("outcome %s: %v: want unreadable, the cache unwritable, naming %s", PassOutcome(res, err), err, cache)
	}
	if res.Rejected != nil || len(res.Tombstoned)+len(res.Finalized)+len(res.Swept) != 0 || res.Changed() || e.snapshotsTip() != before {
		t.Fatalf("a pass on a full disk acted: %+v", res)
	}
	t.Logf("full filesystem under the cache dir: unreadable after %v: %v; nothing tombstoned, finalized or destroyed", detect.Round(time.Millisecond), err)

	if out, err := exec.Command("mount", "-o", "remount,size=64m", mnt).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	start = time.Now()
	res, err = c.Pass(ctx)
	if err != nil || len(res.Tombstoned) != 1 || res.Tombstoned[0] != "VM old-01@hv-a" {
		t.Fatalf("after space was freed: %v, tombstoned %v, want the reviewed delete", err, res.Tombstoned)
	}
	t.Logf("full filesystem under the cache dir: recovered %v after space was freed", time.Since(start).Round(time.Millisecond))
}
