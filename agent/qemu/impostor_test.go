package qemu

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/netnstest"
)

// A guest ready by SSH on a LAN whose address another machine then takes
// (the guest gone from the LAN, a machine with another MAC answering at
// its static address with an SSH banner, as the real neighbour table
// shows it) is not ready, and its readiness names that machine's MAC
// (Readiness.HeldBy), kept in ReadyFile for a restarted agent: the
// refusal is not the guest's sshd's.
func TestAnotherMachineTakingTheAddressIsNamed(t *testing.T) {
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox is not installed")
	}
	if !netnstest.Enter(t) {
		return
	}
	root := t.TempDir()
	p := networkedProvisioner(t, root, "")
	run(t, "ip", "link", "add", "br0", "type", "bridge")
	run(t, "ip", "addr", "add", "192.168.71.1/24", "dev", "br0")
	run(t, "ip", "link", "set", "br0", "up")
	lan := desired.Network{Bridge: "br0"}
	const addr, guestMAC, otherMAC = "192.168.71.50", "52:54:00:00:71:03", "52:54:00:00:71:01"
	// machine is another host on the LAN with mac at the guest's address.
	machine := func(suffix, mac string) { bannerOnLAN(t, root, suffix, mac, addr, "192.168.71.1") }
	st := recordOnLAN(t, p, lan, "web-01", guestMAC, addr)
	machine("g", guestMAC)

	readyFile := filepath.Join(root, ReadyFile)
	w := &bootWatch{pid: 4343, recheck: 50 * time.Millisecond, recheckLate: 50 * time.Millisecond}
	w.r.Booted, w.r.SSHRequired = time.Now(), true
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	t.Cleanup(cancel)
	logger, _ := logtest.NewNullLogger()
	go w.sshLoop(ctx, func(ctx context.Context) (string, error) { return p.probeSSH(ctx, st) }, readyFile, logger.WithField("vm", "web-01"))
	waitFor := func(what string, cond func(agent.Readiness) bool) agent.Readiness {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if r := w.readiness(); cond(r) {
				return r
			}
			if time.Now().After(deadline) {
				t.Fatalf("never %s: %+v", what, w.readiness())
			}
		}
	}
	waitFor("ready", func(r agent.Readiness) bool { return r.Ready })

	run(t, "ip", "link", "del", "vg")   // the guest leaves the LAN
	time.Sleep(1100 * time.Millisecond) // the neighbour table's locktime
	machine("o", otherMAC)
	r := waitFor("not ready", func(r agent.Readiness) bool { return !r.Ready })
	if r.HeldBy != otherMAC || r.Refused.IsZero() {
		t.Fatalf("readiness after another machine took the address: %+v; want HeldBy %s", r, otherMAC)
	}
	if back, ok := readReadyFile(readyFile, 4343); !ok || back.HeldBy != otherMAC || back.Ready {
		t.Errorf("ReadyFile read back: %+v, %v; want the refusal by %s", back, ok, otherMAC)
	}
}
