package hostnet

// A second round of a hostile guest's attacks on its nat network, of the
// kinds TestNATGuestTakesNoNeighboursDHCP, TestNATGuestSendsNoRouterAdvertisements
// and TestNATGuestsClaimNoAddressButTheirOwn pin, in the shapes a filter
// that reads headers at fixed places may miss: IPv4 options and
// fragments, IPv6 extension headers and fragments, DHCP messages in the
// guest's own name that speak of a neighbour, and every kind of
// destination a host service may hear on (broadcast, multicast,
// loopback). One network and one victim serve every subtest.

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gitfleet/gitfleet/testsupport/hostileguest"
	"github.com/gitfleet/gitfleet/testsupport/netnstest"
)

// withIPv4Options is the IPv4 packet p with one 4-byte option (NOP
// padding) in its header, its lengths and header checksum made right.
func withIPv4Options(p []byte) []byte {
	h := append(append([]byte(nil), p[:20]...), 1, 1, 1, 0) // NOP, NOP, NOP, end
	h[0] = 0x46
	binary.BigEndian.PutUint16(h[2:4], uint16(len(p)+4))
	fixIPv4Checksum(h)
	return append(h, p[20:]...)
}

func fixIPv4Checksum(h []byte) {
	h[10], h[11] = 0, 0
	var sum uint32
	for i := 0; i+1 < int(h[0]&0x0f)*4; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(h[10:12], ^uint16(sum))
}

// ipv4Fragments splits the IPv4 packet p (20-byte header) into two
// fragments, the first carrying first bytes (a multiple of 8) of its
// payload.
func ipv4Fragments(p []byte, first int) [][]byte {
	hdr, body := p[:20], p[20:]
	frag := func(off int, data []byte, more bool) []byte {
		h := append([]byte(nil), hdr...)
		binary.BigEndian.PutUint16(h[2:4], uint16(20+len(data)))
		binary.BigEndian.PutUint16(h[4:6], 0x4242)
		v := uint16(off / 8)
		if more {
			v |= 0x2000
		}
		binary.BigEndian.PutUint16(h[6:8], v)
		fixIPv4Checksum(h)
		return append(h, data...)
	}
	return [][]byte{frag(0, body[:first], true), frag(first, body[first:], false)}
}

// withIPv6Ext is the IPv6 packet p with an 8-byte extension header of
// type ext (0: hop-by-hop options, 60: destination options; PadN inside)
// before its upper-layer header. The upper layer's checksum does not
// cover extension headers, so it stays right.
func withIPv6Ext(p []byte, ext uint8) []byte {
	h := append([]byte(nil), p[:40]...)
	next := h[6]
	h[6] = ext
	binary.BigEndian.PutUint16(h[4:6], uint16(len(p)-40+8))
	h = append(h, next, 0, 1, 4, 0, 0, 0, 0)
	return append(h, p[40:]...)
}

// ipv6Fragments splits IPv6 packet p (no extension headers) into two
// fragments, the first carrying first bytes (a multiple of 8) of its
// upper-layer message; with dstopts, the first fragment carries only a
// destination options header and the upper-layer header starts the
// second (a first fragment without the whole header chain, RFC 7112).
func ipv6Fragments(p []byte, first int, dstopts bool) [][]byte {
	hdr, body := p[:40], p[40:]
	next := hdr[6]
	if dstopts {
		body = append([]byte{next, 0, 1, 4, 0, 0, 0, 0}, body...)
		next, first = 60, 8
	}
	frag := func(off int, data []byte, more bool) []byte {
		h := append([]byte(nil), hdr...)
		h[6] = 44
		binary.BigEndian.PutUint16(h[4:6], uint16(8+len(data)))
		fh := make([]byte, 8)
		fh[0] = next
		v := uint16(off)
		if more {
			v |= 1
		}
		binary.BigEndian.PutUint16(fh[2:4], v)
		binary.BigEndian.PutUint32(fh[4:8], 0x26262626)
		return append(append(h, fh...), data...)
	}
	return [][]byte{frag(0, body[:first], true), frag(first, body[first:], false)}
}

// listenIn opens a socket of network network on address in namespace ns
// (the thread switches there only while it opens it).
func listenIn(t *testing.T, ns, network, address string) net.PacketConn {
	t.Helper()
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	type result struct {
		c   net.PacketConn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer self.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: err}
			return
		}
		c, err := net.ListenPacket(network, address)
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("listen %s %s in %s: %v", network, address, ns, r.err)
	}
	t.Cleanup(func() { r.c.Close() })
	return r.c
}

// heard returns, after d, what c received (senders and payloads).
func heard(c net.PacketConn, d time.Duration) []string {
	var out []string
	c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 2048)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return out
		}
		out = append(out, from.String()+": "+string(buf[:n]))
	}
}

func TestAttackNATGuestSecondRound(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	nets := f.labNet("10.126.0.0/24")
	gw := netip.MustParseAddr("10.126.0.1")
	macV, macX := mustMAC("52:54:00:01:26:01"), mustMAC("52:54:00:01:26:02")
	gv := f.tapGuest(nets, "vm-victim", macV.String(), "v", netip.Addr{})
	gx := f.tapGuest(nets, "vm-attacker", macX.String(), "x", netip.Addr{})
	victim, router, _, out := f.lease(gv)
	if !victim.IsValid() || router != gw {
		t.Fatalf("the victim's first lease: %s router %s:\n%s", victim, router, out)
	}
	f.run("ip", "netns", "exec", gv, "ip", "route", "replace", "default", "via", gw.String())
	self := f.dhcp(gx)
	px, pv := f.port(gx), f.port(gv)
	leases := filepath.Join(f.dir, "networks", "lab", LeasesFile)
	fromX := func(fr hostileguest.Frame) bool { return fr.Src.String() == macX.String() }

	t.Run("DHCP in its own name about the neighbour", func(t *testing.T) {
		srv := hostileguest.AddrOption(hostileguest.OptServerID, gw)
		clid := hostileguest.Option{Code: hostileguest.OptClientID, Data: append([]byte{1}, macV...)}
		send := func(from, to netip.Addr, dst net.HardwareAddr, d hostileguest.DHCP) {
			d.Op = hostileguest.BootRequest
			px.Send(hostileguest.Ethernet(dst, macX, hostileguest.EtherIPv4, hostileguest.IPv4UDP(from, to, 68, 67, d.Marshal())))
		}
		br, _ := net.InterfaceByName("gf-lab")
		// A DECLINE of the neighbour's address, with and without its
		// client id; a RELEASE of it unicast to dnsmasq; an INFORM
		// naming it as ciaddr; a REQUEST whose hlen makes chaddr longer
		// than the guest's MAC (the rest the neighbour's).
		send(self, bcast4, hostileguest.Broadcast, hostileguest.DHCP{XID: 11, CHAddr: macX, Opts: []hostileguest.Option{msgType(hostileguest.DHCPDecline), hostileguest.AddrOption(hostileguest.OptRequestedIP, victim), srv, clid}})
		send(self, bcast4, hostileguest.Broadcast, hostileguest.DHCP{XID: 12, CHAddr: macX, Opts: []hostileguest.Option{msgType(hostileguest.DHCPDecline), hostileguest.AddrOption(hostileguest.OptRequestedIP, victim), srv}})
		send(self, gw, br.HardwareAddr, hostileguest.DHCP{XID: 13, CHAddr: macX, CIAddr: victim, Opts: []hostileguest.Option{msgType(hostileguest.DHCPRelease), srv, clid}})
		send(self, gw, br.HardwareAddr, hostileguest.DHCP{XID: 14, CHAddr: macX, CIAddr: victim, Opts: []hostileguest.Option{msgType(8), clid}}) // DHCPINFORM
		long := hostileguest.DHCP{Op: hostileguest.BootRequest, XID: 15, CHAddr: append(append(net.HardwareAddr{}, macX...), macV...), CIAddr: victim,
			Opts: []hostileguest.Option{msgType(hostileguest.DHCPRelease), srv}}.Marshal()
		long[2] = 12
		px.Send(hostileguest.Ethernet(br.HardwareAddr, macX, hostileguest.EtherIPv4, hostileguest.IPv4UDP(self, gw, 68, 67, long)))
		time.Sleep(500 * time.Millisecond)
		if got, err := leaseFor(leases, macV); got != victim {
			t.Errorf("dnsmasq's lease of the victim is %v (%v) after the attacker's messages; want %s", got, err, victim)
		}
		if ip, router, _, out := f.lease(gv); ip != victim || router != gw {
			t.Errorf("the victim's next lease: %s router %s; want %s router %s (dnsmasq disabled its reservation?):\n%s", ip, router, victim, gw, out)
		}
	})

	t.Run("rogue DHCP answers in unusual IPv4 shapes", func(t *testing.T) {
		offer := hostileguest.DHCP{Op: hostileguest.BootReply, XID: 21, YIAddr: victim, CHAddr: macV, Opts: []hostileguest.Option{
			msgType(hostileguest.DHCPOffer), hostileguest.AddrOption(hostileguest.OptServerID, self), hostileguest.AddrOption(hostileguest.OptRouter, self)}}.Marshal()
		var packets [][]byte
		for _, sport := range []uint16{67, 1067} {
			p := hostileguest.IPv4UDP(self, bcast4, sport, 68, offer)
			packets = append(packets, withIPv4Options(p))
			packets = append(packets, ipv4Fragments(p, 8)...)   // the UDP header alone first
			packets = append(packets, ipv4Fragments(p, 248)...) // the cookie in the second
		}
		got := make(chan []hostileguest.Frame)
		go func() {
			got <- pv.Capture(time.Second, func(fr hostileguest.Frame) bool {
				// What a DHCP client reads: no fragment but a first one,
				// UDP to port 68.
				if !fromX(fr) || fr.EtherType != hostileguest.EtherIPv4 || len(fr.Raw) < 34 {
					return false
				}
				return binary.BigEndian.Uint16(fr.Raw[20:22])&0x1fff == 0 && fr.Proto == unix.IPPROTO_UDP && fr.DstPort == 68
			})
		}()
		time.Sleep(100 * time.Millisecond)
		for _, p := range packets {
			for _, dst := range []net.HardwareAddr{macV, hostileguest.Broadcast} {
				px.Send(hostileguest.Ethernet(dst, macX, hostileguest.EtherIPv4, p))
			}
		}
		for _, fr := range <-got {
			t.Errorf("an answer to the DHCP client port from the attacker reached the victim (%d bytes, header length %d)", len(fr.Raw), int(fr.Raw[14]&0x0f)*4)
		}
	})

	t.Run("a DHCP request carries no neighbour's source address", func(t *testing.T) {
		// The filter lets DHCP requests in the guest's own name leave
		// from any source address (a client renewing after a
		// renumbering): they must still go to the DHCP server only.
		c := listenIn(t, gv, "udp4", ":67")
		req := hostileguest.DHCP{Op: hostileguest.BootRequest, XID: 31, CHAddr: macX, Opts: []hostileguest.Option{msgType(hostileguest.DHCPRequest)}}.Marshal()
		px.Send(hostileguest.Ethernet(macV, macX, hostileguest.EtherIPv4, hostileguest.IPv4UDP(gw, victim, 68, 67, req)))
		for _, h := range heard(c, time.Second) {
			t.Errorf("a DHCP request of the attacker's from another's address reached the victim: %s", h)
		}
		// Its own renewal, unicast to dnsmasq from its address, is
		// still answered.
		br, _ := net.InterfaceByName("gf-lab")
		acks := make(chan []hostileguest.Frame)
		go func() {
			acks <- px.Capture(time.Second, func(fr hostileguest.Frame) bool {
				d, ok := fr.DHCP()
				return ok && d.Op == hostileguest.BootReply && d.Type() == hostileguest.DHCPAck && d.YIAddr == self
			})
		}()
		time.Sleep(100 * time.Millisecond)
		renew := hostileguest.DHCP{Op: hostileguest.BootRequest, XID: 32, CIAddr: self, CHAddr: macX, Opts: []hostileguest.Option{msgType(hostileguest.DHCPRequest)}}.Marshal()
		px.Send(hostileguest.Ethernet(br.HardwareAddr, macX, hostileguest.EtherIPv4, hostileguest.IPv4UDP(self, gw, 68, 67, renew)))
		if len(<-acks) == 0 {
			t.Error("dnsmasq did not acknowledge the guest's own unicast renewal")
		}
	})

	t.Run("router advertisements and DHCPv6 behind extension headers and in fragments", func(t *testing.T) {
		f.run("ip", "netns", "exec", gv, "sysctl", "-qw", "net.ipv6.conf.eth0.accept_ra=1")
		waitLinkLocal(t, gv)
		waitLinkLocal(t, gx)
		llV, llX := hostileguest.LinkLocal(macV), hostileguest.LinkLocal(macX)
		c := listenIn(t, gv, "udp6", "[::]:546")
		allNodes := netip.MustParseAddr("ff02::1")
		prefix := netip.MustParsePrefix("2001:db8:26::/64")
		ra := hostileguest.IPv6(llX, allNodes, unix.IPPROTO_ICMPV6, 255, hostileguest.RouterAdvertisement(macX, 30*time.Minute, prefix, llX))
		dhcp6 := hostileguest.IPv6(llX, llV, unix.IPPROTO_UDP, 64, hostileguest.UDP6(547, 546, hostileguest.DHCPv6(hostileguest.DHCPv6Reply, 7, llX)))
		dhcp6Other := hostileguest.IPv6(llX, llV, unix.IPPROTO_UDP, 64, hostileguest.UDP6(1547, 546, hostileguest.DHCPv6(hostileguest.DHCPv6Reply, 8, llX)))
		var packets [][]byte
		for _, p := range [][]byte{ra, dhcp6, dhcp6Other} {
			packets = append(packets, withIPv6Ext(p, 0), withIPv6Ext(p, 60))
			packets = append(packets, ipv6Fragments(p, 8, false)...)
			packets = append(packets, ipv6Fragments(p, 0, true)...)
		}
		for i := 0; i < 3; i++ {
			for _, p := range packets {
				dst := macV
				if p[24] == 0xff {
					dst = hostileguest.MulticastMAC(allNodes)
				}
				px.Send(hostileguest.Ethernet(dst, macX, hostileguest.EtherIPv6, p))
			}
			time.Sleep(200 * time.Millisecond)
		}
		for _, h := range heard(c, time.Second) {
			t.Errorf("the victim's DHCPv6 client port received the attacker's %q", h)
		}
		if out := f.run("ip", "netns", "exec", gv, "ip", "-6", "route", "show", "default"); strings.TrimSpace(out) != "" {
			t.Errorf("the victim took a default route from the attacker: %s", out)
		}
		if out := f.run("ip", "netns", "exec", gv, "ip", "-6", "addr", "show", "dev", "eth0", "scope", "global"); strings.Contains(out, "2001:db8:26") {
			t.Errorf("the victim took an address from the attacker's prefix:\n%s", out)
		}
	})

	t.Run("ICMP redirect from its own address", func(t *testing.T) {
		// Only the current gateway may redirect (RFC 1122); the guest
		// cannot send from the gateway's address, so its redirect names
		// itself and is ignored.
		dst := netip.MustParseAddr("198.51.100.7")
		inner := hostileguest.IPv4UDP(victim, dst, 4000, 53, []byte("x"))[:28]
		icmp := append([]byte{5, 1, 0, 0}, self.AsSlice()...)
		icmp = append(icmp, inner...)
		var sum uint32
		for i := 0; i+1 < len(icmp); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(icmp[i:]))
		}
		for sum > 0xffff {
			sum = sum>>16 + sum&0xffff
		}
		binary.BigEndian.PutUint16(icmp[2:4], ^uint16(sum))
		p := hostileguest.IPv4ICMPEcho(self, victim, 0, 0)[:20]
		binary.BigEndian.PutUint16(p[2:4], uint16(20+len(icmp)))
		fixIPv4Checksum(p)
		for i := 0; i < 3; i++ {
			px.Send(hostileguest.Ethernet(macV, macX, hostileguest.EtherIPv4, append(append([]byte(nil), p...), icmp...)))
		}
		time.Sleep(200 * time.Millisecond)
		if out := f.run("ip", "netns", "exec", gv, "ip", "route", "get", dst.String()); !strings.Contains(out, "via "+gw.String()) {
			t.Errorf("the victim's route to %s after the attacker's redirect: %s; want via %s", dst, out, gw)
		}
	})

	t.Run("host services on broadcast, multicast and loopback", func(t *testing.T) {
		// Host sockets bound to the wildcard hear broadcasts and groups
		// they joined; a packet for 127.0.0.1 is a martian. None of it
		// may reach them from a guest.
		c := listenIn(t, netnstest.Name(), "udp4", ":5026")
		mc, err := net.ListenMulticastUDP("udp4", mustIf(t, "gf-lab"), &net.UDPAddr{IP: net.IPv4(224, 0, 0, 251), Port: 5027})
		if err != nil {
			t.Fatal(err)
		}
		defer mc.Close()
		mc6 := listenIn(t, netnstest.Name(), "udp6", "[::]:5028")
		br, _ := net.InterfaceByName("gf-lab")
		subnetBcast := netip.MustParseAddr("10.126.0.255")
		loop := netip.MustParseAddr("127.0.0.1")
		for _, d := range []struct {
			mac  net.HardwareAddr
			addr netip.Addr
			port uint16
		}{
			{hostileguest.Broadcast, bcast4, 5026}, {hostileguest.Broadcast, subnetBcast, 5026},
			{br.HardwareAddr, loop, 5026}, {br.HardwareAddr, gw, 5026},
			{net.HardwareAddr{1, 0, 0x5e, 0, 0, 0xfb}, netip.MustParseAddr("224.0.0.251"), 5027},
		} {
			px.Send(hostileguest.Ethernet(d.mac, macX, hostileguest.EtherIPv4, hostileguest.IPv4UDP(self, d.addr, 4000, d.port, []byte("from the guest"))))
		}
		allNodes := netip.MustParseAddr("ff02::1")
		px.Send(hostileguest.Ethernet(hostileguest.MulticastMAC(allNodes), macX, hostileguest.EtherIPv6,
			hostileguest.IPv6(hostileguest.LinkLocal(macX), allNodes, unix.IPPROTO_UDP, 1, hostileguest.UDP6(4000, 5028, []byte("from the guest")))))
		for _, pc := range []net.PacketConn{c, mc, mc6} {
			for _, h := range heard(pc, 500*time.Millisecond) {
				t.Errorf("a host service heard the guest: %s", h)
			}
		}
		// The same listeners hear the host itself (the checks prove
		// something).
		l, _ := net.Dial("udp4", "127.0.0.1:5026")
		l.Write([]byte("from the host"))
		l.Close()
		if len(heard(c, 500*time.Millisecond)) == 0 {
			t.Error("the host's own listener hears nothing from the host")
		}
	})

	t.Run("DNS flood stays off the host's disk", func(t *testing.T) {
		dir := filepath.Join(f.dir, "networks", "lab")
		size := func() int64 {
			var n int64
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				if fi, err := e.Info(); err == nil {
					n += fi.Size()
				}
			}
			return n
		}
		before := size()
		q := []byte{0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}
		for i := 0; i < 10000; i++ {
			name := []byte{1, byte('a' + i%26), 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 0, 0, 1, 0, 1}
			msg := append(append([]byte(nil), q...), name...)
			binary.BigEndian.PutUint16(msg[0:2], uint16(i))
			br, _ := net.InterfaceByName("gf-lab")
			px.Send(hostileguest.Ethernet(br.HardwareAddr, macX, hostileguest.EtherIPv4, hostileguest.IPv4UDP(self, gw, uint16(10000+i%50000), 53, msg)))
		}
		time.Sleep(time.Second)
		if grown := size() - before; grown > 2*DnsmasqLogMax {
			t.Errorf("10,000 DNS queries grew dnsmasq's directory by %d bytes; want at most %d", grown, 2*DnsmasqLogMax)
		}
		if f.m.dnsmasqPid("lab") == 0 {
			t.Error("dnsmasq does not run after the DNS flood")
		}
	})
}

func mustIf(t *testing.T, name string) *net.Interface {
	t.Helper()
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return ifc
}
