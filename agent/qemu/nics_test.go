package qemu

import (
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/hostnet"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/netnstest"
)

// A VM with NICs on two nat networks, the second with a fixed MAC, leases
// its reserved address on each (the tiny guest asks on eth0 itself; its
// user-data asks on eth1), Address lists both NICs with those leases, the
// seed's network-config matches each NIC by its MAC, and Destroy removes
// both taps and both reservations.
func TestGuestWithTwoNICsGetsAnAddressOnEach(t *testing.T) {
	netGuest(t)
	if !netnstest.Enter(t) {
		return
	}
	f := newNetFixture(t)
	p, _ := f.provisioner()
	lab := desired.Network{NAT: &desired.NAT{CIDR: "10.91.0.0/24"}}
	dmz := desired.Network{NAT: &desired.NAT{CIDR: "10.92.0.0/24"}}
	nets := map[string]desired.Network{"lab": lab, "dmz": dmz}
	const fixed = "52:54:00:91:92:01"
	ctx := context.Background()
	members := []agent.NetworkMember{{VM: "router", Network: "lab"}, {VM: "router", Network: "dmz", Index: 1, MAC: fixed}}
	if err := p.ReconcileNetworks(ctx, nets, members, map[string]bool{}); err != nil {
		t.Fatalf("ReconcileNetworks: %v", err)
	}
	m := f.machine("router", "lab", lab)
	m.Spec.Network = ""
	m.Spec.NICs = []desired.NIC{{Network: "lab"}, {Network: "dmz", MAC: fixed}}
	m.Networks = nets
	m.Spec.CloudInit = &desired.CloudInit{UserData: "#!/bin/sh\n" +
		"echo \"eth1 mac=$(cat /sys/class/net/eth1/address)\"\n" +
		"ifconfig eth1 up && udhcpc -i eth1 -t 20 -T 1 -n -q -s /etc/udhcpc.script\n" +
		"echo done\n"}
	f.boot(p, m)

	lines := strings.Join(guestLines(waitSerial(t, m.Dir, "probe done")), "\n")
	if !strings.Contains(lines, "probe eth1 mac="+fixed) {
		t.Fatalf("the guest's second NIC has not the fixed MAC %s:\n%s", fixed, lines)
	}
	for _, want := range []string{"lease eth0 ip=10.91.0.", "probe tinyguest: lease eth1 ip=10.92.0."} {
		if !strings.Contains(lines, want) {
			t.Errorf("the guest has no lease %q...:\n%s", want, lines)
		}
	}
	var a agent.Address
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if a = p.Address(m.Name); len(a.NICs) == 2 && a.NICs[0].IP != "" && a.NICs[1].IP != "" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(a.NICs) != 2 || a.NICs[0].Network != "lab" || a.NICs[1].Network != "dmz" || a.NICs[1].MAC != fixed || a.NICs[0].MAC != macFor(m.Name) {
		t.Fatalf("Address NICs = %+v; want lab (MAC %s) and dmz (MAC %s)", a.NICs, macFor(m.Name), fixed)
	}
	for i, pfx := range []string{"10.91.0.0/24", "10.92.0.0/24"} {
		ip, err := netip.ParseAddr(a.NICs[i].IP)
		if err != nil || !netip.MustParsePrefix(pfx).Contains(ip) || !strings.Contains(lines, "ip="+ip.String()) {
			t.Errorf("NIC %d address %q; want the guest's lease in %s:\n%s", i, a.NICs[i].IP, pfx, lines)
		}
	}
	if a.IP != a.NICs[0].IP {
		t.Errorf("Address IP %q; want the first NIC's %q", a.IP, a.NICs[0].IP)
	}

	// Every NIC's reservation is the MAC it leased with.
	for i, name := range []string{"lab", "dmz"} {
		b, _ := os.ReadFile(filepath.Join(f.netDir, name, hostnet.HostsFile))
		var hosts map[string]struct{ MAC, Addr string }
		if err := json.Unmarshal(b, &hosts); err != nil || hosts[m.Name].MAC != a.NICs[i].MAC || hosts[m.Name].Addr != a.NICs[i].IP {
			t.Errorf("%s reservations %s (%v); want %s at %s", name, b, err, a.NICs[i].MAC, a.NICs[i].IP)
		}
	}
	if err := p.Destroy(ctx, m.Name); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	for i := range 2 {
		if _, err := netlink.LinkByName(hostnet.NICTap(m.Name, i)); err == nil {
			t.Errorf("the tap of NIC %d survived Destroy", i)
		}
	}
	for _, name := range []string{"lab", "dmz"} {
		b, _ := os.ReadFile(filepath.Join(f.netDir, name, hostnet.HostsFile))
		if strings.Contains(string(b), m.Name) {
			t.Errorf("%s still reserves an address for the destroyed VM: %s", name, b)
		}
	}
}

// A guest on a nat network with an IPv6 prefix forms its SLAAC address
// from the network's router advertisements, routes by the bridge, pings
// the bridge's IPv6 address (and status shows its address), yet reaches
// no service of the host over IPv6: neither one listening on the bridge's
// address nor one on another address of the host.
func TestGuestOnIPv6NATNetworkGetsAnAddressAndARoute(t *testing.T) {
	netGuest(t)
	if !netnstest.Enter(t) {
		return
	}
	f := newNetFixture(t)
	p, _ := f.provisioner()
	lab := desired.Network{NAT: &desired.NAT{CIDR: "10.93.0.0/24", IPv6: "fd00:93::/64"}}
	nets := map[string]desired.Network{"lab6": lab}
	ctx := context.Background()
	if err := p.ReconcileNetworks(ctx, nets, []agent.NetworkMember{{VM: "six", Network: "lab6"}}, map[string]bool{}); err != nil {
		t.Fatalf("ReconcileNetworks: %v", err)
	}
	// A service of the host on another address of its own.
	run(t, "ip", "link", "add", "svc0", "type", "veth", "peer", "name", "svc1")
	run(t, "ip", "addr", "add", "fd00:aa::1/64", "dev", "svc0", "nodad")
	run(t, "ip", "link", "set", "svc0", "up")
	l, err := net.Listen("tcp6", "[::]:7006")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Write([]byte("banner\n"))
			c.Close()
		}
	}()
	// The host itself reaches its listener on both addresses: the
	// guest's "no" below is the firewall's, not a listener missing.
	for _, a := range []string{"[fd00:93::1]:7006", "[fd00:aa::1]:7006"} {
		c, err := net.DialTimeout("tcp6", a, 3*time.Second)
		if err != nil {
			t.Fatalf("the host's own listener at %s: %v", a, err)
		}
		c.Close()
	}
	// Both of the host's own connections counted before the guest's try.
	for n := 0; n < 50 && accepted.Load() < 2; n++ {
		time.Sleep(100 * time.Millisecond)
	}
	before := accepted.Load()

	m := f.machine("six", "lab6", lab)
	m.Spec.CloudInit = &desired.CloudInit{UserData: "#!/bin/sh\n" +
		"n=0; while [ $n -lt 60 ] && ! ip -6 addr show dev eth0 scope global | grep -q inet6; do sleep 0.5; n=$((n+1)); done\n" +
		"echo \"addr6 $(ip -6 addr show dev eth0 scope global | sed -n 's/.*inet6 \\([^/ ]*\\).*/\\1/p' | head -n1)\"\n" +
		"n=0; while [ $n -lt 20 ] && ! ip -6 route | grep -q '^default'; do sleep 0.5; n=$((n+1)); done\n" +
		"echo \"route6 $(ip -6 route | grep '^default' | head -n1)\"\n" +
		"if ping -6 -c 1 -W 3 fd00:93::1 >/dev/null 2>&1; then echo 'ping6 ok'; else echo 'ping6 failed'; fi\n" +
		"for t in fd00:93::1 fd00:aa::1; do\n" +
		"  out=$(nc -w 5 $t 7006 </dev/null 2>&1)\n" +
		"  case \"$out\" in *banner*) echo \"reach $t yes\";; *) echo \"reach $t no\";; esac\n" +
		"done\n" +
		"echo done\n"}
	f.boot(p, m)
	lines := strings.Join(guestLines(waitSerial(t, m.Dir, "probe done")), "\n")

	hw, _ := net.ParseMAC(macFor(m.Name))
	want := desired.SLAAC(netip.MustParsePrefix("fd00:93::/64"), hw).String()
	if !strings.Contains(lines, "probe addr6 "+want) {
		t.Fatalf("the guest has not its SLAAC address %s:\n%s", want, lines)
	}
	if !strings.Contains(lines, "probe route6 default via fe80::") || !strings.Contains(lines, "dev eth0") {
		t.Errorf("the guest has no IPv6 default route by the bridge:\n%s", lines)
	}
	if !strings.Contains(lines, "probe ping6 ok") {
		t.Fatalf("the guest cannot ping the bridge's IPv6 address (the checks below prove nothing):\n%s", lines)
	}
	for _, a := range []string{"fd00:93::1", "fd00:aa::1"} {
		if !strings.Contains(lines, "probe reach "+a+" no") {
			t.Errorf("the guest reached the host's IPv6 listener at %s:\n%s", a, lines)
		}
	}
	if n := accepted.Load() - before; n != 0 {
		t.Errorf("the host's listener accepted %d connections from the guest", n)
	}
	// Status shows the address once the host's neighbour table holds the
	// guest's MAC for it; the guest's ping above may have aged out of it
	// on a loaded machine, so the host talks to the guest first.
	exec.Command("busybox", "ping", "-6", "-c", "1", "-W", "2", want).Run()
	var a agent.Address
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if a = p.Address(m.Name); len(a.NICs) == 1 && a.NICs[0].IPv6 != "" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(a.NICs) != 1 || a.NICs[0].IPv6 != want {
		neigh, _ := exec.Command("ip", "-6", "neigh", "show", "dev", "gf-lab6").CombinedOutput()
		route, _ := exec.Command("ip", "-6", "route", "get", want).CombinedOutput()
		t.Errorf("Address NICs = %+v; want IPv6 %s (neighbours:\n%s; route: %s)", a.NICs, want, neigh, route)
	}
}

// A guest on VLAN 20 of a VLAN-filtering bridge reaches a peer on VLAN 20
// and not one on VLAN 30 of the same bridge (peers are namespaces of the
// test's own, on access ports as the host's admin would make them).
// Skipped on a kernel without bridge VLAN filtering.
func TestGuestOnVLANReachesItsVLANOnly(t *testing.T) {
	netGuest(t)
	if !netnstest.Enter(t) {
		return
	}
	run(t, "ip", "link", "add", "br0", "type", "bridge")
	if err := exec.Command("ip", "link", "set", "br0", "type", "bridge", "vlan_filtering", "1").Run(); err != nil {
		t.Skip("this kernel has no bridge VLAN filtering (CONFIG_BRIDGE_VLAN_FILTERING)")
	}
	run(t, "ip", "link", "set", "br0", "up")
	for _, peer := range []struct{ name, vid, addr string }{{"p20", "20", "192.168.60.20/24"}, {"p30", "30", "192.168.60.30/24"}} {
		ns := netnstest.Name() + "-" + peer.name
		run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		run(t, "ip", "link", "add", "v"+peer.name, "type", "veth", "peer", "name", "eth0", "netns", ns)
		run(t, "ip", "link", "set", "v"+peer.name, "master", "br0", "up")
		run(t, "bridge", "vlan", "del", "dev", "v"+peer.name, "vid", "1")
		run(t, "bridge", "vlan", "add", "dev", "v"+peer.name, "vid", peer.vid, "pvid", "untagged")
		run(t, "ip", "netns", "exec", ns, "ip", "addr", "add", peer.addr, "dev", "eth0")
		run(t, "ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
	}
	f := newNetFixture(t)
	p, _ := f.provisioner()
	lan := desired.Network{Bridge: "br0", VLAN: 20}
	m := f.machine("vlan-guest", "lan", lan)
	m.Spec.CloudInit = &desired.CloudInit{UserData: "#!/bin/sh\n" +
		"ifconfig eth0 192.168.60.10 netmask 255.255.255.0 up\n" +
		"for a in 192.168.60.20 192.168.60.30; do\n" +
		"  if ping -c 2 -W 2 $a >/dev/null 2>&1; then echo \"reach $a yes\"; else echo \"reach $a no\"; fi\n" +
		"done\n" +
		"echo done\n"}
	f.boot(p, m)
	lines := strings.Join(guestLines(waitSerial(t, m.Dir, "probe done")), "\n")
	if !strings.Contains(lines, "probe reach 192.168.60.20 yes") {
		t.Fatalf("the guest on VLAN 20 does not reach its VLAN's peer (the check below proves nothing):\n%s", lines)
	}
	if !strings.Contains(lines, "probe reach 192.168.60.30 no") {
		t.Errorf("the guest on VLAN 20 reached the peer on VLAN 30:\n%s", lines)
	}
}
