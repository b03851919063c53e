package agent_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/status"
)

// When another machine answers at a ready guest's address (its MAC is not
// the VM's), lastError says so, naming the MAC, and does not blame the
// guest's sshd; the guest answering again clears it.
func TestAnotherMachineAtTheGuestsAddressIsNamed(t *testing.T) {
	f := newFixture(t)
	f.prov.SetSilentGuests(true)
	f.step(snap(1, vm("web-01")))
	f.prov.Answer("web-01", agent.ReadySSH)
	waitRow(t, f, "web-01", func(r status.VM) bool { return r.Phase == status.PhaseReady })

	f.prov.Impostor("web-01", "52:54:00:00:70:01")
	r := waitRow(t, f, "web-01", func(r status.VM) bool { return r.LastError != "" })
	assert.Equal(t, status.PhaseBooting, r.Phase)
	assert.True(t, strings.HasPrefix(r.LastError, "not ready: another machine answers at the guest's address 127.0.0.1:"), r.LastError)
	assert.Contains(t, r.LastError, "(MAC 52:54:00:00:70:01), not the guest, since ")
	assert.NotContains(t, r.LastError, "sshd refuses")

	f.prov.Answer("web-01", agent.ReadySSH)
	r = waitRow(t, f, "web-01", func(r status.VM) bool { return r.Phase == status.PhaseReady })
	assert.Empty(t, r.LastError)
}
