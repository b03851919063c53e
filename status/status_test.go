package status

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/golden"
)

func sampleStatus() *Status {
	return &Status{
		Host:          "hv-a",
		Agent:         AgentInfo{Version: "1.0.0", BootID: "b0", Accel: "kvm"},
		Heartbeat:     7,
		ObservedAt:    time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC),
		LastSeenEpoch: 4,
		VMs: []VM{{Name: "web-01", Phase: PhaseReady, Power: "running", IP: "10.0.2.15",
			SSH: "127.0.0.1:2201", SpecHash: "abc", Message: "cloudInit changed after the VM was created: not applied to this VM"}},
		Quarantined: []Quarantine{{Name: "old-01", Since: time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)}},
		Destroyed:   []string{"gone-01"},
		Volumes:     []Volume{{Name: "web-01-data", Present: true, SizeGB: 50}},
	}
}

func TestMarshalParseRoundTrip(t *testing.T) {
	st := sampleStatus()
	data, err := Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "status.yaml", data)
	back, err := Parse("hosts/hv-a.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(st, back) {
		t.Errorf("round trip changed the status:\n got %+v\nwant %+v", back, st)
	}
}

func TestMarshalWritesEmptyLists(t *testing.T) {
	data, err := Marshal(&Status{Host: "hv-b"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"vms: []", "destroyed: []", "volumes: []", "quarantined: []"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("marshalled status lacks %q:\n%s", want, data)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"empty", "", "hosts/hv-a.yaml:1:1: empty status file"},
		{"unknown field", "host: hv-a\nbogus: 1\n", `hosts/hv-a.yaml:2:1: bogus: unknown field "bogus"`},
		{"no host", "heartbeat: 3\n", "hosts/hv-a.yaml:1:1: host: missing"},
		{"empty host", "host: \"\"\nheartbeat: 3\n", "hosts/hv-a.yaml:1:7: host: must not be empty"},
		{"host not a name", "host: ../hv-a\n", `hosts/hv-a.yaml:1:7: host: "../hv-a" is not a DNS label`},
		{"two documents", "host: hv-a\n---\nhost: hv-b\n", "hosts/hv-a.yaml:3:1: a second YAML document"},
		{"wrong type", "host: hv-a\nheartbeat: many\n", "hosts/hv-a.yaml:2:12: heartbeat: must be an integer"},
		{"coerced string", "host: hv-a\nsnapshotError: 12\n", "hosts/hv-a.yaml:2:16: snapshotError: must be a string, got the integer 12"},
		{"duplicate key", "host: hv-a\nheartbeat: 1\nheartbeat: 9\n", `hosts/hv-a.yaml:3:1: heartbeat: duplicate key "heartbeat"`},
		{"alias", "host: hv-a\ndestroyed: &a [x]\norphans: *a\n", "hosts/hv-a.yaml:2:12: destroyed: anchors (&a) are not supported"},
		{"bad time", "host: hv-a\nobservedAt: yesterday\n", "hosts/hv-a.yaml:2:13: observedAt: must be a time such as 2006-01-02T15:04:05Z (RFC 3339)"},
		{"too large", "host: hv-a\n#" + strings.Repeat("x", MaxFileBytes) + "\n", "hosts/hv-a.yaml:1:1: file is 4194317 bytes; a status file may be at most 4194304 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("hosts/hv-a.yaml", []byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse error = %v, want one containing %q", err, tc.want)
			}
			if !errors.Is(err, desired.ErrInvalid) {
				t.Errorf("error %q is not a desired.ErrorList", err)
			}
		})
	}
}

// mapTree is a desired.Tree over an in-memory map, path → content, with
// the content itself as ID.
type mapTree struct {
	files map[string]string
	reads *int
	err   error
}

func (m mapTree) Walk(fn func(desired.File) error) error {
	for p, c := range m.files {
		c := c
		f := desired.File{Path: p, ID: "id:" + c, Size: int64(len(c)), Read: func() ([]byte, error) {
			if m.reads != nil {
				*m.reads++
			}
			return []byte(c), nil
		}}
		if err := fn(f); err != nil {
			return err
		}
	}
	return m.err
}

func TestReadAll(t *testing.T) {
	a, _ := Marshal(sampleStatus())
	b, _ := Marshal(&Status{Host: "hv-b", Heartbeat: 2})
	imposter, _ := Marshal(&Status{Host: "hv-a"})
	reads := 0
	tree := mapTree{reads: &reads, files: map[string]string{
		"hosts/hv-a.yaml": string(a),
		"hosts/hv-b.yaml": string(b),
		"hosts/hv-c.yaml": string(imposter),
		"hosts/hv-d.yaml": "host: [",
		"README.md":       "# summary",
		"hosts/notes.txt": "x",
	}}
	r := NewReader()
	reps, err := r.ReadAll(tree)
	if err != nil {
		t.Fatal(err)
	}
	var hosts []string
	for _, rep := range reps {
		hosts = append(hosts, rep.Host)
	}
	if want := []string{"hv-a", "hv-b", "hv-c", "hv-d"}; !reflect.DeepEqual(hosts, want) {
		t.Fatalf("hosts = %v, want %v", hosts, want)
	}
	if reps[0].Status == nil || reps[0].Status.Heartbeat != 7 || reps[0].ID == "" {
		t.Errorf("hv-a report = %+v", reps[0])
	}
	if !errors.Is(reps[2].Err, ErrHostMismatch) || reps[2].Status != nil {
		t.Errorf("hv-c report = %+v, want ErrHostMismatch", reps[2])
	}
	if reps[3].Err == nil || reps[3].Status != nil {
		t.Errorf("hv-d report = %+v, want a parse error", reps[3])
	}
	first := reads
	if _, err := r.ReadAll(tree); err != nil {
		t.Fatal(err)
	}
	// Parsed files are cached by blob hash; only the unparseable one is read again.
	if got := reads - first; got != 1 {
		t.Errorf("second ReadAll read %d files, want 1", got)
	}
}

func TestReadAllTreeErrorIsAnError(t *testing.T) {
	_, err := NewReader().ReadAll(mapTree{files: map[string]string{}, err: errors.New("object not found")})
	if err == nil {
		t.Fatal("a tree error read as an empty set of statuses")
	}
}

func TestHostFromPath(t *testing.T) {
	for in, want := range map[string]string{
		"hosts/hv-a.yaml": "hv-a", "hosts/.yaml": "", "README.md": "", "hosts/x/y.yaml": "", "hv-a.yaml": "",
	} {
		got, ok := HostFromPath(in)
		if got != want || ok != (want != "") {
			t.Errorf("HostFromPath(%q) = %q, %v", in, got, ok)
		}
	}
}

func TestRenderSummary(t *testing.T) {
	at := time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		s    Summary
	}{
		{"summary-empty.md", Summary{}},
		{"summary-superseded.md", Summary{Applied: "dddddddddddddddddddddddddddddddddddddddd",
			Rejected: &Rejection{At: at, Reason: "fetch main: connection refused", SupersededBy: "dddddddddddddddddddddddddddddddddddddddd"}}},
		{"summary.md", Summary{
			Branch:  "main",
			Applied: "0123456789abcdef0123456789abcdef01234567",
			Hosts: []HostSummary{
				{Name: "hv-a", Online: true, Reported: true, Heartbeat: 7, Accel: "kvm", AgentVersion: "1.0.0",
					Epoch: 4, LastSeenEpoch: 4, VMs: sampleStatus().VMs,
					Quarantined: []Quarantine{{Name: "old-01", Since: at.Add(time.Minute), DestroyAt: at.Add(6 * time.Minute)}}},
				{Name: "hv-b", Reported: true, Heartbeat: 3, Accel: "tcg", Epoch: 2, LastSeenEpoch: 1,
					FenceViolation: true, VMs: []VM{{Name: "db|1", Phase: PhaseFailed, Power: "running",
						LastError: "boot: qemu exited\nstatus 1"}}},
				{Name: "hv-c", Epoch: 1},
				{Name: "hv-e", Online: true, Reported: true, Heartbeat: 9, Epoch: 5, LastSeenEpoch: 5,
					Suspended: &Suspension{Epoch: 5, Reason: "kernel upgrade"}},
				{Name: "hv-d", Reported: true, StatusError: "parse status hosts/hv-d.yaml: empty file"},
			},
			Pending: []PendingDelete{
				{Kind: "VM", Name: "old-01", Host: "hv-a", Commit: "fedcba9876543210fedcba9876543210fedcba98",
					Author: "Ann <ann@example.com>", Time: at, Epoch: 4,
					DestroyAt: at.Add(6 * time.Minute), SweepAt: at.Add(15 * time.Minute)},
				{Kind: "Volume", Name: "old-data", Host: "hv-b", Commit: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
					Author: "Bob <bob@example.com>", Time: at, Epoch: 2, Rewritten: true},
			},
			AbandonGrace: 15 * time.Minute,
			Swept: []SweptDelete{{Kind: "VM", Name: "lost-01", Host: "hv-c", Commit: "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
				At: at.Add(time.Hour), Reason: "host offline for 3m0s, pending for 15m0s"}},
			Rejected: &Rejection{Commit: "cccccccccccccccccccccccccccccccccccccccc", At: at,
				Reason: "vms/web.yaml:3:1: spec.vcpus: must be at least 1\nvms/db.yaml:1:1: unknown kind"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := RenderSummary(tc.s)
			golden.Check(t, tc.name, got)
			if again := RenderSummary(tc.s); string(again) != string(got) {
				t.Error("rendering the same summary twice gave different bytes")
			}
		})
	}
}

// A token in an error that quotes a URL never reaches the status file, in
// any of its free-text fields.
func TestMarshalRedactsURLs(t *testing.T) {
	const token = "glpat-T0K3N"
	msg := `fetch image: Get "https://` + token + `@h.example/i.qcow2?private_token=` + token + `": EOF`
	st := &Status{Host: "hv-a", SnapshotError: msg,
		VMs:         []VM{{Name: "a", LastError: msg, Message: msg}},
		Quarantined: []Quarantine{{Name: "b", LastError: msg}},
		Vanished:    []Vanished{{Name: "c", LastError: msg, Reason: msg}}}
	data, err := Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), token) {
		t.Errorf("status file carries the token:\n%s", data)
	}
	if st.VMs[0].LastError != msg {
		t.Error("Marshal changed its argument")
	}
}

// A summary cell renders as the text it holds: no Markdown or HTML from an
// agent or a commit takes effect, and no token is shown.
func TestSummaryCellsEscapeMarkdownAndHTML(t *testing.T) {
	hostile := `<img src=x onerror=alert(1)> [click](https://evil.example/) **bold** ` + "`code`" + ` ![i](https://x/y.png) &amp; https://u:T0K3N@h.example/r.git | a`
	got := string(RenderSummary(Summary{Hosts: []HostSummary{{Name: "hv-a", Reported: true,
		VMs: []VM{{Name: "a", Phase: "failed", LastError: hostile}}}},
		Rejected: &Rejection{Reason: "fetch https://T0K3N@h.example/r.git: denied\n```\n<script>x</script>"}}))
	for _, bad := range []string{"<img", "](", "**bold**", "`code`", "![", " &amp; ", "T0K3N", "https://evil"} {
		if strings.Contains(got, bad) {
			t.Errorf("summary holds %q:\n%s", bad, got)
		}
	}
	// The rejected reason is a code block: a fence inside it cannot close it.
	if n := strings.Count(got, "```"); n != 2 {
		t.Errorf("summary has %d fences, want the reason's 2:\n%s", n, got)
	}
}

// A status file over MaxFileBytes is refused by its size, without being
// read, and reported as that host's error; the other hosts are read.
func TestReadAllRefusesAHugeStatusUnread(t *testing.T) {
	good, _ := Marshal(&Status{Host: "hv-b"})
	tree := fileTree{
		{Path: "hosts/hv-a.yaml", ID: "a", Size: MaxFileBytes + 1, Read: func() ([]byte, error) {
			t.Error("the huge status was read")
			return nil, errors.New("read")
		}},
		{Path: "hosts/hv-b.yaml", ID: "b", Size: int64(len(good)), Read: func() ([]byte, error) { return good, nil }},
	}
	reps, err := NewReader().ReadAll(tree)
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 2 || !errors.Is(reps[0].Err, ErrFileTooLarge) || reps[1].Err != nil {
		t.Fatalf("reports %+v: want hv-a refused as too large, hv-b read", reps)
	}
}

// fileTree is a desired.Tree over a list of files.
type fileTree []desired.File

func (ft fileTree) Walk(fn func(desired.File) error) error {
	for _, f := range ft {
		if err := fn(f); err != nil {
			return err
		}
	}
	return nil
}

// A status may claim any epoch a uint64 holds: the controller must read the
// claim to refuse it (fleet's ErrEpochBound), never take the file for
// unreadable. One past it is an error of the field.
func TestParseFullEpochRange(t *testing.T) {
	st, err := Parse("hosts/hv-a.yaml", []byte("host: hv-a\nlastSeenEpoch: 18446744073709551615\n"))
	if err != nil || st.LastSeenEpoch != math.MaxUint64 {
		t.Fatalf("Parse = %+v, %v; want lastSeenEpoch 2^64-1", st, err)
	}
	_, err = Parse("hosts/hv-a.yaml", []byte("host: hv-a\nlastSeenEpoch: 18446744073709551616\n"))
	if want := "hosts/hv-a.yaml:2:16: lastSeenEpoch: must be a non-negative integer below 2^64"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Parse(2^64) error = %v, want %s", err, want)
	}
}
