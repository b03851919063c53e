package agent

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
)

// step is one named stage of a pass. Names appear in lastError and logs so a
// reader sees where a create stopped.
type step struct {
	name string
	run  func(ctx context.Context) error
}

// Step names of the create sequence, in order.
const (
	StepPreflight = "preflight"
	StepAdmission = "admission"
	StepRootDisk  = "root disk"
	StepVolumes   = "volumes"
	StepBoot      = "boot"
	StepAddress   = "address"
	// StepStage is the make-before-break step of an edit of a created VM:
	// the new spec's artifacts fetched and verified, its seed rendered,
	// the running VM untouched.
	StepStage = "stage"
	// StepFirmware is an edit's check that it changes no created VM's
	// firmware without the spec's opt-in (allowFirmwareChangeFrom).
	StepFirmware = "firmware"
)

// runSteps runs steps in order and stops at the first error, which it
// returns wrapped with the step's name.
func runSteps(ctx context.Context, steps []step) (failed string, err error) {
	for _, s := range steps {
		if err := s.run(ctx); err != nil {
			return s.name, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return "", nil
}

// pass runs one VM's reconcile and reports whether the VM is gone (no record
// and nothing desired), so its worker can end.
func (e *Engine) pass(name string) (gone bool) {
	want, rec, hostCap, hostNets, skip := e.view(name)
	if skip {
		return false
	}
	ctx, interrupt := context.WithCancelCause(e.ctx)
	defer interrupt(nil)
	e.passStarted(name, interrupt, want != nil && !want.Tombstoned)
	defer e.passEnded(name)
	if e.cfg.VMTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, e.cfg.VMTimeout)
		defer cancel()
	}
	p := &vmPass{e: e, ctx: ctx, log: e.log.WithField("vm", name), want: want, rec: rec, hostCap: hostCap, hostNets: hostNets}
	switch {
	case rec == nil && (want == nil || want.Tombstoned):
		return true // nothing here; a tombstone is acked by Report
	case want == nil:
		p.vanished()
		return false
	case want.Tombstoned:
		return p.remove()
	default:
		p.apply()
		return false
	}
}

// vmPass is the state of one pass over one VM.
type vmPass struct {
	e       *Engine
	ctx     context.Context
	log     logrus.FieldLogger
	want    *snapshots.SnapshotVM
	rec     *Record
	hostCap *desired.Capacity
	// hostNets are the host's networks, from the accepted snapshot.
	hostNets map[string]desired.Network
}

func (p *vmPass) machine(spec desired.VMSpec) Machine {
	m := Machine{Name: p.rec.Name, Dir: p.e.store.VMDir(p.rec.Name), Spec: spec, InstanceID: p.rec.InstanceID}
	for _, nic := range spec.Interfaces() {
		if n, ok := p.hostNets[nic.Network]; ok {
			if m.Networks == nil {
				m.Networks = map[string]desired.Network{}
			}
			m.Networks[nic.Network] = n
		}
	}
	for _, v := range spec.Volumes {
		if validName(v) {
			m.Volumes = append(m.Volumes, p.e.store.VolumePath(v))
		}
	}
	return m
}

// watchdogFired reports whether the pass's own deadline ended it (and not
// the engine closing).
func (p *vmPass) watchdogFired() bool {
	return errors.Is(p.ctx.Err(), context.DeadlineExceeded) && p.e.ctx.Err() == nil
}

// interrupted reports whether the pass was cancelled because its VM was
// deleted meanwhile (errDeleted): what it did costs no attempt, and the
// delete's pass runs next.
func (p *vmPass) interrupted() bool {
	return errors.Is(context.Cause(p.ctx), errDeleted)
}

// vanished keeps a VM the accepted snapshot no longer names and holds no
// tombstone for. Absence is not a delete: a repository restored from a
// backup, a hand-edited snapshots branch or a controller bug all look like
// it, and none of them is a reviewed delete. So the VM is left exactly as it
// is for VanishGrace, measured from the VanishedAt marker in its record (a
// restart does not reset it); then it is shut down gracefully and kept,
// record, root disk and volumes, for as long as it stays absent. Its
// reappearance resumes it (apply); its tombstone deletes it (remove).
func (p *vmPass) vanished() {
	rec := p.rec
	if rec.VanishedAt == nil {
		t := p.e.now()
		rec.VanishedAt = &t
		if rec.QuarantinedAt != nil {
			// Its tombstone left the snapshot without the VM coming back:
			// the delete is no longer asked for. The VM stays down; a
			// tombstone that returns gets a whole new grace and nonce.
			rec.QuarantinedAt, rec.Confirm = nil, ""
			rec.LastError = ""
			p.e.endWait(confirmVM, rec.Name)
		}
		p.log.WithField("grace", p.e.cfg.VanishGrace.String()).Warn("vm absent from the snapshot without a tombstone; left as it is, then shut down and kept after the grace; never destroyed without a tombstone")
		_ = p.e.commit(rec)
		return
	}
	if p.e.now().Sub(*rec.VanishedAt) < p.e.cfg.VanishGrace {
		return
	}
	if p.e.prov.Running(rec.Name) {
		if err := p.e.prov.Shutdown(p.ctx, rec.Name); err != nil {
			rec.LastError = "shutdown: " + err.Error()
			p.log.WithError(err).Warn("shutdown of a vanished vm failed; retrying next tick")
			_ = p.e.commit(rec)
			return
		}
		p.log.Warn("vm still absent from the snapshot after its vanish grace; shut down and kept (disk, volumes, record)")
	}
	rec.Reserved = nil
	rec.Phase = status.PhaseQuarantined
	rec.Power = string(desired.PowerStopped)
	rec.LastError = ""
	_ = p.e.commit(rec)
}

// remove is the delete path of a tombstoned VM: shut down and quarantine,
// then destroy once TombstoneGrace has passed since the quarantine marker
// and, when the engine requires it, the accepted snapshot's tombstone
// carries the quarantine's nonce (confirm.go), given only once the grace
// has passed. Only a successful destroy removes the record. It reports
// whether the VM is gone.
func (p *vmPass) remove() bool {
	rec := p.rec
	if rec.DestroyedAt != nil {
		// Destroyed on an earlier pass, but the state directory was not
		// removed (a failure, or the agent was killed): finish the removal.
		return p.removeState()
	}
	grace := p.e.cfg.TombstoneGrace
	if rec.QuarantinedAt == nil || p.e.prov.Running(rec.Name) {
		if err := p.e.prov.Shutdown(p.ctx, rec.Name); err != nil {
			rec.LastError = "shutdown: " + err.Error()
			p.log.WithError(err).Warn("shutdown for quarantine failed; retrying next tick")
			_ = p.e.commit(rec)
			return false
		}
		if rec.QuarantinedAt == nil {
			t := p.e.now()
			rec.QuarantinedAt = &t
			rec.VanishedAt = nil
			rec.Confirm = ""
			p.log.WithField("grace", grace.String()).Info("tombstoned vm shut down and quarantined")
		}
		rec.Reserved = nil
		rec.Phase = status.PhaseQuarantined
		rec.Power = string(desired.PowerStopped)
		rec.LastError = ""
		if err := p.e.commit(rec); err != nil {
			return false
		}
	}
	if p.e.now().Sub(*rec.QuarantinedAt) < grace {
		if rec.Confirm != "" {
			// A nonce given inside the grace (by an earlier release)
			// may be confirmed before an un-delete in the grace: that
			// confirmation, replayed, would destroy what the un-delete
			// keeps. It is dropped; the grace's end gives a fresh one.
			rec.Confirm = ""
			_ = p.e.commit(rec)
		}
		return false
	}
	if p.e.ConfirmsDeletes() && rec.Confirm == "" {
		// The grace has passed: only now does the quarantine get its
		// nonce (also one begun before this agent required
		// confirmation), so every confirmation the controller signs
		// postdates the grace, and an un-delete within the grace leaves
		// none to replay. The nonce is reported at the next status
		// write; nothing is destroyed before it is confirmed.
		if !p.giveConfirm() {
			return false
		}
		p.log.WithField("confirm", rec.Confirm).Info("tombstone grace passed; quarantined vm given a confirmation nonce for the controller to confirm")
		_ = p.e.commit(rec)
		return false
	}
	if !p.e.confirmed(confirmVM, rec.Name, rec.Confirm, p.want.Tombstone) {
		return false
	}
	if err := p.e.prov.Destroy(p.ctx, rec.Name); err != nil {
		rec.LastError = "destroy: " + err.Error()
		p.log.WithError(err).Warn("destroy failed; the record stays and the destroy is retried")
		_ = p.e.commit(rec)
		return false
	}
	// The destroy is witnessed on disk before the directory goes, so a
	// removal cut short is never mistaken for a VM with its root disk.
	t := p.e.now()
	rec.DestroyedAt = &t
	rec.Reserved = nil
	rec.LastError = ""
	if err := p.e.commit(rec); err != nil {
		// Not witnessed: the next tick destroys again (a no-op for a gone VM).
		rec.DestroyedAt = nil
		return false
	}
	p.log.Info("tombstoned vm destroyed after its grace")
	return p.removeState()
}

// giveConfirm gives the quarantine of p's VM a fresh nonce (not yet
// saved). It reports false, with lastError saying why and nothing
// destroyed, when none can be made.
func (p *vmPass) giveConfirm() bool {
	nonce, err := newConfirm()
	if err != nil {
		p.rec.LastError = err.Error()
		p.log.WithError(err).Warn("quarantine without a confirmation nonce cannot be confirmed; retrying next tick")
		_ = p.e.commit(p.rec)
		return false
	}
	p.rec.Confirm = nonce
	return true
}

// removeState removes the state directory of a VM whose destroy succeeded
// and is recorded (DestroyedAt), then forgets it. It reports whether the VM
// is gone.
func (p *vmPass) removeState() bool {
	rec := p.rec
	if err := p.e.store.RemoveVM(rec.Name); err != nil {
		// The record is removed last, so it is still readable (with its
		// DestroyedAt) and the removal is retried next tick; nothing is
		// acked meanwhile.
		rec.LastError = "destroy: remove state: " + err.Error()
		p.log.WithError(err).Warn("vm destroyed but its directory remains; retrying")
		_ = p.e.commit(rec)
		return false
	}
	p.e.forgetBackups(rec.Name)
	p.e.forget(rec.Name)
	return true
}

// apply drives a desired, non-tombstoned VM toward its spec: create,
// un-delete, spec edits, power and address.
func (p *vmPass) apply() {
	want := p.want
	if p.rec == nil {
		p.rec = &Record{
			Name:       want.Name,
			InstanceID: newInstanceID(want.Name),
			Spec:       want.Spec,
			SpecHash:   want.SpecHash,
			Phase:      status.PhaseCreating,
			CreatedAt:  p.e.now(),
		}
		// Saved before any step, so an interrupted create is found and
		// finished by a later pass.
		if err := p.e.commit(p.rec); err != nil {
			return
		}
	}
	rec := p.rec
	if rec.DestroyedAt != nil {
		p.recreate()
		rec = p.rec
		if err := p.e.commit(rec); err != nil {
			return
		}
	}
	if rec.QuarantinedAt != nil {
		rec.QuarantinedAt, rec.Confirm = nil, ""
		rec.LastError = ""
		rec.Phase = status.PhaseStopped
		p.e.endWait(confirmVM, rec.Name)
		p.log.Info("vm un-deleted; quarantine cleared")
	}
	if rec.VanishedAt != nil {
		rec.VanishedAt = nil
		rec.LastError = ""
		if rec.Phase == status.PhaseQuarantined {
			rec.Phase = status.PhaseStopped
		}
		p.log.Info("vm back in the snapshot; vanish marker cleared")
	}
	editErr := ""
	if rec.SpecHash == want.SpecHash && rec.EditHash != "" && rec.BootID != "" {
		// A pending edit was reverted: nothing is pending now, and asking
		// for that edit again is a new edit, tried afresh and reported,
		// never dropped in silence because it once failed.
		rec.EditHash, rec.Attempts, rec.Failed = "", 0, false
	}
	if rec.SpecHash != want.SpecHash {
		if rec.BootID == "" {
			// The create never completed: start it over with the new spec and
			// a fresh budget.
			rec.Spec, rec.SpecHash = want.Spec, want.SpecHash
			rec.Attempts, rec.Failed, rec.LastError, rec.EditHash = 0, false, "", ""
			rec.Reserved = nil
			rec.Phase = status.PhaseCreating
		} else if !p.edit() {
			// The VM keeps its previous spec and is kept running on it.
			editErr = rec.LastError
		}
	}
	if rec.BootID == "" {
		p.create()
		return
	}
	p.converge(editErr)
}

// recreate turns the record of a VM that was destroyed (its removal never
// finished) and is wanted again into a new create: new InstanceID, the
// wanted spec, no completion witness, a fresh budget. Its root disk is gone,
// so booting it is not an option; what is left of its directory is created
// over, as for any interrupted create.
func (p *vmPass) recreate() {
	old := p.rec
	p.log.WithField("destroyedAt", old.DestroyedAt.UTC().Format(time.RFC3339)).Warn("vm un-deleted after its destroy; creating it again from scratch (its root disk is gone)")
	p.rec = &Record{
		Name:       old.Name,
		InstanceID: newInstanceID(old.Name),
		Spec:       p.want.Spec,
		SpecHash:   p.want.SpecHash,
		Phase:      status.PhaseCreating,
		Message:    "re-created: the VM was destroyed before it was un-deleted; its earlier root disk is gone",
		CreatedAt:  p.e.now(),
	}
}

// create runs the create steps. BootID is set only when every step passed:
// it is the witness that the create completed.
func (p *vmPass) create() {
	rec := p.rec
	if rec.Failed {
		rec.Phase = status.PhaseFailed
		_ = p.e.commit(rec)
		return
	}
	spec := rec.Spec
	m := p.machine(spec)
	running := spec.Power != desired.PowerStopped
	// A VM that runs although its create never recorded completion was
	// booted just before the agent stopped: its root disk is in use and is
	// not prepared again; the remaining steps witness the create.
	booted := p.e.prov.Running(rec.Name)
	steps := []step{
		{StepUserData, func(context.Context) error { return p.userDataCheck(spec) }},
		{StepPreflight, p.e.prov.Preflight},
		{StepAdmission, func(context.Context) error { return p.admit(spec) }},
		{StepRestore, func(ctx context.Context) error {
			if booted {
				return nil
			}
			return p.restore(ctx, &m)
		}},
		{StepRootDisk, func(ctx context.Context) error {
			if booted {
				return nil
			}
			return p.e.prov.PrepareRootDisk(ctx, m)
		}},
		{StepVolumes, func(context.Context) error { return p.volumesPresent(spec) }},
		{StepBoot, func(ctx context.Context) error {
			if !running {
				return nil
			}
			return p.e.prov.Boot(ctx, m)
		}},
		{StepAddress, func(context.Context) error { p.noteAddress(); return nil }},
	}
	failed, err := runSteps(p.ctx, steps)
	if err == nil {
		rec.BootID = p.e.cfg.BootID()
		rec.DiskGB = spec.DiskGB
		rec.RootImage = imageSHA(spec)
		rec.Attempts, rec.LastError = 0, ""
		rec.Power = string(desired.PowerRunning)
		p.noteReadiness()
		if !running {
			rec.Phase, rec.Power = status.PhaseStopped, string(desired.PowerStopped)
		}
		rec.Message = p.diskMessage()
		p.e.cfg.Metrics.create(true)
		p.log.Info("vm created")
		_ = p.e.commit(rec)
		return
	}
	if p.createFailed(failed, err) {
		_ = p.e.commit(rec)
	}
}

// createFailed records why the create failed at step failed and what it
// costs: the watchdog, the VM's delete (interrupted) and what the host
// lacks for now spend no attempt, a permanent error fails the VM at once,
// any other spends one of the budget. It reports whether the record is to
// be written (not while the agent stops).
func (p *vmPass) createFailed(failed string, err error) bool {
	rec := p.rec
	msg := err.Error()
	rec.LastError = msg
	switch {
	case p.watchdogFired():
		rec.LastError = "watchdog: " + msg
		rec.Phase = status.PhaseCreating
		p.log.WithField("step", failed).Warn("create ended by the watchdog; no attempt spent")
	case p.e.ctx.Err() != nil:
		return false // the agent is stopping: neither an attempt nor a record write
	case p.interrupted():
		rec.Phase = status.PhaseCreating
		p.log.WithField("step", failed).Info("create interrupted by the VM's delete; no attempt spent")
	case errors.Is(err, ErrCapacity):
		rec.Phase = status.PhaseFailed
	case waitsForHost(err):
		// Waits for the volume or the bridge: checked again every tick,
		// no attempt spent; it comes up at the tick after it appears. A
		// volume link to nothing is shown failed with why until fixed.
		rec.Phase = status.PhaseCreating
		if errors.Is(err, ErrVolumeUnusable) {
			rec.Phase = status.PhaseFailed
		}
	case errors.Is(err, ErrUserDataSealed):
		rec.Phase = status.PhaseFailed
	case IsPermanent(err):
		p.e.cfg.Metrics.create(false)
		rec.Attempts++
		rec.Failed = true
		rec.Phase = status.PhaseFailed
		p.log.WithField("step", failed).WithError(err).Error("create failed permanently")
	default:
		p.e.cfg.Metrics.create(false)
		rec.Attempts++
		rec.Phase = status.PhaseCreating
		if rec.Attempts >= p.e.cfg.MaxAttempts {
			rec.Failed = true
			rec.Phase = status.PhaseFailed
			p.log.WithField("step", failed).WithField("attempts", rec.Attempts).WithError(err).Error("create failed; retry budget spent")
		} else {
			p.log.WithField("step", failed).WithField("attempts", rec.Attempts).WithError(err).Warn("create failed; retrying next tick")
		}
	}
	return true
}

// converge keeps a created VM in its desired power state and notes its
// address. A VM that should run and does not (host reboot, crashed
// hypervisor, an edit's restart, an un-delete) is booted again. editErr is
// why a pending edit is not applied ("" when none is pending): it stays the
// VM's lastError while the VM runs on its previous spec.
func (p *vmPass) converge(editErr string) {
	rec := p.rec
	spec := rec.Spec
	running := p.e.prov.Running(rec.Name)
	if spec.Power != desired.PowerStopped {
		if !running {
			if err := p.boot(spec); err != nil {
				rec.LastError = err.Error()
				rec.Phase, rec.Power = status.PhaseFailed, string(desired.PowerStopped)
				if (!p.watchdogFired() && p.e.ctx.Err() != nil) || p.interrupted() {
					return
				}
				p.log.WithError(err).Warn("boot failed; retrying next tick")
				_ = p.e.commit(rec)
				return
			}
		}
		rec.Power, rec.LastError = string(desired.PowerRunning), joinErrors(editErr, p.userDataProblem())
		p.noteReadiness()
	} else {
		if running {
			rec.Phase = status.PhaseStopping
			_ = p.e.commit(rec)
			if err := p.e.prov.Shutdown(p.ctx, rec.Name); err != nil {
				rec.LastError = "shutdown: " + err.Error()
				rec.Power = string(desired.PowerRunning)
				_ = p.e.commit(rec)
				return
			}
			p.log.Info("vm stopped as its spec asks")
		}
		rec.Phase, rec.Power, rec.LastError = status.PhaseStopped, string(desired.PowerStopped), joinErrors(editErr, p.userDataProblem())
	}
	p.noteAddress()
	rec.Message = p.diskMessage()
	_ = p.e.commit(rec)
}

// notAnswered starts the lastError of a VM whose guest has not proved it
// is up within ReadyTimeout; sshRefused that of a VM whose guest answered
// by SSH and now refuses.
const (
	notAnswered = "not ready: the guest has not answered"
	sshRefused  = "not ready: the guest's sshd refuses"
	// notLeased starts the lastError of a VM whose guest answered but
	// holds no lease of the address its network reserves for it
	// (LeaseReporter).
	notLeased = "not ready: the guest holds no lease of its address"
	// heldByOther starts the lastError of a VM whose address another
	// machine answers at, not its guest (Readiness.HeldBy).
	heldByOther = "not ready: another machine answers at the guest's address"
)

// noteReadiness sets the phase of a VM that runs: ready while its guest
// counts as answering in this boot (Provisioner.Readiness), booting
// otherwise. A guest still silent ReadyTimeout after its boot began keeps
// its VM booting, with lastError saying so; so does a guest reached by SSH
// whose sshd refuses after it answered, and one that answered but holds
// no lease of its address (notLeased). None is ever restarted or
// destroyed for it.
func (p *vmPass) noteReadiness() {
	rec := p.rec
	r := p.e.prov.Readiness(rec.Name)
	if r.Ready {
		if err := p.e.unleased(rec.Name); err != nil {
			p.notLeased(r, err)
			return
		}
		if rec.Phase != status.PhaseReady {
			p.log.WithFields(logrus.Fields{"via": r.Via, "addr": r.Addr, "seconds": r.At.Sub(r.Booted).Seconds()}).Info("guest answered; vm ready")
		}
		if strings.HasPrefix(rec.LastError, sshRefused) || strings.HasPrefix(rec.LastError, notLeased) || strings.HasPrefix(rec.LastError, heldByOther) {
			rec.LastError = ""
		}
		rec.Phase = status.PhaseReady
		return
	}
	if rec.Phase == status.PhaseReady && !r.Booted.IsZero() {
		if r.HeldBy != "" {
			p.log.WithField("addr", r.Addr).WithField("heldBy", r.HeldBy).Warn("another machine answers at the guest's address; vm booting until the guest answers again")
		} else {
			p.log.WithField("addr", r.Addr).Warn("the guest's sshd refuses; vm booting until it answers again")
		}
	}
	rec.Phase = status.PhaseBooting
	switch {
	case !r.Refused.IsZero() && r.HeldBy != "":
		rec.LastError = fmt.Sprintf("%s %s (%s), not the guest, since %s (the guest answered at %s); booting until the guest answers again; the VM is left running",
			heldByOther, r.Addr, holderText(r.HeldBy), r.Refused.UTC().Format(time.RFC3339), r.At.UTC().Format(time.RFC3339))
	case !r.Refused.IsZero():
		rec.LastError = fmt.Sprintf("%s at %s since %s (it answered at %s); booting until it answers again; the VM is left running",
			sshRefused, r.Addr, r.Refused.UTC().Format(time.RFC3339), r.At.UTC().Format(time.RFC3339))
	case !r.Booted.IsZero() && p.e.now().Sub(r.Booted) >= p.e.cfg.ReadyTimeout:
		ways := fmt.Sprintf("no SSH banner, no qemu-guest-agent ping, no %s console line", ConsoleReadyMarker)
		if r.SSHRequired {
			ways = "no SSH banner, which a guest given SSH keys must send"
		}
		rec.LastError = fmt.Sprintf("%s within readyTimeout %s of its boot at %s (%s); the VM is left running",
			notAnswered, p.e.cfg.ReadyTimeout, r.Booted.UTC().Format(time.RFC3339), ways)
		p.e.mu.Lock()
		prev := p.e.recs[rec.Name]
		p.e.mu.Unlock()
		if prev == nil || !strings.HasPrefix(prev.LastError, notAnswered) {
			p.log.Warn(rec.LastError)
		}
	}
}

// notLeased keeps booting a VM whose guest answered but holds no lease of
// its address (why: LeaseReporter.Unleased): with lastError saying so at
// once when another machine holds the address, else once ReadyTimeout has
// passed since its boot.
func (p *vmPass) notLeased(r Readiness, why error) {
	rec := p.rec
	if rec.Phase == status.PhaseReady {
		p.log.WithError(why).Warn("the guest holds no lease of its address; vm booting until it does")
	}
	rec.Phase = status.PhaseBooting
	if !errors.Is(why, ErrAddressHeld) && p.e.now().Sub(r.Booted) < p.e.cfg.ReadyTimeout {
		return
	}
	rec.LastError = fmt.Sprintf("%s: %v; booting until it holds one; the VM is left running", notLeased, why)
	p.e.mu.Lock()
	prev := p.e.recs[rec.Name]
	p.e.mu.Unlock()
	if prev == nil || !strings.HasPrefix(prev.LastError, notLeased) {
		p.log.Warn(rec.LastError)
	}
}

// unleased is the provisioner's account (LeaseReporter) of why VM name's
// guest holds no lease of its address; nil when it holds it, or when the
// provisioner gives none.
func (e *Engine) unleased(name string) error {
	if lr, ok := e.prov.(LeaseReporter); ok {
		return lr.Unleased(name)
	}
	return nil
}

// boot starts a created VM again: admission when it holds no reservation
// (after an un-delete), its volumes present, then Boot.
func (p *vmPass) boot(spec desired.VMSpec) error {
	rec := p.rec
	why := "vm process gone"
	switch {
	case rec.BootID != p.e.cfg.BootID():
		why = "host rebooted"
	case rec.Phase == status.PhaseRestarting:
		why = "restart to apply the edited spec"
	case rec.Phase == status.PhaseStopped:
		why = "spec says power: running"
	}
	if rec.Reserved == nil {
		if err := p.admit(spec); err != nil {
			return fmt.Errorf("%s: %w", StepAdmission, err)
		}
	}
	if err := p.volumesPresent(spec); err != nil {
		return fmt.Errorf("%s: %w", StepVolumes, err)
	}
	log := p.log.WithField("reason", why)
	if last := p.e.prov.FailureReason(rec.Name); last != "" {
		// The lost hypervisor's own account, logged once here: it belongs
		// to that run, never to an error of the boot that follows.
		log = log.WithField("lastRun", last)
	}
	log.Info("booting vm")
	if err := p.e.prov.Boot(p.ctx, p.machine(spec)); err != nil {
		// The backend's error carries the account of this boot's failure
		// (QEMU's output of the run that failed), nothing older.
		return fmt.Errorf("%s: %w", StepBoot, err)
	}
	rec.BootID = p.e.cfg.BootID()
	return nil
}

// edit applies a changed spec to a created VM, make before break: while
// the VM keeps running, every artifact of the new spec is fetched and
// verified and its seed rendered (Stage), its volumes are checked present,
// the host's capacity is checked
// and a larger root disk is grown (online); only then is the VM shut down,
// and only for a change that needs a restart (vCPUs, memory, network,
// volumes, kernel), to be booted with the new spec by converge. A changed
// image, cloudInit or static is recorded but not applied to the existing
// VM (firstBootOnly; the status message says so). It returns false when the
// edit could not be applied: the VM keeps its previous spec and keeps
// running, rec.LastError says why, and failures spend the retry budget as
// a create's do (a permanent one at once; capacity none).
func (p *vmPass) edit() bool {
	rec, want := p.rec, p.want
	if rec.EditHash != want.SpecHash {
		rec.EditHash, rec.Attempts, rec.Failed = want.SpecHash, 0, false
	}
	if rec.Failed {
		return false // this edit failed for good; only a new edit is tried
	}
	old, spec := rec.Spec, firstBootOnly(want.Spec, rec.Spec)
	if err := firmwareChange(old, spec); err != nil {
		p.editFailed(StepFirmware, err)
		return false
	}
	restart := needsRestart(old, spec)
	grow := spec.DiskGB > rec.DiskGB
	m := p.machine(spec)
	if err := p.e.prov.Stage(p.ctx, m); err != nil {
		p.editFailed(StepStage, err)
		return false
	}
	// Checked here, not only at boot: after the shutdown below, a volume
	// that is not there would leave the VM stopped on neither spec.
	if err := p.volumesPresent(spec); err != nil {
		p.editFailed(StepVolumes, err)
		return false
	}
	if spec.VCPUs > old.VCPUs || spec.MemoryMB > old.MemoryMB || rec.Reserved == nil {
		if err := p.admit(spec); err != nil {
			p.editFailed(StepAdmission, err)
			return false
		}
	} else {
		rec.Reserved = &Reservation{VCPUs: spec.VCPUs, MemoryMB: spec.MemoryMB}
	}
	if grow {
		if err := p.e.prov.PrepareRootDisk(p.ctx, m); err != nil {
			p.editFailed(StepRootDisk, err)
			return false
		}
		p.log.WithField("fromGB", rec.DiskGB).WithField("toGB", spec.DiskGB).Info("root disk grown")
		rec.DiskGB = spec.DiskGB
	}
	if restart && p.e.prov.Running(rec.Name) {
		rec.Phase = status.PhaseRestarting
		_ = p.e.commit(rec)
		p.log.Info("spec edited; every new artifact is in place; restarting the vm to apply it")
		if err := p.e.prov.Shutdown(p.ctx, rec.Name); err != nil {
			rec.Phase = status.PhaseReady
			p.editFailed("shutdown", err)
			return false
		}
	}
	if !sameNICs(old, spec) {
		// The known address belongs to the old network: forget it rather
		// than show it until the new one is learned.
		rec.IP, rec.SSH, rec.NICs = "", "", nil
	}
	rec.Spec, rec.SpecHash = spec, want.SpecHash
	rec.Attempts, rec.Failed, rec.LastError, rec.EditHash = 0, false, "", ""
	return true
}

// editFailed records why an edit was not applied and what it costs, as
// create does for a create: the watchdog, capacity and what the host
// lacks for now (waitsForHost) spend no attempt, a permanent error fails
// the edit at once, any other spends one of the budget. A failed edit is
// not tried again until the spec changes. Edits are not create attempts:
// the create metrics do not count them.
func (p *vmPass) editFailed(step string, err error) {
	rec := p.rec
	msg := fmt.Sprintf("edit to spec %.12s not applied; the VM keeps its previous spec: %s: %v", p.want.SpecHash, step, err)
	log := p.log.WithField("step", step).WithError(err)
	switch {
	case p.watchdogFired():
		msg = "watchdog: " + msg
	case p.e.ctx.Err() != nil, p.interrupted(), errors.Is(err, ErrCapacity), waitsForHost(err):
		// Waits, as a create does: checked again every tick, no attempt
		// (or the delete that interrupted it runs next).
	case IsPermanent(err):
		rec.Attempts++
		rec.Failed = true
		log.Error("edit failed permanently; the vm keeps its previous spec")
	default:
		rec.Attempts++
		if rec.Attempts >= p.e.cfg.MaxAttempts {
			rec.Failed = true
			log.WithField("attempts", rec.Attempts).Error("edit failed; retry budget spent; the vm keeps its previous spec")
		} else {
			log.WithField("attempts", rec.Attempts).Warn("edit failed; retrying next tick; the vm keeps its previous spec")
		}
	}
	if rec.Failed {
		msg += fmt.Sprintf(" (given up after %d attempts; a new edit is tried afresh)", rec.Attempts)
	}
	rec.LastError = msg
}

// needsRestart reports whether going from old to spec takes a restart of a
// running VM: vCPUs, memory, network, MAC, volumes, kernel or the machine
// model (firmware, Secure Boot, TPM, architecture, machine type, CPU
// model) changed.
func needsRestart(old, spec desired.VMSpec) bool {
	return old.VCPUs != spec.VCPUs || old.MemoryMB != spec.MemoryMB ||
		!sameNICs(old, spec) || !slices.Equal(old.Volumes, spec.Volumes) ||
		!reflect.DeepEqual(old.Kernel, spec.Kernel) ||
		old.Firmware.Or(desired.FirmwareBIOS) != spec.Firmware.Or(desired.FirmwareBIOS) ||
		old.SecureBoot != spec.SecureBoot || old.TPM != spec.TPM || old.Arch != spec.Arch ||
		old.Machine != spec.Machine || old.CPUModel != spec.CPUModel
}

// firmwareChange refuses, as a permanent error, an edit that changes a
// created VM's firmware from old's unless spec.AllowFirmwareChangeFrom
// names old's: the guest was installed for its firmware (desired's
// FirmwareChangeRefused says so in the plan too).
func firmwareChange(old, spec desired.VMSpec) error {
	from, to := old.Firmware.Or(desired.FirmwareBIOS), spec.Firmware.Or(desired.FirmwareBIOS)
	if from == to || spec.AllowFirmwareChangeFrom == from {
		return nil
	}
	return Permanent(fmt.Errorf(desired.FirmwareChangeRefused, from, to, from))
}

// sameNICs reports whether a and b have the same NICs on the same
// networks, MACs and models (static addresses aside: they are first-boot
// only). A VM on user-mode networking has no Interfaces, but a NIC all
// the same, with spec.mac when set.
func sameNICs(a, b desired.VMSpec) bool {
	x, y := a.Interfaces(), b.Interfaces()
	if len(x) != len(y) || a.MAC != b.MAC {
		return false
	}
	for i := range x {
		if x[i].Network != y[i].Network || x[i].MAC != y[i].MAC || x[i].ModelOf() != y[i].ModelOf() {
			return false
		}
	}
	return true
}

// firstBootOnly is want with the cloudInit and static addresses the VM
// was created with (applied's): cloud-init runs a seed once per instance,
// network-config included (NoCloud applies it on a new instance-id only),
// and re-seeding a created VM under a new instance-id would regenerate the
// guest's SSH host keys and re-run its first-boot modules, yet still never
// remove a key it installed before. So an edit of either applies only when
// the VM is created again, and the status message says so (as does a
// restore, which makes a new VM's disks only); the seed of
// every later boot, and the VM's address reservation on a nat network,
// keep what the guest was given.
//
// RootDisk is kept as created too: a disk is adopted at create only, and
// an adopted VM is never seeded, so neither an adopt added to a created
// VM nor one removed from an adopted VM changes what it boots.
func firstBootOnly(want, applied desired.VMSpec) desired.VMSpec {
	want.CloudInit = applied.CloudInit
	want.Static = applied.Static
	want.RootDisk = applied.RootDisk
	want.Restore = applied.Restore
	if len(want.NICs) > 0 {
		had := applied.Interfaces()
		want.NICs = slices.Clone(want.NICs)
		for i := range want.NICs {
			want.NICs[i].Static = nil
			if i < len(had) {
				want.NICs[i].Static = had[i].Static
			}
		}
	}
	return want
}

// admit reserves spec's vCPUs and memory against the host's capacity. It is
// serialized across workers, so two VMs admitted in one tick see each other.
// Every VM holding a reservation counts, failed creates included.
func (p *vmPass) admit(spec desired.VMSpec) error {
	e := p.e
	e.admitMu.Lock()
	defer e.admitMu.Unlock()
	want := Reservation{VCPUs: spec.VCPUs, MemoryMB: spec.MemoryMB}
	if c := p.hostCap; c != nil && (c.VCPUs > 0 || c.MemoryMB > 0) {
		var used Reservation
		e.mu.Lock()
		for name, r := range e.recs {
			if name != p.rec.Name && r.Reserved != nil {
				used.VCPUs += r.Reserved.VCPUs
				used.MemoryMB += r.Reserved.MemoryMB
			}
		}
		e.mu.Unlock()
		if c.VCPUs > 0 && used.VCPUs+want.VCPUs > c.VCPUs {
			return fmt.Errorf("%w: vcpus: %d in use + %d asked > %d on host", ErrCapacity, used.VCPUs, want.VCPUs, c.VCPUs)
		}
		if c.MemoryMB > 0 && used.MemoryMB+want.MemoryMB > c.MemoryMB {
			return fmt.Errorf("%w: memoryMB: %d in use + %d asked > %d on host", ErrCapacity, used.MemoryMB, want.MemoryMB, c.MemoryMB)
		}
	}
	p.rec.Reserved = &want
	return p.e.commit(p.rec)
}

// volumesPresent checks every volume the spec names is a file on this host.
// Nothing at the path is ErrVolumeMissing; a symlink to nothing or a path
// that is not a regular file is ErrVolumeUnusable (the latter permanent),
// never handed to the hypervisor. A stat error other than "does not exist"
// counts as present.
func (p *vmPass) volumesPresent(spec desired.VMSpec) error {
	for _, v := range spec.Volumes {
		if err := checkName("volume", v); err != nil {
			return Permanent(err)
		}
		_, present, err := inspectVolume(p.e.store.VolumePath(v))
		switch {
		case !present:
			return fmt.Errorf("%s: %w", v, ErrVolumeMissing)
		case errors.Is(err, ErrVolumeUnusable):
			return fmt.Errorf("volume %s: %w", v, err)
		}
	}
	return nil
}

// noteAddress records the provisioner's answer. An empty answer is "not
// known", never "gone": the known address stays.
func (p *vmPass) noteAddress() {
	a := p.e.prov.Address(p.rec.Name)
	if a.IP != "" {
		p.rec.IP = a.IP
	}
	if a.SSH != "" {
		p.rec.SSH = a.SSH
	}
	if len(a.NICs) > 0 {
		nics := slices.Clone(a.NICs)
		for i := range nics {
			if i < len(p.rec.NICs) && p.rec.NICs[i].MAC == nics[i].MAC {
				if nics[i].IP == "" {
					nics[i].IP = p.rec.NICs[i].IP
				}
				if nics[i].IPv6 == "" {
					nics[i].IPv6 = p.rec.NICs[i].IPv6
				}
			}
		}
		p.rec.NICs = nics
	}
}

// statics are the static configurations of s's NICs, in order.
func statics(s desired.VMSpec) []*desired.StaticIP {
	if len(s.NICs) == 0 {
		return []*desired.StaticIP{s.Static}
	}
	var out []*desired.StaticIP
	for _, n := range s.NICs {
		out = append(out, n.Static)
	}
	return out
}

// CloudInitNotApplied is the status message of a created VM whose spec's
// cloudInit changed: what happens instead and how to rotate a key.
const CloudInitNotApplied = "cloudInit changed after the VM was created: not applied to this VM. cloud-init seeds a VM once, at its first boot, and never removes a key it installed; " +
	"to rotate an SSH key, add the new key to and remove the old one from ~/.ssh/authorized_keys inside the guest (the spec's new cloudInit then describes the guest, and seeds it if the VM is ever created again)"

// StaticNotApplied is the status message of a created VM whose spec's
// static addresses changed: the guest keeps the network configuration of
// its first boot.
const StaticNotApplied = "static changed after the VM was created: not applied to this VM. cloud-init applies network-config at an instance's first boot only, so the guest keeps the addresses it was created with (and its seed and address reservation keep them too); " +
	"to change them, change the guest's network configuration inside it, or create the VM again"

// RootDiskNotApplied is the status message of a created VM whose spec's
// rootDisk changed: a disk is adopted at create only.
const RootDiskNotApplied = "rootDisk changed after the VM was created: not applied to this VM. A disk is adopted when the VM is created; the VM keeps the root disk (and the seed, or none) it was created with"

// diskMessage tells a person what a spec asks of the root disk, or of
// cloud-init, that the agent will not do to the existing VM.
func (p *vmPass) diskMessage() string {
	rec := p.rec
	var msgs []string
	if p.want != nil && !reflect.DeepEqual(p.want.Spec.CloudInit, rec.Spec.CloudInit) {
		msgs = append(msgs, CloudInitNotApplied)
	}
	if p.want != nil && !reflect.DeepEqual(statics(p.want.Spec), statics(rec.Spec)) {
		msgs = append(msgs, StaticNotApplied)
	}
	if p.want != nil && !reflect.DeepEqual(p.want.Spec.RootDisk, rec.Spec.RootDisk) {
		msgs = append(msgs, RootDiskNotApplied)
	}
	if sha := imageSHA(rec.Spec); rec.RootImage != "" && sha != rec.RootImage {
		msgs = append(msgs, fmt.Sprintf("image changed: the existing root disk (from image sha256 %.12s) is kept; a new image applies only to a newly created VM", rec.RootImage))
	}
	if rec.DiskGB > 0 && rec.Spec.DiskGB < rec.DiskGB {
		msgs = append(msgs, fmt.Sprintf("diskGB %d is below the root disk's %d GB: disks never shrink", rec.Spec.DiskGB, rec.DiskGB))
	}
	return strings.Join(msgs, "; ")
}

func imageSHA(spec desired.VMSpec) string {
	if spec.Image == nil {
		return ""
	}
	return spec.Image.SHA256
}

// holderText names the machine of Readiness.HeldBy for a person.
func holderText(heldBy string) string {
	if heldBy == "host" {
		return "the host's own address"
	}
	return "MAC " + heldBy
}
