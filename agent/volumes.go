package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
)

// maxVolumeGB bounds what can be a volume at all (1 PiB); the desired
// package validates what a fleet may ask for.
const maxVolumeGB = 1 << 20

// reconcileVolumes drives the volumes directory toward snap and reports a row
// for every volume the snapshot names (present or not: silence would read as
// gone) and the names of orphans, files no snapshot names. Orphans are kept:
// automation never deletes a volume except for its own tombstone, and an
// orphan's pending reclaim marker is removed.
//
// It runs inside Tick, before any VM worker is kicked, so a VM's volumes
// exist when it boots. Sparse creation costs nothing, so it is synchronous.
func (e *Engine) reconcileVolumes(snap *snapshots.Snapshot, inUse map[string]bool) ([]status.Volume, []string) {
	rows := make([]status.Volume, 0, len(snap.Volumes))
	named := make(map[string]bool, len(snap.Volumes))
	for _, v := range snap.Volumes {
		if err := checkName("volume", v.Name); err != nil {
			// Refused before any path is built; answered, so the controller
			// hears about every volume it named.
			e.log.WithField("volume", v.Name).Warn("refusing a volume name that is not a DNS label")
			rows = append(rows, status.Volume{Name: v.Name, Present: false})
			continue
		}
		named[v.Name] = true
		rows = append(rows, e.convergeVolume(v, inUse[v.Name]))
	}
	orphans := e.orphanVolumes(named)
	for _, n := range orphans {
		// A reclaim the snapshot no longer asks for is forgotten: if the
		// tombstone returns, it gets a whole new grace.
		if err := os.Remove(e.volumeMarker(n)); err == nil {
			e.log.WithField("volume", n).Warn("tombstoned volume left the snapshot without a finalized delete; kept as an orphan, its pending reclaim forgotten")
		}
	}
	return rows, orphans
}

// reportVolumes describes the snapshot's volumes and the orphans without
// touching anything: the fence path uses it.
func (e *Engine) reportVolumes(snap *snapshots.Snapshot) ([]status.Volume, []string) {
	named := map[string]bool{}
	var rows []status.Volume
	if snap != nil {
		for _, v := range snap.Volumes {
			if !validName(v.Name) {
				rows = append(rows, status.Volume{Name: v.Name})
				continue
			}
			named[v.Name] = true
			rows = append(rows, e.statVolume(v.Name))
		}
	}
	return rows, e.orphanVolumes(named)
}

// orphanVolumes lists volume files whose names are not in named, sorted. It
// only reads the directory. Entries carrying a '.' are the store's own
// temporaries and markers (a DNS label has none).
func (e *Engine) orphanVolumes(named map[string]bool) []string {
	ents, err := os.ReadDir(e.store.VolumesDir())
	if err != nil {
		e.log.WithError(err).Warn("cannot list the volumes directory; orphans unreported")
		return nil
	}
	var out []string
	for _, ent := range ents {
		n := ent.Name()
		if strings.Contains(n, ".") || named[n] || ent.IsDir() {
			continue
		}
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// statVolume reports what is at the volume's path. Only "does not exist" is
// evidence of absence: any other error reads as present (size unknown, 0),
// because absence is what leads to creating the file, and a create ends in a
// rename over the path.
// Something that is there but is no usable volume (a symlink to nothing, a
// directory, a device) is present too, with Error saying what it is: it is
// never created over, deleted or replaced.
func (e *Engine) statVolume(name string) status.Volume {
	fi, present, err := inspectVolume(e.store.VolumePath(name))
	return e.volumeRow(name, fi, present, err)
}

// volumeRow is statVolume's row for what inspectVolume found.
func (e *Engine) volumeRow(name string, fi fs.FileInfo, present bool, err error) status.Volume {
	switch {
	case !present:
		return status.Volume{Name: name, Present: false}
	case err != nil:
		e.log.WithField("volume", name).WithError(err).Warn("volume path holds no usable file; treating it as present and leaving it as it is")
		return status.Volume{Name: name, Present: true, Error: err.Error()}
	}
	return status.Volume{Name: name, Present: true, SizeGB: int(fi.Size() >> 30)}
}

// inspectVolume says what is at a volume's path. present is false only when
// nothing at all is there (not even a symlink). err is non-nil for a
// present path that is no usable volume: a symlink whose target does not
// exist (ErrVolumeUnusable), something other than a regular file
// (Permanent, ErrVolumeUnusable), or a stat error (present, size unknown).
func inspectVolume(path string) (fi fs.FileInfo, present bool, err error) {
	fi, err = os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, lerr := os.Lstat(path); lerr == nil {
			target, _ := os.Readlink(path)
			return nil, true, fmt.Errorf("%s is a symlink to %q, which does not exist; fix or remove the link: %w", path, target, ErrVolumeUnusable)
		}
		return nil, false, nil
	case err != nil:
		return nil, true, fmt.Errorf("stat %s: %w", path, err)
	case !fi.Mode().IsRegular():
		return fi, true, Permanent(fmt.Errorf("%s is not a regular file (mode %s); refusing to attach it, and it is never deleted or replaced: %w", path, fi.Mode().Type(), ErrVolumeUnusable))
	}
	return fi, true, nil
}

// convergeVolume brings one named volume toward its spec and reports it.
// A present volume is never resized, in either direction: the guest's
// filesystem was made against its size.
func (e *Engine) convergeVolume(v snapshots.SnapshotVolume, inUse bool) status.Volume {
	if v.Tombstoned {
		return e.reclaimVolume(v.Name, inUse)
	}
	// An un-deleted volume forgets its pending reclaim.
	if err := os.Remove(e.volumeMarker(v.Name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		e.log.WithField("volume", v.Name).WithError(err).Warn("cannot clear volume tombstone marker")
	}
	if row := e.statVolume(v.Name); row.Present {
		return row
	}
	if err := createSparse(e.store.VolumePath(v.Name), v.SizeGB); err != nil {
		e.log.WithField("volume", v.Name).WithError(err).Warn("create volume")
		return status.Volume{Name: v.Name, Present: false}
	}
	e.log.WithField("volume", v.Name).WithField("sizeGB", v.SizeGB).Info("volume created")
	return e.statVolume(v.Name)
}

func (e *Engine) volumeMarker(name string) string {
	return e.store.VolumePath(name) + tombstoneSuffix
}

// reclaimVolume deletes a tombstoned volume once TombstoneGrace has passed
// since its marker was written. The marker is on disk, so the grace survives
// restarts and does not restart with every snapshot that restates the
// tombstone. A volume still attached to a running VM waits for that VM.
func (e *Engine) reclaimVolume(name string, inUse bool) status.Volume {
	fi, present, err := inspectVolume(e.store.VolumePath(name))
	row := e.volumeRow(name, fi, present, err)
	if !present {
		_ = os.Remove(e.volumeMarker(name))
		return row
	}
	if errors.Is(err, ErrVolumeUnusable) {
		// Not a volume the agent made: a tombstone is no permission to
		// remove a directory, a device or a link.
		e.log.WithField("volume", name).WithError(err).Warn("tombstoned volume path holds no volume file; left as it is")
		return row
	}
	since, err := readMarker(e.volumeMarker(name))
	if errors.Is(err, fs.ErrNotExist) {
		since = e.now()
		err = writeMarker(e.volumeMarker(name), since)
	}
	if err != nil {
		// A grace that cannot be read is no permission to delete.
		e.log.WithField("volume", name).WithError(err).Warn("volume tombstone marker")
		return row
	}
	if e.now().Sub(since) < e.cfg.TombstoneGrace {
		return row
	}
	if inUse {
		e.log.WithField("volume", name).Info("tombstoned volume still attached to a VM on this host (or a VM record is unreadable); waiting")
		return row
	}
	if err := os.Remove(e.store.VolumePath(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		e.log.WithField("volume", name).WithError(err).Warn("reclaim volume")
		return row
	}
	_ = os.Remove(e.volumeMarker(name))
	_ = syncDir(e.store.VolumesDir())
	e.log.WithField("volume", name).Info("tombstoned volume deleted after its grace")
	return status.Volume{Name: name, Present: false}
}

// createSparse makes a sizeGB (GiB) sparse file at path through
// path.partial and a rename, so the final path only ever holds a complete
// volume.
func createSparse(path string, sizeGB int) error {
	if sizeGB < 1 || sizeGB > maxVolumeGB {
		return fmt.Errorf("volume size %d GB out of range 1..%d", sizeGB, maxVolumeGB)
	}
	tmp := path + partialSuffix
	_ = os.Remove(tmp) // a torn earlier attempt
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if err := f.Truncate(int64(sizeGB) << 30); err != nil {
		_ = f.Close()
		_ = os.Remove(tmp)
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		_ = os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	// Renamed into place without clobbering: a hard link fails if something
	// appeared at path meanwhile, so a create can never replace a volume. A
	// filesystem without hard links gets a plain rename.
	switch err := os.Link(tmp, path); {
	case errors.Is(err, fs.ErrExist):
		_ = os.Remove(tmp)
		return err
	case err != nil:
		if err := os.Rename(tmp, path); err != nil {
			_ = os.Remove(tmp)
			return err
		}
	default:
		_ = os.Remove(tmp)
	}
	return syncDir(filepath.Dir(path))
}

// writeMarker records t in a marker file (RFC 3339, nanoseconds) and sets
// its mtime to t as well, for a person reading ls -l.
func writeMarker(path string, t time.Time) error {
	if err := writeFileAtomic(path, []byte(t.UTC().Format(time.RFC3339Nano)+"\n")); err != nil {
		return err
	}
	_ = os.Chtimes(path, t, t)
	return nil
}

// readMarker reads the time a marker records; a marker whose content does not
// parse falls back to its mtime.
func readMarker(path string) (time.Time, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, err
	}
	if t, perr := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(data))); perr == nil {
		return t, nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return time.Time{}, err
	}
	return fi.ModTime(), nil
}
