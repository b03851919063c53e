package snapshots

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/desired"
)

func TestLedgerRoundTripAndStrictness(t *testing.T) {
	l := NewLedger()
	l.Applied = &AppliedCommit{Commit: "abc", Branch: "main"}
	l.Hosts["hv-a"] = &HostRecord{Epoch: 3, Hash: "k", VMs: []string{"a", "b"}, Volumes: []string{"v"}}
	spec := desired.VMSpec{Host: "hv-a", VCPUs: 1}
	l.Tombstones = []*TombstoneRecord{{Kind: desired.KindVM, Name: "z", Host: "hv-a", Spec: &spec,
		Tombstone: Tombstone{Commit: "c", Epoch: 3}, PublishedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}}
	data, err := l.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseLedger(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, l) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, l)
	}
	// A ledger in block YAML (edited by hand) reads the same.
	y, err := ParseLedger([]byte("version: 1\napplied: {commit: abc, branch: main}\nhosts:\n  hv-a: {epoch: 3, hash: k, vms: [a, b], volumes: [v]}\n"))
	if err != nil || y.Hosts["hv-a"].Epoch != 3 || y.Applied.Commit != "abc" || len(y.Hosts["hv-a"].VMs) != 2 {
		t.Errorf("YAML ledger: %+v, %v", y, err)
	}
	for name, bad := range map[string]string{
		"unknown json field": `{"version": 1, "hosts": {}, "surprise": 1}`,
		"unknown field":      "version: 1\nhosts: {}\nsurprise: 1\n",
		"wrong version":      "version: 2\nhosts: {}\n",
		"bad tombstone":      "version: 1\nhosts: {}\ntombstones: [{kind: Host, name: x, host: y}]\n",
	} {
		if _, err := ParseLedger([]byte(bad)); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

func TestLedgerRoundTripRetainedPathFile(t *testing.T) {
	l := NewLedger()
	p := "fleet"
	l.Applied = &AppliedCommit{Commit: "abc", Branch: "main", Path: &p}
	l.Hosts["hv-a"] = &HostRecord{Epoch: 3, Hash: "k", File: "0011223344556677", VMs: []string{"a"}}
	l.Tombstones = []*TombstoneRecord{}
	spec := desired.VMSpec{Host: "hv-a", VCPUs: 1}
	since := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l.Retained = []*RetainedRecord{
		{Kind: desired.KindVolume, Name: "v", Host: "hv-a", SizeGB: 5, Commit: "d", Since: since},
		{Kind: desired.KindVM, Name: "r", Host: "hv-a", Spec: &spec, Commit: "d", Since: since},
	}
	data, err := l.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseLedger(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, l) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, l)
	}
	if back.Retained[0].Kind != desired.KindVM {
		t.Error("retained records are not sorted by host, kind and name")
	}
	if _, err := ParseLedger([]byte("version: 1\nhosts: {}\nretained: [{kind: Host, name: x, host: y}]\n")); err == nil {
		t.Error("a retained Host parsed")
	}
	// A ledger written before the path was recorded is read as any path.
	old, err := ParseLedger([]byte(`{"version": 1, "applied": {"commit": "abc", "branch": "main"}, "hosts": {}, "tombstones": []}`))
	if err != nil || old.Applied.Path != nil {
		t.Fatalf("old ledger: %+v, %v", old, err)
	}
}

// FuzzParseLedger: a ledger either fails to parse or re-encodes into one
// that parses to the same thing.
func FuzzParseLedger(f *testing.F) {
	l := NewLedger()
	l.Applied = &AppliedCommit{Commit: "abc", Branch: "main"}
	l.Hosts["hv-a"] = &HostRecord{Epoch: 3, Hash: "k", VMs: []string{"a"}}
	seed, _ := l.Marshal()
	f.Add(seed)
	f.Add([]byte("version: 1\nhosts: {hv-a: {epoch: 2}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := ParseLedger(data)
		if err != nil {
			return
		}
		out, err := l.Marshal()
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		back, err := ParseLedger(out)
		if err != nil {
			t.Fatalf("reparse %s: %v", out, err)
		}
		again, _ := back.Marshal()
		if string(again) != string(out) {
			t.Fatalf("not stable:\n%s\n%s", out, again)
		}
	})
}

// TestParseLedgerYAMLErrors: a ledger that is not JSON is read by the
// strict decoder of object files, whose errors give line, column and field.
func TestParseLedgerYAMLErrors(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"unknown field", "version: 1\nhosts: {}\nsurprise: 1\n", `parse ledger.yaml: 3:1: surprise: unknown field "surprise"`},
		{"duplicate key", "version: 1\nhosts: {}\nhosts: {}\n", `parse ledger.yaml: 3:1: hosts: duplicate key "hosts" (first written at line 2)`},
		{"coerced epoch", "version: 1\nhosts:\n  hv-a: {epoch: \"3\"}\n", `parse ledger.yaml: 3:17: hosts.hv-a.epoch: must be an integer, got the string "3"`},
		{"alias", "version: 1\nhosts: {hv-a: &h {epoch: 3}, hv-b: *h}\n", "parse ledger.yaml: 2:15: hosts.hv-a: anchors (&h) are not supported"},
		{"bad time", "version: 1\nhosts: {}\nrejected: {reason: r, at: noon}\n", "parse ledger.yaml: 3:27: rejected.at: must be a time such as 2006-01-02T15:04:05Z (RFC 3339)"},
		{"empty", "# nothing\n", "parse ledger.yaml: 1:1: empty ledger; a ledger is a mapping with version and hosts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseLedger([]byte(tc.in))
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("ParseLedger error = %v, want one starting %q", err, tc.want)
			}
		})
	}
}

func TestLedgerAppliedHash(t *testing.T) {
	var none *Ledger
	if got := none.AppliedHash(); got != "" {
		t.Errorf("nil ledger: %q", got)
	}
	if got := (&Ledger{}).AppliedHash(); got != "" {
		t.Errorf("nothing applied: %q", got)
	}
	l := &Ledger{Applied: &AppliedCommit{Commit: "0123456789abcdef0123456789abcdef01234567"}}
	if got := l.AppliedHash(); got != "0123456789abcdef0123456789abcdef01234567" {
		t.Errorf("applied: %q", got)
	}
}
