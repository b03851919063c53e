package agent

import (
	"fmt"
	"sort"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
)

// Report describes the host as the engine knows it, in the status file's
// shape (docs/DESIGN.md, Branches and files). Agent, Heartbeat and ObservedAt
// are left for the writer; SnapshotError says why the host is fenced, if it
// is, and the writer may put a fetch's refusal there instead. It reads only memory (and the
// provisioner's optional progress for VMs being created, and its Readiness
// for VMs recorded ready), so it is cheap.
//
//   - VMs: a row per desired, non-tombstoned VM (sorted by name), and per VM
//     still being shut down for a delete; a VM whose record cannot be read
//     keeps its row as failed with the reason. IP and SSH are shown only
//     while the VM's power is running. A VM recorded ready whose current
//     boot has not answered (Provisioner.Readiness) is shown booting.
//   - Quarantined: tombstoned VMs shut down and waiting for their grace
//     and, when the engine requires it, for the controller's confirmation
//     (Confirm, Confirmed); QuarantinedVolumes the same for volumes.
//   - Vanished: VMs this host keeps although the snapshot dropped them
//     without a tombstone: left as they are for VanishGrace, then shut down
//     and kept (Quarantined set), never destroyed.
//   - Destroyed: every tombstoned VM of the accepted snapshot that this host
//     no longer has, repeated on every report until the name leaves the
//     snapshot.
//   - Volumes and Orphans: as the last tick found them (read from disk
//     while fenced or suspended).
//   - Suspended: set while the accepted snapshot suspends the host; VM
//     rows then show what the provisioner observes (observeSuspended).
//
// The engine lock is held only to copy what the engine knows; the
// provisioner's answers and the volume directory (read while fenced) are
// asked for after it is released.
func (e *Engine) Report() *status.Status {
	st, snap, fenced := e.reportLocked()
	if fenced || st.Suspended != nil {
		st.Volumes, st.Orphans, st.QuarantinedVolumes = e.reportVolumes(snap)
		if st.Volumes == nil {
			st.Volumes = []status.Volume{}
		}
	}
	progress, _ := e.prov.(ProgressReporter)
	for i := range st.VMs {
		row := &st.VMs[i]
		if row.Phase == status.PhaseReady && !e.prov.Readiness(row.Name).Ready {
			// The record says a boot answered, but not this one (the
			// agent restarted and no pass has looked yet, or the VM
			// died): ready is shown only for the boot that answered.
			row.Phase = status.PhaseBooting
		}
		if st.Suspended != nil {
			e.observeSuspended(row)
		}
		if row.Phase == status.PhaseCreating && progress != nil {
			if done, total, ok := progress.VMProgress(row.Name); ok {
				row.Message = progressMessage(done, total)
			}
		}
	}
	return st
}

// observeSuspended shows row as the provisioner finds the VM while the
// host is suspended, when no pass records what changes: a booting guest
// that answered (and holds the lease of its address) is ready, a VM meant
// to run whose hypervisor is gone is
// stopped, and the message says nothing is done about it.
func (e *Engine) observeSuspended(row *status.VM) {
	if row.Power != string(desired.PowerRunning) {
		return
	}
	switch {
	case !e.prov.Running(row.Name):
		row.Phase, row.Power, row.IP, row.SSH = status.PhaseStopped, string(desired.PowerStopped), "", ""
		row.Message = "not running; not booted again while the host is suspended"
	case row.Phase == status.PhaseBooting && e.prov.Readiness(row.Name).Ready && e.unleased(row.Name) == nil:
		row.Phase = status.PhaseReady
	}
}

// reportLocked builds Report's rows from the engine's memory under the
// engine lock; it returns the accepted snapshot and whether the host is
// fenced, for the volume rows Report reads from disk.
func (e *Engine) reportLocked() (st *status.Status, snap *snapshots.Snapshot, fenced bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st = &status.Status{
		Host:           e.cfg.Host,
		LastSeenEpoch:  e.lastEpoch,
		FenceViolation: e.fenced,
		Suspended:      e.suspended,
		SnapshotError:  e.fenceMsg,
		VMs:            []status.VM{},
		Quarantined:    []status.Quarantine{},
		Destroyed:      []string{},
		Volumes:        append([]status.Volume{}, e.volumes...),
		Orphans:        append([]string(nil), e.orphans...),
	}
	if len(e.volQuarantined) > 0 {
		st.QuarantinedVolumes = append([]status.Quarantine(nil), e.volQuarantined...)
	}
	for _, name := range e.namesLocked() {
		want, rec, bad := e.want[name], e.recs[name], e.bad[name]
		switch {
		case bad != nil:
			st.VMs = append(st.VMs, status.VM{Name: name, Phase: status.PhaseFailed, LastError: bad.Error(), SpecHash: specHashOf(want)})
		case !validName(name):
			st.VMs = append(st.VMs, status.VM{Name: name, Phase: status.PhaseFailed, LastError: checkName("vm", name).Error(), SpecHash: specHashOf(want)})
		case rec == nil:
			if want == nil {
				continue
			}
			if want.Tombstoned {
				st.Destroyed = append(st.Destroyed, name)
				continue
			}
			st.VMs = append(st.VMs, status.VM{Name: name, Phase: status.PhasePending, Power: string(desired.PowerStopped), SpecHash: want.SpecHash})
		case rec.QuarantinedAt != nil:
			q := status.Quarantine{Name: name, Since: rec.QuarantinedAt.UTC(), LastError: rec.LastError}
			if e.suspended == nil {
				// A suspended host destroys nothing: no time is promised.
				q.DestroyAt = rec.QuarantinedAt.Add(e.cfg.TombstoneGrace).UTC()
			}
			var tomb *snapshots.Tombstone
			if want != nil {
				tomb = want.Tombstone
			}
			e.confirmRow(&q, rec.Confirm, tomb)
			st.Quarantined = append(st.Quarantined, q)
		case want == nil:
			v := e.vanishedRow(rec)
			if e.suspended != nil {
				v.Reason += "; nothing is done about it while the host is suspended"
			}
			st.Vanished = append(st.Vanished, v)
		default:
			st.VMs = append(st.VMs, e.vmRow(name, rec, want))
		}
	}
	e.networksLocked(st)
	sort.Slice(st.Vanished, func(i, j int) bool { return st.Vanished[i].Name < st.Vanished[j].Name })
	sort.Slice(st.Quarantined, func(i, j int) bool { return st.Quarantined[i].Name < st.Quarantined[j].Name })
	return st, e.snap, e.fenced
}

// vmRow is the status row of a VM this host has a record of and the
// snapshot wants: its record's phase, power, addresses and errors, and
// its backup state.
func (e *Engine) vmRow(name string, rec *Record, want *snapshots.SnapshotVM) status.VM {
	row := status.VM{
		Name:      name,
		Phase:     rec.Phase,
		Power:     rec.Power,
		IP:        rec.IP,
		SSH:       rec.SSH,
		NICs:      rec.NICs,
		LastError: rec.LastError,
		Message:   rec.Message,
		SpecHash:  rec.SpecHash,
		Backup:    e.backupRow(name, want.Spec.Backup),
	}
	if row.Power == "" {
		row.Power = string(desired.PowerStopped)
	}
	if row.Power != string(desired.PowerRunning) {
		// A VM that is not running answers on no address: the record
		// keeps them for the next boot, the report does not show them.
		row.IP, row.SSH, row.NICs = "", "", nil
	}
	return row
}

// vanishedRow reports a VM the snapshot dropped without a tombstone. A
// record without a VanishedAt marker yet (its pass has not run) counts from
// now.
func (e *Engine) vanishedRow(rec *Record) status.Vanished {
	since := e.now()
	if rec.VanishedAt != nil {
		since = *rec.VanishedAt
	}
	v := status.Vanished{Name: rec.Name, Since: since.UTC(), Power: rec.Power, LastError: rec.LastError}
	if v.Power == "" {
		v.Power = string(desired.PowerStopped)
	}
	grace := e.cfg.VanishGrace
	if rec.VanishedAt != nil && rec.Phase == status.PhaseQuarantined && e.now().Sub(since) >= grace {
		v.Quarantined = true
		v.Reason = fmt.Sprintf("absent from snapshot epoch %d without a tombstone since %s; shut down after vanishGrace %s and kept with its disk and volumes; it runs again if a snapshot names it, and only a tombstone deletes it",
			e.lastEpoch, since.UTC().Format(time.RFC3339), grace)
	} else {
		v.Reason = fmt.Sprintf("absent from snapshot epoch %d without a tombstone since %s; left as it is until %s, then shut down and kept; never destroyed without a tombstone",
			e.lastEpoch, since.UTC().Format(time.RFC3339), since.Add(grace).UTC().Format(time.RFC3339))
	}
	return v
}

// specHashOf is v's SpecHash, "" for a VM the snapshot does not name.
func specHashOf(v *snapshots.SnapshotVM) desired.Hash {
	if v == nil {
		return ""
	}
	return v.SpecHash
}

// progressMessage renders a download's progress for a person, in GB.
func progressMessage(done, total int64) string {
	const gb = 1 << 30
	if total <= 0 {
		return fmt.Sprintf("downloading: %.2f GB so far", float64(done)/gb)
	}
	return fmt.Sprintf("downloading: %.2f of %.2f GB (%d%%)", float64(done)/gb, float64(total)/gb, done*100/total)
}
