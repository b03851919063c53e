package hostnet

// Attacks of a hostile guest on its neighbours through a nat network. Each
// guest is a network namespace whose veth port on the network's bridge is
// recorded as the VM's tap, so the tap filter holds it exactly as it holds
// a tap: a tap passes frames only while QEMU holds it, and these attacks
// need frames crafted byte by byte (testsupport/hostileguest), which a
// namespace sends and captures directly. dnsmasq, nftables and the
// victims' DHCP clients (busybox udhcpc, as in the tiny guest) and kernels
// are real.

import (
	"bytes"
	"context"
	"crypto/rand"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/hostileguest"
	"github.com/gitfleet/gitfleet/testsupport/netnstest"
)

// labNet is a single nat network "lab" on cidr, reconciled.
func (f *fixture) labNet(cidr string) map[string]desired.Network {
	f.t.Helper()
	nets := map[string]desired.Network{"lab": {NAT: &desired.NAT{CIDR: cidr}}}
	if err := f.m.Reconcile(context.Background(), nets, nil); err != nil {
		f.t.Fatalf("Reconcile: %v", err)
	}
	return nets
}

// tapGuest attaches vm with mac to network "lab" of nets (static as in
// Attach) and makes a namespace standing in for its guest, whose veth
// port is filtered as the VM's tap. It returns the namespace.
func (f *fixture) tapGuest(nets map[string]desired.Network, vm, mac, suffix string, static netip.Addr) string {
	f.t.Helper()
	hw, err := net.ParseMAC(mac)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := f.m.Attach(ctx, "lab", nets["lab"], NIC{VM: vm, MAC: hw, Static: static}); err != nil {
		f.t.Fatalf("Attach %s: %v", vm, err)
	}
	ns := f.peer(suffix, "gf-lab", hw.String())
	if err := f.m.recordTap(ctx, "v"+suffix, tapRecord{MAC: hw.String(), NAT: true}); err != nil {
		f.t.Fatal(err)
	}
	return ns
}

// port opens a packet socket on the eth0 of namespace ns, closed with the
// test.
func (f *fixture) port(ns string) *hostileguest.Port {
	f.t.Helper()
	p, err := hostileguest.Open(ns, "eth0")
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { p.Close() })
	return p
}

// lease runs a fresh busybox udhcpc in ns, as the tiny guest does, and
// returns what it was given: address, router and DNS server (invalid when
// it got no lease), and its output.
func (f *fixture) lease(ns string) (ip, router, dns netip.Addr, out string) {
	f.t.Helper()
	script := filepath.Join(f.dir, "udhcpc-lease.sh")
	os.WriteFile(script, []byte("#!/bin/sh\ncase \"$1\" in bound|renew)\n"+
		"  busybox ifconfig \"$interface\" \"$ip\" netmask \"$subnet\" up\n"+
		"  echo \"leased $ip router $router dns $dns\";;\nesac\n"), 0o755)
	b, _ := exec.Command("ip", "netns", "exec", ns, "busybox", "udhcpc", "-i", "eth0", "-t", "5", "-T", "1", "-n", "-q", "-s", script).CombinedOutput()
	out = string(b)
	for _, l := range strings.Split(out, "\n") {
		fields := strings.Fields(l)
		if len(fields) == 6 && fields[0] == "leased" {
			ip, _ = netip.ParseAddr(fields[1])
			router, _ = netip.ParseAddr(fields[3])
			dns, _ = netip.ParseAddr(fields[5])
		}
	}
	return ip, router, dns, out
}

func mustMAC(s string) net.HardwareAddr {
	hw, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return hw
}

var (
	zero4  = netip.IPv4Unspecified()
	bcast4 = netip.AddrFrom4([4]byte{255, 255, 255, 255})
)

// dhcpClientFrame is a DHCP client message d as a guest with MAC src
// broadcasts it from address from.
func dhcpClientFrame(src net.HardwareAddr, from netip.Addr, d hostileguest.DHCP) []byte {
	d.Op = hostileguest.BootRequest
	return hostileguest.Ethernet(hostileguest.Broadcast, src, hostileguest.EtherIPv4,
		hostileguest.IPv4UDP(from, bcast4, 68, 67, d.Marshal()))
}

func msgType(t uint8) hostileguest.Option {
	return hostileguest.Option{Code: hostileguest.OptMessageType, Data: []byte{t}}
}

// rogueDHCP answers the DHCP requests of the client with MAC victim that
// port p sees, as a DHCP server at self sending from UDP port sport:
// offering and acknowledging offer with self as router and DNS server. It
// runs until stop is closed; wait for it with wg.
func rogueDHCP(p *hostileguest.Port, victim net.HardwareAddr, self, offer netip.Addr, sport uint16, stop chan struct{}, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, fr := range p.Capture(100*time.Millisecond, nil) {
				d, ok := fr.DHCP()
				if !ok || d.Op != hostileguest.BootRequest || d.CHAddr.String() != victim.String() {
					continue
				}
				var typ uint8
				switch d.Type() {
				case hostileguest.DHCPDiscover:
					typ = hostileguest.DHCPOffer
				case hostileguest.DHCPRequest:
					typ = hostileguest.DHCPAck
				default:
					continue
				}
				reply := hostileguest.DHCP{Op: hostileguest.BootReply, XID: d.XID, YIAddr: offer, SIAddr: self, CHAddr: victim, Opts: []hostileguest.Option{
					msgType(typ),
					hostileguest.AddrOption(hostileguest.OptServerID, self),
					hostileguest.AddrOption(hostileguest.OptSubnetMask, netip.MustParseAddr("255.255.255.0")),
					hostileguest.AddrOption(hostileguest.OptRouter, self),
					hostileguest.AddrOption(hostileguest.OptDNS, self),
					{Code: hostileguest.OptLeaseTime, Data: []byte{0, 0, 0x0e, 0x10}},
				}}
				p.Send(hostileguest.Ethernet(hostileguest.Broadcast, p.MAC, hostileguest.EtherIPv4,
					hostileguest.IPv4UDP(self, bcast4, sport, 68, reply.Marshal())))
			}
		}
	}()
}

// A guest of a nat network cannot become its neighbour's DHCP server: it
// cannot make dnsmasq forget or refuse the neighbour (a DHCPDECLINE or
// DHCPRELEASE naming the neighbour's MAC in the message, or its client
// identifier, sent with the guest's own MAC on the wire), and its DHCP
// answers reach nobody, from whichever UDP port to whichever port. The
// attack it pins: the neighbour's next lease named the attacker as
// router and DNS server, a man in the middle status did not show.
func TestNATGuestTakesNoNeighboursDHCP(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	nets := f.labNet("10.110.0.0/24")
	gw := netip.MustParseAddr("10.110.0.1")
	macV, macX := mustMAC("52:54:00:01:10:01"), mustMAC("52:54:00:01:10:02")
	gv := f.tapGuest(nets, "vm-victim", macV.String(), "v", netip.Addr{})
	gx := f.tapGuest(nets, "vm-attacker", macX.String(), "x", netip.Addr{})
	leased, router, _, out := f.lease(gv)
	if !leased.IsValid() || router != gw {
		t.Fatalf("the victim's first lease: %s router %s; want one from dnsmasq (router %s):\n%s", leased, router, gw, out)
	}
	self := f.dhcp(gx)
	px, pv := f.port(gx), f.port(gv)

	// dnsmasq is made to forget the victim's lease and to refuse its
	// address: messages on its behalf.
	srv := hostileguest.AddrOption(hostileguest.OptServerID, gw)
	for _, d := range []hostileguest.DHCP{
		{XID: 1, CHAddr: macV, Opts: []hostileguest.Option{msgType(hostileguest.DHCPDecline), hostileguest.AddrOption(hostileguest.OptRequestedIP, leased), srv}},
		{XID: 2, CHAddr: macV, CIAddr: leased, Opts: []hostileguest.Option{msgType(hostileguest.DHCPRelease), srv}},
		{XID: 3, CHAddr: macX, CIAddr: leased, Opts: []hostileguest.Option{msgType(hostileguest.DHCPRelease), srv,
			{Code: hostileguest.OptClientID, Data: append([]byte{1}, macV...)}}},
	} {
		if err := px.Send(dhcpClientFrame(macX, self, d)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	if got, err := leaseFor(filepath.Join(f.dir, "networks", "lab", LeasesFile), macV); got != leased {
		t.Errorf("after the attacker's DHCPRELEASEs dnsmasq's lease of the victim is %v (%v); want %s still", got, err, leased)
	}

	// A rogue server answers from port 1067, the victim asks again.
	stop, wg := make(chan struct{}), &sync.WaitGroup{}
	rogueDHCP(px, macV, self, leased, 1067, stop, wg)
	ip, router, dns, out := f.lease(gv)
	close(stop)
	wg.Wait()
	if ip != leased || router != gw || dns != gw {
		t.Errorf("the victim's next lease: %s router %s dns %s; want %s from dnsmasq, router and DNS %s:\n%s", ip, router, dns, leased, gw, out)
	}

	// No DHCP answer of the attacker's reaches the victim, from any port
	// to any port.
	offer := hostileguest.DHCP{Op: hostileguest.BootReply, XID: 9, YIAddr: leased, CHAddr: macV, Opts: []hostileguest.Option{
		msgType(hostileguest.DHCPOffer), hostileguest.AddrOption(hostileguest.OptServerID, self), hostileguest.AddrOption(hostileguest.OptRouter, self)}}
	got := make(chan []hostileguest.Frame)
	go func() {
		got <- pv.Capture(time.Second, func(fr hostileguest.Frame) bool {
			d, ok := fr.DHCP()
			return ok && d.Op == hostileguest.BootReply && fr.Src.String() == macX.String()
		})
	}()
	time.Sleep(100 * time.Millisecond)
	for _, ports := range [][2]uint16{{1067, 68}, {67, 68}, {67, 1068}, {5353, 5353}} {
		for _, dst := range []net.HardwareAddr{macV, hostileguest.Broadcast} {
			px.Send(hostileguest.Ethernet(dst, macX, hostileguest.EtherIPv4, hostileguest.IPv4UDP(self, bcast4, ports[0], ports[1], offer.Marshal())))
		}
	}
	for _, fr := range <-got {
		t.Errorf("the attacker's DHCP answer from port %d to port %d reached the victim", fr.SrcPort, fr.DstPort)
	}
}

// A guest of a nat network is no IPv6 router, DHCPv6 server or redirector
// for its neighbours: nat networks offer no IPv6, and a guest's router
// advertisement would give the others an address, a default route and a
// DNS server through it. IPv6 between the guests' link-local addresses
// still works.
func TestNATGuestSendsNoRouterAdvertisements(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	nets := f.labNet("10.111.0.0/24")
	macV, macX := mustMAC("52:54:00:01:11:01"), mustMAC("52:54:00:01:11:02")
	gv := f.tapGuest(nets, "vm-victim", macV.String(), "v", netip.Addr{})
	gx := f.tapGuest(nets, "vm-attacker", macX.String(), "x", netip.Addr{})
	f.run("ip", "netns", "exec", gv, "sysctl", "-qw", "net.ipv6.conf.eth0.accept_ra=1")
	llV, llX := hostileguest.LinkLocal(macV), hostileguest.LinkLocal(macX)
	waitLinkLocal(t, gv)
	waitLinkLocal(t, gx)
	px, pv := f.port(gx), f.port(gv)

	got := make(chan []hostileguest.Frame)
	go func() {
		got <- pv.Capture(3*time.Second, func(fr hostileguest.Frame) bool {
			return fr.Src.String() == macX.String() && fr.EtherType == hostileguest.EtherIPv6 &&
				(fr.Proto == unix.IPPROTO_ICMPV6 && len(fr.Payload) > 0 && (fr.Payload[0] == 134 || fr.Payload[0] == 137) ||
					fr.Proto == unix.IPPROTO_UDP && (fr.DstPort == 546 || fr.SrcPort == 547))
		})
	}()
	time.Sleep(100 * time.Millisecond)
	allNodes := netip.MustParseAddr("ff02::1")
	prefix := netip.MustParsePrefix("2001:db8:66::/64")
	for i := 0; i < 3; i++ {
		ra := hostileguest.RouterAdvertisement(macX, 30*time.Minute, prefix, llX)
		px.Send(hostileguest.Ethernet(hostileguest.MulticastMAC(allNodes), macX, hostileguest.EtherIPv6, hostileguest.IPv6(llX, allNodes, unix.IPPROTO_ICMPV6, 255, ra)))
		px.Send(hostileguest.Ethernet(macV, macX, hostileguest.EtherIPv6, hostileguest.IPv6(llX, llV, unix.IPPROTO_ICMPV6, 255, ra)))
		rd := hostileguest.Redirect(llX, netip.MustParseAddr("2001:db8:77::1"), macX)
		px.Send(hostileguest.Ethernet(macV, macX, hostileguest.EtherIPv6, hostileguest.IPv6(llX, llV, unix.IPPROTO_ICMPV6, 255, rd)))
		for _, typ := range []uint8{hostileguest.DHCPv6Advertise, hostileguest.DHCPv6Reply} {
			px.Send(hostileguest.Ethernet(macV, macX, hostileguest.EtherIPv6, hostileguest.IPv6(llX, llV, unix.IPPROTO_UDP, 64,
				hostileguest.UDP6(547, 546, hostileguest.DHCPv6(typ, 7, llX)))))
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, fr := range <-got {
		t.Errorf("the attacker's IPv6 router or DHCPv6 server message reached the victim: proto %d ports %d->%d payload % x", fr.Proto, fr.SrcPort, fr.DstPort, fr.Payload[:min(4, len(fr.Payload))])
	}
	if out := f.run("ip", "netns", "exec", gv, "ip", "-6", "route", "show", "default"); strings.TrimSpace(out) != "" {
		t.Errorf("the victim took a default route from the attacker: %s", out)
	}
	if out := f.run("ip", "netns", "exec", gv, "ip", "-6", "addr", "show", "dev", "eth0", "scope", "global"); strings.Contains(out, "2001:db8:66") {
		t.Errorf("the victim took an address from the attacker's prefix:\n%s", out)
	}
	if err := f.try(gv, "busybox", "ping", "-6", "-c", "1", "-W", "2", llX.WithZone("eth0").String()); err != nil {
		t.Errorf("the guests do not reach each other's link-local addresses (the checks above prove nothing): %v", err)
	}
}

// waitLinkLocal waits (up to 5 s) until eth0 of namespace ns holds its
// IPv6 link-local address, past duplicate address detection.
func waitLinkLocal(t *testing.T, ns string) {
	t.Helper()
	for i := 0; i < 100; i++ {
		out, _ := exec.Command("ip", "netns", "exec", ns, "ip", "-6", "addr", "show", "dev", "eth0", "scope", "link").CombinedOutput()
		if strings.Contains(string(out), "fe80::") && !strings.Contains(string(out), "tentative") {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Skipf("namespace %s has no IPv6 link-local address (IPv6 off in this kernel)", ns)
}

// A guest flooding its network's dnsmasq writes (next to) nothing to the
// host's disk: 60,000 DISCOVERs each naming a random client MAC (its own
// MAC on the wire) made dnsmasq log 5.7 MB in 7 s, never capped. The
// guest's messages in its own name that dnsmasq does log (requests for an
// address not its own) are capped with the rest of the log.
func TestNATGuestsDHCPFloodStaysOffTheHostsDisk(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	nets := f.labNet("10.112.0.0/24")
	gw := netip.MustParseAddr("10.112.0.1")
	macX := mustMAC("52:54:00:01:12:02")
	gx := f.tapGuest(nets, "vm-attacker", macX.String(), "x", netip.Addr{})
	self := f.dhcp(gx)
	px := f.port(gx)
	dir := filepath.Join(f.dir, "networks", "lab")
	size := func() int64 {
		var n int64
		for _, name := range []string{DnsmasqLog, DnsmasqLog + ".1"} {
			if fi, err := os.Stat(filepath.Join(dir, name)); err == nil {
				n += fi.Size()
			}
		}
		return n
	}
	before := size()
	random := make([]byte, 6*60000)
	rand.Read(random)
	for i := 0; i < 60000; i++ {
		chaddr := net.HardwareAddr(random[6*i : 6*i+6])
		chaddr[0] = chaddr[0]&^1 | 2
		px.Send(dhcpClientFrame(macX, zero4, hostileguest.DHCP{XID: uint32(i), CHAddr: chaddr, Opts: []hostileguest.Option{msgType(hostileguest.DHCPDiscover)}}))
	}
	time.Sleep(time.Second)
	if grown := size() - before; grown > 0 {
		t.Errorf("60,000 DISCOVERs for random clients grew dnsmasq's log by %d bytes", grown)
	}
	pid := f.m.dnsmasqPid("lab")
	if pid == 0 {
		t.Fatal("dnsmasq does not run after the flood")
	}

	// Requests in its own name, which dnsmasq refuses and logs (about 100
	// bytes each).
	before = size()
	for i := 0; i < 60000; i++ {
		wrong := netip.AddrFrom4([4]byte{10, 112, 0, byte(2 + i%250)})
		px.Send(dhcpClientFrame(macX, self, hostileguest.DHCP{XID: uint32(i), CHAddr: macX, Opts: []hostileguest.Option{
			msgType(hostileguest.DHCPRequest), hostileguest.AddrOption(hostileguest.OptRequestedIP, wrong), hostileguest.AddrOption(hostileguest.OptServerID, gw)}}))
	}
	time.Sleep(2 * time.Second)
	if grown := size() - before; grown > 16<<10 {
		t.Errorf("60,000 refused requests grew dnsmasq's log by %d bytes; want at most 16 KiB", grown)
	}
	if f.m.dnsmasqPid("lab") != pid {
		t.Fatalf("dnsmasq pid %d after the flood; want %d", f.m.dnsmasqPid("lab"), pid)
	}
	if got := f.dhcp(gx); got != self {
		t.Errorf("the guest leased %s after the flood; want its %s", got, self)
	}
}

// dnsmasq never writes a file past DnsmasqLogMax, whatever it logs, and
// outlives a full log; Guard moves a log past half of it aside, so a
// network's logs never take more than twice that. (dnsmasq logs its
// statistics on SIGUSR1: the host makes it log here, as the many guests
// it would take would.)
func TestDnsmasqLogIsBounded(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	f.labNet("10.116.0.0/24")
	dir := filepath.Join(f.dir, "networks", "lab")
	logFile := filepath.Join(dir, DnsmasqLog)
	logSize := func() int64 {
		fi, err := os.Stat(logFile)
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	pid := f.m.dnsmasqPid("lab")
	signal := func() {
		before := logSize()
		unix.Kill(pid, unix.SIGUSR1)
		for i := 0; i < 100 && logSize() == before; i++ {
			time.Sleep(time.Millisecond)
		}
	}
	signal()
	if logSize() == 0 {
		t.Fatal("dnsmasq logs nothing on SIGUSR1: the checks below prove nothing")
	}
	for i := 0; i < 3000 && logSize() <= DnsmasqLogMax/2; i++ {
		signal()
	}
	if err := f.m.Guard(context.Background()); err != nil {
		t.Fatalf("Guard: %v", err)
	}
	if n := logSize(); n > DnsmasqLogMax/2 {
		t.Errorf("dnsmasq's log holds %d bytes after Guard; want it moved to %s", n, DnsmasqLog+".1")
	}
	signal()
	if logSize() == 0 {
		t.Error("dnsmasq logs nothing once Guard moved its log")
	}
	for i := 0; i < 3000 && logSize() < DnsmasqLogMax-2048; i++ {
		signal()
	}
	for i := 0; i < 20; i++ {
		signal()
	}
	if n := logSize(); n > DnsmasqLogMax || n < DnsmasqLogMax-2048 {
		t.Errorf("dnsmasq's log holds %d bytes; want it full at %d at most", n, DnsmasqLogMax)
	}
	if f.m.dnsmasqPid("lab") != pid {
		t.Errorf("dnsmasq did not outlive its full log (pid %d, was %d)", f.m.dnsmasqPid("lab"), pid)
	}
	old, _ := os.Stat(logFile + ".1")
	if old == nil || old.Size() > DnsmasqLogMax {
		t.Errorf("%s: %v; want at most %d bytes", DnsmasqLog+".1", old, DnsmasqLogMax)
	}
}

// A guest of a nat network speaks only from its own address: no ARP of
// its claims the gateway's address or a neighbour's (the victim's and the
// host's neighbour tables keep the real holders), no ARP probe of its
// makes a neighbour think its address taken, and no packet of its carries
// another address as its source.
func TestNATGuestsClaimNoAddressButTheirOwn(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	nets := f.labNet("10.113.0.0/24")
	gw := netip.MustParseAddr("10.113.0.1")
	macV, macX := mustMAC("52:54:00:01:13:01"), mustMAC("52:54:00:01:13:02")
	gv := f.tapGuest(nets, "vm-victim", macV.String(), "v", netip.Addr{})
	gx := f.tapGuest(nets, "vm-attacker", macX.String(), "x", netip.Addr{})
	victim, self := f.dhcp(gv), f.dhcp(gx)
	f.run("ip", "netns", "exec", gv, "busybox", "ping", "-c", "1", "-W", "2", gw.String())
	f.run("busybox", "ping", "-c", "1", "-W", "2", victim.String())
	time.Sleep(1200 * time.Millisecond) // past the neighbour tables' locktime
	px, pv := f.port(gx), f.port(gv)
	br, _ := net.InterfaceByName("gf-lab")

	got := make(chan []hostileguest.Frame)
	go func() {
		got <- pv.Capture(2*time.Second, func(fr hostileguest.Frame) bool {
			ours := fr.EtherType == hostileguest.EtherIPv4 || fr.EtherType == hostileguest.EtherARP
			return ours && fr.Src.String() == macX.String() && fr.IPSrc != self
		})
	}()
	time.Sleep(100 * time.Millisecond)
	arp := func(dst net.HardwareAddr, op uint16, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) {
		px.Send(hostileguest.Ethernet(dst, macX, hostileguest.EtherARP, hostileguest.ARP(op, macX, spa, tha, tpa)))
	}
	none := net.HardwareAddr{0, 0, 0, 0, 0, 0}
	for i := 0; i < 3; i++ {
		for _, claimed := range []netip.Addr{gw, victim} {
			arp(hostileguest.Broadcast, hostileguest.ARPRequest, claimed, none, claimed) // gratuitous
			arp(macV, hostileguest.ARPReply, claimed, macV, victim)
			arp(br.HardwareAddr, hostileguest.ARPReply, claimed, br.HardwareAddr, gw)
		}
		arp(hostileguest.Broadcast, hostileguest.ARPRequest, zero4, none, victim) // a probe for the victim's address
		px.Send(hostileguest.Ethernet(macV, macX, hostileguest.EtherIPv4, hostileguest.IPv4UDP(gw, victim, 53, 4000, []byte("from the gateway"))))
		px.Send(hostileguest.Ethernet(br.HardwareAddr, macX, hostileguest.EtherIPv4, hostileguest.IPv4ICMPEcho(victim, gw, 1, uint16(i))))
		time.Sleep(100 * time.Millisecond)
	}
	for _, fr := range <-got {
		t.Errorf("a frame of the attacker's with source address %s reached the victim (ethertype %#x)", fr.IPSrc, fr.EtherType)
	}
	if out := f.run("ip", "netns", "exec", gv, "ip", "neigh", "show", gw.String()); !strings.Contains(out, br.HardwareAddr.String()) {
		t.Errorf("the victim's neighbour entry for the gateway %s is %q; want the bridge's MAC %s", gw, out, br.HardwareAddr)
	}
	if mac, err := f.m.Holder("lab", nets["lab"], victim); err != nil || mac.String() != macV.String() {
		t.Errorf("the host holds %v (%v) for the victim's %s; want the victim's MAC %s", mac, err, victim, macV)
	}
	// The attacker's own address works.
	if err := f.try(gx, "busybox", "ping", "-c", "1", "-W", "2", victim.String()); err != nil {
		t.Errorf("the attacker cannot ping the victim from its own address (the checks above prove nothing): %v", err)
	}
}

// A guest speaks no VLAN on a nat network: a tagged frame would carry
// IPv4 past the rules that bind the guest to its address.
func TestNATGuestsSendNoTaggedFrames(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	nets := f.labNet("10.115.0.0/24")
	gw := netip.MustParseAddr("10.115.0.1")
	macV, macX := mustMAC("52:54:00:01:15:01"), mustMAC("52:54:00:01:15:02")
	gv := f.tapGuest(nets, "vm-victim", macV.String(), "v", netip.Addr{})
	gx := f.tapGuest(nets, "vm-attacker", macX.String(), "x", netip.Addr{})
	victim := f.dhcp(gv)
	px, pv := f.port(gx), f.port(gv)
	claim := hostileguest.ARP(hostileguest.ARPReply, macX, gw, macV, victim)
	got := make(chan []hostileguest.Frame)
	go func() {
		got <- pv.Capture(time.Second, func(fr hostileguest.Frame) bool {
			return bytes.Contains(fr.Raw, []byte("tagged")) || bytes.Contains(fr.Raw, claim)
		})
	}()
	time.Sleep(100 * time.Millisecond)
	for _, id := range []uint16{0, 7} {
		px.Send(hostileguest.VLAN(macV, macX, id, hostileguest.EtherIPv4, hostileguest.IPv4UDP(gw, victim, 53, 4000, []byte("tagged"))))
		px.Send(hostileguest.VLAN(hostileguest.Broadcast, macX, id, hostileguest.EtherARP, claim))
	}
	for _, fr := range <-got {
		t.Errorf("a tagged frame of the attacker's reached the victim (ethertype %#x)", fr.EtherType)
	}
}
