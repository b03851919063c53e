package agent

import (
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/gitfleet/gitfleet/desired"
)

// StepUserData is the create step that checks this host can decrypt the
// VM's encrypted user-data (EngineConfig.AgeIdentity), before anything is
// fetched or made: user-data encrypted to another key fails the create
// with ErrUserDataSealed.
const StepUserData = "user-data"

// ErrUserDataSealed is a create's error when this host cannot decrypt the
// VM's encrypted user-data. Like a missing volume it spends no attempt
// and is checked again every tick (for free: the answer is memoized), so
// an agent restarted with the right identity file, or a spec encrypted
// again, resumes the create; the VM shows failed with why meanwhile.
var ErrUserDataSealed = errors.New("this host cannot decrypt the VM's encryptedUserData")

// UserDataNotOpened starts the lastError of a created VM whose encrypted
// user-data this host cannot decrypt (its key changed since the VM was
// created). The VM is neither restarted nor destroyed for it.
const UserDataNotOpened = "encryptedUserData cannot be decrypted on this host"

// userDataOpens reports why this host cannot decrypt spec's encrypted
// user-data for the VM named name (it opens only for the VM it was sealed
// for: sealed.Keyring.Open), or nil (also when it has none). The
// plaintext is dropped at once; the answer is memoized by the sha256 of
// the name and the ciphertext, since the keyring never changes while the
// engine runs. The error names keys and VMs, never content.
func (e *Engine) userDataOpens(name string, spec desired.VMSpec) error {
	ci := spec.CloudInit
	if ci == nil || ci.EncryptedUserData == nil {
		return nil
	}
	key := sha256.Sum256([]byte(name + "\x00" + ci.EncryptedUserData.Ciphertext))
	if v, ok := e.opens.Load(key); ok {
		err, _ := v.(error)
		return err
	}
	_, err := e.cfg.AgeIdentity.Open(ci.EncryptedUserData.Ciphertext, name)
	if err != nil {
		err = fmt.Errorf("user-data encrypted to %s: %w", ci.EncryptedUserData.Recipient, err)
	}
	e.opens.Store(key, err)
	return err
}

// userDataCheck is the create step StepUserData.
func (p *vmPass) userDataCheck(spec desired.VMSpec) error {
	if err := p.e.userDataOpens(p.rec.Name, spec); err != nil {
		return fmt.Errorf("%w: %v; encrypt it to this host's recipient (the Host's spec.ageRecipient, which this host's identity file must hold: gitfleet encrypt --host %s)", ErrUserDataSealed, err, p.e.cfg.Host)
	}
	return nil
}

// userDataProblem is what a created VM's status says when this host cannot
// decrypt its user-data: the applied spec's (the seed the VM was created
// with, which cloud-init read at first boot), or a new one the spec asks
// for. "" when there is none.
func (p *vmPass) userDataProblem() string {
	if err := p.e.userDataOpens(p.rec.Name, p.rec.Spec); err != nil {
		return fmt.Sprintf("%s: %v; nothing is restarted or destroyed for it: the VM keeps running, and a later boot reuses the user-data of its existing seed; encrypt it again to this host's recipient before the VM is ever created again", UserDataNotOpened, err)
	}
	if p.want != nil {
		if err := p.e.userDataOpens(p.rec.Name, p.want.Spec); err != nil {
			return fmt.Sprintf("%s: the spec's new user-data: %v; it would only seed the VM if it were created again", UserDataNotOpened, err)
		}
	}
	return ""
}

// checkHostRecipient warns when the Host object names an age recipient
// this host's identity does not hold (the Host's key was changed in the
// repository before the agent got the new identity, or the other way
// round): VMs encrypted to it cannot be created here. Logged with each
// accepted snapshot that names it; each VM's status says the rest.
func (e *Engine) checkHostRecipient(recipient string) {
	if recipient == "" || e.cfg.AgeIdentity.Holds(recipient) {
		return
	}
	held := []string{}
	if e.cfg.AgeIdentity != nil {
		held = e.cfg.AgeIdentity.Recipients()
	}
	e.log.WithField("ageRecipient", recipient).WithField("held", held).
		Warn("the Host's spec.ageRecipient is not a key this agent's identity file holds: user-data encrypted to it cannot be decrypted here; add its identity to the agent's ageIdentity file and restart the agent")
}

// joinErrors joins the non-empty messages with "; ".
func joinErrors(msgs ...string) string {
	out := ""
	for _, m := range msgs {
		switch {
		case m == "":
		case out == "":
			out = m
		default:
			out += "; " + m
		}
	}
	return out
}
