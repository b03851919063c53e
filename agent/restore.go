package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/gitfleet/gitfleet/agent/backup"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
)

// StepRestore is the create step that makes a VM's disks from a backup
// (spec.restore) instead of its image.
const StepRestore = "restore"

// maxManifest bounds a backup manifest read from a repository (bytes).
const maxManifest = 1 << 20

// restore makes the disks of the VM being created from the backup its
// spec.restore names, before its root disk step (which then only grows the
// restored disk to diskGB). It runs only while the create never completed
// and the VM is not running, and never writes over a disk: the provisioner
// refuses a running VM's disk, and a volume file already there (made
// empty by the volume pass, or a partial earlier attempt's) is kept aside
// as <file>.before-restore-<unix time>. Once every disk is in place the
// record says which backup it came from (Record.RestoredFrom) and a retry
// of the create does not restore again. A VM restored under its own name
// keeps the backup's instance-id (the same machine: cloud-init does not
// run its first boot again); under another name it is a new instance.
func (p *vmPass) restore(ctx context.Context, m *Machine) error {
	rec, src := p.rec, p.rec.Spec.Restore
	if src == nil || rec.RestoredFrom != "" {
		return nil
	}
	ds, ok := p.e.prov.(DiskSnapshotter)
	if !ok {
		return Permanent(ErrBackupUnsupported)
	}
	if err := p.volumesPresent(rec.Spec); err != nil {
		return err
	}
	repo, err := p.e.openRepository(ctx, src.Repository, p.e.snapshotRepository(src.Repository))
	if err != nil {
		return err
	}
	man, err := p.e.findBackup(ctx, repo, rec.Name, src)
	if err != nil {
		return err
	}
	if err := restoreFits(man, rec.Spec, len(m.Volumes)); err != nil {
		return Permanent(err)
	}
	for i, d := range man.Disks {
		target := "root"
		if i > 0 {
			target = filepath.Base(m.Volumes[i-1])
		}
		if err := p.restoreDisk(ctx, ds, repo, *m, target, d); err != nil {
			return fmt.Errorf("disk %s (from %s of %s): %w", target, d.Name, man.VM, err)
		}
	}
	if man.VM == rec.Name && man.InstanceID != "" {
		rec.InstanceID, m.InstanceID = man.InstanceID, man.InstanceID
	}
	rec.RestoredFrom = man.BackupID
	p.log.WithField("backup", man.BackupID).WithField("from", man.VM).WithField("madeBy", man.Host).Info("disks restored from the backup")
	return p.e.commit(rec)
}

// restoreFits refuses a backup whose disks do not fit the spec: the root
// disk larger than diskGB (disks never shrink), or another number of
// volumes than the VM has.
func restoreFits(man backup.Manifest, spec desired.VMSpec, volumes int) error {
	if man.Disks[0].Name != "root" {
		return fmt.Errorf("backup %s of %s has no root disk first", man.BackupID, man.VM)
	}
	if want := int64(spec.DiskGB) << 30; man.Disks[0].VirtualSize > want {
		return fmt.Errorf("backup %s of %s has a root disk of %d bytes, larger than diskGB %d: disks never shrink; raise diskGB", man.BackupID, man.VM, man.Disks[0].VirtualSize, spec.DiskGB)
	}
	if len(man.Disks)-1 != volumes {
		return fmt.Errorf("backup %s of %s has %d volumes, the VM %d: list as many volumes, in the order of the backed-up VM's", man.BackupID, man.VM, len(man.Disks)-1, volumes)
	}
	return nil
}

// restoreDisk writes one disk of the backup into place.
func (p *vmPass) restoreDisk(ctx context.Context, ds DiskSnapshotter, repo *backup.Repository, m Machine, target string, d backup.ManifestDisk) error {
	rc, err := repo.Dump(ctx, d.SnapshotID, d.File)
	if err != nil {
		return err
	}
	defer rc.Close()
	out, err := ds.RestoreDisk(ctx, RestoreRequest{Machine: m, Disk: target, Size: d.VirtualSize, SHA256: d.SHA256, Replace: true}, rc)
	if err != nil {
		return err
	}
	if out.KeptOld != "" {
		p.log.WithField("disk", target).WithField("keptAs", out.KeptOld).Warn("a disk was in the restored disk's place; kept aside")
	}
	return nil
}

// snapshotRepository is the accepted snapshot's repository name (zero
// when it has none for this host).
func (e *Engine) snapshotRepository(name string) snapshots.SnapshotBackupRepository {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s := e.snap.BackupRepository(name); s != nil {
		return *s
	}
	return snapshots.SnapshotBackupRepository{}
}

// findBackup finds the whole backup src names of vm (src.VM when set) and
// returns its manifest: the newest meta snapshot with the VM's tags (of
// src.Host when set, and of the backup id unless "latest"), read back and
// checked. A backup without its meta snapshot is not whole and never
// found.
func (e *Engine) findBackup(ctx context.Context, repo *backup.Repository, vm string, src *desired.RestoreSource) (backup.Manifest, error) {
	if src.VM != "" {
		vm = src.VM
	}
	tags := []string{backup.TagOwner, backup.TagVM(vm), backup.TagMeta}
	if src.Backup != desired.RestoreLatest {
		tags = append(tags, backup.TagBackup(src.Backup))
	}
	list, err := repo.Snapshots(ctx, backup.Filter{Host: src.Host, Tags: tags})
	if err != nil {
		return backup.Manifest{}, err
	}
	if len(list) == 0 {
		return backup.Manifest{}, Permanent(fmt.Errorf("no whole backup %s of VM %s in repository %s (host %q): restic snapshots --tag %s lists none",
			src.Backup, vm, src.Repository, src.Host, joinTags(tags)))
	}
	meta := list[len(list)-1]
	rc, err := repo.Dump(ctx, meta.ID, backup.ManifestFilename(vm))
	if err != nil {
		return backup.Manifest{}, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, maxManifest+1))
	if err != nil {
		return backup.Manifest{}, err
	}
	var man backup.Manifest
	if len(data) > maxManifest {
		return man, Permanent(fmt.Errorf("manifest of snapshot %s is larger than %d bytes", meta.ShortID, maxManifest))
	}
	if err := json.Unmarshal(data, &man); err != nil {
		return man, Permanent(fmt.Errorf("manifest of snapshot %s: %w", meta.ShortID, err))
	}
	if err := man.Check(); err != nil {
		return man, Permanent(fmt.Errorf("manifest of snapshot %s: %w", meta.ShortID, err))
	}
	if man.VM != vm {
		return man, Permanent(fmt.Errorf("manifest of snapshot %s is of VM %s, not %s", meta.ShortID, man.VM, vm))
	}
	return man, nil
}

func joinTags(tags []string) string { return strings.Join(tags, ",") }
