package fleet

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

func loadFiles(t *testing.T, files map[string]string) *desired.Fleet {
	t.Helper()
	dir := t.TempDir()
	w := writeTree(t, dir, files)
	f, err := desired.LoadDir(w)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestBuildSnapshotsRoundTrip pins the snapshot builder on live objects:
// one snapshot per host, also a host with nothing on it (a real, empty
// desired state), VMs and volumes sorted by name with their spec hashes and
// sizes, the Host's spec, and bytes that parse back to the same snapshot.
func TestBuildSnapshotsRoundTrip(t *testing.T) {
	files := baseFleet()
	files["vms/web-02.yaml"] = vmYAML("web-02", "hv-a", 3)
	files["hosts/hv-c.yaml"] = hostYAML("hv-c")
	f := loadFiles(t, files)
	snaps := buildSnapshots(f, nil, func(vm *desired.VM) desired.Hash { return desired.SpecHash(vm.Spec) }, true)
	if len(snaps) != 3 || snaps["hv-c"] == nil || len(snaps["hv-c"].snap.VMs) != 0 {
		t.Fatalf("got %d snapshots, want one per host (3), hv-c empty", len(snaps))
	}
	a := snaps["hv-a"].snap
	if len(a.VMs) != 2 || a.VMs[0].Name != "web-01" || a.VMs[1].Name != "web-02" {
		t.Fatalf("hv-a VMs = %+v, want web-01, web-02 in order", a.VMs)
	}
	if a.VMs[1].SpecHash != desired.SpecHash(f.VMs["web-02"].Spec) || !reflect.DeepEqual(a.VMs[1].Spec, f.VMs["web-02"].Spec) {
		t.Errorf("web-02 = %+v", a.VMs[1])
	}
	if b := snaps["hv-b"].snap; len(b.Volumes) != 1 || b.Volumes[0] != (snapshots.SnapshotVolume{Name: "db-data", SizeGB: 50}) {
		t.Errorf("hv-b volumes = %+v", b.Volumes)
	}
	if a.HostSpec.Capacity == nil || a.HostSpec.Capacity.VCPUs != 32 {
		t.Errorf("hv-a hostSpec = %+v", a.HostSpec)
	}
	for _, s := range snaps {
		s.snap.Epoch, s.snap.Source = 7, snapshots.SnapshotSource{Commit: "0123abcd", Branch: "main"}
		data, err := snapshots.MarshalSnapshot(s.snap)
		if err != nil {
			t.Fatal(err)
		}
		back, err := snapshots.ParseSnapshot(data)
		if err != nil {
			t.Fatalf("ParseSnapshot(MarshalSnapshot(%s)): %v\n%s", s.snap.Host, err, data)
		}
		if !reflect.DeepEqual(back, s.snap) {
			t.Errorf("round trip of %s:\n got %+v\nwant %+v", s.snap.Host, back, s.snap)
		}
	}
}

func TestContentKeyIgnoresEpochAndSource(t *testing.T) {
	f := loadFiles(t, baseFleet())
	hash := func(vm *desired.VM) desired.Hash { return desired.SpecHash(vm.Spec) }
	a := buildSnapshots(f, nil, hash, false)["hv-a"].snap
	k := contentKey(a)
	a.Epoch, a.Source = 9, snapshots.SnapshotSource{Commit: "x", Branch: "y"}
	if contentKey(a) != k {
		t.Error("epoch or source changed the content key")
	}
	tomb := &snapshots.TombstoneRecord{Kind: desired.KindVM, Name: "gone", Host: "hv-a", Tombstone: snapshots.Tombstone{Commit: "c", Epoch: 0}}
	b := buildSnapshots(f, []*snapshots.TombstoneRecord{tomb}, hash, false)["hv-a"].snap
	kb := contentKey(b)
	if kb == k {
		t.Error("a tombstone did not change the content key")
	}
	tomb.Tombstone.Epoch = 7
	if contentKey(buildSnapshots(f, []*snapshots.TombstoneRecord{tomb}, hash, false)["hv-a"].snap) != kb {
		t.Error("a tombstone's publishing epoch changed the content key")
	}
}

func TestAckedEpochRule(t *testing.T) {
	vm := &snapshots.TombstoneRecord{Kind: desired.KindVM, Name: "old", Host: "h", Tombstone: snapshots.Tombstone{Epoch: 5}}
	vol := &snapshots.TombstoneRecord{Kind: desired.KindVolume, Name: "data", Host: "h", Tombstone: snapshots.Tombstone{Epoch: 5}}
	for _, tc := range []struct {
		name string
		t    *snapshots.TombstoneRecord
		st   status.Status
		want bool
	}{
		{"fresh destroy ack", vm, status.Status{LastSeenEpoch: 5, Destroyed: []string{"old"}}, true},
		{"later epoch", vm, status.Status{LastSeenEpoch: 9, Destroyed: []string{"old"}}, true},
		{"stale ack", vm, status.Status{LastSeenEpoch: 4, Destroyed: []string{"old"}}, false},
		{"no ack", vm, status.Status{LastSeenEpoch: 9, Destroyed: []string{"other"}}, false},
		{"quarantined is no ack", vm, status.Status{LastSeenEpoch: 9, Quarantined: []status.Quarantine{{Name: "old"}}}, false},
		{"volume absent", vol, status.Status{LastSeenEpoch: 5, Volumes: []status.Volume{{Name: "data", Present: false}}}, true},
		{"volume present", vol, status.Status{LastSeenEpoch: 5, Volumes: []status.Volume{{Name: "data", Present: true}}}, false},
		{"volume unlisted", vol, status.Status{LastSeenEpoch: 5}, false},
		{"volume stale", vol, status.Status{LastSeenEpoch: 4, Volumes: []status.Volume{{Name: "data"}}}, false},
		{"volume name in destroyed", vol, status.Status{LastSeenEpoch: 5, Destroyed: []string{"data"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := acked(&tc.st, tc.t); got != tc.want {
				t.Errorf("acked = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestLivenessByOwnClock(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newLiveness(start, 3*time.Minute)
	if off, _ := l.offline("never-seen", start.Add(2*time.Minute)); off {
		t.Error("an unseen host is offline before offlineAfter from the start")
	}
	if off, _ := l.offline("never-seen", start.Add(3*time.Minute)); !off {
		t.Error("an unseen host is still online after offlineAfter")
	}
	l.observe("h", "id1", start)
	l.observe("h", "id1", start.Add(2*time.Minute)) // same content: no change
	if off, _ := l.offline("h", start.Add(3*time.Minute)); !off {
		t.Error("an unchanged file kept the host online")
	}
	l.observe("h", "id2", start.Add(3*time.Minute))
	if off, _ := l.offline("h", start.Add(5*time.Minute)); off {
		t.Error("a changed file did not reset the clock")
	}
}

// A host whose status alternates between two files (an unsigned agent's
// two heartbeat commits) looks unchanged to a controller that missed an
// even number of its writes: after a gap in reading longer than a third
// of offlineAfter its clock starts again, so it is never judged offline
// on a gap. A host whose file never went back keeps its clock, and every
// host is judged again once the reads come often.
func TestLivenessAfterAGapInReading(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newLiveness(start, 3*time.Minute)
	at := func(d time.Duration) time.Time { return start.Add(d) }
	for i, id := range []string{"a", "b", "a"} { // toggles, read every minute
		l.look(at(time.Duration(i) * time.Minute))
		l.observe("toggler", id, at(time.Duration(i)*time.Minute))
		l.observe("silent", "s", at(time.Duration(i)*time.Minute))
	}
	// The controller reads nothing for four minutes (the git server was
	// down): the toggler wrote four times and shows "a" again.
	l.look(at(6 * time.Minute))
	l.observe("toggler", "a", at(6*time.Minute))
	l.observe("silent", "s", at(6*time.Minute))
	if off, _ := l.offline("toggler", at(6*time.Minute)); off {
		t.Error("an alternating host was judged offline on what a gap in reading hid")
	}
	if off, _ := l.offline("silent", at(6*time.Minute)); !off {
		t.Error("a host whose file never changed was not judged offline")
	}
	// Read every minute again: a toggler that really stopped goes offline
	// offlineAfter after the gap.
	for m := 7; m <= 9; m++ {
		l.look(at(time.Duration(m) * time.Minute))
		l.observe("toggler", "a", at(time.Duration(m)*time.Minute))
	}
	if off, _ := l.offline("toggler", at(9*time.Minute)); !off {
		t.Error("an alternating host that stopped stayed online while the controller watched it")
	}
}

// A status signed by the host's agentKey is a heartbeat only with a
// number above every one seen signed: an older signed commit replayed
// is none.
func TestLivenessSignedHeartbeatMustGrow(t *testing.T) {
	l := newLiveness(time.Now(), 3*time.Minute)
	for _, tc := range []struct {
		hb   uint64
		want bool
	}{{5, true}, {6, true}, {6, false}, {4, false}, {7, true}} {
		if got := l.fresh("h", tc.hb); got != tc.want {
			t.Errorf("fresh(%d) = %v, want %v", tc.hb, got, tc.want)
		}
	}
}

// TestRunKickedByWebhook runs the loop against a repository served over
// HTTP (no file watching) with a long interval: only the signed webhook can
// start the pass that publishes a new commit.
func TestRunKickedByWebhook(t *testing.T) {
	dir := gittest.NewBare(t)
	url := gittest.Serve(t, strings.TrimSuffix(dir, "/repo.git")) + "/repo.git"
	gittest.Commit(t, dir, gittest.Edit{Write: baseFleet()})
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: url, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{Repo: repo, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, time.Hour) }()
	defer func() {
		cancel()
		<-done
	}()
	e := &env{t: t, dir: dir}
	waitFor(t, func() bool { return hasBranch(t, dir, DefaultSnapshotsBranch) && e.snapshot("hv-a") != nil })
	gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"vms/web-01.yaml": vmYAML("web-01", "hv-a", 8)}})

	hook := httptest.NewServer(WebhookHandler([]byte("k"), c.Kick))
	defer hook.Close()
	body := `{"ref":"refs/heads/main"}`
	m := hmac.New(sha256.New, []byte("k"))
	m.Write([]byte(body))
	req, _ := http.NewRequest("POST", hook.URL+"/hooks/github", strings.NewReader(body))
	req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(m.Sum(nil)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("webhook status %d", resp.StatusCode)
	}
	waitFor(t, func() bool { return e.snapshot("hv-a").VM("web-01").Spec.VCPUs == 8 })
}

func hasBranch(t *testing.T, dir, branch string) bool {
	return strings.Contains(gittest.Git(t, dir, "branch", "--list", branch), branch)
}

// waitFor polls cond until it holds; a generous deadline only guards
// against hanging forever.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition never held")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRunReactsToLocalCommit runs the loop on a local repository with a long
// interval: the commit is noticed through the repository's refs at once.
func TestRunReactsToLocalCommit(t *testing.T) {
	e := newEnv(t, baseFleet())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.c.Run(ctx, time.Hour) }()
	defer func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	}()
	waitFor(t, func() bool { return hasBranch(t, e.dir, DefaultSnapshotsBranch) && e.snapshot("hv-a") != nil })
	e.commit(gittest.Edit{Write: map[string]string{"vms/web-01.yaml": vmYAML("web-01", "hv-a", 6)}})
	waitFor(t, func() bool { return e.snapshot("hv-a").VM("web-01").Spec.VCPUs == 6 })
}

func TestMissing(t *testing.T) {
	for _, tc := range []struct {
		had, now, want []string
	}{
		{nil, []string{"a"}, nil},
		{[]string{"a", "b", "c"}, []string{"a", "c"}, []string{"b"}},
		{[]string{"a", "b"}, nil, []string{"a", "b"}},
		{[]string{"b", "d"}, []string{"a", "c", "e"}, []string{"b", "d"}},
		{[]string{"a", "z"}, []string{"a", "m", "z"}, nil},
	} {
		got := missing(tc.had, len(tc.now), func(i int) string { return tc.now[i] })
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("missing(%v, %v) = %v, want %v", tc.had, tc.now, got, tc.want)
		}
	}
}

// TestRunSleepsThroughItsOwnStatusWrite runs the loop on a local
// repository with a long interval: the summary the controller writes after
// a publish moves the status branch, and that starts no pass of its own;
// a write by anyone else (an agent of the old layout) does.
func TestRunSleepsThroughItsOwnStatusWrite(t *testing.T) {
	e := newEnv(t, baseFleet())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.c.Run(ctx, time.Hour) }()
	defer func() {
		cancel()
		<-done
	}()
	waitFor(t, func() bool { return hasBranch(t, e.dir, DefaultStatusBranch) })
	passes := func() float64 { return metricValue(t, e.c, "gitfleet_controller_passes_total") }
	// Past the status gap, twice over: a pass woken by a write would have
	// run by then.
	time.Sleep(2 * statusGap)
	settled := passes()
	e.commit(gittest.Edit{Write: map[string]string{"vms/web-01.yaml": vmYAML("web-01", "hv-a", 6)}})
	waitFor(t, func() bool { return e.snapshot("hv-a").VM("web-01").Spec.VCPUs == 6 })
	time.Sleep(2 * statusGap)
	if n := passes() - settled; n != 1 {
		t.Errorf("%v passes for a commit, want 1: the controller's own status write woke it", n)
	}
	settled = passes()
	gittest.Commit(t, e.dir, gittest.Edit{Branch: DefaultStatusBranch, Write: map[string]string{"hosts/hv-a.yaml": "host: hv-a\nheartbeat: 1\n"}})
	waitFor(t, func() bool { return passes() > settled })
}

// TestSnapshotsCarryTheirHostsBackupRepositories: each host's snapshot
// lists the repositories whose spec.hosts name it (URL, no secret), marks
// the one it maintains, and changes its content key when one changes.
func TestSnapshotsCarryTheirHostsBackupRepositories(t *testing.T) {
	files := baseFleet()
	files["backup/nas.yaml"] = "apiVersion: gitfleet.dev/v1alpha1\nkind: BackupRepository\nmetadata: {name: nas}\nspec: {url: /srv/restic, hosts: [hv-a, hv-b], maintenance: hv-b}\n"
	f := loadFiles(t, files)
	hash := func(vm *desired.VM) desired.Hash { return desired.SpecHash(vm.Spec) }
	snaps := buildSnapshots(f, nil, hash, true)
	a, b := snaps["hv-a"].snap, snaps["hv-b"].snap
	if want := []snapshots.SnapshotBackupRepository{{Name: "nas", URL: "/srv/restic"}}; !reflect.DeepEqual(a.BackupRepositories, want) {
		t.Errorf("hv-a repositories = %+v, want %+v", a.BackupRepositories, want)
	}
	if want := []snapshots.SnapshotBackupRepository{{Name: "nas", URL: "/srv/restic", Maintenance: true}}; !reflect.DeepEqual(b.BackupRepositories, want) {
		t.Errorf("hv-b repositories = %+v, want %+v", b.BackupRepositories, want)
	}
	data, err := snapshots.MarshalSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	if back, err := snapshots.ParseSnapshot(data); err != nil || !reflect.DeepEqual(back.BackupRepositories, b.BackupRepositories) {
		t.Errorf("round trip: %+v, %v", back, err)
	}
	k := contentKey(a)
	a.BackupRepositories[0].URL = "/srv/other"
	if contentKey(a) == k {
		t.Error("a repository's new URL did not change the content key")
	}
}
