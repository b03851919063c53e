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
//
// It also returns the quarantined volumes: tombstoned volumes still
// present, with their marker's time and nonce.
func (e *Engine) reconcileVolumes(snap *snapshots.Snapshot, inUse map[string]bool) ([]status.Volume, []string, []status.Quarantine) {
	rows := make([]status.Volume, 0, len(snap.Volumes))
	named := make(map[string]bool, len(snap.Volumes))
	var quarantined []status.Quarantine
	for _, v := range snap.Volumes {
		if err := checkName("volume", v.Name); err != nil {
			// Refused before any path is built; answered, so the controller
			// hears about every volume it named.
			e.log.WithField("volume", v.Name).Warn("refusing a volume name that is not a DNS label")
			rows = append(rows, status.Volume{Name: v.Name, Present: false})
			continue
		}
		named[v.Name] = true
		row, q := e.convergeVolume(v, inUse[v.Name])
		rows = append(rows, row)
		if q != nil {
			quarantined = append(quarantined, *q)
		}
	}
	orphans := e.orphanVolumes(named)
	for _, n := range orphans {
		// A reclaim the snapshot no longer asks for is forgotten: if the
		// tombstone returns, it gets a whole new grace and nonce.
		e.endWait(confirmVolume, n)
		if err := os.Remove(e.volumeMarker(n)); err == nil {
			e.log.WithField("volume", n).Warn("tombstoned volume left the snapshot without a finalized delete; kept as an orphan, its pending reclaim forgotten")
		}
	}
	return rows, orphans, quarantined
}

// reportVolumes describes the snapshot's volumes, the orphans and the
// quarantined volumes (from their markers) without touching anything: the
// fence and suspend paths use it. A suspended or fenced host removes
// nothing, so no quarantine promises a time.
func (e *Engine) reportVolumes(snap *snapshots.Snapshot) ([]status.Volume, []string, []status.Quarantine) {
	named := map[string]bool{}
	var rows []status.Volume
	var quarantined []status.Quarantine
	if snap != nil {
		for _, v := range snap.Volumes {
			if !validName(v.Name) {
				rows = append(rows, status.Volume{Name: v.Name})
				continue
			}
			named[v.Name] = true
			row := e.statVolume(v.Name)
			rows = append(rows, row)
			if !v.Tombstoned || !row.Present {
				continue
			}
			if m, err := readMarker(e.volumeMarker(v.Name)); err == nil {
				q := status.Quarantine{Name: v.Name, Since: m.since.UTC()}
				e.confirmRow(&q, m.confirm, v.Tombstone)
				quarantined = append(quarantined, q)
			}
		}
	}
	return rows, e.orphanVolumes(named), quarantined
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
// A tombstoned volume is reclaimed (reclaimVolume), and its quarantine row
// returned while it is present.
func (e *Engine) convergeVolume(v snapshots.SnapshotVolume, inUse bool) (status.Volume, *status.Quarantine) {
	if v.Tombstoned {
		return e.reclaimVolume(v, inUse)
	}
	// An un-deleted volume forgets its pending reclaim, and its nonce.
	e.endWait(confirmVolume, v.Name)
	if err := os.Remove(e.volumeMarker(v.Name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		e.log.WithField("volume", v.Name).WithError(err).Warn("cannot clear volume tombstone marker")
	}
	if row := e.statVolume(v.Name); row.Present {
		return row, nil
	}
	if err := createSparse(e.store.VolumePath(v.Name), v.SizeGB); err != nil {
		e.log.WithField("volume", v.Name).WithError(err).Warn("create volume")
		return status.Volume{Name: v.Name, Present: false}, nil
	}
	e.log.WithField("volume", v.Name).WithField("sizeGB", v.SizeGB).Info("volume created")
	return e.statVolume(v.Name), nil
}

func (e *Engine) volumeMarker(name string) string {
	return e.store.VolumePath(name) + tombstoneSuffix
}

// reclaimVolume deletes a tombstoned volume once TombstoneGrace has passed
// since its marker was written and, when the engine requires it, the
// snapshot's tombstone carries the marker's nonce (confirm.go), given
// only once the grace has passed and no VM holds the volume. The marker
// is on disk, so the grace and the nonce survive restarts and do not
// restart with every snapshot that restates the tombstone. A volume still
// attached to a running VM waits for that VM. It returns the volume's row
// and, while the volume is present, its quarantine row.
func (e *Engine) reclaimVolume(v snapshots.SnapshotVolume, inUse bool) (status.Volume, *status.Quarantine) {
	name := v.Name
	log := e.log.WithField("volume", name)
	fi, present, err := inspectVolume(e.store.VolumePath(name))
	row := e.volumeRow(name, fi, present, err)
	if !present {
		e.endWait(confirmVolume, name)
		_ = os.Remove(e.volumeMarker(name))
		return row, nil
	}
	if errors.Is(err, ErrVolumeUnusable) {
		// Not a volume the agent made: a tombstone is no permission to
		// remove a directory, a device or a link.
		log.WithError(err).Warn("tombstoned volume path holds no volume file; left as it is")
		return row, nil
	}
	m, err := e.volumeQuarantine(name)
	if err != nil {
		// A grace or nonce that cannot be read or kept is no permission
		// to delete.
		log.WithError(err).Warn("volume tombstone marker")
		return row, nil
	}
	q := &status.Quarantine{Name: name, Since: m.since.UTC(), DestroyAt: m.since.Add(e.cfg.TombstoneGrace).UTC()}
	if e.now().Sub(m.since) < e.cfg.TombstoneGrace {
		if m.confirm != "" {
			// Given inside the grace (by an earlier release): dropped,
			// as a VM's is (vmPass.remove).
			m.confirm = ""
			if err := writeMarker(e.volumeMarker(name), m); err != nil {
				log.WithError(err).Warn("volume tombstone marker")
			}
		}
		return row, q
	}
	if inUse {
		log.Info("tombstoned volume still attached to a VM on this host (or a VM record is unreadable); waiting")
		e.confirmRow(q, m.confirm, v.Tombstone)
		return row, q
	}
	if e.ConfirmsDeletes() && m.confirm == "" {
		// Its nonce only now, as a VM's (vmPass.remove): every
		// confirmation postdates the grace.
		if err := e.giveVolumeConfirm(name, &m); err != nil {
			log.WithError(err).Warn("volume tombstone marker: no confirmation nonce; retrying next tick")
		}
		e.confirmRow(q, m.confirm, v.Tombstone)
		return row, q
	}
	e.confirmRow(q, m.confirm, v.Tombstone)
	if !e.confirmed(confirmVolume, name, m.confirm, v.Tombstone) {
		return row, q
	}
	if err := os.Remove(e.store.VolumePath(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		log.WithError(err).Warn("reclaim volume")
		q.LastError = "remove: " + err.Error()
		return row, q
	}
	e.endWait(confirmVolume, name)
	_ = os.Remove(e.volumeMarker(name))
	_ = syncDir(e.store.VolumesDir())
	log.Info("tombstoned volume deleted after its grace")
	return status.Volume{Name: name, Present: false}, nil
}

// volumeQuarantine reads the tombstoned volume's marker, writing it first
// when there is none (the tombstone is first seen now). The marker gets
// its nonce only once the grace has passed (giveVolumeConfirm).
func (e *Engine) volumeQuarantine(name string) (marker, error) {
	path := e.volumeMarker(name)
	m, err := readMarker(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return m, err
	}
	m = marker{since: e.now()}
	if err := writeMarker(path, m); err != nil {
		return marker{}, err
	}
	e.log.WithField("volume", name).WithField("grace", e.cfg.TombstoneGrace.String()).Info("tombstoned volume quarantined")
	return m, nil
}

// giveVolumeConfirm gives m, the marker of the tombstoned volume name
// whose grace has passed, a fresh nonce and writes it. On error m is
// unchanged.
func (e *Engine) giveVolumeConfirm(name string, m *marker) error {
	c, err := newConfirm()
	if err != nil {
		return err
	}
	next := *m
	next.confirm = c
	if err := writeMarker(e.volumeMarker(name), next); err != nil {
		return err
	}
	*m = next
	e.log.WithField("volume", name).WithField("confirm", c).Info("tombstone grace passed; quarantined volume given a confirmation nonce for the controller to confirm")
	return nil
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

// marker is what a volume's tombstone marker records: when the tombstone
// was first seen and, when deletes need confirmation, the quarantine's
// nonce ("" when none).
type marker struct {
	since   time.Time
	confirm string
}

// confirmPrefix starts a marker's nonce line.
const confirmPrefix = "confirm "

// writeMarker records m in a marker file: the time (RFC 3339,
// nanoseconds) on the first line, then "confirm <nonce>" when m has one.
// It sets the file's mtime to the time as well, for a person reading ls -l.
func writeMarker(path string, m marker) error {
	data := m.since.UTC().Format(time.RFC3339Nano) + "\n"
	if m.confirm != "" {
		data += confirmPrefix + m.confirm + "\n"
	}
	if err := writeFileAtomic(path, []byte(data)); err != nil {
		return err
	}
	_ = os.Chtimes(path, m.since, m.since)
	return nil
}

// readMarker reads a marker. A time that does not parse falls back to the
// file's mtime; a nonce line that is not a nonce (snapshots.ValidConfirm)
// reads as none, and is replaced by a fresh one.
func readMarker(path string) (marker, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return marker{}, err
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	var m marker
	if len(lines) > 1 {
		if c, ok := strings.CutPrefix(strings.TrimSpace(lines[1]), confirmPrefix); ok && snapshots.ValidConfirm(c) {
			m.confirm = c
		}
	}
	if t, perr := time.Parse(time.RFC3339Nano, strings.TrimSpace(lines[0])); perr == nil {
		m.since = t
		return m, nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return marker{}, err
	}
	m.since = fi.ModTime()
	return m, nil
}
