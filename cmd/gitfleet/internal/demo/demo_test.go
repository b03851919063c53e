package demo

import (
	"bytes"
	"context"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/internal/syncbuf"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent/qemu"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/internal/tinyguest"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func quietLog() *logrus.Entry {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return logrus.NewEntry(l)
}

// fakeGuest writes two small files standing for a kernel and an initramfs
// under dir and returns them as a Guest.
func fakeGuest(t *testing.T, dir string) Guest {
	t.Helper()
	k, i := filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd")
	require.NoError(t, os.WriteFile(k, []byte("kernel"), 0o644))
	require.NoError(t, os.WriteFile(i, []byte("initrd"), 0o644))
	ks, err := tinyguest.FileSHA256(k)
	require.NoError(t, err)
	is, err := tinyguest.FileSHA256(i)
	require.NoError(t, err)
	return Guest{Kernel: k, KernelSHA256: ks, Initrd: i, InitrdSHA256: is, Cmdline: "console=ttyS0"}
}

func writeFiles(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for p, data := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, data, 0o644))
	}
}

func TestFleetFilesValidate(t *testing.T) {
	g := fakeGuest(t, t.TempDir())
	dir := t.TempDir()
	writeFiles(t, dir, FleetFiles(g))

	f, err := desired.LoadDir(dir)
	require.NoError(t, err, "the demo fleet must validate")
	require.Len(t, f.Hosts, 1)
	require.Contains(t, f.Hosts, HostName)
	require.Len(t, f.VMs, len(VMNames))
	require.Len(t, f.Volumes, 1)
	assert.Equal(t, HostName, f.Volumes[VolumeName].Spec.Host)

	for i, name := range VMNames {
		t.Run(name, func(t *testing.T) {
			vm := f.VMs[name]
			require.NotNil(t, vm)
			s := vm.Spec
			assert.Equal(t, HostName, s.Host)
			assert.Equal(t, 1, s.VCPUs)
			assert.GreaterOrEqual(t, s.MemoryMB, 128)
			assert.LessOrEqual(t, s.MemoryMB, 256)
			assert.Equal(t, desired.PowerRunning, s.Power)
			require.NotNil(t, s.Kernel)
			require.NotNil(t, s.Kernel.Initrd)
			// The URLs name the files and the sums are theirs.
			for _, a := range []desired.Artifact{{URL: s.Kernel.URL, SHA256: s.Kernel.SHA256}, *s.Kernel.Initrd} {
				path, ok := strings.CutPrefix(a.URL, "file://")
				require.True(t, ok, a.URL)
				sum, err := tinyguest.FileSHA256(path)
				require.NoError(t, err)
				assert.Equal(t, sum, a.SHA256, a.URL)
			}
			require.NotNil(t, s.CloudInit)
			assert.True(t, strings.HasPrefix(s.CloudInit.UserData, "#cloud-config\n"))
			if i == 0 {
				assert.Equal(t, []string{VolumeName}, s.Volumes)
			} else {
				assert.Empty(t, s.Volumes)
			}
		})
	}

	// The edits the demo prints must keep the fleet valid.
	t.Run("printed edits", func(t *testing.T) {
		p := filepath.Join(dir, "vms", "hello-2.yaml")
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		third := strings.ReplaceAll(string(b), "hello-2", "hello-2-b")
		require.NoError(t, os.WriteFile(filepath.Join(dir, "vms", "hello-2-b.yaml"), []byte(third), 0o644))
		stopped := strings.Replace(string(b), "power: running", "power: stopped", 1)
		require.NotEqual(t, string(b), stopped, "the stop edit must change the file")
		require.NoError(t, os.WriteFile(p, []byte(stopped), 0o644))
		f, err := desired.LoadDir(dir)
		require.NoError(t, err)
		assert.Equal(t, desired.PowerStopped, f.VMs["hello-2"].Spec.Power)
		if assert.Contains(t, f.VMs, "hello-2-b") {
			assert.Equal(t, desired.PowerRunning, f.VMs["hello-2-b"].Spec.Power)
		}
	})
}

// TestFleetFilesGolden pins the files the demo commits, with fixed paths.
func TestFleetFilesGolden(t *testing.T) {
	g := Guest{Kernel: "/demo/images/vmlinuz", KernelSHA256: strings.Repeat("a", 64),
		Initrd: "/demo/images/initrd", InitrdSHA256: strings.Repeat("b", 64), Cmdline: "console=ttyS0 loglevel=4"}
	files := FleetFiles(g)
	var buf bytes.Buffer
	for _, p := range sortedKeys(files) {
		buf.WriteString("=== " + p + "\n")
		buf.Write(files[p])
	}
	golden := filepath.Join("testdata", "fleet.golden")
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(golden, buf.Bytes(), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err, "run go test -update to create it")
	assert.Equal(t, string(want), buf.String())
}

func sortedKeys(m map[string][]byte) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	for i := range keys {
		for j := i + 1; j < len(keys); j++ {
			if keys[j] < keys[i] {
				keys[i], keys[j] = keys[j], keys[i]
			}
		}
	}
	return keys
}

func TestSetupRepoCreatesThenResumes(t *testing.T) {
	gittest.NeedGit(t)
	ctx := context.Background()
	g := fakeGuest(t, t.TempDir())
	path := filepath.Join(t.TempDir(), "fleet.git")

	url, created, err := SetupRepo(ctx, path, FleetFiles(g), quietLog())
	require.NoError(t, err)
	assert.True(t, created)
	assert.Equal(t, "file://"+path, url)
	first := gittest.Rev(t, path, "main")
	assert.Equal(t, "refs/heads/main", gittest.Git(t, path, "symbolic-ref", "HEAD"), "a clone must check out main")

	// What is on main loads and validates, read through git.
	repo, err := gitsource.Open(ctx, gitsource.Options{URL: url, Logger: quietLog()})
	require.NoError(t, err)
	head, err := repo.Fetch(ctx, "main")
	require.NoError(t, err)
	tree, err := repo.Tree(head, "")
	require.NoError(t, err)
	f, err := desired.NewLoader("").Load(tree)
	require.NoError(t, err)
	assert.Len(t, f.VMs, 2)

	// Someone pushes; a second setup keeps their commit.
	edited := gittest.Commit(t, path, gittest.Edit{Remove: []string{"vms/hello-2.yaml"}, Message: "remove hello-2"})
	require.NotEqual(t, first, edited)
	_, created, err = SetupRepo(ctx, path, FleetFiles(g), quietLog())
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, edited, gittest.Rev(t, path, "main"))
}

func TestCheckToolsNamesTheMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	err := CheckTools()
	require.ErrorIs(t, err, ErrMissingTools)
	for _, want := range []string{"qemu-system-x86_64", "qemu-img", "make demo", "install-deps.sh"} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestConsoleFollowsTheSerialLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "serial.log")
	c := &console{path: path}
	assert.Empty(t, c.read(), "no log yet")

	appendTo := func(s string) {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		require.NoError(t, err)
		_, err = f.WriteString(s)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
	appendTo("SeaBIOS noise\r\ntinyguest: init 6.1.0\r\ntinyguest: see")
	assert.Equal(t, []string{"init 6.1.0"}, c.read(), "a partial line waits for its end")
	appendTo("d none\nkernel: something\n[   12.5] clocksource: unstabletinyguest: ready\n")
	assert.Equal(t, []string{"seed none", "ready"}, c.read())
	assert.Empty(t, c.read())

	// A second boot appends to the log: only its lines are new.
	appendTo("--- gitfleet: boot 2026-01-01T00:00:00Z ---\ntinyguest: init 6.1.1\n")
	assert.Equal(t, []string{"init 6.1.1"}, c.read())

	// A rotated log is read from the top.
	require.NoError(t, os.WriteFile(path, []byte("tinyguest: init 6.1.0\n"), 0o644))
	assert.Equal(t, []string{"init 6.1.0"}, c.read())
}

func TestWatcherSettled(t *testing.T) {
	ready := func(name string) status.VM { return status.VM{Name: name, Phase: status.PhaseReady, Power: "running"} }
	booting := func(name string) status.VM {
		return status.VM{Name: name, Phase: status.PhaseBooting, Power: "running"}
	}
	tests := []struct {
		name  string
		st    status.Status
		upFor time.Duration // how long ago the VMs' QEMU came up
		want  bool
	}{
		{"no VMs yet", status.Status{}, 0, false},
		{"one creating", status.Status{VMs: []status.VM{ready("a"), {Name: "b", Phase: status.PhaseCreating}}}, 0, false},
		{"one booting", status.Status{VMs: []status.VM{ready("a"), booting("b")}}, 0, false},
		{"one booting past the wait", status.Status{VMs: []status.VM{ready("a"), booting("b")}}, bootWait + time.Second, true},
		{"all ready", status.Status{VMs: []status.VM{ready("a"), ready("b")}}, 0, true},
		{"one stopped", status.Status{VMs: []status.VM{ready("a"), {Name: "b", Phase: status.PhaseStopped}}}, 0, true},
		{"one failed", status.Status{VMs: []status.VM{ready("a"), {Name: "b", Phase: status.PhaseFailed}}}, 0, false},
		{"one quarantined", status.Status{VMs: []status.VM{ready("a")}, Quarantined: []status.Quarantine{{Name: "b"}}}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWatcher(io.Discard, time.Now(), Layout{Dir: t.TempDir()})
			for _, vm := range tc.st.VMs {
				w.upAt[vm.Name] = time.Now().Add(-tc.upFor)
			}
			assert.Equal(t, tc.want, w.settled(&tc.st))
		})
	}
}

// qemuPid is the live QEMU of a demo VM, or 0.
func qemuPid(l Layout, vm string) int {
	b, err := os.ReadFile(filepath.Join(l.State(), "vms", vm, qemu.PidFile))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || syscall.Kill(pid, 0) != nil {
		return 0
	}
	return pid
}

// readStatus reads the demo host's status from its host branch in the
// bare repository, where the agent writes it.
func readStatus(t *testing.T, l Layout) *status.Status {
	t.Helper()
	out, err := gitShow(l.Repo(), status.HostBranch(HostName)+":"+status.Path(HostName))
	if err != nil {
		return nil
	}
	st, err := status.Parse(status.Path(HostName), []byte(out))
	require.NoError(t, err)
	return st
}

// gitShow prints rev (such as "branch:path") of the bare repository.
func gitShow(repo, rev string) (string, error) {
	out, err := exec.Command("git", "--git-dir", repo, "show", rev).Output()
	return string(out), err
}

func vmPhase(st *status.Status, name string) string {
	if vm := st.VM(name); vm != nil {
		return vm.Phase
	}
	return ""
}

// TestRunBootsTheFleetAppliesAPushAndResumes runs the demo with real QEMU:
// both VMs become ready and boot; a push that stops hello-2 lands while it
// runs; on exit the guests are shut down. A second run on the same
// directory resumes (the push is kept, hello-1 boots again) and, with Keep,
// leaves hello-1 running.
func TestRunBootsTheFleetAppliesAPushAndResumes(t *testing.T) {
	if err := CheckTools(); err != nil {
		t.Skip(err)
	}
	gittest.NeedGit(t)
	l := Layout{Dir: t.TempDir()}
	t.Cleanup(func() {
		for _, vm := range []string{"hello-1", "hello-2"} {
			if pid := qemuPid(l, vm); pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	cfg := Config{Dir: l.Dir, CacheDir: tinyguest.TestCacheDir(), Accel: os.Getenv("GITFLEET_TEST_ACCEL"),
		TickInterval: time.Second, PollInterval: 2 * time.Second, ControllerInterval: 2 * time.Second,
		Heartbeat: 5 * time.Second}

	// First run: settle, push "hello-2 stopped", see it land, stop.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out1 syncbuf.Buffer
	settled := make(chan *status.Status, 1)
	cfg.Out = &out1
	cfg.OnSettled = func(st *status.Status) { settled <- st }
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()

	var st *status.Status
	select {
	case st = <-settled:
	case err := <-done:
		t.Fatalf("demo ended before the fleet settled: %v\n%s", err, out1.String())
	case <-ctx.Done():
		t.Fatalf("the fleet did not settle:\n%s", out1.String())
	}
	for _, name := range VMNames {
		assert.Equal(t, status.PhaseReady, vmPhase(st, name), name)
		assert.NotZero(t, qemuPid(l, name), "%s runs", name)
	}
	vol, err := os.Stat(filepath.Join(l.State(), "volumes", VolumeName))
	require.NoError(t, err, "the volume is made")
	assert.Equal(t, int64(1<<30), vol.Size())

	b := []byte(gittest.Show(t, l.Repo(), "main", "vms/hello-2.yaml"))
	stop := gittest.Commit(t, l.Repo(), gittest.Edit{
		Write:   map[string]string{"vms/hello-2.yaml": strings.Replace(string(b), "power: running", "power: stopped", 1)},
		Message: "stop hello-2",
	})
	for vmPhase(readStatus(t, l), "hello-2") != status.PhaseStopped {
		select {
		case <-ctx.Done():
			t.Fatalf("hello-2 never reported stopped:\n%s", out1.String())
		case err := <-done:
			t.Fatalf("demo ended early: %v\n%s", err, out1.String())
		case <-time.After(500 * time.Millisecond):
		}
	}
	// The demo reads the ledger every 2 s and the status on its own clock:
	// wait for it to tell of the push and of the stop it caused.
	for _, line := range []string{"controller applied main at " + stop[:12], "hello-2    stopped"} {
		for !strings.Contains(out1.String(), line) {
			select {
			case <-ctx.Done():
				t.Fatalf("the demo never printed %q:\n%s", line, out1.String())
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	cancel()
	require.NoError(t, <-done)
	text := out1.String()
	t.Logf("first run:\n%s", text)
	for _, want := range []string{
		"with the demo fleet committed to main",
		"The fleet is up after",
		"hello-1    console     ready: the guest has booted",
		"hello-2    console     ready: the guest has booted",
		"hello-1    booting     running  QEMU up, the guest boots; ssh forward 127.0.0.1:",
		"hello-1    ready       running  the guest answered, ",
		"hello-2    stopped",
		"controller applied main at " + stop[:12] + ": snapshot published for demo (epoch 2)",
		": 2 guests ready.",
		"git clone " + RepoURL(l.Repo()),
		"status --repo " + RepoURL(l.Repo()),
		filepath.Join(l.State(), "vms", "hello-1", qemu.SerialLog),
		"The VMs are shut down",
		"rm -rf " + l.Dir,
	} {
		assert.Contains(t, text, want)
	}
	// The agent stops hello-2 only after the controller published the
	// push: the lines come in that order.
	applied := strings.Index(text, "controller applied main at "+stop[:12])
	stopped := strings.Index(text, "hello-2    stopped")
	assert.True(t, applied >= 0 && stopped > applied, "the applied line comes before the stop it caused")
	for _, name := range VMNames {
		assert.Zero(t, qemuPid(l, name), "%s is shut down on exit", name)
	}
	assert.FileExists(t, filepath.Join(l.State(), "vms", "hello-1", qemu.RootDiskFile), "disks stay")
	if t.Failed() {
		logs, _ := os.ReadFile(l.Log())
		t.Logf("output:\n%s\nlogs:\n%s", text, logs)
		return
	}

	// Second run: resume, keep.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel2()
	var out2 syncbuf.Buffer
	cfg.Out, cfg.Keep = &out2, true
	cfg.OnSettled = func(st *status.Status) {
		assert.Equal(t, status.PhaseReady, vmPhase(st, "hello-1"))
		assert.Equal(t, status.PhaseStopped, vmPhase(st, "hello-2"))
		cancel2()
	}
	require.NoError(t, Run(ctx2, cfg))
	text = out2.String()
	t.Logf("second run:\n%s", text)
	assert.Contains(t, text, "resumed")
	assert.Contains(t, text, "snapshots: main at "+stop[:12]+", applied by the last run; published for demo (epoch 2)")
	assert.Contains(t, text, "The fleet is up after")
	assert.Contains(t, text, "The VMs keep running (--keep)")
	assert.NotContains(t, text, "snapshot published", "a resume publishes nothing new")
	assert.NotContains(t, text, "controller applied", "nothing was pushed since the last run")
	assert.NotZero(t, qemuPid(l, "hello-1"), "hello-1 keeps running with Keep")
	assert.Zero(t, qemuPid(l, "hello-2"))
	if t.Failed() {
		t.Logf("output:\n%s", text)
		return
	}

	// Third run: hello-1 is re-attached, its old console is not replayed
	// and its boot counts (it settles without waiting for a new one).
	// Then hello-2's file is deleted: the demo tells the delete from its
	// publish to its finalization, each line after its cause.
	ctx3, cancel3 := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel3()
	var out3 syncbuf.Buffer
	cfg.Out, cfg.Keep, cfg.TombstoneGrace = &out3, false, time.Second
	settled3 := make(chan struct{})
	cfg.OnSettled = func(*status.Status) { close(settled3) }
	done3 := make(chan error, 1)
	go func() { done3 <- Run(ctx3, cfg) }()
	select {
	case <-settled3:
	case err := <-done3:
		t.Fatalf("demo ended before the fleet settled: %v\n%s", err, out3.String())
	}
	del := gittest.Commit(t, l.Repo(), gittest.Edit{Remove: []string{"vms/hello-2.yaml"}, Message: "delete hello-2"})
	finalized := "controller finalized the delete of VM hello-2 on demo: the agent destroyed it"
	for !strings.Contains(out3.String(), finalized) {
		select {
		case <-ctx3.Done():
			t.Fatalf("the demo never said the delete was finalized:\n%s", out3.String())
		case err := <-done3:
			t.Fatalf("demo ended early: %v\n%s", err, out3.String())
		case <-time.After(200 * time.Millisecond):
		}
	}
	cancel3()
	require.NoError(t, <-done3)
	text = out3.String()
	t.Logf("third run:\n%s", text)
	assert.Contains(t, text, "hello-1    ready       running  QEMU was already running: re-attached")
	assert.Contains(t, text, ": 1 guest ready, 1 VM stopped.")
	assert.NotContains(t, text, "hello-1    console", "an old boot's console lines are not replayed")
	order := []string{
		"controller applied main at " + del[:12] + ": snapshot published for demo (epoch 3)",
		"controller published the delete of VM hello-2 on demo (removed by " + del[:12] + ")",
		"hello-2    quarantined stopped  no longer in the desired state (its file deleted, or the VM renamed)",
		"hello-2    destroyed",
		finalized,
	}
	last := -1
	for _, want := range order {
		i := strings.Index(text, want)
		assert.Greater(t, i, last, "%q comes after the line before it", want)
		last = i
	}
	assert.Zero(t, qemuPid(l, "hello-1"), "shut down without Keep")
}

// TestRunRefusesASecondDemoOnOneDirectory pins the directory lock.
func TestRunRefusesASecondDemoOnOneDirectory(t *testing.T) {
	if err := CheckTools(); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	unlock, err := lockDir(dir)
	require.NoError(t, err)
	defer unlock()
	err = Run(context.Background(), Config{Dir: dir, CacheDir: t.TempDir(), Out: io.Discard})
	require.ErrorIs(t, err, ErrBusy)
}

// TestLedgerWatchSaysWhatTheControllerDid follows the ledger through a
// fleet's life: a snapshot is said to be published only when a host's
// epoch moved; an applied commit that changed no snapshot (a revert) is
// said to be ledger-only; deletes are told when published, finalized,
// swept or cancelled.
func TestLedgerWatchSaysWhatTheControllerDid(t *testing.T) {
	at := time.Date(2026, 11, 30, 4, 0, 0, 0, time.UTC)
	applied := func(commit string) *snapshots.AppliedCommit {
		return &snapshots.AppliedCommit{Commit: desired.Hash(commit), Branch: "main"}
	}
	hosts := func(epoch uint64, vms ...string) map[string]*snapshots.HostRecord {
		return map[string]*snapshots.HostRecord{"demo": {Epoch: epoch, VMs: vms}}
	}
	tomb := func(name, commit string) *snapshots.TombstoneRecord {
		return &snapshots.TombstoneRecord{Kind: desired.KindVM, Name: name, Host: "demo", Tombstone: snapshots.Tombstone{Commit: desired.Hash(commit)}}
	}
	lw := &ledgerWatch{}
	steps := []struct {
		name   string
		ledger snapshots.Ledger
		want   []string
	}{
		{"nothing yet", snapshots.Ledger{}, nil},
		{"first apply", snapshots.Ledger{Applied: applied("aaaaaaaaaaaaaaaa"), Hosts: hosts(1, "a", "b")},
			[]string{"controller applied main at aaaaaaaaaaaa: snapshot published for demo (epoch 1)"}},
		{"same again", snapshots.Ledger{Applied: applied("aaaaaaaaaaaaaaaa"), Hosts: hosts(1, "a", "b")}, nil},
		{"a bad push", snapshots.Ledger{Applied: applied("aaaaaaaaaaaaaaaa"), Hosts: hosts(1, "a", "b"),
			Rejected: &snapshots.Rejection{Commit: "bbbbbbbbbbbbbbbb", Reason: "vms/x.yaml:3:1: bad", At: at}},
			[]string{"controller REJECTED bbbbbbbbbbbb; the last good state stays. Fix it and push again:\n           vms/x.yaml:3:1: bad"}},
		{"its revert changes no snapshot", snapshots.Ledger{Applied: applied("cccccccccccccccc"), Hosts: hosts(1, "a", "b"),
			Rejected: &snapshots.Rejection{Commit: "bbbbbbbbbbbbbbbb", Reason: "vms/x.yaml:3:1: bad", At: at, Superseded: "cccccccccccccccc"}},
			[]string{"controller applied main at cccccccccccc: no host's snapshot changed, only the ledger records the commit"}},
		{"a delete", snapshots.Ledger{Applied: applied("dddddddddddddddd"), Hosts: hosts(2, "a"), Tombstones: []*snapshots.TombstoneRecord{tomb("b", "dddddddddddddddd")}},
			[]string{"controller applied main at dddddddddddd: snapshot published for demo (epoch 2)",
				"controller published the delete of VM b on demo (removed by dddddddddddd): shut down now, destroyed after the agent's grace"}},
		{"the agent acked it", snapshots.Ledger{Applied: applied("dddddddddddddddd"), Hosts: hosts(3, "a")},
			[]string{"controller finalized the delete of VM b on demo: the agent destroyed it", "controller: snapshot published for demo (epoch 3)"}},
		{"another delete", snapshots.Ledger{Applied: applied("eeeeeeeeeeeeeeee"), Hosts: hosts(4), Tombstones: []*snapshots.TombstoneRecord{tomb("a", "eeeeeeeeeeeeeeee")}},
			[]string{"controller applied main at eeeeeeeeeeee: snapshot published for demo (epoch 4)",
				"controller published the delete of VM a on demo (removed by eeeeeeeeeeee): shut down now, destroyed after the agent's grace"}},
		{"undone by a push", snapshots.Ledger{Applied: applied("ffffffffffffffff"), Hosts: hosts(5, "a")},
			[]string{"controller applied main at ffffffffffff: snapshot published for demo (epoch 5)",
				"controller cancelled the delete of VM a on demo: its file is back"}},
		{"a third delete", snapshots.Ledger{Applied: applied("1111111111111111"), Hosts: hosts(6), Tombstones: []*snapshots.TombstoneRecord{tomb("a", "1111111111111111")}},
			[]string{"controller applied main at 111111111111: snapshot published for demo (epoch 6)",
				"controller published the delete of VM a on demo (removed by 111111111111): shut down now, destroyed after the agent's grace"}},
		{"swept while the host was offline", snapshots.Ledger{Applied: applied("1111111111111111"), Hosts: hosts(7),
			Sweeps: []snapshots.SweepRecord{{Kind: desired.KindVM, Name: "a", Host: "demo", Reason: "host offline past the abandon grace"}}},
			[]string{"controller finalized the delete of VM a on demo itself: host offline past the abandon grace",
				"controller: snapshot published for demo (epoch 7)"}},
		{"a ledger-only commit", snapshots.Ledger{Applied: applied("1111111111111111"), Hosts: hosts(7),
			Sweeps: []snapshots.SweepRecord{{Kind: desired.KindVM, Name: "a", Host: "demo", Reason: "host offline past the abandon grace"}}}, nil},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			assert.Equal(t, step.want, lw.changes(&step.ledger))
		})
	}
}

// TestLedgerWatchDue pins when the ledger is read at once: the agent took
// an epoch the ledger has not told of, once per such epoch.
func TestLedgerWatchDue(t *testing.T) {
	lw := &ledgerWatch{}
	assert.False(t, lw.due("demo", 0), "no snapshot yet")
	assert.True(t, lw.due("demo", 1))
	assert.False(t, lw.due("demo", 1), "once per epoch, even if the read failed")
	lw.changes(&snapshots.Ledger{Applied: &snapshots.AppliedCommit{Commit: "a", Branch: "main"}, Hosts: map[string]*snapshots.HostRecord{"demo": {Epoch: 2}}})
	assert.False(t, lw.due("demo", 2), "the ledger told of epoch 2")
	assert.True(t, lw.due("demo", 3))
}

// TestWatcherPrintsEachChangeOnce follows one VM from creation to its
// delete: a line per change, nothing for a status that did not change.
func TestWatcherPrintsEachChangeOnce(t *testing.T) {
	var out bytes.Buffer
	w := newWatcher(&out, time.Now(), Layout{Dir: t.TempDir()})
	vm := func(phase, power, ssh, lastError string) *status.Status {
		return &status.Status{VMs: []status.VM{{Name: "hello-1", Phase: phase, Power: power, SSH: ssh, LastError: lastError}}}
	}
	steps := []struct {
		st   *status.Status
		want string // the line printed, without its time stamp; "" for none
	}{
		{vm(status.PhaseCreating, "stopped", "", ""), "hello-1    creating"},
		{vm(status.PhaseCreating, "stopped", "", ""), ""},
		{withMessage(vm(status.PhaseCreating, "stopped", "", ""), "image 1 of 3 MB"), ""}, // too soon after the last line
		{withMessage(vm(status.PhaseCreating, "stopped", "", ""), "image 2 of 3 MB"), "hello-1    creating             image 2 of 3 MB"},
		{vm(status.PhaseBooting, "running", "127.0.0.1:2201", ""), "hello-1    booting     running  QEMU up, the guest boots; ssh forward 127.0.0.1:2201"},
		{vm(status.PhaseBooting, "running", "127.0.0.1:2201", ""), ""},
		{vm(status.PhaseReady, "running", "127.0.0.1:2201", ""), "hello-1    ready       running  the guest answered, 0.0s after QEMU came up; ssh forward 127.0.0.1:2201"},
		{vm(status.PhaseReady, "running", "127.0.0.1:2201", ""), ""},
		{vm(status.PhaseFailed, "stopped", "", "boot: qemu exited"), "hello-1    failed      stopped  error: boot: qemu exited"},
		{vm(status.PhaseStopped, "stopped", "", ""), "hello-1    stopped     stopped"},
		{&status.Status{Vanished: []status.Vanished{{Name: "hello-1", Power: "stopped", Reason: "absent from the snapshot"}}},
			"hello-1    vanished    stopped  absent from the snapshot"},
		{&status.Status{Vanished: []status.Vanished{{Name: "hello-1", Power: "stopped", Reason: "absent from the snapshot"}}}, ""},
		{&status.Status{Quarantined: []status.Quarantine{{Name: "hello-1"}}},
			"hello-1    quarantined stopped  no longer in the desired state (its file deleted, or the VM renamed): shut down, destroyed after the grace"},
		{&status.Status{Quarantined: []status.Quarantine{{Name: "hello-1"}}}, ""},
		{&status.Status{Destroyed: []string{"hello-1"}},
			"hello-1    destroyed: its disks are removed; volumes stay until their own file is deleted"},
		{&status.Status{}, ""},
	}
	for i, step := range steps {
		out.Reset()
		if strings.Contains(step.want, "image 2") {
			w.msgAt["hello-1"] = time.Now().Add(-progressEvery) // as if 5 s passed
		}
		w.observe(step.st)
		got := out.String()
		if step.want == "" {
			assert.Empty(t, got, "step %d", i)
			continue
		}
		_, line, ok := strings.Cut(strings.TrimSuffix(got, "\n"), "] ")
		assert.True(t, ok && strings.HasPrefix(got, "["), "step %d: time stamp in %q", i, got)
		assert.Equal(t, step.want, line, "step %d", i)
	}
}

func withMessage(st *status.Status, msg string) *status.Status {
	st.VMs[0].Message = msg
	return st
}

// TestWatcherLinesAlign pins that every phase, "quarantined" and
// "vanished" included, leaves the power and detail columns where they are.
func TestWatcherLinesAlign(t *testing.T) {
	var out bytes.Buffer
	w := newWatcher(&out, time.Now(), Layout{Dir: t.TempDir()})
	w.observe(&status.Status{VMs: []status.VM{{Name: "a", Phase: status.PhaseStopped, Power: "stopped", Message: "by its spec"}}})
	w.observe(&status.Status{
		Quarantined: []status.Quarantine{{Name: "a"}},
		Vanished:    []status.Vanished{{Name: "b", Power: "running", Reason: "kept"}},
	})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 3, out.String())
	// name (10) + space + phase (11) + space: the power column at 23.
	for _, l := range lines {
		_, rest, _ := strings.Cut(l, "] ")
		require.Greater(t, len(rest), 23, l)
		power := rest[23:]
		assert.True(t, strings.HasPrefix(power, "stopped  ") || strings.HasPrefix(power, "running  "), "power column in %q", l)
		assert.Equal(t, byte(' '), rest[22], "the phase fits its column in %q", l)
	}
}

// TestWatcherReattachDoesNotReplayTheConsole pins that a VM whose QEMU
// ran before the demo started is followed from its log's end: its old
// lines are not printed as new, its earlier boot counts, and what the
// guest prints next is shown.
func TestWatcherReattachDoesNotReplayTheConsole(t *testing.T) {
	l := Layout{Dir: t.TempDir()}
	logs := map[string]string{}
	for _, name := range []string{"old", "new"} {
		dir := filepath.Join(l.State(), "vms", name)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		logs[name] = filepath.Join(dir, qemu.SerialLog)
		require.NoError(t, os.WriteFile(logs[name], []byte("tinyguest: init 6.1.0\ntinyguest: ready\n"), 0o644))
	}
	var out bytes.Buffer
	w := newWatcher(&out, time.Now(), l)
	w.attached = map[string]bool{"old": true}
	st := &status.Status{VMs: []status.VM{
		{Name: "new", Phase: status.PhaseBooting, Power: "running"},
		{Name: "old", Phase: status.PhaseReady, Power: "running"},
	}}
	w.observe(st)
	text := out.String()
	assert.Contains(t, text, "old        ready       running  QEMU was already running: re-attached")
	assert.NotContains(t, text, "old        console")
	assert.Contains(t, text, "new        booting     running  QEMU up, the guest boots")
	assert.Contains(t, text, "new        console     init 6.1.0")
	assert.Contains(t, text, "new        console     ready: the guest has booted")
	assert.False(t, w.settled(st), "new's guest has not answered yet")
	st.VMs[0].Phase = status.PhaseReady
	w.observe(st)
	assert.Contains(t, out.String(), "new        ready       running  the guest answered, ")
	assert.True(t, w.settled(st))
	assert.Equal(t, "2 guests ready", w.upSummary(st))

	out.Reset()
	f, err := os.OpenFile(logs["old"], os.O_APPEND|os.O_WRONLY, 0o644)
	require.NoError(t, err)
	_, err = f.WriteString("tinyguest: power button\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	out.Reset()
	w.observe(st)
	assert.Contains(t, out.String(), "old        console     power button")
	assert.Equal(t, 1, strings.Count(out.String(), "\n"), out.String())
}

func TestUpSummary(t *testing.T) {
	w := newWatcher(io.Discard, time.Now(), Layout{Dir: t.TempDir()})
	st := &status.Status{VMs: []status.VM{
		{Name: "a", Phase: status.PhaseReady},
		{Name: "b", Phase: status.PhaseBooting},
		{Name: "c", Phase: status.PhaseStopped},
	}}
	assert.Equal(t, "1 guest ready, QEMU runs b but the guest has not answered within 2m0s, 1 VM stopped", w.upSummary(st))
}

func TestDefaultCacheDir(t *testing.T) {
	withKernel := func(dir string) {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "kernel"), 0o755))
	}
	tests := []struct {
		name        string
		own, test   bool
		wantTestDir bool
	}{
		{"neither has a kernel", false, false, false},
		{"only the test cache has one", false, true, true},
		{"both have one", true, true, false},
		{"only its own has one", true, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			t.Setenv("XDG_CACHE_HOME", base)
			own, test := filepath.Join(base, "gitfleet", "tinyguest"), filepath.Join(base, "gitfleet-test", "tinyguest")
			if tc.own {
				withKernel(own)
			}
			if tc.test {
				withKernel(test)
			}
			want := own
			if tc.wantTestDir {
				want = test
			}
			assert.Equal(t, want, DefaultCacheDir())
		})
	}
}

// A console made for a guest that just booted starts at its boot's marker:
// the log keeps earlier runs' boots (a "0.0s after QEMU started" line, an
// old power-button line), which are not this boot's.
func TestConsoleStartsAtTheCurrentBoot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "serial.log")
	old := "--- gitfleet: boot 2026-01-01T00:00:00Z ---\ntinyguest: init 6.1.0\ntinyguest: power button\n"
	require.NoError(t, os.WriteFile(path, []byte(old+"--- gitfleet: boot 2026-01-02T00:00:00Z ---\ntinyguest: init 6.1.1\n"), 0o644))
	c := &console{path: path}
	c.fromLastBoot()
	assert.Equal(t, []string{"init 6.1.1"}, c.read(), "only the current boot's lines")

	require.NoError(t, os.WriteFile(path, []byte("tinyguest: init 6.1.0\n"), 0o644))
	c.fromLastBoot()
	assert.Equal(t, []string{"init 6.1.0"}, c.read(), "a log without a marker is read from the top")
}

// "Up" is timed from the guests' readiness: a fleet that settles later
// (it waited for a destroy) was up when its last guest answered.
func TestUpIsTimedFromTheGuestsReadiness(t *testing.T) {
	start := time.Now().Add(-20 * time.Second)
	w := newWatcher(io.Discard, start, Layout{})
	w.phaseChanged(status.VM{Name: "a", Phase: status.PhaseReady, Power: "running"}, status.VM{Name: "a", Phase: status.PhaseBooting})
	assert.False(t, w.readyAt["a"].IsZero(), "becoming ready is recorded")
	w.readyAt["a"] = start.Add(6 * time.Second)
	w.readyAt["b"] = start.Add(5 * time.Second)
	st := &status.Status{VMs: []status.VM{{Name: "a", Phase: status.PhaseReady}, {Name: "b", Phase: status.PhaseReady}}}
	assert.Equal(t, 6*time.Second, w.upAfter(st, time.Now()))
	none := &status.Status{VMs: []status.VM{{Name: "c", Phase: status.PhaseStopped}}}
	assert.Equal(t, 20*time.Second, w.upAfter(none, start.Add(20*time.Second)))
}

// The printed hints name the fleet as it is: after hello-2 was renamed
// web-9, the edits the demo prints are web-9's.
func TestHintsFollowTheCurrentFleet(t *testing.T) {
	var b strings.Builder
	st := &status.Status{VMs: []status.VM{{Name: "hello-1", Power: "running"}, {Name: "web-9", Power: "running"}}}
	printSummary(&b, Config{Command: "gitfleet"}, Layout{}, "file:///tmp/demo.git", st)
	out := b.String()
	assert.Contains(t, out, "sed 's/web-9/web-9-b/g' vms/web-9.yaml > vms/web-9-b.yaml")
	assert.Contains(t, out, "# stop web-9")
	assert.NotContains(t, out, "hello-2")
}
