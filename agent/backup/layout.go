package backup

import (
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"time"
)

// The layout of gitfleet's backups in a restic repository: the contract a
// person restores by hand with restic alone (docs/DESIGN.md, "Backups").
// One --stdin snapshot per disk per backup, holding the raw virtual disk
// as the guest sees it at <vm>/<disk>.raw (a volume backed up on its own:
// volumes/<volume>.raw), and one meta snapshot per backup holding
// <vm>/gitfleet-backup.json (a Manifest), written last. Every snapshot is
// tagged TagOwner, the VM (or volume) tag and the backup tag; restic's
// --host is the gitfleet host's name. So
//
//	restic snapshots --tag gitfleet,gitfleet-vm=web-01
//	restic dump <id> web-01/root.raw > root.raw
//
// lists a VM's backups and gives back a bootable raw disk.
const (
	// TagOwner marks every snapshot gitfleet wrote; Forget is scoped by it.
	TagOwner = "gitfleet"
	// TagMeta marks a backup's meta snapshot (TagPart + "meta").
	TagMeta = "gitfleet-part=meta"

	tagVM     = "gitfleet-vm="
	tagVolume = "gitfleet-volume="
	tagDisk   = "gitfleet-disk="
	tagBackup = "gitfleet-backup="

	// ManifestFile is the meta snapshot's file name inside <vm>/.
	ManifestFile = "gitfleet-backup.json"
)

// TagVM, TagVolume, TagDisk and TagBackup are the tags naming a VM, a
// volume, a disk and a backup id.
func TagVM(vm string) string              { return tagVM + vm }
func TagVolume(vol string) string         { return tagVolume + vol }
func TagDisk(disk string) string          { return tagDisk + disk }
func TagBackup(id string) string          { return tagBackup + id }
func DiskFilename(vm, disk string) string { return path.Join(vm, disk+".raw") }

// VolumeFilename is where a volume backed up on its own is stored.
func VolumeFilename(vol string) string { return path.Join("volumes", vol+".raw") }

// ManifestFilename is where a VM backup's meta snapshot keeps its
// Manifest.
func ManifestFilename(vm string) string { return path.Join(vm, ManifestFile) }

// DiskTags are the tags of the snapshot of one disk of a VM's backup.
func DiskTags(vm, disk, backupID string) []string {
	return []string{TagOwner, TagVM(vm), TagDisk(disk), TagBackup(backupID)}
}

// VolumeTags are the tags of a volume backed up on its own.
func VolumeTags(vol, backupID string) []string {
	return []string{TagOwner, TagVolume(vol), TagBackup(backupID)}
}

// MetaTags are the tags of a VM backup's meta snapshot.
func MetaTags(vm, backupID string) []string {
	return []string{TagOwner, TagVM(vm), TagMeta, TagBackup(backupID)}
}

// VMScope is what a Forget of a VM's backups made by host may touch.
func VMScope(host, vm string) Scope { return Scope{Host: host, Tags: []string{TagOwner, TagVM(vm)}} }

// VolumeScope is VMScope for a volume backed up on its own.
func VolumeScope(host, vol string) Scope {
	return Scope{Host: host, Tags: []string{TagOwner, TagVolume(vol)}}
}

// name is what a VM, volume, disk or backup id may be: it becomes a path
// element and a tag value.
var name = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,126}[a-z0-9])?$`)

// CheckName refuses a VM, volume, disk or backup id that cannot be a path
// element and a tag value (lowercase letters, digits, '.', '_', '-', at
// most 128 characters, starting and ending with a letter or digit).
func CheckName(what, s string) error {
	if !name.MatchString(s) || s == "volumes" {
		return configError("layout", "%s %q: want lowercase letters, digits, '.', '_' or '-' (at most 128)", what, s)
	}
	return nil
}

// Consistency of a backup: the guest's filesystems were frozen through
// its guest agent at the instant (application), or not (crash: what a
// power cut at that instant would have left).
const (
	ConsistencyApplication = "application"
	ConsistencyCrash       = "crash"
)

// Manifest is the meta snapshot's file, <vm>/gitfleet-backup.json: what a
// whole backup is. A backup counts only when the meta snapshot exists and
// every disk it names does; it is written last.
type Manifest struct {
	// Format is ManifestFormat.
	Format     int       `json:"format"`
	BackupID   string    `json:"backupID"`
	VM         string    `json:"vm"`
	InstanceID string    `json:"instanceID,omitempty"`
	Host       string    `json:"host"`
	Time       time.Time `json:"time"`
	// Consistency is ConsistencyApplication or ConsistencyCrash.
	Consistency string `json:"consistency"`
	// Spec is the VM's spec as the snapshot gave it (YAML or JSON, kept
	// verbatim so a restore can recreate the VM file).
	Spec    json.RawMessage `json:"spec,omitempty"`
	Disks   []ManifestDisk  `json:"disks"`
	Version string          `json:"gitfleetVersion,omitempty"`
}

// ManifestFormat is the Manifest format this package writes.
const ManifestFormat = 1

// ManifestDisk is one disk of a backup: its name ("root" or a volume's),
// the virtual size in bytes, the snapshot holding it, the file in that
// snapshot, and the sha256 (lowercase hex) of its whole stream.
type ManifestDisk struct {
	Name        string `json:"name"`
	VirtualSize int64  `json:"virtualSize"`
	SnapshotID  string `json:"snapshotID"`
	File        string `json:"file"`
	SHA256      string `json:"sha256"`
}

var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Check refuses a manifest that does not describe a whole backup.
func (m Manifest) Check() error {
	if m.Format != ManifestFormat {
		return configError("manifest", "format %d: this gitfleet reads %d", m.Format, ManifestFormat)
	}
	for _, c := range []struct{ what, v string }{{"vm", m.VM}, {"backup id", m.BackupID}} {
		if err := CheckName(c.what, c.v); err != nil {
			return err
		}
	}
	if m.Consistency != ConsistencyApplication && m.Consistency != ConsistencyCrash {
		return configError("manifest", "consistency %q", m.Consistency)
	}
	if len(m.Disks) == 0 {
		return configError("manifest", "no disks")
	}
	for _, d := range m.Disks {
		if err := CheckName("disk", d.Name); err != nil {
			return err
		}
		if d.VirtualSize <= 0 || !hex64.MatchString(d.SHA256) || !hex64.MatchString(d.SnapshotID) || d.File != DiskFilename(m.VM, d.Name) {
			return configError("manifest", "disk %s: size %d, sha256 %q, snapshot %q, file %q", d.Name, d.VirtualSize, d.SHA256, d.SnapshotID, d.File)
		}
	}
	return nil
}

// Disk returns the manifest's disk called name.
func (m Manifest) Disk(name string) (ManifestDisk, error) {
	for _, d := range m.Disks {
		if d.Name == name {
			return d, nil
		}
	}
	return ManifestDisk{}, fmt.Errorf("backup %s of %s has no disk %q", m.BackupID, m.VM, name)
}
