package qemu

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/netnstest"
)

// A guest on user-mode networking reaches no host service, loopback
// included (TestGuestCannotReachHostLoopback): the guard refuses QEMU's
// user every new connection to a local address. A host service may also
// hear a multicast group (mDNS, LLMNR, SSDP) or broadcasts; the guest's
// datagrams to those leave QEMU's sockets for no local address, and the
// kernel loops multicast back to the host's own members. The test's
// namespace routes multicast over its loopback, where the host's
// listener joins the group.
func TestAttackUserModeGuestReachesHostMulticast(t *testing.T) {
	needQEMU(t)
	testQEMUUser(t)
	if !netnstest.Enter(t) {
		return
	}
	for _, args := range [][]string{
		{"link", "set", "lo", "multicast", "on"},
		{"route", "add", "224.0.0.0/4", "dev", "lo"},
		{"route", "add", "default", "dev", "lo"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	group, err := net.ListenMulticastUDP("udp4", lo, &net.UDPAddr{IP: net.IPv4(224, 0, 0, 251), Port: 5353})
	if err != nil {
		t.Fatal(err)
	}
	defer group.Close()
	bcast, err := net.ListenPacket("udp4", ":5355")
	if err != nil {
		t.Fatal(err)
	}
	defer bcast.Close()
	// DNS on a local address is what the guard lets QEMU's user reach:
	// the guest's datagram there proves its others left QEMU too.
	dns, err := net.ListenPacket("udp4", "127.0.0.1:53")
	if err != nil {
		t.Fatal(err)
	}
	defer dns.Close()

	srv := newArtifactServer(t)
	spec := guestSpec(t, srv)
	// busybox's tftp is the guest's UDP sender (its nc speaks only TCP),
	// nslookup the control.
	spec.CloudInit = &desired.CloudInit{UserData: "#!/bin/sh\nsleep 1\n" +
		"for i in 1 2 3; do\n" +
		"  tftp -g -r from-the-guest -l /tmp/x 224.0.0.251 5353 2>&1 & sleep 1; kill $! 2>/dev/null\n" +
		"  tftp -g -r from-the-guest -l /tmp/x 255.255.255.255 5355 2>&1 & sleep 1; kill $! 2>/dev/null\n" +
		"done\n" +
		"nslookup from-the-guest 10.0.2.2 >/dev/null 2>&1 & sleep 2; kill $! 2>/dev/null\n" +
		"echo 'probe multicast sent'\n"}
	vmRoot := t.TempDir()
	p := confinedProvisioner(t, vmRoot)
	name := "mcast"
	dir := filepath.Join(vmRoot, name)
	os.MkdirAll(dir, 0o700)
	m := agent.Machine{Name: name, Dir: dir, Spec: spec, InstanceID: "i-mcast"}
	t.Cleanup(func() { p.Destroy(context.Background(), name) })
	ctx := context.Background()
	if err := p.PrepareRootDisk(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := p.Boot(ctx, m); err != nil {
		t.Fatal(err)
	}
	serialOut := waitSerial(t, dir, "probe multicast sent")
	var reached []string
	for _, c := range []net.PacketConn{group, bcast} {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 512)
		if n, from, err := c.ReadFrom(buf); err == nil {
			reached = append(reached, c.LocalAddr().String()+" heard "+strings.TrimSpace(string(buf[:n]))+" from "+from.String())
		}
	}
	dns.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, _, err := dns.ReadFrom(make([]byte, 512)); err != nil {
		t.Fatalf("the host's DNS port heard nothing from the guest (the checks prove nothing): %v\n%s", err, strings.Join(guestLines(serialOut), "\n"))
	}
	// The listeners hear the host (the check proves something).
	if c, err := net.Dial("udp4", "224.0.0.251:5353"); err == nil {
		c.Write([]byte("from-the-host"))
		c.Close()
	}
	group.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, _, err := group.ReadFrom(make([]byte, 512)); err != nil {
		t.Fatalf("the host's group member hears nothing from the host: %v", err)
	}
	if len(reached) > 0 {
		t.Skipf("BREAK: a user-mode guest reached host listeners: %s", strings.Join(reached, "; "))
	}
}
