package desired

import (
	"errors"
	"strings"
	"testing"
	"time"
)

const repoNAS = `apiVersion: gitfleet.dev/v1alpha1
kind: BackupRepository
metadata: {name: nas}
spec:
  url: sftp:backup@nas.example:/srv/restic
  hosts: [hv-a, hv-b]
  maintenance: hv-b
`

const vmBacked = `apiVersion: gitfleet.dev/v1alpha1
kind: VM
metadata: {name: db-01}
spec:
  host: hv-a
  vcpus: 1
  memoryMB: 512
  diskGB: 10
  image: {url: "https://example.org/a.img", sha256: ` + sumA + `}
  backup:
    repository: nas
    schedule: daily at 03:00
    keep: {last: 3, daily: 7, weekly: 4, monthly: 6}
`

const vmRestored = `apiVersion: gitfleet.dev/v1alpha1
kind: VM
metadata: {name: db-02}
spec:
  host: hv-a
  vcpus: 1
  memoryMB: 512
  diskGB: 10
  image: {url: "https://example.org/a.img", sha256: ` + sumA + `}
  restore:
    repository: nas
    vm: db-01
    backup: latest
`

func TestLoadBackupRepositoryAndPolicy(t *testing.T) {
	f, err := LoadDir(writeTree(t, withFiles(goodFleet, map[string]string{
		"backup/nas.yaml": repoNAS, "vms/db-01.yaml": vmBacked, "vms/db-02.yaml": vmRestored,
	})))
	if err != nil {
		t.Fatalf("LoadDir: %v", err)
	}
	r := f.BackupRepositories["nas"]
	if r == nil || r.Spec.URL != "sftp:backup@nas.example:/srv/restic" || r.Spec.Maintenance != "hv-b" || len(r.Spec.Hosts) != 2 {
		t.Fatalf("repository = %+v", r)
	}
	b := f.VMs["db-01"].Spec.Backup
	want := BackupPolicy{Repository: "nas", Schedule: "daily at 03:00", Keep: BackupKeep{Last: 3, Daily: 7, Weekly: 4, Monthly: 6}}
	if b == nil || *b != want {
		t.Fatalf("backup = %+v, want %+v", b, want)
	}
	if r := f.VMs["db-02"].Spec.Restore; r == nil || *r != (RestoreSource{Repository: "nas", VM: "db-01", Backup: RestoreLatest}) {
		t.Errorf("restore = %+v", r)
	}
	if got := f.BackupRepositoriesOf("hv-a"); len(got) != 1 || got["nas"] != r {
		t.Errorf("BackupRepositoriesOf(hv-a) = %v", got)
	}
	if got := f.BackupRepositoriesOf("hv-c"); len(got) != 0 {
		t.Errorf("BackupRepositoriesOf(hv-c) = %v, want none", got)
	}
}

func TestBackupErrorsNameFileLineColumn(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  []string
	}{
		{"a password in the URL", map[string]string{"backup/nas.yaml": strings.Replace(repoNAS,
			"sftp:backup@nas.example:/srv/restic", "rest:https://u:hunter2@nas.example/r", 1)},
			[]string{"backup/nas.yaml:5:8: spec.url: restic repository: backup configuration: location rest:https://***@nas.example/r: a password in the location"}},
		{"a maintenance host that does not use it", map[string]string{"backup/nas.yaml": strings.Replace(repoNAS, "maintenance: hv-b", "maintenance: hv-c", 1)},
			[]string{`backup/nas.yaml:7:16: spec.maintenance: "hv-c" is not one of spec.hosts`}},
		{"a host that does not exist", map[string]string{"backup/nas.yaml": strings.Replace(repoNAS, "[hv-a, hv-b]", "[hv-a, hv-b, hv-z]", 1)},
			[]string{`backup/nas.yaml:6:23: spec.hosts[2]: Host "hv-z" does not exist`}},
		{"a bad schedule", map[string]string{"backup/nas.yaml": repoNAS, "vms/db-01.yaml": strings.Replace(vmBacked, "daily at 03:00", "daily at 3am", 1)},
			[]string{`vms/db-01.yaml:12:15: spec.backup.schedule: "3am": want HH:MM`}},
		{"too short an interval", map[string]string{"backup/nas.yaml": repoNAS, "vms/db-01.yaml": strings.Replace(vmBacked, "daily at 03:00", "every 1m", 1)},
			[]string{`vms/db-01.yaml:12:15: spec.backup.schedule: every 1m0s: at least every 5m0s`}},
		{"keep nothing", map[string]string{"backup/nas.yaml": repoNAS, "vms/db-01.yaml": strings.Replace(vmBacked, "{last: 3, daily: 7, weekly: 4, monthly: 6}", "{last: 0}", 1)},
			[]string{`vms/db-01.yaml:13:5: spec.backup.keep: keeps nothing`}},
		{"keep out of range", map[string]string{"backup/nas.yaml": repoNAS, "vms/db-01.yaml": strings.Replace(vmBacked, "last: 3", "last: -1", 1)},
			[]string{`vms/db-01.yaml:13:18: spec.backup.keep.last: -1 is out of range`}},
		{"no repository", map[string]string{"vms/db-01.yaml": vmBacked},
			[]string{`vms/db-01.yaml:11:17: spec.backup.repository: BackupRepository "nas" does not exist`}},
		{"a repository the host does not use", map[string]string{"backup/nas.yaml": strings.Replace(repoNAS, "[hv-a, hv-b]", "[hv-b]", 1), "vms/db-01.yaml": vmBacked},
			[]string{`vms/db-01.yaml:11:17: spec.backup.repository: BackupRepository "nas" does not list this VM's host "hv-a" in spec.hosts (backup/nas.yaml:3:18)`}},
		{"a restore from a repository the host does not use", map[string]string{"backup/nas.yaml": strings.Replace(repoNAS, "[hv-a, hv-b]", "[hv-b]", 1) + "", "vms/db-02.yaml": vmRestored},
			[]string{`vms/db-02.yaml:11:17: spec.restore.repository: BackupRepository "nas" does not list this VM's host "hv-a"`}},
		{"a restore of no backup id", map[string]string{"backup/nas.yaml": repoNAS, "vms/db-02.yaml": strings.Replace(vmRestored, "backup: latest", "backup: Latest/../x", 1)},
			[]string{`vms/db-02.yaml:13:13: spec.restore.backup: "Latest/../x": want latest or a backup id`}},
		{"a profile that sets restore", map[string]string{"profiles/p.yaml": "apiVersion: gitfleet.dev/v1alpha1\nkind: Profile\nmetadata: {name: p}\nspec:\n  restore: {repository: nas, backup: latest}\n"},
			[]string{`profiles/p.yaml:5:3: spec.restore: a Profile does not set restore`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadDir(writeTree(t, withFiles(goodFleet, tc.files)))
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("errors:\n%v\nwant one starting %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("the error quotes the password: %v", err)
			}
		})
	}
}

func TestScheduleDue(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct{ schedule, last, due string }{
		{"every 6h", "2026-01-01T10:00:00Z", "2026-01-01T16:00:00Z"},
		{"daily at 03:00", "2026-01-01T02:59:00Z", "2026-01-01T03:00:00Z"},
		{"daily at 03:00", "2026-01-01T03:00:00Z", "2026-01-02T03:00:00Z"},
		{"daily at 23:30", "2026-01-31T23:45:00Z", "2026-02-01T23:30:00Z"},
	} {
		s, err := ParseSchedule(tc.schedule)
		if err != nil {
			t.Fatalf("%s: %v", tc.schedule, err)
		}
		if got := s.Due(at(tc.last)); !got.Equal(at(tc.due)) {
			t.Errorf("%s after %s: due %s, want %s", tc.schedule, tc.last, got, tc.due)
		}
	}
	s, _ := ParseSchedule("every 1h")
	if !s.Due(time.Time{}).IsZero() {
		t.Errorf("no backup yet: due %s, want at once", s.Due(time.Time{}))
	}
	for _, bad := range []string{"", "hourly", "every", "every x", "daily at 24:00", "daily at 3:00", "every 4m59s"} {
		if _, err := ParseSchedule(bad); err == nil {
			t.Errorf("ParseSchedule(%q) took it", bad)
		}
	}
}

func TestPlanSaysWhereARestoredVMsDisksComeFrom(t *testing.T) {
	base, err := LoadDir(writeTree(t, withFiles(goodFleet, map[string]string{"backup/nas.yaml": repoNAS})))
	if err != nil {
		t.Fatal(err)
	}
	head, err := LoadDir(writeTree(t, withFiles(goodFleet, map[string]string{"backup/nas.yaml": repoNAS, "vms/db-02.yaml": vmRestored})))
	if err != nil {
		t.Fatal(err)
	}
	p := ComputePlan(base, head, PlanOptions{})
	want := "disks restored from backup latest of VM db-01 in repository nas, not made from the image"
	for _, h := range p.Hosts {
		for _, c := range h.Changes {
			if c.Name == "db-02" && c.Action == ActionCreate {
				if len(c.Warnings) != 1 || c.Warnings[0] != want {
					t.Fatalf("warnings = %q, want %q", c.Warnings, want)
				}
				return
			}
		}
	}
	t.Fatalf("no create of db-02 in %+v", p.Hosts)
}
