package hostnet

import (
	"context"
	"errors"
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
	"github.com/gitfleet/gitfleet/testsupport/hostileguest"
	"github.com/gitfleet/gitfleet/testsupport/netnstest"
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

// natGuest reconciles a single nat network "lab" on cidr, attaches vm
// with mac to it, and makes a namespace (named with suffix) standing in
// for the guest on its bridge, which leases its address by DHCP. It
// returns the namespace and the leased address.
func (f *fixture) natGuest(cidr, vm, mac, suffix string) (string, netip.Addr) {
	f.t.Helper()
	ctx := context.Background()
	nets := map[string]desired.Network{"lab": {NAT: &desired.NAT{CIDR: cidr}}}
	if err := f.m.Reconcile(ctx, nets, nil); err != nil {
		f.t.Fatalf("Reconcile: %v", err)
	}
	hw, err := net.ParseMAC(mac)
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.m.Attach(ctx, "lab", nets["lab"], NIC{VM: vm, MAC: hw}); err != nil {
		f.t.Fatal(err)
	}
	g := f.peer(suffix, "gf-lab", hw.String())
	return g, f.dhcp(g)
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
	if _, err := f.m.Attach(ctx, "a", nets["a"], NIC{VM: "vm-a", MAC: macA}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.m.Attach(ctx, "b", nets["b"], NIC{VM: "vm-b", MAC: macB}); err != nil {
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
	// Guests of one network reach each other, whether or not bridged
	// traffic passes the host's firewall (br_netfilter).
	macA2, _ := net.ParseMAC("52:54:00:00:0a:02")
	if _, err := f.m.Attach(ctx, "a", nets["a"], NIC{VM: "vm-a2", MAC: macA2}); err != nil {
		t.Fatal(err)
	}
	ga2 := f.peer("a2", "gf-a", macA2.String())
	f.dhcp(ga2)
	if !f.reaches(ga2, addrA.String(), "7001", "guest-a") {
		t.Errorf("a guest of network a does not reach another guest of network a (%s)", addrA)
	}
}

// A guest reaches no host service over IPv6 either: the bridge has an
// IPv6 link-local address as soon as it is up.
func TestNATGuestsDoNotReachTheHostOverIPv6(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	g, _ := f.natGuest("10.83.0.0/24", "vm-c", "52:54:00:00:0c:01", "c")
	port := hostService(t, "[::]:0")
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

// A nat network whose CIDR overlaps the host's own addresses or routes
// (its LAN, a VPN's range, a blackhole) is left unmade, changing nothing
// on the host, until the conflict goes: its bridge would take those
// addresses from the host and hand them to guests.
func TestNATNetworkOverlappingTheHostsRoutesIsRefused(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	f.run("ip", "link", "add", "lan0", "type", "veth", "peer", "name", "lan0p")
	f.run("ip", "addr", "add", "10.85.0.5/16", "dev", "lan0")
	f.run("ip", "link", "set", "lan0", "up")
	f.run("ip", "route", "add", "default", "via", "10.85.0.1")
	f.run("ip", "route", "add", "blackhole", "10.86.0.0/24")

	for _, c := range []struct{ cidr, route string }{
		{"10.85.3.0/24", "10.85.0.0/16"}, // inside the LAN's prefix
		{"10.85.0.0/29", "10.85.0.0/16"}, // holding the host's own address
		{"10.86.0.0/16", "10.86.0.0/24"}, // around a blackhole route
	} {
		nets := map[string]desired.Network{"lab": {NAT: &desired.NAT{CIDR: c.cidr}}}
		err := f.m.Reconcile(ctx, nets, nil)
		if !errors.Is(err, ErrHostConflict) || !strings.Contains(err.Error(), c.route) {
			t.Errorf("Reconcile with %s = %v; want ErrHostConflict naming %s", c.cidr, err, c.route)
		}
		if err := f.m.Check("lab", nets["lab"]); !errors.Is(err, ErrHostConflict) {
			t.Errorf("Check with %s = %v; want ErrHostConflict", c.cidr, err)
		}
		mac, _ := net.ParseMAC("52:54:00:00:0d:01")
		if _, err := f.m.Attach(ctx, "lab", nets["lab"], NIC{VM: "vm-d", MAC: mac}); !errors.Is(err, ErrHostConflict) {
			t.Errorf("Attach with %s = %v; want ErrHostConflict", c.cidr, err)
		}
		if _, err := netlink.LinkByName("gf-lab"); err == nil {
			t.Fatalf("bridge gf-lab made for %s, which the host's routes use", c.cidr)
		}
		if exec.Command("nft", "list", "table", "inet", NftTable).Run() == nil {
			t.Fatalf("nftables table loaded for %s, which the host's routes use", c.cidr)
		}
		if out := f.run("ip", "route", "get", "10.85.0.9"); !strings.Contains(out, "dev lan0") {
			t.Fatalf("the host's LAN route changed: %s", out)
		}
	}

	// The default route conflicts with nothing, and once the conflict goes
	// the network is made.
	nets := map[string]desired.Network{"lab": {NAT: &desired.NAT{CIDR: "10.87.0.0/24"}}}
	if err := f.m.Reconcile(ctx, nets, nil); err != nil {
		t.Fatalf("Reconcile with 10.87.0.0/24 beside a default route: %v", err)
	}
	f.run("ip", "route", "del", "blackhole", "10.86.0.0/24")
	nets = map[string]desired.Network{"lab": {NAT: &desired.NAT{CIDR: "10.86.0.0/16"}}}
	if err := f.m.Reconcile(ctx, nets, nil); err != nil {
		t.Fatalf("Reconcile once the blackhole route is gone: %v", err)
	}
	if err := f.m.Check("lab", nets["lab"]); err != nil {
		t.Fatalf("Check of the made network (its own bridge's routes) = %v", err)
	}
}

// Two nat networks that swap CIDRs (and a renamed network taking the CIDR
// of one still in use) converge: the agent's own bridges are no conflict.
func TestNATNetworksSwappingCIDRsConverge(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	a, b := &desired.NAT{CIDR: "10.88.0.0/24"}, &desired.NAT{CIDR: "10.89.0.0/24"}
	if err := f.m.Reconcile(ctx, map[string]desired.Network{"a": {NAT: a}, "b": {NAT: b}}, nil); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	swapped := map[string]desired.Network{"a": {NAT: b}, "b": {NAT: a}}
	var err error
	for i := 0; i < 3; i++ {
		if err = f.m.Reconcile(ctx, swapped, nil); err == nil {
			break
		}
		t.Logf("Reconcile %d after the swap: %v", i+1, err)
	}
	if err != nil {
		t.Fatalf("the swapped networks did not converge: %v", err)
	}
	for name, want := range map[string]string{"a": "10.89.0.1/24", "b": "10.88.0.1/24"} {
		br, _ := netlink.LinkByName(desired.NATBridge(name))
		addrs, _ := netlink.AddrList(br, netlink.FAMILY_V4)
		if len(addrs) != 1 || addrs[0].IPNet.String() != want {
			t.Errorf("%s addresses = %v; want %s", desired.NATBridge(name), addrs, want)
		}
		if f.m.dnsmasqPid(name) == 0 {
			t.Errorf("no dnsmasq runs for %s", name)
		}
	}
	mac, _ := net.ParseMAC("52:54:00:00:0e:01")
	if _, err := f.m.Attach(ctx, "a", swapped["a"], NIC{VM: "vm-e", MAC: mac}); err != nil {
		t.Fatal(err)
	}
	g := f.peer("e", "gf-a", mac.String())
	if got := f.dhcp(g); !netip.MustParsePrefix("10.89.0.0/24").Contains(got) {
		t.Errorf("guest on a leased %s; want an address of 10.89.0.0/24", got)
	}

	// A network renamed while a VM still uses the old one, the new one
	// taking the old one's CIDR: the two would hold one address on two
	// bridges. The new one waits, naming the old one, until no VM uses it;
	// the old one goes on serving its guests.
	renamed := map[string]desired.Network{"c": {NAT: b}, "b": {NAT: a}}
	err = f.m.Reconcile(ctx, renamed, map[string]bool{"a": true})
	if !errors.Is(err, ErrHostConflict) || !strings.Contains(err.Error(), "overlaps nat network a (bridge gf-a), which the Host spec no longer names but a VM still uses") {
		t.Fatalf("Reconcile with a renamed to c while a VM uses a = %v; want ErrHostConflict naming a", err)
	}
	if err := f.m.Check("c", renamed["c"]); !errors.Is(err, ErrHostConflict) {
		t.Fatalf("Check of c = %v; want ErrHostConflict", err)
	}
	if _, err := netlink.LinkByName("gf-c"); err == nil {
		t.Fatal("bridge gf-c made with the address of gf-a")
	}
	if f.m.dnsmasqPid("a") == 0 {
		t.Fatal("dnsmasq of the kept network a stopped")
	}
	if err := f.m.Reconcile(ctx, renamed, map[string]bool{}); err != nil {
		t.Fatalf("Reconcile once no VM uses a: %v", err)
	}
	if f.m.dnsmasqPid("c") == 0 {
		t.Fatal("dnsmasq of c does not run")
	}
}

// A guest that changed its address on the LAN shows the new one, though
// the host's neighbour table still holds the old ones for its MAC.
func TestBridgeAddressFollowsTheGuestsNewestAddress(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	lan := desired.Network{Bridge: "br0"}
	f.run("ip", "link", "add", "br0", "type", "bridge")
	f.run("ip", "addr", "add", "192.168.60.1/24", "dev", "br0")
	f.run("ip", "link", "set", "br0", "up")
	mac, _ := net.ParseMAC("52:54:00:00:0f:01")
	guest := f.peer("g", "br0", mac.String())
	for _, addr := range []string{"192.168.60.30", "192.168.60.11", "192.168.60.52", "192.168.60.7", "192.168.60.44", "192.168.60.20"} {
		f.run("ip", "netns", "exec", guest, "ip", "addr", "flush", "dev", "eth0")
		f.run("ip", "netns", "exec", guest, "ip", "addr", "add", addr+"/24", "dev", "eth0")
		f.run("ip", "netns", "exec", guest, "busybox", "ping", "-c", "1", "-W", "2", "192.168.60.1")
		time.Sleep(50 * time.Millisecond)
		if got := f.m.Address("lan", lan, mac); got != netip.MustParseAddr(addr) {
			t.Errorf("Address after the guest moved to %s = %s; neighbours:\n%s", addr, got, f.run("ip", "neigh", "show", "dev", "br0"))
		}
	}
}

// The nftables table is repaired whatever happened to it: deleted, a
// chain flushed, a rule removed, a rule added to it. Its drop rules are
// what keeps guests off the host.
func TestNATNftablesTableIsRepairedWhenTamperedWith(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	nets := map[string]desired.Network{"lab": {NAT: &desired.NAT{CIDR: "10.84.0.0/24"}}}
	if err := f.m.Reconcile(ctx, nets, nil); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	want := f.run("nft", "list", "table", "inet", NftTable)
	for _, tamper := range [][]string{
		{"delete", "table", "inet", NftTable},
		{"flush", "chain", "inet", NftTable, "input"},
		{"flush", "chain", "inet", NftTable, "forward"},
		{"add", "rule", "inet", NftTable, "input", "iifname", "gf-lab", "tcp", "dport", "22", "accept"},
		{"insert", "rule", "inet", NftTable, "forward", "accept"},
	} {
		f.run("nft", tamper...)
		if err := f.manager().Reconcile(ctx, nets, nil); err != nil {
			t.Fatalf("Reconcile after nft %s: %v", strings.Join(tamper, " "), err)
		}
		if got := f.run("nft", "list", "table", "inet", NftTable); got != want {
			t.Errorf("after nft %s and a Reconcile the table is\n%s\nwant\n%s", strings.Join(tamper, " "), got, want)
		}
	}
}

// A nat network whose name the spec gives a bridge network instead is
// kept while a VM's tap is on it, and torn down once its VMs moved to the
// bridge, though their records name the network still.
func TestNATNetworkTurnedBridgeGoesOnceItsVMsMoved(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	nat := desired.Network{NAT: &desired.NAT{CIDR: "10.91.0.0/24"}}
	if err := f.m.Reconcile(ctx, map[string]desired.Network{"lab": nat}, nil); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	mac, _ := net.ParseMAC("52:54:00:00:91:01")
	if _, err := f.m.Attach(ctx, "lab", nat, NIC{VM: "vm-g", MAC: mac}); err != nil {
		t.Fatal(err)
	}
	f.run("ip", "link", "add", "br1", "type", "bridge")
	f.run("ip", "link", "set", "br1", "up")
	bridged := map[string]desired.Network{"lab": {Bridge: "br1"}}
	inUse := map[string]bool{"lab": true}
	if err := f.m.Reconcile(ctx, bridged, inUse); err != nil {
		t.Fatalf("Reconcile with lab a bridge network: %v", err)
	}
	if _, err := netlink.LinkByName("gf-lab"); err != nil || f.m.dnsmasqPid("lab") == 0 {
		t.Fatalf("the nat network went while vm-g's tap is on it: %v", err)
	}
	// vm-g boots again, on the bridge.
	if _, err := f.m.Attach(ctx, "lab", bridged["lab"], NIC{VM: "vm-g", MAC: mac}); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Reconcile(ctx, bridged, inUse); err != nil {
		t.Fatalf("Reconcile once vm-g moved: %v", err)
	}
	if _, err := netlink.LinkByName("gf-lab"); err == nil {
		t.Error("gf-lab is still there once no tap is on it")
	}
	if _, err := os.Stat(filepath.Join(f.dir, "networks", "lab")); err == nil {
		t.Error("the nat network's directory is still there")
	}
	if exec.Command("nft", "list", "table", "inet", NftTable).Run() == nil {
		t.Error("the nftables table is still there")
	}
}

// A device left behind under a VM's tap name is made the VM's tap, or
// refused when it is no tap; a bridge network naming a device that is no
// bridge (lo, an interface) is refused, and the device left alone.
func TestLeftoverTapsAndDevicesThatAreNoBridge(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	f.run("ip", "link", "add", "br0", "type", "bridge")
	f.run("ip", "link", "set", "br0", "up")
	lan := desired.Network{Bridge: "br0"}
	mac, _ := net.ParseMAC("52:54:00:00:92:01")
	for _, leftover := range [][]string{
		{"tuntap", "add", "dev", TapName("vm-h"), "mode", "tap"},                          // a crash's tap, down, on no bridge
		{"tuntap", "add", "dev", TapName("vm-h"), "mode", "tun"},                          // a tun under the tap's name
		{"tuntap", "add", "dev", TapName("vm-h"), "mode", "tap", "multi_queue"},           // a tap QEMU cannot open as one queue
		{"tuntap", "add", "dev", TapName("vm-h"), "mode", "tap", "one_queue", "vnet_hdr"}, // one as the agent makes it
	} {
		exec.Command("ip", "link", "del", TapName("vm-h")).Run()
		f.run("ip", leftover...)
		a, err := f.m.Attach(ctx, "lan", lan, NIC{VM: "vm-h", MAC: mac})
		if err != nil {
			t.Errorf("Attach over a leftover (ip %s): %v", strings.Join(leftover, " "), err)
			continue
		}
		l, err := netlink.LinkByName(a.Tap)
		if err != nil {
			t.Fatal(err)
		}
		tap, ok := l.(*netlink.Tuntap)
		br, _ := netlink.LinkByName("br0")
		if !ok || tap.Mode != netlink.TUNTAP_MODE_TAP || tap.Flags&netlink.TUNTAP_MULTI_QUEUE != 0 || l.Attrs().MasterIndex != br.Attrs().Index || l.Attrs().Flags&net.FlagUp == 0 {
			t.Errorf("after Attach over a leftover (ip %s) the tap is %+v", strings.Join(leftover, " "), l)
		}
	}
	for _, dev := range []string{"lo", "eth0"} {
		if dev == "eth0" {
			f.run("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
		}
		def := desired.Network{Bridge: dev}
		if err := f.m.Check("lan", def); err == nil || !strings.Contains(err.Error(), "not a bridge") {
			t.Errorf("Check of bridge %s = %v; want not a bridge", dev, err)
		}
		if _, err := f.m.Attach(ctx, "lan", def, NIC{VM: "vm-i", MAC: mac}); err == nil {
			t.Errorf("Attach to bridge %s succeeded", dev)
		}
		if l, _ := netlink.LinkByName(TapName("vm-i")); l != nil && l.Attrs().MasterIndex != 0 {
			t.Errorf("a tap was made a port of %s", dev)
		}
	}
}

// A guest speaks only with the MAC its NIC was given: frames from its tap
// with another source MAC (another VM's, to take its lease, its neighbour
// entry or its readiness) are dropped where they enter the bridge.
func TestTapsCarryOnlyTheirVMsMAC(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	nets := map[string]desired.Network{"lab": {NAT: &desired.NAT{CIDR: "10.94.0.0/24"}}}
	if err := f.m.Reconcile(ctx, nets, nil); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	macG, _ := net.ParseMAC("52:54:00:00:94:01")
	macH, _ := net.ParseMAC("52:54:00:00:94:02")
	for vm, mac := range map[string]net.HardwareAddr{"vm-g": macG, "vm-h": macH} {
		if _, err := f.m.Attach(ctx, "lab", nets["lab"], NIC{VM: vm, MAC: mac}); err != nil {
			t.Fatal(err)
		}
	}
	for vm, mac := range map[string]string{"vm-g": macG.String(), "vm-h": macH.String()} {
		rules := f.run("nft", "list", "chain", "bridge", NftTable, nicChain(TapName(vm)))
		if want := `ether saddr != ` + mac + ` drop`; !strings.Contains(rules, want) {
			t.Errorf("tap filter lacks %q:\n%s", want, rules)
		}
	}
	// The guest is a namespace behind a veth port standing in for vm-g's
	// tap (a tap passes frames only while QEMU holds it): the filter
	// holds the port to vm-g's MAC as it holds the tap.
	g := f.peer("g", "gf-lab", macG.String())
	if err := f.m.recordTap(ctx, "vg", tapRecord{MAC: macG.String(), NAT: true}); err != nil {
		t.Fatal(err)
	}
	f.dhcp(g)
	if err := f.try(g, "busybox", "ping", "-c", "1", "-W", "2", "10.94.0.1"); err != nil {
		t.Fatalf("the guest cannot ping its gateway with its own MAC: %v", err)
	}
	f.run("ip", "netns", "exec", g, "ip", "link", "set", "eth0", "address", macH.String())
	f.run("ip", "netns", "exec", g, "ip", "neigh", "flush", "all")
	if err := f.try(g, "busybox", "ping", "-c", "1", "-W", "2", "10.94.0.1"); err == nil {
		t.Error("the guest reached its gateway with vm-h's MAC")
	}
	if out, err := exec.Command("ip", "netns", "exec", g, "busybox", "udhcpc", "-i", "eth0", "-t", "2", "-T", "1", "-n", "-q", "-s", "/bin/true").CombinedOutput(); err == nil {
		t.Errorf("the guest got vm-h's lease with vm-h's MAC: %s", out)
	}

	// Detached VMs leave the filter; with no tap left the table goes.
	for _, vm := range []string{"vm-g", "vm-h"} {
		if err := f.m.Detach(vm); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.m.recordTap(ctx, "vg", tapRecord{}); err != nil {
		t.Fatal(err)
	}
	if exec.Command("nft", "list", "table", "bridge", NftTable).Run() == nil {
		t.Errorf("the tap filter is still there with no tap:\n%s", f.run("nft", "list", "table", "bridge", NftTable))
	}
}

// A guest reaches no link-local address through the host: the cloud
// metadata service at 169.254.169.254 answers the host's own requests
// with the host's credentials, and masquerading would make a guest's
// request the host's.
func TestNATGuestsDoNotReachTheMetadataService(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	g, _ := f.natGuest("10.96.0.0/24", "vm-m", "52:54:00:00:96:01", "g")
	// The metadata service, on the host's own link to it.
	md := netnstest.Name() + "-md"
	f.run("ip", "netns", "add", md)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", md).Run() })
	f.run("ip", "link", "add", "meta0", "type", "veth", "peer", "name", "eth0", "netns", md)
	f.run("ip", "addr", "add", "169.254.0.1/16", "dev", "meta0")
	f.run("ip", "link", "set", "meta0", "up")
	f.run("ip", "netns", "exec", md, "ip", "addr", "add", "169.254.169.254/16", "dev", "eth0")
	f.run("ip", "netns", "exec", md, "ip", "link", "set", "eth0", "up")
	f.run("ip", "netns", "exec", md, "ip", "link", "set", "lo", "up")
	f.serve(md, "80", "host-credentials")
	if !f.reaches(netnstest.Name(), "169.254.169.254", "80", "host-credentials") {
		t.Fatal("the host does not reach its metadata service: the check below proves nothing")
	}
	if f.reaches(g, "169.254.169.254", "80", "host-credentials") {
		t.Error("a guest of a nat network read the host's metadata service")
	}
}

// A guest reaches the host for DHCP, DNS and ping at its network's bridge
// address only: a DNS or DHCP service of the host's on another address is
// no more the guests' than any other service. And the bridge address
// serves only its guests: a machine beyond the host that routes to it
// reaches neither dnsmasq nor anything else there.
func TestNATHostServicesAreTheBridgeAddressesAndTheGuestsOnly(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	g, _ := f.natGuest("10.97.0.0/24", "vm-n", "52:54:00:00:97:01", "g")
	// The host's LAN: an uplink with the host at .1 and a machine at .2
	// that routes 10.97.0.0/24 to the host.
	up := netnstest.Name() + "-u"
	f.run("ip", "netns", "add", up)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", up).Run() })
	f.run("ip", "link", "add", "uplink", "type", "veth", "peer", "name", "eth0", "netns", up)
	f.run("ip", "addr", "add", "198.51.100.1/24", "dev", "uplink")
	f.run("ip", "link", "set", "uplink", "up")
	f.run("ip", "netns", "exec", up, "ip", "addr", "add", "198.51.100.2/24", "dev", "eth0")
	f.run("ip", "netns", "exec", up, "ip", "link", "set", "eth0", "up")
	f.run("ip", "netns", "exec", up, "ip", "route", "add", "10.97.0.0/24", "via", "198.51.100.1")
	// A DNS service of the host's on its LAN address (TCP, so a
	// connection says it is reached).
	l, err := net.Listen("tcp", "198.51.100.1:53")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("host dns\n"))
			c.Close()
		}
	}()
	if f.reaches(g, "198.51.100.1", "53", "host dns") {
		t.Error("a guest reached the host's DNS service on its LAN address")
	}
	if !f.reaches(up, "198.51.100.1", "53", "host dns") {
		t.Fatal("the LAN does not reach the host's DNS service: the check above proves nothing")
	}
	// dnsmasq on the bridge address answers the guest, not the LAN.
	lookup := func(ns string) string {
		out, _ := exec.Command("ip", "netns", "exec", ns, "busybox", "nslookup", "-timeout=2", "-retry=1", "vm-n", "10.97.0.1").CombinedOutput()
		return string(out)
	}
	if out := lookup(g); !strings.Contains(out, "10.97.0.") {
		t.Fatalf("the guest gets no answer from dnsmasq (the check below proves nothing):\n%s", out)
	}
	if out := lookup(up); strings.Contains(out, "10.97.0.") {
		t.Errorf("a machine beyond the host got an answer from the network's dnsmasq:\n%s", out)
	}
}

// A device of a nat network's bridge name that the agent did not make is
// never taken over: its addresses stay, nothing joins it, and teardown
// never deletes it.
func TestNATNetworkLeavesAForeignBridgeOfItsNameAlone(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	f.run("ip", "link", "add", "gf-lan", "type", "bridge")
	f.run("ip", "addr", "add", "192.168.99.1/24", "dev", "gf-lan")
	f.run("ip", "link", "set", "gf-lan", "up")
	before := f.run("ip", "-o", "addr", "show", "dev", "gf-lan")
	nets := map[string]desired.Network{"lan": {NAT: &desired.NAT{CIDR: "10.98.0.0/24"}}}
	if err := f.m.Reconcile(ctx, nets, nil); !errors.Is(err, ErrHostConflict) || !strings.Contains(err.Error(), "gf-lan exists and the agent did not make it") {
		t.Fatalf("Reconcile = %v; want ErrHostConflict naming gf-lan", err)
	}
	if err := f.m.Check("lan", nets["lan"]); !errors.Is(err, ErrHostConflict) {
		t.Errorf("Check = %v; want ErrHostConflict", err)
	}
	mac, _ := net.ParseMAC("52:54:00:00:98:01")
	if _, err := f.m.Attach(ctx, "lan", nets["lan"], NIC{VM: "vm-f", MAC: mac}); !errors.Is(err, ErrHostConflict) {
		t.Errorf("Attach = %v; want ErrHostConflict", err)
	}
	if err := f.m.Reconcile(ctx, nil, map[string]bool{}); err != nil {
		t.Fatalf("Reconcile without the network: %v", err)
	}
	if after := f.run("ip", "-o", "addr", "show", "dev", "gf-lan"); after != before {
		t.Errorf("gf-lan changed:\n%s\nwas\n%s", after, before)
	}
	if f.m.dnsmasqPid("lan") != 0 {
		t.Error("a dnsmasq runs on the foreign bridge")
	}
}

// A nat network's dnsmasq that died is started again by Guard, which the
// agent runs at every tick even while the host is suspended (its guests
// keep running, and would lose their addresses when their leases end),
// with the configuration it had and its leases.
func TestGuardStartsADeadDnsmasqAgain(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	g, leased := f.natGuest("10.99.0.0/24", "vm-k", "52:54:00:00:99:01", "g")
	conf := filepath.Join(f.dir, "networks", "lab", DnsmasqConf)
	before, _ := os.ReadFile(conf)
	pid := f.m.dnsmasqPid("lab")
	if err := stopProcess(pid); err != nil {
		t.Fatal(err)
	}
	if err := f.manager().Guard(ctx); err != nil {
		t.Fatalf("Guard: %v", err)
	}
	if p := f.m.dnsmasqPid("lab"); p == 0 || p == pid {
		t.Fatalf("dnsmasq pid %d after Guard (was %d); want a new one", p, pid)
	}
	if after, _ := os.ReadFile(conf); string(after) != string(before) {
		t.Errorf("Guard changed dnsmasq's configuration:\n%s\nwas\n%s", after, before)
	}
	if got := f.dhcp(g); got != leased {
		t.Errorf("guest leased %s after Guard; want its %s", got, leased)
	}
	if n := dnsmasqProcesses(t, conf); n != 1 {
		t.Errorf("%d dnsmasq processes after Guard; want 1", n)
	}
}

// A guest's DHCP traffic writes nothing to the host's disk: a guest that
// asks for its lease in a loop would otherwise grow dnsmasq's log under
// the agent's state directory without bound.
func TestGuestDHCPDoesNotGrowTheHostsLog(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	g, _ := f.natGuest("10.100.0.0/24", "vm-l", "52:54:00:00:a0:01", "g")
	logFile := filepath.Join(f.dir, "networks", "lab", DnsmasqLog)
	before, _ := os.ReadFile(logFile)
	for i := 0; i < 10; i++ {
		f.dhcp(g)
	}
	after, _ := os.ReadFile(logFile)
	if grown := len(after) - len(before); grown > 0 {
		t.Errorf("10 leases grew dnsmasq's log by %d bytes:\n%s", grown, after[len(before):])
	}
}

// A guest on a bridge network is a machine of the LAN and may be its DHCP
// server: its answers reach the other guests (on a nat network they reach
// nobody, TestNATGuestTakesNoNeighboursDHCP), while it still speaks only
// with its own MAC.
func TestBridgeNetworkGuestsMayServeDHCP(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	f.run("ip", "link", "add", "br0", "type", "bridge")
	f.run("ip", "link", "set", "br0", "up")
	lan := desired.Network{Bridge: "br0"}
	macS, macC := mustMAC("52:54:00:00:a1:03"), mustMAC("52:54:00:00:a1:04")
	for vm, mac := range map[string]net.HardwareAddr{"vm-server": macS, "vm-client": macC} {
		if _, err := f.m.Attach(ctx, "lan", lan, NIC{VM: vm, MAC: mac}); err != nil {
			t.Fatal(err)
		}
	}
	gs, gc := f.peer("s", "br0", macS.String()), f.peer("c", "br0", macC.String())
	for suffix, mac := range map[string]net.HardwareAddr{"s": macS, "c": macC} {
		if err := f.m.recordTap(ctx, "v"+suffix, tapRecord{MAC: mac.String()}); err != nil {
			t.Fatal(err)
		}
	}
	rules := f.run("nft", "list", "chain", "bridge", NftTable, nicChain(TapName("vm-server")))
	if want := `ether saddr != ` + macS.String() + ` drop`; !strings.Contains(rules, want) {
		t.Errorf("the tap filter lacks %q:\n%s", want, rules)
	}
	ps, pc := f.port(gs), f.port(gc)
	server, client := netip.MustParseAddr("192.168.61.1"), netip.MustParseAddr("192.168.61.50")
	offer := hostileguest.DHCP{Op: hostileguest.BootReply, XID: 5, YIAddr: client, CHAddr: macC, Opts: []hostileguest.Option{
		msgType(hostileguest.DHCPOffer), hostileguest.AddrOption(hostileguest.OptServerID, server)}}
	got := make(chan []hostileguest.Frame)
	go func() {
		got <- pc.Capture(time.Second, func(fr hostileguest.Frame) bool {
			d, ok := fr.DHCP()
			return ok && d.Op == hostileguest.BootReply && d.XID == 5
		})
	}()
	time.Sleep(100 * time.Millisecond)
	ps.Send(hostileguest.Ethernet(hostileguest.Broadcast, macS, hostileguest.EtherIPv4, hostileguest.IPv4UDP(server, bcast4, 67, 68, offer.Marshal())))
	if frames := <-got; len(frames) == 0 {
		t.Error("a LAN guest's DHCP offer did not reach the other guest")
	}
}
