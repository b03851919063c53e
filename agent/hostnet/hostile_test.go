package hostnet

import (
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/netnstest"
)

// serve runs a TCP service in namespace ns on port that answers every
// connection with banner, until the test ends.
func (f *fixture) serve(ns, port, banner string) {
	f.t.Helper()
	script := filepath.Join(f.dir, "banner-"+ns+".sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho "+banner+"\n"), 0o755); err != nil {
		f.t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", ns, "busybox", "nc", "-ll", "-p", port, "-e", script)
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for i := 0; i < 100; i++ {
		out, _ := exec.Command("ip", "netns", "exec", ns, "busybox", "nc", "-w", "1", "127.0.0.1", port).CombinedOutput()
		if strings.Contains(string(out), banner) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.t.Fatalf("service in %s on port %s did not start", ns, port)
}

// reaches reports whether a connection from namespace ns to addr:port
// reads banner.
func (f *fixture) reaches(ns, addr, port, banner string) bool {
	out, _ := exec.Command("ip", "netns", "exec", ns, "busybox", "nc", "-w", "2", addr, port).CombinedOutput()
	return strings.Contains(string(out), banner)
}

// Guests of one nat network never start a connection to a guest of
// another: "nothing outside starts a connection to a guest" holds for the
// host's other nat networks too, whichever sorts first.
func TestNATNetworksDoNotReachEachOthersGuests(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	nets := map[string]desired.Network{
		"a": {NAT: &desired.NAT{CIDR: "10.81.0.0/24"}},
		"b": {NAT: &desired.NAT{CIDR: "10.82.0.0/24"}},
	}
	if err := f.m.Reconcile(ctx, nets, nil); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	macA, _ := net.ParseMAC("52:54:00:00:0a:01")
	macB, _ := net.ParseMAC("52:54:00:00:0b:01")
	if _, err := f.m.Attach(ctx, "a", nets["a"], "vm-a", macA, netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.m.Attach(ctx, "b", nets["b"], "vm-b", macB, netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	ga := f.peer("a", "gf-a", macA.String())
	gb := f.peer("b", "gf-b", macB.String())
	addrA, addrB := f.dhcp(ga), f.dhcp(gb)
	f.serve(ga, "7001", "guest-a")
	f.serve(gb, "7002", "guest-b")
	if f.reaches(ga, addrB.String(), "7002", "guest-b") {
		t.Errorf("a guest of network a opened a connection to a guest of network b (%s)", addrB)
	}
	if f.reaches(gb, addrA.String(), "7001", "guest-a") {
		t.Errorf("a guest of network b opened a connection to a guest of network a (%s)", addrA)
	}
	// The services are there: each guest reaches its own.
	if !f.reaches(ga, addrA.String(), "7001", "guest-a") || !f.reaches(gb, addrB.String(), "7002", "guest-b") {
		t.Fatalf("the guests' own services do not answer: the checks above prove nothing")
	}
}

// A guest reaches no host service over IPv6 either: the bridge has an
// IPv6 link-local address as soon as it is up.
func TestNATGuestsDoNotReachTheHostOverIPv6(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	nets := map[string]desired.Network{"lab": {NAT: &desired.NAT{CIDR: "10.83.0.0/24"}}}
	if err := f.m.Reconcile(ctx, nets, nil); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	mac, _ := net.ParseMAC("52:54:00:00:0c:01")
	if _, err := f.m.Attach(ctx, "lab", nets["lab"], "vm-c", mac, netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	g := f.peer("c", "gf-lab", mac.String())
	f.dhcp(g)
	l, err := net.Listen("tcp", "[::]:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("host service\n"))
			c.Close()
		}
	}()
	br, _ := netlink.LinkByName("gf-lab")
	var ll netip.Addr
	for i := 0; i < 100 && !ll.IsValid(); i++ {
		addrs, _ := netlink.AddrList(br, netlink.FAMILY_V6)
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.IsLinkLocalUnicast() && a.Flags&0x40 == 0 { // not tentative
				ll = ip
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !ll.IsValid() {
		t.Skip("the bridge has no IPv6 link-local address (IPv6 off in this kernel)")
	}
	time.Sleep(2 * time.Second) // DAD on the guest's side
	target := ll.WithZone("eth0").String()
	if f.reaches(g, target, itoa(port), "host service") {
		t.Errorf("a guest reached a host service at [%s]:%d", target, port)
	}
	if out, err := exec.Command("busybox", "nc", "-w", "2", ll.WithZone("gf-lab").String(), itoa(port)).CombinedOutput(); !strings.Contains(string(out), "host service") {
		t.Errorf("the host cannot reach its own service over IPv6 (the check above proves nothing): %v: %s", err, out)
	}
}
