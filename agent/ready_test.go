package agent_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/agenttest"
)

// waitRow polls the engine's report, without ticking, until cond holds for
// the VM's row (at most 10 s, far above the engine's ReadyPollInterval).
func waitRow(t *testing.T, f *fixture, name string, cond func(status.VM) bool) status.VM {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := row(t, f.eng.Report(), name)
		if cond(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("vm %s never reached the wanted state; last row %+v", name, r)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestReadyOnlyOnceTheGuestAnswers(t *testing.T) {
	f := newFixture(t)
	f.prov.SetClock(f.clock.Now)
	f.prov.SetSilentGuests(true)

	st := f.step(snap(1, vm("web-01")))
	r := row(t, st, "web-01")
	assert.Equal(t, status.PhaseBooting, r.Phase, "the hypervisor runs but the guest has not answered")
	assert.Equal(t, "running", r.Power)
	assert.Empty(t, r.LastError)

	// Ticks do not make it ready; only the guest does.
	assert.Equal(t, status.PhaseBooting, row(t, f.step(nil), "web-01").Phase)

	for _, via := range []string{agent.ReadySSH, agent.ReadyGuestAgent, agent.ReadyConsole} {
		t.Run(via, func(t *testing.T) {
			f.prov.Crash("web-01")
			assert.Equal(t, status.PhaseBooting, row(t, f.step(nil), "web-01").Phase, "booted again after the crash: not ready until it answers")
			f.prov.Answer("web-01", via)
			// No tick: the engine notices the answer by itself.
			r := waitRow(t, f, "web-01", func(r status.VM) bool { return r.Phase != status.PhaseBooting })
			assert.Equal(t, status.PhaseReady, r.Phase)
			assert.Empty(t, r.LastError)
		})
	}

	// An agent restart during the same boot keeps it ready.
	f.restart()
	assert.Equal(t, status.PhaseReady, row(t, f.step(nil), "web-01").Phase)
}

func TestSilentGuestStaysBootingAfterReadyTimeout(t *testing.T) {
	f := newFixture(t, func(c *agent.EngineConfig) { c.ReadyTimeout = 10 * time.Minute })
	f.prov.SetClock(f.clock.Now)
	f.prov.SetSilentGuests(true)
	assert.Equal(t, status.PhaseBooting, row(t, f.step(snap(1, vm("web-01"))), "web-01").Phase)

	f.clock.Add(9 * time.Minute)
	r := row(t, f.step(nil), "web-01")
	assert.Equal(t, status.PhaseBooting, r.Phase)
	assert.Empty(t, r.LastError, "within readyTimeout nothing is wrong yet")

	f.clock.Add(2 * time.Minute)
	// Without a tick, the engine's watch notices the timeout.
	r = waitRow(t, f, "web-01", func(r status.VM) bool { return r.LastError != "" })
	assert.Equal(t, status.PhaseBooting, r.Phase, "never failed for not answering")
	assert.True(t, strings.HasPrefix(r.LastError, "not ready: the guest has not answered"), r.LastError)
	assert.Contains(t, r.LastError, "readyTimeout 10m0s")
	r = row(t, f.step(nil), "web-01")
	assert.Equal(t, status.PhaseBooting, r.Phase)
	assert.Empty(t, f.prov.Calls(agenttest.OpShutdown), "never shut down for not answering")
	assert.Empty(t, f.prov.Calls(agenttest.OpDestroy), "never destroyed for not answering")
	assert.Len(t, f.prov.Calls(agenttest.OpBoot), 1, "never restarted for not answering")

	f.prov.Answer("web-01", agent.ReadySSH)
	r = waitRow(t, f, "web-01", func(r status.VM) bool { return r.Phase == status.PhaseReady })
	assert.Empty(t, r.LastError, "the answer clears the complaint")
}

func TestStoppingIsShownWhileTheShutdownRuns(t *testing.T) {
	f := newFixture(t)
	f.step(snap(1, vm("web-01")))
	seen := make(chan string, 1)
	f.prov.SetHook(func(_ context.Context, op agenttest.Op, name string) error {
		if op == agenttest.OpShutdown {
			for _, v := range f.eng.Report().VMs {
				if v.Name == name {
					seen <- v.Phase
				}
			}
		}
		return nil
	})
	st := f.step(snap(2, vm("web-01", stopped)))
	require.Len(t, seen, 1)
	assert.Equal(t, status.PhaseStopping, <-seen)
	assert.Equal(t, status.PhaseStopped, row(t, st, "web-01").Phase)
}

func TestReadyIsNeverShownForABootThatHasNotAnswered(t *testing.T) {
	f := newFixture(t)
	f.prov.SetSilentGuests(true)
	f.step(snap(1, vm("web-01")))
	f.prov.Answer("web-01", agent.ReadySSH)
	waitRow(t, f, "web-01", func(r status.VM) bool { return r.Phase == status.PhaseReady })

	// The guest's hypervisor dies (or the agent restarts onto a new boot):
	// before any pass looks, the record still says ready; status must not.
	f.prov.Crash("web-01")
	assert.Equal(t, status.PhaseBooting, row(t, f.eng.Report(), "web-01").Phase)
	r := row(t, f.step(nil), "web-01")
	assert.Equal(t, status.PhaseBooting, r.Phase, "booted again, silent")
}

func TestGuestReachedBySSHIsBootingWhileItsSSHDRefuses(t *testing.T) {
	f := newFixture(t)
	f.prov.SetSilentGuests(true)
	f.step(snap(1, vm("web-01")))
	f.prov.Answer("web-01", agent.ReadySSH)
	waitRow(t, f, "web-01", func(r status.VM) bool { return r.Phase == status.PhaseReady })

	// sshd stops answering (cloud-init restarting it, a crash): without a
	// tick, the engine's watch runs the VM's pass, which records it.
	f.prov.Refuse("web-01")
	assert.Equal(t, status.PhaseBooting, row(t, f.eng.Report(), "web-01").Phase, "never shown ready while sshd refuses")
	r := waitRow(t, f, "web-01", func(r status.VM) bool { return r.LastError != "" })
	assert.Equal(t, status.PhaseBooting, r.Phase)
	assert.True(t, strings.HasPrefix(r.LastError, "not ready: the guest's sshd refuses at 127.0.0.1:"), r.LastError)
	assert.Equal(t, status.PhaseBooting, f.record("web-01").Phase, "the record says booting too")
	assert.Empty(t, f.prov.Calls(agenttest.OpShutdown), "never shut down for a refusing sshd")

	f.prov.Answer("web-01", agent.ReadySSH)
	r = waitRow(t, f, "web-01", func(r status.VM) bool { return r.Phase == status.PhaseReady && r.LastError == "" })
	assert.Equal(t, status.PhaseReady, f.record("web-01").Phase)
	assert.Len(t, f.prov.Calls(agenttest.OpBoot), 1, "never restarted for a refusing sshd")
}

// Why a running guest is not ready survives an agent restart for as long
// as it is still true: a keyed guest whose sshd refuses, a guest silent
// past readyTimeout. The restarted agent shows the reason at once and
// after its first pass, never a booting VM with no reason.
func TestNotReadyReasonsSurviveAnAgentRestart(t *testing.T) {
	f := newFixture(t, func(c *agent.EngineConfig) { c.ReadyTimeout = 10 * time.Minute })
	f.prov.SetClock(f.clock.Now)
	f.prov.SetSilentGuests(true)
	f.step(snap(1, vm("keyed-01"), vm("silent-01")))
	f.prov.Answer("keyed-01", agent.ReadySSH)
	waitRow(t, f, "keyed-01", func(r status.VM) bool { return r.Phase == status.PhaseReady })
	f.prov.Refuse("keyed-01")
	waitRow(t, f, "keyed-01", func(r status.VM) bool { return r.LastError != "" })
	f.clock.Add(11 * time.Minute)
	waitRow(t, f, "silent-01", func(r status.VM) bool { return r.LastError != "" })

	f.restart()
	for _, st := range []*status.Status{f.eng.Report(), f.step(nil)} {
		k, s := row(t, st, "keyed-01"), row(t, st, "silent-01")
		assert.Equal(t, status.PhaseBooting, k.Phase)
		assert.True(t, strings.HasPrefix(k.LastError, "not ready: the guest's sshd refuses"), k.LastError)
		assert.Equal(t, status.PhaseBooting, s.Phase)
		assert.True(t, strings.HasPrefix(s.LastError, "not ready: the guest has not answered"), s.LastError)
	}
}

// A guest that answered but holds no lease of the address its network
// reserves for it is not ready: it has no address anyone reaches it at.
// When another machine's lease holds the address, lastError names that
// MAC at once; a guest that simply has not leased yet is told so only
// once ReadyTimeout has passed (it may answer before it asks). Once it
// holds its lease it is ready, the complaint gone.
func TestGuestWithoutItsLeaseIsNotReady(t *testing.T) {
	f := newFixture(t, func(c *agent.EngineConfig) { c.ReadyTimeout = 10 * time.Minute })
	f.prov.SetClock(f.clock.Now)
	f.prov.SetSilentGuests(true)
	f.step(snap(1, vm("web-01")))
	held := fmt.Errorf("address 10.77.0.7 reserved for MAC 52:54:00:00:00:0b on network lab is leased to another MAC 52:54:00:00:00:0a (%w)", agent.ErrAddressHeld)
	f.prov.SetUnleased("web-01", held)
	f.prov.Answer("web-01", agent.ReadyConsole)
	r := waitRow(t, f, "web-01", func(r status.VM) bool { return r.LastError != "" })
	assert.Equal(t, status.PhaseBooting, r.Phase, "answered, but its address is another's")
	assert.True(t, strings.HasPrefix(r.LastError, "not ready: the guest holds no lease of its address: address 10.77.0.7"), r.LastError)
	assert.Contains(t, r.LastError, "is leased to another MAC 52:54:00:00:00:0a")
	assert.Equal(t, status.PhaseBooting, row(t, f.step(nil), "web-01").Phase, "a tick changes nothing")

	f.prov.SetUnleased("web-01", errors.New("no lease of address 10.77.0.7 for MAC 52:54:00:00:00:0b on network lab"))
	r = row(t, f.step(nil), "web-01")
	assert.Equal(t, status.PhaseBooting, r.Phase)
	assert.Empty(t, r.LastError, "within readyTimeout a missing lease is not wrong yet")
	f.clock.Add(11 * time.Minute)
	r = waitRow(t, f, "web-01", func(r status.VM) bool { return r.LastError != "" })
	assert.Equal(t, status.PhaseBooting, r.Phase)
	assert.True(t, strings.HasPrefix(r.LastError, "not ready: the guest holds no lease of its address: no lease of address 10.77.0.7"), r.LastError)

	f.prov.SetUnleased("web-01", nil)
	r = waitRow(t, f, "web-01", func(r status.VM) bool { return r.Phase == status.PhaseReady })
	assert.Empty(t, r.LastError, "the lease clears the complaint")
	assert.Empty(t, f.prov.Calls(agenttest.OpShutdown), "never shut down for its lease")
}
