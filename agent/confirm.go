package agent

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
)

// Delete confirmation (docs/DESIGN.md, "Delete confirmation"). A signed
// snapshot proves the controller wrote it, not that it is the latest: an
// old, genuine snapshot that tombstones a VM since un-deleted, pushed back
// to the snapshots branch while the controller is stopped, passes every
// check of an agent that was offline across both. So an agent that
// verifies snapshots destroys in two phases: its quarantine gets a fresh
// random nonce, reported in its status; the controller copies the nonce
// into the host's snapshot while the delete is pending in its ledger; the
// agent destroys only when the snapshot it accepted carries its nonce. An
// old commit can only carry the nonces of earlier quarantines.

// newConfirm returns a fresh confirmation nonce: 128 random bits in
// snapshots.ConfirmLen lowercase hex digits. Its error is the system
// random source's.
func newConfirm() (string, error) {
	var b [snapshots.ConfirmLen / 2]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("make a confirmation nonce: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// requireConfirmation makes the engine's destroys wait for the
// controller's confirmation (EngineConfig.ConfirmDeletes). An Agent that
// verifies snapshots calls it before its first tick.
func (e *Engine) requireConfirmation() { e.confirmDeletes.Store(true) }

// ConfirmsDeletes reports whether the engine's destroys wait for the
// controller's confirmation (EngineConfig.ConfirmDeletes, or an Agent
// with ControllerKeys).
func (e *Engine) ConfirmsDeletes() bool { return e.confirmDeletes.Load() }

// Kinds of object a confirmation is for, in log fields and confirmKey.
const (
	confirmVM     = "vm"
	confirmVolume = "volume"
)

func confirmKey(kind, name string) string { return kind + "/" + name }

// confirmed reports whether the quarantined object kind/name (nonce, its
// quarantine's) may be destroyed once its grace has passed: always when
// the engine does not require confirmation; otherwise only when t, its
// tombstone in the accepted snapshot, carries nonce. The first time an
// object whose grace has passed is found waiting (per nonce), it is logged
// once; a confirmation, or forget, ends the wait.
func (e *Engine) confirmed(kind, name, nonce string, t *snapshots.Tombstone) bool {
	if !e.ConfirmsDeletes() {
		return true
	}
	key := confirmKey(kind, name)
	ok := t.Confirms(nonce)
	e.mu.Lock()
	logged := e.awaiting[key] == nonce
	if ok {
		delete(e.awaiting, key)
	} else {
		e.awaiting[key] = nonce
	}
	e.mu.Unlock()
	if !ok && !logged {
		e.log.WithField(kind, name).WithField("confirm", nonce).
			Warn("tombstone grace passed; waiting for the controller to confirm the delete (a snapshot it publishes carrying this quarantine's nonce): not destroyed until it does")
	}
	return ok
}

// endWait forgets the wait of kind/name for confirmation: the object was
// destroyed, un-deleted or dropped.
func (e *Engine) endWait(kind, name string) {
	e.mu.Lock()
	delete(e.awaiting, confirmKey(kind, name))
	e.mu.Unlock()
}

// confirmRow completes q, the status row of an object quarantined with
// nonce whose tombstone in the accepted snapshot is t (nil when none),
// with the nonce and whether t confirms it, when the engine requires
// confirmation.
func (e *Engine) confirmRow(q *status.Quarantine, nonce string, t *snapshots.Tombstone) {
	if !e.ConfirmsDeletes() {
		return
	}
	q.Confirm = nonce
	q.Confirmed = t.Confirms(nonce)
}
