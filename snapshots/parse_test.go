package snapshots

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/desired"
)

func TestParseSnapshotErrors(t *testing.T) {
	valid := "host: hv-a\nepoch: 4\nsource: {commit: abc, branch: main}\nhostSpec: {}\nvms:\n  - name: web-01\n    specHash: HASH\n    spec: {host: hv-a, vcpus: 1, memoryMB: 512, diskGB: 5, power: running}\n    tombstoned: false\nvolumes: []\n"
	spec := desired.VMSpec{Host: "hv-a", VCPUs: 1, MemoryMB: 512, DiskGB: 5, Power: desired.PowerRunning}
	valid = strings.Replace(valid, "HASH", string(desired.SpecHash(spec)), 1)
	if s, err := ParseSnapshot([]byte(valid)); err != nil || !reflect.DeepEqual(s.VMs[0].Spec, spec) || s.Epoch != 4 {
		t.Fatalf("ParseSnapshot(valid) = %+v, %v", s, err)
	}
	tests := []struct{ name, input, want string }{
		{"empty", "", "1:1: empty snapshot; a snapshot is a mapping with host, vms and volumes"},
		{"not a mapping", "- host: hv-a\n", "1:1: a snapshot must be a mapping with host, vms and volumes; got a list"},
		{"two documents", valid + "---\nhost: hv-b\n", "12:1: a second YAML document; a snapshot is one document"},
		{"unknown field", strings.Replace(valid, "epoch: 4", "epoc: 4", 1), "2:1: epoc: unknown field \"epoc\"; did you mean \"epoch\"?"},
		{"vms missing", strings.Replace(valid, "vms:", "vns:", 1), "1:1: vms: missing\n5:1: vns: unknown field \"vns\"; did you mean \"vms\"?"},
		{"negative epoch", strings.Replace(valid, "epoch: 4", "epoch: -4", 1), "2:8: epoch: must be a non-negative integer below 2^64, got -4"},
		{"quoted boolean", strings.Replace(valid, "tombstoned: false", `tombstoned: "false"`, 1), "9:17: vms[0].tombstoned: must be true or false, got the string \"false\""},
		{"spec edited without its hash", strings.Replace(valid, "vcpus: 1", "vcpus: 2", 1),
			"7:15: vms[0].specHash: \"" + string(desired.SpecHash(spec)) + "\" does not match the spec, whose hash is " + string(desired.SpecHash(desired.VMSpec{Host: "hv-a", VCPUs: 2, MemoryMB: 512, DiskGB: 5, Power: desired.PowerRunning}))},
		{"duplicate VM", strings.Replace(valid, "volumes: []\n", "", 1) + strings.Join(strings.SplitAfter(valid, "\n")[5:9], "") + "volumes: []\n",
			"10:11: vms[1].name: VM \"web-01\" is listed twice"},
		{"confirm that is no nonce", strings.Replace(valid, "tombstoned: false\n", "tombstoned: true\n    tombstone: {commit: abc, author: a, time: t, epoch: 3, confirm: not-a-nonce}\n", 1),
			"10:69: vms[0].tombstone.confirm: \"not-a-nonce\" is not a confirmation nonce (32 lowercase hex digits)"},
		{"a backup repository with a password", strings.Replace(valid, "volumes: []\n", "volumes: []\nbackupRepositories:\n  - {name: nas, url: \"rest:https://u:hunter2@nas/r\"}\n", 1),
			"12:22: backupRepositories[0].url: restic repository: backup configuration: location rest:https://***@nas/r: a password in the location: put RESTIC_REST_USERNAME and RESTIC_REST_PASSWORD (or the backend's credentials) in the environment file"},
		{"bad host name", strings.Replace(valid, "host: hv-a\nepoch", "host: HV_A\nepoch", 1), "1:7: host: \"HV_A\" is not a DNS label (RFC 1123): lowercase letters, digits and '-', starting and ending with a letter or digit"},
	}
	nics := func(list string) string {
		s := desired.VMSpec{Host: "hv-a", VCPUs: 1, MemoryMB: 512, DiskGB: 5, Power: desired.PowerRunning}
		doc := "host: hv-a\nepoch: 4\nsource: {commit: abc, branch: main}\nhostSpec: {}\nvms:\n  - name: web-01\n    specHash: HASH\n    spec: {host: hv-a, vcpus: 1, memoryMB: 512, diskGB: 5, power: running, nics: " + list + "}\n    tombstoned: false\nvolumes: []\n"
		// The hash is the spec's own, as a forger would compute it.
		probe := &Snapshot{}
		desired.Decode("", []byte(strings.Replace(doc, "HASH", "x", 1)), probe, snapshotFormat)
		if len(probe.VMs) == 1 {
			s = probe.VMs[0].Spec
		}
		return strings.Replace(doc, "HASH", string(desired.SpecHash(s)), 1)
	}
	var nine []string
	for i := 1; i <= 9; i++ {
		nine = append(nine, fmt.Sprintf("{network: n%d}", i))
	}
	tests = append(tests,
		struct{ name, input, want string }{"forged snapshot with 9 NICs", nics("[" + strings.Join(nine, ", ") + "]"),
			"8:82: vms[0].spec.nics: lists 9 NICs; a VM has at most 8"},
		struct{ name, input, want string }{"forged snapshot with one MAC twice",
			nics(`[{network: a, mac: "52:54:00:00:00:01"}, {network: b, mac: "52:54:00:00:00:01"}]`),
			"8:141: vms[0].spec.nics[1].mac: 52:54:00:00:00:01 is also nics[0]'s MAC"},
	)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := ParseSnapshot([]byte(tt.input))
			if err == nil || err.Error() != tt.want {
				t.Errorf("ParseSnapshot = %+v, %v\nwant error %s", s, err, tt.want)
			}
			if err != nil && s != nil {
				t.Errorf("a snapshot with an error")
			}
		})
	}
}

// TestParseSnapshotBound: a snapshot is bounded by MaxSnapshotBytes, as its
// readers are, not by the 1 MiB of one object file: a host whose VMs carry
// large user-data has a snapshot larger than any one of their files.
func TestParseSnapshotBound(t *testing.T) {
	s := &Snapshot{Host: "hv-a", Epoch: 1}
	for _, name := range []string{"web-01", "web-02", "web-03"} {
		spec := desired.VMSpec{Host: "hv-a", VCPUs: 1, MemoryMB: 512, DiskGB: 5, Power: desired.PowerRunning,
			CloudInit: &desired.CloudInit{UserData: "#cloud-config\n# " + strings.Repeat("x", 600<<10) + "\n"}}
		s.VMs = append(s.VMs, SnapshotVM{Name: name, SpecHash: desired.SpecHash(spec), Spec: spec})
	}
	data, err := MarshalSnapshot(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) <= desired.MaxFileSize {
		t.Fatalf("the snapshot is %d bytes, not above one object file's bound", len(data))
	}
	back, err := ParseSnapshot(data)
	if err != nil || len(back.VMs) != 3 || back.VMs[2].Spec.CloudInit.UserData != s.VMs[2].Spec.CloudInit.UserData {
		t.Fatalf("ParseSnapshot of a %d-byte snapshot: %v", len(data), err)
	}

	big := append(append([]byte{}, data...), make([]byte, MaxSnapshotBytes-len(data)+1)...)
	for i := len(data); i < len(big); i++ {
		big[i] = '#'
	}
	want := fmt.Sprintf("1:1: file is %d bytes; a snapshot may be at most %d bytes", MaxSnapshotBytes+1, MaxSnapshotBytes)
	if _, err := ParseSnapshot(big); err == nil || err.Error() != want {
		t.Errorf("ParseSnapshot of %d bytes: %v, want %s", len(big), err, want)
	}
}

// A tombstone's confirm is a nonce: ConfirmLen lowercase hex digits, and
// only a nonce equal to the quarantine's confirms it.
func TestConfirmNonce(t *testing.T) {
	nonce := strings.Repeat("0f", ConfirmLen/2)
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{nonce, true},
		{"", false},
		{nonce[:ConfirmLen-1], false},
		{nonce + "0", false},
		{strings.ToUpper(nonce), false},
		{strings.Repeat("g", ConfirmLen), false},
	} {
		if got := ValidConfirm(tc.in); got != tc.want {
			t.Errorf("ValidConfirm(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
	var none *Tombstone
	if none.Confirms(nonce) {
		t.Error("a missing tombstone confirms")
	}
	if (&Tombstone{}).Confirms("") {
		t.Error("an empty confirm confirms a quarantine without a nonce")
	}
	if (&Tombstone{Confirm: nonce}).Confirms(strings.Repeat("ab", ConfirmLen/2)) {
		t.Error("another nonce confirms")
	}
	if !(&Tombstone{Confirm: nonce}).Confirms(nonce) {
		t.Error("the nonce does not confirm")
	}
}
