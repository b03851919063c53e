package fleet

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// A host whose Host file a reviewed change removed (the runbook's "host
// gone for good") says so in the Hosts table and in liveness.yaml while
// deletes delivered to it wait for its ack, and leaves both once nothing
// is delivered to it, its status file on the branches notwithstanding.
func TestRetiredHostLeavesTheSummary(t *testing.T) {
	files := baseFleet()
	files["hosts/hv-c.yaml"] = hostYAML("hv-c")
	files["vms/web-03.yaml"] = vmYAML("web-03", "hv-c", 1)
	e := newEnv(t, files)
	e.pass()
	for _, h := range []string{"hv-a", "hv-b", "hv-c"} {
		writeStatus(t, e.url, &status.Status{Host: h, Heartbeat: 1, LastSeenEpoch: 1})
	}
	e.pass()
	if live, err := status.ParseLiveness(status.LivenessPath, []byte(e.statusFile(status.LivenessPath))); err != nil || live["hv-c"].State != status.StateOnline {
		t.Fatalf("liveness.yaml before hv-c falls silent: %v, %+v", err, live)
	}

	// hv-c is gone: its VM's delete is swept once it has been offline past
	// the abandon grace, then its Host file is removed.
	e.commit(gittest.Edit{Remove: []string{"vms/web-03.yaml"}})
	e.pass()
	for i := 0; i < 4; i++ {
		e.clock.Add(5 * time.Minute)
		writeStatus(t, e.url, &status.Status{Host: "hv-a", Heartbeat: uint64(2 + i), LastSeenEpoch: 2})
		writeStatus(t, e.url, &status.Status{Host: "hv-b", Heartbeat: uint64(2 + i), LastSeenEpoch: 2})
		e.pass()
	}
	if l := e.ledger(); len(l.Sweeps) != 1 {
		t.Fatalf("web-03 not swept on the offline hv-c: %+v", l.Sweeps)
	}
	e.commit(gittest.Edit{Remove: []string{"hosts/hv-c.yaml"}})
	e.pass()
	readme := e.summary()
	if !strings.Contains(readme, "| hv-c | offline, retired\\: no Host object; listed until it acks the deletes delivered to it |") {
		t.Errorf("the retired hv-c is not marked in the Hosts table:\n%s", readme)
	}
	live, err := status.ParseLiveness(status.LivenessPath, []byte(e.statusFile(status.LivenessPath)))
	if err != nil {
		t.Fatal(err)
	}
	if got := live["hv-c"]; !got.Retired || got.State != status.StateOffline {
		t.Errorf("liveness of hv-c = %+v, want offline and retired", got)
	}
	if got := live["hv-a"]; got.Retired || got.State != status.StateOnline {
		t.Errorf("liveness of hv-a = %+v, want online", got)
	}

	// A host retired with nothing delivered to it leaves at once: hv-d
	// runs nothing, reports, and its Host file goes.
	e.commit(gittest.Edit{Write: map[string]string{"hosts/hv-d.yaml": hostYAML("hv-d")}})
	e.pass()
	writeStatus(t, e.url, &status.Status{Host: "hv-d", Heartbeat: 1, LastSeenEpoch: e.snapshot("hv-d").Epoch})
	e.pass()
	if !strings.Contains(e.summary(), "| hv-d | online |") {
		t.Fatalf("hv-d is not listed online:\n%s", e.summary())
	}
	e.commit(gittest.Edit{Remove: []string{"hosts/hv-d.yaml"}})
	e.pass()
	if readme := e.summary(); strings.Contains(readme, "| hv-d |") {
		t.Errorf("hv-d, retired with nothing delivered to it, is still in the summary:\n%s", readme)
	}
	if live := e.statusFile(status.LivenessPath); strings.Contains(live, "hv-d") {
		t.Errorf("hv-d is still in liveness.yaml:\n%s", live)
	}
}

// The warning on a status of a host the fleet does not have says what to
// do, naming where the status is: the host's own branch (or, of an agent
// of an earlier release, its file on the status branch).
func TestIgnoredStatusSaysWhatToDo(t *testing.T) {
	e := newEnv(t, baseFleet())
	var logs bytes.Buffer
	l := logrus.New()
	l.SetOutput(&logs)
	c, err := New(Config{URL: e.url, Clock: e.clock.Now, Logger: logrus.NewEntry(l), SummaryInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	writeStatus(t, e.url, &status.Status{Host: "hv-typo", Heartbeat: 1})
	e.pass()
	want := "add a Host object named hv-typo, or stop the agent configured with host: hv-typo and delete its branch gitfleet/hosts/hv-typo"
	if !strings.Contains(logs.String(), want) {
		t.Errorf("log lacks %q:\n%s", want, logs.String())
	}
}
