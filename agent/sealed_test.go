package agent_test

import (
	"bytes"
	"strings"
	"testing"

	"filippo.io/age"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/sealed"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
)

const sealedSecret = "#cloud-config\npassword: S3CR3T-hunter2\n"

func newKeyring(t *testing.T) (*sealed.Keyring, string) {
	t.Helper()
	id, err := age.GenerateX25519Identity()
	require.NoError(t, err)
	k, err := sealed.NewKeyring(id)
	require.NoError(t, err)
	return k, id.Recipient().String()
}

// encryptedTo gives the VM user-data encrypted to recipient, sealed for
// the VM web-01.
func encryptedTo(t *testing.T, recipient, plain string) func(*desired.VMSpec) {
	return sealedFor(t, "web-01", recipient, plain)
}

// sealedFor gives a VM user-data encrypted to recipient, sealed for the
// VM named vm.
func sealedFor(t *testing.T, vm, recipient, plain string) func(*desired.VMSpec) {
	ct, err := sealed.Seal(recipient, vm, []byte(plain))
	require.NoError(t, err)
	return func(s *desired.VMSpec) {
		s.CloudInit = &desired.CloudInit{EncryptedUserData: &desired.EncryptedUserData{Recipient: recipient, Ciphertext: ct}}
	}
}

// The host holds the key: the create runs as any other.
func TestCreateWithUserDataEncryptedToThisHost(t *testing.T) {
	keys, recipient := newKeyring(t)
	f := newFixture(t, func(c *agent.EngineConfig) { c.AgeIdentity = keys })
	st := f.step(snap(1, vm("web-01", encryptedTo(t, recipient, sealedSecret))))
	r := row(t, st, "web-01")
	assert.Equal(t, status.PhaseReady, r.Phase)
	assert.Empty(t, r.LastError)
}

// User-data encrypted to a key this host does not hold: the create stops
// at its user-data step, before the backend is asked for anything; the VM
// shows failed with both keys named and no content; no attempt is spent,
// and an agent restarted with the right identity resumes the create.
func TestCreateWithUserDataEncryptedToAnotherKeyFailsClearly(t *testing.T) {
	hostKeys, hostRecipient := newKeyring(t)
	otherKeys, otherRecipient := newKeyring(t)
	keys := hostKeys
	f := newFixture(t, func(c *agent.EngineConfig) { c.AgeIdentity = keys })
	s := snap(1, vm("web-01", encryptedTo(t, otherRecipient, sealedSecret)))
	for range 3 {
		st := f.step(s)
		r := row(t, st, "web-01")
		assert.Equal(t, status.PhaseFailed, r.Phase)
		assert.Contains(t, r.LastError, agent.StepUserData+": "+agent.ErrUserDataSealed.Error())
		assert.Contains(t, r.LastError, otherRecipient, "names the key it is encrypted to")
		assert.Contains(t, r.LastError, hostRecipient, "names the key this host holds")
		assert.NotContains(t, r.LastError, "S3CR3T")
	}
	assert.Empty(t, f.prov.AllCalls(), "nothing was fetched, made or booted")
	assert.Zero(t, f.record("web-01").Attempts, "no attempt spent")
	assert.False(t, f.record("web-01").Failed, "not given up: the next tick checks again")

	keys = otherKeys
	f.restart()
	st := f.step(nil)
	assert.Equal(t, status.PhaseReady, row(t, st, "web-01").Phase, "the agent restarted with the right identity creates the VM")

	// No identity at all: the error names the setting.
	g := newFixture(t)
	st = g.step(snap(1, vm("web-02", sealedFor(t, "web-02", hostRecipient, sealedSecret))))
	assert.Contains(t, row(t, st, "web-02").LastError, "ageIdentity")
}

// A ciphertext copied from one VM's file into another's on the same host
// (review cannot tell ciphertexts apart) opens for the VM it was sealed
// for only: the other VM's create stops at its user-data step, naming
// both VMs and no content, and nothing is made or booted.
func TestCreateWithUserDataSealedForAnotherVMFails(t *testing.T) {
	keys, recipient := newKeyring(t)
	f := newFixture(t, func(c *agent.EngineConfig) { c.AgeIdentity = keys })
	st := f.step(snap(1, vm("web-01", sealedFor(t, "db-01", recipient, sealedSecret))))
	r := row(t, st, "web-01")
	assert.Equal(t, status.PhaseFailed, r.Phase)
	assert.Contains(t, r.LastError, agent.StepUserData+": "+agent.ErrUserDataSealed.Error())
	assert.Contains(t, r.LastError, `sealed for VM "db-01", not "web-01"`)
	assert.NotContains(t, r.LastError, "S3CR3T")
	assert.Empty(t, f.prov.AllCalls(), "nothing was fetched, made or booted")
}

// The host's key changed after the VM was created: the VM keeps running
// (no shutdown, no boot, no destroy), and its status says why its
// user-data cannot be decrypted here; a new ciphertext in the spec that
// this host cannot decrypt is reported too and not applied.
func TestACreatedVMWhoseKeyChangedKeepsRunning(t *testing.T) {
	oldKeys, oldRecipient := newKeyring(t)
	newKeys, newRecipient := newKeyring(t)
	keys := oldKeys
	f := newFixture(t, func(c *agent.EngineConfig) { c.AgeIdentity = keys })
	created := vm("web-01", encryptedTo(t, oldRecipient, sealedSecret))
	st := f.step(snap(1, created))
	require.Equal(t, status.PhaseReady, row(t, st, "web-01").Phase)

	keys = newKeys
	f.restart()
	f.prov.ResetCalls()
	st = f.step(nil)
	r := row(t, st, "web-01")
	assert.Equal(t, status.PhaseReady, r.Phase, "the VM keeps running")
	assert.True(t, strings.HasPrefix(r.LastError, agent.UserDataNotOpened), "lastError: %s", r.LastError)
	assert.Contains(t, r.LastError, oldRecipient)
	assert.Contains(t, r.LastError, "nothing is restarted or destroyed")
	assert.NotContains(t, r.LastError, "S3CR3T")
	for _, op := range []agenttest.Op{agenttest.OpBoot, agenttest.OpShutdown, agenttest.OpDestroy, agenttest.OpRootDisk} {
		assert.Empty(t, f.prov.Calls(op), "no %s", op)
	}

	// The spec is encrypted again to the new key: a cloudInit edit,
	// shown and not applied; the VM keeps running on what it was created
	// with, and the applied user-data's problem is still said.
	edited := vm("web-01", encryptedTo(t, newRecipient, sealedSecret+"# again\n"))
	require.NotEqual(t, created.SpecHash, edited.SpecHash, "a new ciphertext is a new spec")
	st = f.step(snap(2, edited))
	r = row(t, st, "web-01")
	assert.Equal(t, status.PhaseReady, r.Phase)
	assert.Contains(t, r.Message, agent.CloudInitNotApplied)
	assert.Empty(t, f.prov.Calls(agenttest.OpShutdown))
	assert.Empty(t, f.prov.Calls(agenttest.OpDestroy))
}

// A Host naming a recipient this agent does not hold is logged when the
// snapshot is accepted, with the keys it does hold.
func TestAHostRecipientTheAgentDoesNotHoldIsLogged(t *testing.T) {
	keys, held := newKeyring(t)
	_, other := newKeyring(t)
	var buf bytes.Buffer
	f := newFixture(t, func(c *agent.EngineConfig) { c.AgeIdentity, c.Log = keys, logTo(&buf) })
	s := snap(1, vm("web-01"))
	s.HostSpec.AgeRecipient = held
	f.step(s)
	assert.NotContains(t, buf.String(), "spec.ageRecipient is not a key")
	s = snap(2, vm("web-01"))
	s.HostSpec.AgeRecipient = other
	f.step(s)
	assert.Contains(t, buf.String(), "spec.ageRecipient is not a key this agent's identity file holds")
	assert.Contains(t, buf.String(), other)
	assert.Contains(t, buf.String(), held)
}
