package status

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/testsupport/golden"
)

// Objects kept after a history rewrite and VMs on a host that the desired
// state lacks each get their own section, with the words a person acts on.
func TestRenderSummaryKept(t *testing.T) {
	at := time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)
	s := Summary{
		Branch:  "main",
		Applied: "0123456789abcdef0123456789abcdef01234567",
		Retained: []RetainedObject{
			{Kind: "VM", Name: "web-02", Host: "hv-a", Commit: "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", Since: at},
			{Kind: "Volume", Name: "web-02-data", Host: "hv-a", Commit: "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", Since: at},
		},
		Unmanaged: []UnmanagedVM{{Name: "old|01", Host: "hv-b", Phase: PhaseReady}},
	}
	got := RenderSummary(s)
	golden.Check(t, "summary-kept.md", got)
	for _, want := range []string{
		"kept after a history rewrite at `eeeeeeeeeeee`: restore the file, or re-add and delete it in a reviewed commit",
		"| old\\|01 | hv-b | ready | on host, not in the desired state: kept |",
	} {
		if !strings.Contains(string(got), want) {
			t.Errorf("summary lacks %q", want)
		}
	}
	if empty := string(RenderSummary(Summary{})); strings.Contains(empty, "history rewrite") || strings.Contains(empty, "not in the desired state") {
		t.Error("an empty summary shows the kept sections")
	}
}

// Acks the controller did not act on get their own section, with the
// commit and why; a summary without any has none.
func TestRenderSummaryForgedAcks(t *testing.T) {
	s := Summary{
		Branch:  "main",
		Applied: "0123456789abcdef0123456789abcdef01234567",
		ForgedAcks: []ForgedAck{
			{Ref: "VM old-01@hv-a", Commit: "abcdefabcdefabcdefabcdefabcdefabcdefabcd", Reason: "not signed by the key the Host's spec.agentKey names (commit abcdefabcdef carries no signature)"},
			{Ref: "Volume scratch@hv-b", Reason: "the status was read from gitfleet/status (the old layout), which the host's agent does not sign"},
		},
	}
	got := RenderSummary(s)
	golden.Check(t, "summary-forged.md", got)
	for _, want := range []string{"## Forged acks", "| VM old-01\\@hv-a | `abcdefabcdef` | not signed by", "| Volume scratch\\@hv-b | - | the status was read"} {
		if !strings.Contains(string(got), want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(string(RenderSummary(Summary{})), "Forged acks") {
		t.Error("an empty summary shows the forged acks section")
	}
}

// Snapshots commits and ledger records the controller refused get their
// own section, with the signed commit it read instead; a summary without
// any has none.
func TestRenderSummaryForgedCommits(t *testing.T) {
	at := time.Date(2026, 11, 30, 23, 0, 0, 0, time.UTC)
	s := Summary{
		Branch:  "main",
		Applied: "0123456789abcdef0123456789abcdef01234567",
		ForgedCommits: []ForgedCommit{
			{Commit: "feedfeedfeedfeedfeedfeedfeedfeedfeedfeed", Signed: "5151515151515151515151515151515151515151", Reason: "commit feedfeedfeed carries no signature", At: at},
			{Commit: "abcdefabcdefabcdefabcdefabcdefabcdefabcd", Reason: "ledger record not acted on: retained VM evil@hv-a: the commit 012345678901 does not hold it on host hv-a", At: at},
		},
	}
	got := RenderSummary(s)
	golden.Check(t, "summary-forged-commits.md", got)
	for _, want := range []string{"## Forged snapshots commits", "| `feedfeedfeed` | `515151515151` | 2026-11-30T23:00:00Z | commit feedfeedfeed carries no signature |", "retained VM evil\\@hv-a"} {
		if !strings.Contains(string(got), want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(string(RenderSummary(Summary{})), "Forged snapshots") {
		t.Error("an empty summary shows the forged commits section")
	}
}

// Every section the summary shows for what the controller refused as
// forged has its entry in the runbook (docs/operating.md, section 12),
// under the same heading.
func TestRunbookExplainsForgeries(t *testing.T) {
	data, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	start, end := strings.Index(doc, "## 12. Runbook"), strings.Index(doc, "## 13.")
	if start < 0 || end < start {
		t.Fatal("docs/operating.md has no section 12 runbook")
	}
	runbook := doc[start:end]
	s := Summary{Branch: "main",
		ForgedAcks:    []ForgedAck{{Ref: "VM a@h", Reason: "r"}},
		ForgedCommits: []ForgedCommit{{Commit: "feedfeedfeedfeedfeedfeedfeedfeedfeedfeed", Reason: "r"}}}
	n := 0
	for _, line := range strings.Split(string(RenderSummary(s)), "\n") {
		heading, ok := strings.CutPrefix(line, "## Forged ")
		if !ok {
			continue
		}
		n++
		if !strings.Contains(runbook, "\n### Forged "+heading+"\n") {
			t.Errorf("the runbook has no entry %q", "### Forged "+heading)
		}
	}
	if n != 2 {
		t.Fatalf("%d forged sections rendered, want 2", n)
	}
}

// A quarantined object whose host waits for the controller's confirmation
// says so in its note, its pending delete's deadline and its host's line;
// a confirmed one, or one from an agent that does not confirm, does not.
func TestSummaryShowsDeletesAwaitingConfirmation(t *testing.T) {
	since := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
	nonce := strings.Repeat("ab", 16)
	waiting := Quarantine{Name: "old-01", Since: since, DestroyAt: since.Add(5 * time.Minute), Confirm: nonce}
	confirmed := waiting
	confirmed.Confirmed = true
	plain := waiting
	plain.Confirm = ""
	if !waiting.AwaitsConfirmation() || confirmed.AwaitsConfirmation() || plain.AwaitsConfirmation() {
		t.Fatalf("AwaitsConfirmation: waiting %v, confirmed %v, without a nonce %v", waiting.AwaitsConfirmation(), confirmed.AwaitsConfirmation(), plain.AwaitsConfirmation())
	}
	const says = "waiting for the controller to confirm the delete"
	if note := QuarantineNote(waiting); !strings.Contains(note, says) || !strings.Contains(note, nonce[:8]) {
		t.Errorf("note of a quarantine waiting for confirmation: %q", note)
	}
	for _, q := range []Quarantine{confirmed, plain} {
		if note := QuarantineNote(q); strings.Contains(note, says) {
			t.Errorf("note of %+v: %q", q, note)
		}
	}
	p := PendingDelete{Kind: "Volume", DestroyAt: waiting.DestroyAt, Unconfirmed: true}
	if d := p.Deadline(time.Hour); !strings.Contains(d, "host removes it at 2026-11-30T02:05:00Z") || !strings.Contains(d, "waits for the controller to confirm the delete") {
		t.Errorf("deadline of an unconfirmed volume delete: %q", d)
	}
	got := string(RenderSummary(Summary{Hosts: []HostSummary{{Name: "hv-a", Reported: true, Online: true, Quarantined: []Quarantine{waiting}, Unconfirmed: 1}}}))
	for _, want := range []string{"1 quarantined, waiting for the controller to confirm the delete", "waiting for the controller to confirm the delete \\(nonce abababab\\)"} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
}

// StampSummary puts when the controller wrote the README right after its
// intro, and nothing else changes.
func TestStampSummary(t *testing.T) {
	data := RenderSummary(Summary{Branch: "main", Applied: "0123456789abcdef0123456789abcdef01234567"})
	w := LastWrite{At: time.Date(2026, 11, 30, 3, 4, 5, 600, time.UTC), RefreshSeconds: 600}
	got := string(StampSummary(data, w))
	line := "Written at 2026-11-30T03:04:05Z. The controller rewrites this branch at least every 10m0s: a time older than 30m0s means what follows is not its current view"
	i := strings.Index(got, line)
	if i < 0 || !strings.HasPrefix(got[:i], "# gitfleet status\n\nThis file is written by the gitfleet controller") || !strings.HasSuffix(got[:i], ".\n\n") {
		t.Fatalf("the Written paragraph is not right after the intro:\n%s", got)
	}
	if rest := got[:i] + got[strings.Index(got[i:], "\n\n")+i+2:]; rest != string(data) {
		t.Errorf("stamping changed more than the one paragraph:\n%s", got)
	}
	if other := []byte("# not a summary\n"); string(StampSummary(other, w)) != string(other) {
		t.Error("a file without the intro was changed")
	}
}

// A pending delete on a host whose status is unverified says its host's
// progress is unknown, whatever destroy time it carries.
func TestDeadlineOfAnUnverifiedHost(t *testing.T) {
	p := PendingDelete{Kind: "VM", DestroyAt: time.Date(2026, 11, 30, 3, 5, 0, 0, time.UTC), HostUnverified: true}
	if d := p.Deadline(0); !strings.HasPrefix(d, "unknown: the host's status is not signed by its agentKey") || strings.Contains(d, "03:05") {
		t.Errorf("deadline %q", d)
	}
}

func TestBackupNote(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		b    *Backup
		want string
	}{
		{nil, ""},
		{&Backup{Repository: "nas", NextDue: at}, "backup to nas: none yet, next due " + stamp(at)},
		{&Backup{Repository: "nas", LastSuccess: at, LastBackupID: "20260102t030000z-1a2b3c4d", Consistency: "crash", BytesAdded: 42,
			NextDue: at.Add(time.Minute), LastError: "backup to nas failed: wrong password"},
			"backup to nas: 20260102t030000z-1a2b3c4d at " + stamp(at) + " (crash, 42 bytes added), next due " + stamp(at.Add(time.Minute)) +
				"; last failure: backup to nas failed: wrong password"},
	} {
		if got := BackupNote(tc.b); got != tc.want {
			t.Errorf("BackupNote(%+v) = %q, want %q", tc.b, got, tc.want)
		}
	}
}

// A VM's backup state survives the status file's strict decoder.
func TestBackupRowRoundTrips(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	st := &Status{Host: "hv-a", VMs: []VM{{Name: "db-01", Phase: PhaseReady, Power: "running", SpecHash: "abc",
		Backup: &Backup{Repository: "nas", LastSuccess: at, LastBackupID: "20260102t030000z-1a2b3c4d", LastSnapshot: "0123abcd",
			Bytes: 2 << 30, BytesAdded: 42, DurationSeconds: 17, Consistency: "crash", NextDue: at.Add(time.Hour),
			LastError: "backup to nas failed", LastFailure: at.Add(-time.Hour)}}},
		Quarantined: []Quarantine{}, Destroyed: []string{}}
	data, err := Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse("hosts/hv-a.yaml", data)
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, data)
	}
	if got := back.VMs[0].Backup; got == nil || *got != *st.VMs[0].Backup {
		t.Errorf("round trip: %+v, want %+v", got, st.VMs[0].Backup)
	}
}
