package desired

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gitfleet/gitfleet/agent/backup"
	"github.com/gitfleet/gitfleet/internal/safetext"
)

// KindBackupRepository is a restic repository hosts back their VMs up to
// (see BackupRepository).
const KindBackupRepository Kind = "BackupRepository"

// BackupRepositorySpec is a restic repository as git declares it: where it
// is, which hosts use it, and which one of them runs its maintenance. Its
// password and credentials are never in git: each host's agent
// configuration names the files that hold them, under the repository's
// name (docs/operating.md, "Backups").
type BackupRepositorySpec struct {
	// URL is restic's repository location: an absolute local path (a NAS
	// mount), sftp:[user@]host:/path, rest:https://host/path, s3:…, with
	// no secret in it (backup.CheckURL: a password, a user of a rest: URL
	// or a query string is refused).
	URL string `yaml:"url" json:"url"`
	// Hosts are the Hosts that use the repository: a VM may back up to it
	// or restore from it only on one of them. At least one.
	Hosts []string `yaml:"hosts" json:"hosts"`
	// Maintenance is the one host among Hosts that runs the repository's
	// prune and check (restic's exclusive lock), so hosts sharing it never
	// take turns at it.
	Maintenance string `yaml:"maintenance" json:"maintenance"`
}

func (BackupRepositorySpec) schema() typeSchema {
	return typeSchema{desc: "A restic repository hosts back up to; its password and credentials are files on each host, named in the agent config.", fields: map[string]fieldSchema{
		"url":         {minLength: 1, desc: "restic's repository location: an absolute path, sftp:[user@]host:/path, rest:https://host/path, s3:..., with no password or query string in it."},
		"hosts":       {minItems: 1, unique: true, items: &fieldSchema{shape: "name"}, desc: "The Hosts that use the repository."},
		"maintenance": {shape: "name", desc: "The one host of hosts that runs prune and check."},
	}}
}

// BackupRepository is a decoded BackupRepository object.
type BackupRepository struct {
	Metadata Metadata             `yaml:"metadata" json:"metadata"`
	Spec     BackupRepositorySpec `yaml:"spec" json:"spec"`
	Origin   Origin               `yaml:"-" json:"-"`
}

type backupRepositoryDoc struct {
	APIVersion string               `yaml:"apiVersion"`
	Kind       string               `yaml:"kind"`
	Metadata   Metadata             `yaml:"metadata"`
	Spec       BackupRepositorySpec `yaml:"spec"`
}

func (backupRepositoryDoc) schema() typeSchema { return envelope(KindBackupRepository) }

// BackupPolicy is a VM's opt-in to scheduled backups: the repository (a
// BackupRepository that lists the VM's host), when (Schedule, see
// ParseSchedule) and how many backups to keep (Keep, restic forget's
// policy, applied to this VM's backups made by its host only).
type BackupPolicy struct {
	Repository string     `yaml:"repository" json:"repository"`
	Schedule   string     `yaml:"schedule" json:"schedule"`
	Keep       BackupKeep `yaml:"keep" json:"keep"`
}

func (BackupPolicy) schema() typeSchema {
	return typeSchema{desc: "Scheduled backups of the VM's disks into a BackupRepository, while it runs.", fields: map[string]fieldSchema{
		"repository": {shape: "name", desc: "A BackupRepository whose hosts include the VM's host."},
		"schedule":   {pattern: scheduleSchemaPattern, desc: `When to back up: "every <duration>" (Go duration, at least 5m, such as "every 6h") or "daily at HH:MM" (UTC). The first backup is due at once.`},
		"keep":       {desc: "How many backups to keep (restic forget --keep-*); at least one of them above 0."},
	}}
}

// BackupKeep is restic forget's keep policy: the newest Last backups, and
// the newest of each of the last Daily days, Weekly weeks and Monthly
// months. At least one is above 0; each is at most MaxKeep.
type BackupKeep struct {
	Last    int `yaml:"last,omitempty" json:"last,omitempty"`
	Daily   int `yaml:"daily,omitempty" json:"daily,omitempty"`
	Weekly  int `yaml:"weekly,omitempty" json:"weekly,omitempty"`
	Monthly int `yaml:"monthly,omitempty" json:"monthly,omitempty"`
}

// MaxKeep bounds each count of BackupKeep.
const MaxKeep = 1000

func (BackupKeep) schema() typeSchema {
	r := between(0, MaxKeep)
	return typeSchema{fields: map[string]fieldSchema{
		"last":    {ints: r, desc: "Keep the newest this many backups."},
		"daily":   {ints: r, desc: "Keep the newest backup of each of the last this many days."},
		"weekly":  {ints: r, desc: "Keep the newest backup of each of the last this many weeks."},
		"monthly": {ints: r, desc: "Keep the newest backup of each of the last this many months."},
	}}
}

// Policy is the keep policy as agent/backup's Forget takes it.
func (k BackupKeep) Policy() backup.KeepPolicy {
	return backup.KeepPolicy{Last: k.Last, Daily: k.Daily, Weekly: k.Weekly, Monthly: k.Monthly}
}

// Schedule is a parsed BackupPolicy.Schedule: Every > 0 (every that long)
// or, with Every 0, daily at Daily past midnight UTC.
type Schedule struct {
	Every time.Duration
	Daily time.Duration
}

// MinBackupInterval is the shortest "every" schedule accepted.
const MinBackupInterval = 5 * time.Minute

const scheduleSchemaPattern = `^(every [0-9][0-9a-z.]*|daily at [0-2][0-9]:[0-5][0-9])$`

// ParseSchedule parses a backup schedule, one of two forms:
//
//	every <duration>   a Go duration of at least 5m: "every 6h", "every 90m"
//	daily at HH:MM     once a day at that time, UTC: "daily at 03:00"
//
// The error says what was wrong and never quotes more than 70 characters.
func ParseSchedule(s string) (Schedule, error) {
	if rest, ok := strings.CutPrefix(s, "every "); ok {
		d, err := time.ParseDuration(rest)
		switch {
		case err != nil:
			return Schedule{}, fmt.Errorf("%q: not a duration such as 6h or 90m", safetext.Truncate(rest, 70))
		case d < MinBackupInterval:
			return Schedule{}, fmt.Errorf("every %s: at least every %s", d, MinBackupInterval)
		}
		return Schedule{Every: d}, nil
	}
	if rest, ok := strings.CutPrefix(s, "daily at "); ok {
		h, m, ok := strings.Cut(rest, ":")
		hh, err1 := strconv.Atoi(h)
		mm, err2 := strconv.Atoi(m)
		if !ok || len(h) != 2 || len(m) != 2 || err1 != nil || err2 != nil || hh > 23 || mm > 59 || hh < 0 || mm < 0 {
			return Schedule{}, fmt.Errorf("%q: want HH:MM, 00:00 to 23:59 (UTC)", safetext.Truncate(rest, 70))
		}
		return Schedule{Daily: time.Duration(hh)*time.Hour + time.Duration(mm)*time.Minute}, nil
	}
	return Schedule{}, fmt.Errorf("%q: want \"every <duration>\" (such as every 6h) or \"daily at HH:MM\" (UTC)", safetext.Truncate(s, 70))
}

// Due is when the backup after one made at last is due: last + Every, or
// the first daily time after last. A zero last (no backup yet) is due at
// once (the zero time).
func (s Schedule) Due(last time.Time) time.Time {
	if last.IsZero() {
		return time.Time{}
	}
	if s.Every > 0 {
		return last.Add(s.Every)
	}
	last = last.UTC()
	day := time.Date(last.Year(), last.Month(), last.Day(), 0, 0, 0, 0, time.UTC).Add(s.Daily)
	if !day.After(last) {
		day = day.AddDate(0, 0, 1)
	}
	return day
}

// RestoreSource names the backup a new VM's disks are made from: the
// backup Backup ("latest", or a gitfleet backup id such as
// "20260102t030000z-1a2b3c4d", the gitfleet-backup= tag) of VM ("": the
// VM's own name) made by Host ("": any host) in Repository, a
// BackupRepository whose hosts include the VM's host. Its root disk is
// the backup's, grown to diskGB when that is larger; its volumes, in
// order, get the backup's volumes in order (the counts must match), each
// volume file found there kept aside, never overwritten. It is read when
// the VM is created only: on a created VM it changes nothing.
type RestoreSource struct {
	Repository string `yaml:"repository" json:"repository"`
	VM         string `yaml:"vm,omitempty" json:"vm,omitempty"`
	Host       string `yaml:"host,omitempty" json:"host,omitempty"`
	Backup     string `yaml:"backup" json:"backup"`
}

// RestoreLatest is RestoreSource.Backup for the newest whole backup.
const RestoreLatest = "latest"

func (RestoreSource) schema() typeSchema {
	return typeSchema{desc: "The backup a new VM's disks are made from.", fields: map[string]fieldSchema{
		"repository": {shape: "name", desc: "A BackupRepository whose hosts include the VM's host."},
		"vm":         {shape: "name", desc: "The VM whose backup it is; this VM's own name when left out."},
		"host":       {shape: "name", desc: "The host that made the backup; any host when left out."},
		"backup":     {minLength: 1, desc: `"latest", or a gitfleet backup id (the gitfleet-backup= tag, status' lastBackupID).`},
	}}
}

// checkRestore checks a VM's spec.restore by itself.
func (d *nodeDecoder) checkRestore(r *RestoreSource) {
	const f = "spec.restore"
	if d.required(f + ".repository") {
		d.name(f+".repository", r.Repository)
	}
	for _, n := range []struct{ field, v string }{{"vm", r.VM}, {"host", r.Host}} {
		if d.written(f + "." + n.field) {
			d.name(f+"."+n.field, n.v)
		}
	}
	if d.required(f+".backup") && !d.bad[f+".backup"] && r.Backup != RestoreLatest {
		if backup.CheckName("backup id", r.Backup) != nil {
			d.add(d.valPos(f+".backup"), f+".backup", "%q: want latest or a backup id (lowercase letters, digits, '.', '_', '-')", safetext.Truncate(r.Backup, 70))
		}
	}
}

// checkBackup checks a VM's (or a Profile's) spec.backup by itself;
// whether its repository exists and serves the VM's host is a
// cross-object check.
func (d *nodeDecoder) checkBackup(p *BackupPolicy) {
	const f = "spec.backup"
	if d.required(f + ".repository") {
		d.name(f+".repository", p.Repository)
	}
	if d.required(f+".schedule") && !d.bad[f+".schedule"] {
		if _, err := ParseSchedule(p.Schedule); err != nil {
			d.add(d.valPos(f+".schedule"), f+".schedule", "%v", err)
		}
	}
	if !d.required(f + ".keep") {
		return
	}
	k := p.Keep
	for _, c := range []struct {
		field string
		n     int
	}{{"last", k.Last}, {"daily", k.Daily}, {"weekly", k.Weekly}, {"monthly", k.Monthly}} {
		d.intRange(f+".keep."+c.field, c.n, 0, MaxKeep, "")
	}
	if k.Last <= 0 && k.Daily <= 0 && k.Weekly <= 0 && k.Monthly <= 0 && !d.bad[f+".keep"] {
		d.add(d.keyPos(f+".keep"), f+".keep", "keeps nothing: set at least one of last, daily, weekly, monthly above 0 (every backup would be forgotten)")
	}
}

// checkBackupRepository checks a BackupRepository by itself.
func (d *nodeDecoder) checkBackupRepository(s *BackupRepositorySpec) {
	if d.required("spec.url") && !d.bad["spec.url"] {
		if err := backup.CheckURL(s.URL); err != nil {
			d.add(d.valPos("spec.url"), "spec.url", "%v", err)
		}
	}
	seen := map[string]int{}
	if d.required("spec.hosts") && len(s.Hosts) == 0 && !d.bad["spec.hosts"] {
		d.add(d.valPos("spec.hosts"), "spec.hosts", "lists no host; a repository no host uses serves nothing")
	}
	for i, h := range s.Hosts {
		f := indexPath("spec.hosts", i)
		d.name(f, h)
		if j, ok := seen[h]; ok {
			d.add(d.valPos(f), f, "host %q is listed twice (first at spec.hosts[%d])", h, j)
		}
		seen[h] = i
	}
	if d.required("spec.maintenance") {
		d.name("spec.maintenance", s.Maintenance)
		if _, ok := seen[s.Maintenance]; !ok && len(s.Hosts) > 0 && !d.bad["spec.maintenance"] {
			d.add(d.valPos("spec.maintenance"), "spec.maintenance", "%q is not one of spec.hosts: the maintenance host must use the repository", s.Maintenance)
		}
	}
}

// backupRepositoryHosts checks that every host a BackupRepository lists
// exists.
func (c *crossChecker) backupRepositoryHosts(o *object) {
	if !c.complete {
		return
	}
	for i, h := range o.backupRepo.Spec.Hosts {
		if _, ok := c.hosts[h]; !ok {
			c.add(o, o.at.repoHosts[i], indexPath("spec.hosts", i), "Host %q does not exist", h)
		}
	}
}

// vmBackup checks that the repository a VM backs up to (and restores
// from) exists and lists the VM's host.
func (c *crossChecker) vmBackup(o *object) {
	s := &o.vm.Spec
	check := func(field string, at pos, name string) {
		r, ok := c.backupRepos[name]
		switch {
		case !ok:
			if c.complete {
				c.add(o, at, field, "BackupRepository %q does not exist", name)
			}
		case !r.backupRepo.Spec.servesHost(s.Host):
			c.add(o, at, field, "BackupRepository %q does not list this VM's host %q in spec.hosts (%s:%d:%d): the host has no way to reach it",
				name, s.Host, r.origin().File, r.at.name.line, r.at.name.col)
		}
	}
	if s.Backup != nil {
		check("spec.backup.repository", o.at.backupRepository, s.Backup.Repository)
	}
	if s.Restore != nil {
		check("spec.restore.repository", o.at.restoreRepository, s.Restore.Repository)
	}
}

// servesHost reports whether host uses the repository.
func (s *BackupRepositorySpec) servesHost(host string) bool {
	for _, h := range s.Hosts {
		if h == host {
			return true
		}
	}
	return false
}

// BackupRepositoriesOf returns the repositories of f that host uses, by
// name.
func (f *Fleet) BackupRepositoriesOf(host string) map[string]*BackupRepository {
	out := map[string]*BackupRepository{}
	for name, r := range f.BackupRepositories {
		if r.Spec.servesHost(host) {
			out[name] = r
		}
	}
	return out
}
