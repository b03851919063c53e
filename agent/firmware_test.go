package agent_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/testsupport/gittest"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
)

func firmware(f desired.Firmware) func(*desired.VMSpec) {
	return func(s *desired.VMSpec) { s.Firmware = f }
}

// A created VM's firmware is not changed without the spec's opt-in: the
// edit fails for good, the VM runs on its firmware untouched, and status
// says what to set. With allowFirmwareChangeFrom naming the old firmware
// the VM restarts on the new one.
func TestAFirmwareChangeNeedsTheOptIn(t *testing.T) {
	f := newFixture(t)
	f.step(snap(1, vm("web-01")))
	f.prov.ResetCalls()
	uefi := vm("web-01", firmware(desired.FirmwareUEFI))
	r := row(t, f.step(snap(2, uefi)), "web-01")
	assert.Empty(t, f.prov.Calls(agenttest.OpShutdown), "the VM was stopped for a refused firmware change")
	assert.Equal(t, status.PhaseReady, r.Phase)
	assert.NotEqual(t, uefi.SpecHash, r.SpecHash, "the refused spec was recorded as applied")
	assert.Contains(t, r.LastError, "firmware: firmware change from bios to uefi refused")
	assert.Contains(t, r.LastError, "allowFirmwareChangeFrom: bios")
	assert.True(t, f.record("web-01").Failed, "a refusal is permanent until the spec changes")

	allowed := vm("web-01", firmware(desired.FirmwareUEFI), func(s *desired.VMSpec) { s.AllowFirmwareChangeFrom = desired.FirmwareBIOS })
	r = row(t, f.step(snap(3, allowed)), "web-01")
	assert.Empty(t, r.LastError)
	assert.Equal(t, allowed.SpecHash, r.SpecHash)
	assert.Len(t, f.prov.Calls(agenttest.OpShutdown), 1, "the VM restarts to boot its new firmware")
}

// The TPM, like the rest of the machine model, is applied by a restart.
func TestATPMEditRestartsTheVM(t *testing.T) {
	f := newFixture(t)
	f.step(snap(1, vm("web-01")))
	f.prov.ResetCalls()
	tpm := vm("web-01", func(s *desired.VMSpec) { s.TPM = true })
	r := row(t, f.step(snap(2, tpm)), "web-01")
	assert.Empty(t, r.LastError)
	assert.Equal(t, tpm.SpecHash, r.SpecHash)
	assert.Len(t, f.prov.Calls(agenttest.OpShutdown), 1)
}

// archProvisioner is a provisioner that reports its guests' architecture.
type archProvisioner struct {
	*agenttest.Provisioner
}

func (archProvisioner) Arch() string   { return "arm64" }
func (archProvisioner) Emulated() bool { return true }

// The status says which architecture the host's guests are, and that
// they are emulated, as the provisioner reports it.
func TestStatusSaysTheGuestsArchitecture(t *testing.T) {
	gittest.NeedGit(t)
	bare := gittest.NewBare(t)
	h := newHostAgent(t, bare, newClock(), func(c *agent.EngineConfig) {
		c.Provisioner = archProvisioner{c.Provisioner.(*agenttest.Provisioner)}
	})
	require.NoError(t, h.once())
	st := readStatus(t, bare)
	require.NotNil(t, st)
	assert.Equal(t, "arm64", st.Agent.Arch)
	assert.True(t, st.Agent.Emulated)
}
