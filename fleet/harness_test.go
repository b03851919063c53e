package fleet

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

const imageSHA = "64a7b8b7a4ad44f1d2c1e6b8a1c8f1e0c4b1a2d3e4f5a6b7c8d9e0f1a2b3c4d5"

func hostYAML(name string) string {
	return fmt.Sprintf(`apiVersion: gitfleet.dev/v1alpha1
kind: Host
metadata:
  name: %s
spec:
  capacity: {vcpus: 32, memoryMB: 131072}
`, name)
}

func vmYAML(name, host string, vcpus int, volumes ...string) string {
	vols := ""
	if len(volumes) > 0 {
		vols = "  volumes: [" + strings.Join(volumes, ", ") + "]\n"
	}
	return fmt.Sprintf(`apiVersion: gitfleet.dev/v1alpha1
kind: VM
metadata:
  name: %s
spec:
  host: %s
  vcpus: %d
  memoryMB: 512
  diskGB: 2
  image:
    url: https://example.com/debian.qcow2
    sha256: %s
%s`, name, host, vcpus, imageSHA, vols)
}

// growDB is an edit of main that gives db-01 (on hv-b) 4 vCPUs.
func growDB() gittest.Edit {
	return gittest.Edit{Write: map[string]string{"vms/db-01.yaml": vmYAML("db-01", "hv-b", 4, "db-data")}, Message: "grow db-01"}
}

func volumeYAML(name, host string, size int) string {
	return fmt.Sprintf(`apiVersion: gitfleet.dev/v1alpha1
kind: Volume
metadata: {name: %s}
spec: {host: %s, sizeGB: %d}
`, name, host, size)
}

// clock is a test clock the controller reads.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// env is one fleet repository (a bare repository in t.TempDir()), a
// controller over it and a clock.
type env struct {
	t     testing.TB
	dir   string // the bare repository
	url   string
	clock *clock
	c     *Controller
}

func quietLogger() *logrus.Entry {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return logrus.NewEntry(l)
}

func newEnv(t testing.TB, files map[string]string) *env {
	t.Helper()
	dir := gittest.NewBare(t)
	e := &env{t: t, dir: dir, url: dir, clock: &clock{now: time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)}}
	if files != nil {
		e.commit(gittest.Edit{Write: files, Message: "initial fleet"})
	}
	e.c = e.newController()
	return e
}

// newController opens the repository by URL, as `gitfleet controller`
// does: the desired branch in full, the snapshots and status branches at
// depth 1, renewed every hour of the test clock.
func (e *env) newController() *Controller {
	e.t.Helper()
	c, err := New(Config{URL: e.url, Clock: e.clock.Now, Logger: quietLogger(), SummaryInterval: -1})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func (e *env) commit(ed gittest.Edit) string {
	e.t.Helper()
	return gittest.Commit(e.t, e.dir, ed)
}

// pass runs one pass and fails the test on a git error.
func (e *env) pass() PassResult {
	e.t.Helper()
	res, err := e.c.Pass(context.Background())
	if err != nil {
		e.t.Fatalf("pass: %v", err)
	}
	return res
}

// commitBroken commits a desired state that does not parse (web-01's
// YAML cut short) for the next pass to reject, and returns the commit.
func (e *env) commitBroken() string {
	e.t.Helper()
	return e.commit(gittest.Edit{Write: map[string]string{"vms/web-01.yaml": "kind: VM\nmetadata: {name: web-01\n"}, Message: "broken"})
}

// snapshot reads host's snapshot at the snapshots tip; nil when absent.
func (e *env) snapshot(host string) *snapshots.Snapshot {
	e.t.Helper()
	files := gittest.Files(e.t, e.dir, "refs/heads/"+DefaultSnapshotsBranch)
	found := false
	for _, f := range files {
		found = found || f == snapshots.Path(host)
	}
	if !found {
		return nil
	}
	s, err := snapshots.ParseSnapshot([]byte(gittest.Show(e.t, e.dir, "refs/heads/"+DefaultSnapshotsBranch, snapshots.Path(host)) + "\n"))
	if err != nil {
		e.t.Fatalf("snapshot of %s: %v", host, err)
	}
	return s
}

func (e *env) ledger() *snapshots.Ledger {
	e.t.Helper()
	l, err := snapshots.ParseLedger([]byte(gittest.Show(e.t, e.dir, "refs/heads/"+DefaultSnapshotsBranch, snapshots.LedgerPath) + "\n"))
	if err != nil {
		e.t.Fatal(err)
	}
	return l
}

func (e *env) snapshotsTip() string {
	return gittest.Rev(e.t, e.dir, "refs/heads/"+DefaultSnapshotsBranch)
}

// writeStatus plays an agent: it writes host's status file on its host
// branch with the agents' status.Writer, from its own repository clone.
func writeStatus(t testing.TB, url string, st *status.Status) {
	t.Helper()
	writeSignedStatus(t, url, st, nil)
}

// writeSignedStatus is writeStatus with each commit signed by signer (the
// agent's key; nil leaves it unsigned).
func writeSignedStatus(t testing.TB, url string, st *status.Status, signer gitsource.CommitSigner) {
	t.Helper()
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: url, Logger: quietLogger(),
		Committer: "agent " + st.Host + " <agent@" + st.Host + ">", UpdateAttempts: 50})
	if err != nil {
		t.Fatal(err)
	}
	if err := putSignedStatus(repo, st, signer); err != nil {
		t.Fatal(err)
	}
}

// putStatus writes st with the agents' status.Writer on repo, unsigned.
func putStatus(repo *gitsource.Repo, st *status.Status) error {
	return putSignedStatus(repo, st, nil)
}

// putSignedStatus is putStatus with each commit signed by signer.
func putSignedStatus(repo *gitsource.Repo, st *status.Status, signer gitsource.CommitSigner) error {
	w := &status.Writer{Repo: repo, Host: st.Host, Signer: signer}
	_, err := w.Write(context.Background(), st)
	return err
}

// writeOldStatus plays an agent of the old layout: it writes host's
// status file on the shared status branch.
func writeOldStatus(t testing.TB, url string, st *status.Status) {
	t.Helper()
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: url, Logger: quietLogger(), UpdateAttempts: 50})
	if err != nil {
		t.Fatal(err)
	}
	data, err := status.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	_, err = repo.Update(context.Background(), DefaultStatusBranch, func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
		return map[string][]byte{status.Path(st.Host): data}, "status of " + st.Host, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// writeTree writes files under dir and returns dir.
func writeTree(t testing.TB, dir string, files map[string]string) string {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// metricValue returns the sum of the counter or gauge series of the
// controller's registry whose labels include labels (name=value pairs):
// the value of the one series when labels name it, of every series when
// none are given.
func metricValue(t testing.TB, c *Controller, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := c.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || (lp.GetName() == labels[i] && lp.GetValue() == labels[i+1])
				}
				if !found {
					continue series
				}
			}
			if m.GetCounter() != nil {
				sum += m.GetCounter().GetValue()
			} else {
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}
