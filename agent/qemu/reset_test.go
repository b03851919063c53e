package qemu

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// rebootSilentScript makes the tiny guest, once up, mark its root disk
// and reboot itself (the same QEMU process): the next boot prints no
// readiness marker and runs neither sshd nor a guest agent. It waits
// 20 s first: a reset that comes before the agent saw the first boot
// answer rightly discards that boot's readiness, and the first boot
// would then never count as ready (on a loaded machine the probe can
// lag the guest by seconds).
const rebootSilentScript = `#!/bin/sh
for d in /sys/block/vd*; do
	[ "$(cat "$d/serial")" = gitfleet-root ] && root=/dev/${d##*/}
done
sleep 20
printf tinyguest-silent > "$root" && sync
echo rebooting
reboot -f
`

// A guest that was ready and rebooted itself into a boot that never
// answers is taken out of ready by QEMU's RESET event (read on
// QMPEventsSocket), in the same QEMU process, and stays not ready: the
// new boot is marked in the serial log, and ReadyFile no longer says the
// process answered, so a restarted agent does not read it ready either.
func TestGuestRebootEndsReadiness(t *testing.T) {
	needQEMU(t)
	t.Parallel()
	p, m, srv := bootScripted(t, "reboots", rebootSilentScript)
	name := m.Name
	first := waitReady(t, p, name)
	pid := p.machines[name].pid()
	s := waitSerial(t, m.Dir, "tinyguest: silent boot")
	if p.machines[name].pid() != pid {
		t.Fatalf("QEMU was restarted (pid %d, then %d): the reboot must stay in one process", pid, p.machines[name].pid())
	}
	if !strings.Contains(s, "(guest reset) ---") {
		t.Errorf("the serial log does not mark the boot after the reset:\n%s", s)
	}
	// The silent boot is up; for a while after it, readiness is probed
	// and never found.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		r := p.Readiness(name)
		if r.Ready {
			t.Fatalf("ready after the guest rebooted into a boot that never answered: %+v (first boot: %+v)", r, first)
		}
		if !r.Booted.After(first.At) {
			t.Fatalf("the current boot began %s, before the first boot answered at %s", r.Booted, first.At)
		}
	}
	if _, ok := readReadyFile(filepath.Join(m.Dir, ReadyFile), pid); ok {
		t.Error("ReadyFile still says this QEMU's guest answered")
	}
	// A new provisioner (an agent restarted) watching the same process
	// does not read it ready either.
	q := newTestProvisioner(t, t.TempDir(), filepath.Dir(m.Dir), srv)
	time.Sleep(time.Second)
	if r := q.Readiness(name); r.Ready {
		t.Errorf("a restarted agent reads the rebooted guest ready: %+v", r)
	}
}
