// Package hostileguest sends what a hostile guest puts on its link and
// captures what a guest receives there, for tests that stand a network
// namespace in for a guest on a bridge (testsupport/netnstest): a packet
// socket on the namespace's interface, and builders of the frames the
// attacks need — ARP, IPv4/UDP with DHCP (RFC 2131), IPv6 with ICMPv6
// router advertisements and redirects (RFC 4861) and UDP with DHCPv6
// (RFC 8415) — with their checksums, so the kernel, a DHCP client or
// dnsmasq on the other side takes them as real.
//
// Usage, inside a test's namespace, with ns a namespace made by
// `ip netns add`:
//
//	p, err := hostileguest.Open(ns, "eth0")
//	...
//	defer p.Close()
//	p.Send(hostileguest.Ethernet(hostileguest.Broadcast, p.MAC, hostileguest.EtherARP, arp))
//	frames := p.Capture(2*time.Second, func(f hostileguest.Frame) bool { return f.EtherType == hostileguest.EtherIPv4 })
//
// Nothing here chooses an address: every frame goes where the test says,
// and a test may only address namespaces it made.
package hostileguest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// EtherTypes of the frames built here.
const (
	EtherIPv4 = 0x0800
	EtherARP  = 0x0806
	EtherVLAN = 0x8100
	EtherIPv6 = 0x86dd
)

// Broadcast is the Ethernet broadcast address.
var Broadcast = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// Port is a packet socket (AF_PACKET, all protocols) bound to one
// interface of a network namespace: it sends whole Ethernet frames as
// given and captures the frames that arrive on the interface.
type Port struct {
	fd      int
	ifindex int
	// MAC is the interface's address.
	MAC net.HardwareAddr
}

// Open opens a Port on interface ifname of the named network namespace
// (/run/netns/<ns>). The socket stays in that namespace; the calling
// goroutine's thread is switched there only while it opens it.
func Open(ns, ifname string) (*Port, error) {
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		return nil, fmt.Errorf("namespace %s: %w", ns, err)
	}
	defer target.Close()
	type result struct {
		p   *Port
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The switch is per thread: this goroutine keeps its thread, and
		// a thread that cannot switch back ends with it (no Unlock).
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer self.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("setns %s: %w", ns, err)}
			return
		}
		p, err := open(ifname)
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{p, err}
	}()
	r := <-ch
	if r.err != nil {
		return nil, fmt.Errorf("packet socket on %s in %s: %w", ifname, ns, r.err)
	}
	return r.p, nil
}

func open(ifname string) (*Port, error) {
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifc.Index}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &Port{fd: fd, ifindex: ifc.Index, MAC: ifc.HardwareAddr}, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Close closes the socket.
func (p *Port) Close() error { return unix.Close(p.fd) }

// Send puts frame (destination MAC first, no frame check sequence) on the
// link as it is.
func (p *Port) Send(frame []byte) error {
	if len(frame) < 14 {
		return errors.New("frame shorter than an Ethernet header")
	}
	var dst [8]byte
	copy(dst[:], frame[:6])
	sa := &unix.SockaddrLinklayer{Protocol: htons(binary.BigEndian.Uint16(frame[12:14])), Ifindex: p.ifindex, Halen: 6, Addr: dst}
	return unix.Sendto(p.fd, frame, 0, sa)
}

// Capture reads the frames that arrive on the interface (not the ones it
// sends) for d, and returns those keep accepts (every one when keep is
// nil), parsed.
func (p *Port) Capture(d time.Duration, keep func(Frame) bool) []Frame {
	var out []Frame
	deadline := time.Now().Add(d)
	buf := make([]byte, 65536)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return out
		}
		tv := unix.NsecToTimeval(left.Nanoseconds())
		unix.SetsockoptTimeval(p.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		n, from, err := unix.Recvfrom(p.fd, buf, 0)
		if err != nil {
			continue // the timeout, or a signal: the deadline decides
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		f := Parse(append([]byte(nil), buf[:n]...))
		if keep == nil || keep(f) {
			out = append(out, f)
		}
	}
}

// Ethernet is a frame: dst, src, etherType and payload.
func Ethernet(dst, src net.HardwareAddr, etherType uint16, payload []byte) []byte {
	b := make([]byte, 14, 14+len(payload))
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:14], etherType)
	return append(b, payload...)
}

// VLAN is an 802.1Q-tagged frame: the tag (VLAN id) before etherType.
func VLAN(dst, src net.HardwareAddr, id uint16, etherType uint16, payload []byte) []byte {
	tag := make([]byte, 4, 4+len(payload))
	binary.BigEndian.PutUint16(tag[0:2], id&0x0fff)
	binary.BigEndian.PutUint16(tag[2:4], etherType)
	return Ethernet(dst, src, EtherVLAN, append(tag, payload...))
}

// ARP operations.
const (
	ARPRequest = 1
	ARPReply   = 2
)

// ARP is an Ethernet/IPv4 ARP packet (RFC 826): op, sender MAC and IPv4
// address, target MAC and IPv4 address.
func ARP(op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) []byte {
	b := make([]byte, 28)
	binary.BigEndian.PutUint16(b[0:2], 1) // Ethernet
	binary.BigEndian.PutUint16(b[2:4], EtherIPv4)
	b[4], b[5] = 6, 4
	binary.BigEndian.PutUint16(b[6:8], op)
	copy(b[8:14], sha)
	s, t := spa.As4(), tpa.As4()
	copy(b[14:18], s[:])
	copy(b[18:24], tha)
	copy(b[24:28], t[:])
	return b
}

// checksum is the Internet checksum (RFC 1071) of the concatenated parts.
func checksum(parts ...[]byte) uint16 {
	var sum uint32
	var odd []byte
	for _, p := range parts {
		if len(odd) == 1 {
			p = append(odd, p...)
			odd = nil
		}
		for len(p) >= 2 {
			sum += uint32(binary.BigEndian.Uint16(p))
			p = p[2:]
		}
		if len(p) == 1 {
			odd = []byte{p[0]}
		}
	}
	if len(odd) == 1 {
		sum += uint32(odd[0]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// udp is a UDP header and payload with the checksum over pseudo.
func udp(pseudo []byte, sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(b[0:2], sport)
	binary.BigEndian.PutUint16(b[2:4], dport)
	binary.BigEndian.PutUint16(b[4:6], uint16(8+len(payload)))
	b = append(b, payload...)
	c := checksum(pseudo, b)
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(b[6:8], c)
	return b
}

// IPv4UDP is an IPv4 packet (TTL 64, no options, not fragmented) carrying
// a UDP datagram from src:sport to dst:dport.
func IPv4UDP(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	s, d := src.As4(), dst.As4()
	pseudo := make([]byte, 12)
	copy(pseudo[0:4], s[:])
	copy(pseudo[4:8], d[:])
	pseudo[9] = unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(pseudo[10:12], uint16(8+len(payload)))
	return ipv4(src, dst, unix.IPPROTO_UDP, udp(pseudo, sport, dport, payload))
}

// IPv4ICMPEcho is an IPv4 ICMP echo request from src to dst.
func IPv4ICMPEcho(src, dst netip.Addr, id, seq uint16) []byte {
	b := make([]byte, 8)
	b[0] = 8
	binary.BigEndian.PutUint16(b[4:6], id)
	binary.BigEndian.PutUint16(b[6:8], seq)
	binary.BigEndian.PutUint16(b[2:4], checksum(b))
	return ipv4(src, dst, unix.IPPROTO_ICMP, b)
}

func ipv4(src, dst netip.Addr, proto uint8, payload []byte) []byte {
	h := make([]byte, 20, 20+len(payload))
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:4], uint16(20+len(payload)))
	h[8], h[9] = 64, proto
	s, d := src.As4(), dst.As4()
	copy(h[12:16], s[:])
	copy(h[16:20], d[:])
	binary.BigEndian.PutUint16(h[10:12], checksum(h))
	return append(h, payload...)
}

// IPv6 is an IPv6 packet from src to dst with hop limit hop carrying an
// upper-layer payload of protocol next (unix.IPPROTO_ICMPV6 or
// unix.IPPROTO_UDP), whose checksum field the caller left zero: it is
// filled in over the pseudo-header (RFC 8200 8.1).
func IPv6(src, dst netip.Addr, next, hop uint8, payload []byte) []byte {
	payload = append([]byte(nil), payload...)
	s, d := src.As16(), dst.As16()
	pseudo := make([]byte, 40)
	copy(pseudo[0:16], s[:])
	copy(pseudo[16:32], d[:])
	binary.BigEndian.PutUint32(pseudo[32:36], uint32(len(payload)))
	pseudo[39] = next
	switch next {
	case unix.IPPROTO_ICMPV6:
		binary.BigEndian.PutUint16(payload[2:4], checksum(pseudo, payload))
	case unix.IPPROTO_UDP:
		c := checksum(pseudo, payload)
		if c == 0 {
			c = 0xffff
		}
		binary.BigEndian.PutUint16(payload[6:8], c)
	}
	h := make([]byte, 40, 40+len(payload))
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:6], uint16(len(payload)))
	h[6], h[7] = next, hop
	copy(h[8:24], s[:])
	copy(h[24:40], d[:])
	return append(h, payload...)
}

// UDP6 is a UDP datagram for IPv6 (checksum left to IPv6).
func UDP6(sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(b[0:2], sport)
	binary.BigEndian.PutUint16(b[2:4], dport)
	binary.BigEndian.PutUint16(b[4:6], uint16(8+len(payload)))
	return append(b, payload...)
}

// RouterAdvertisement is an ICMPv6 router advertisement (RFC 4861 4.2)
// from a router with MAC mac: a default router for lifetime, the on-link,
// autonomous prefix (SLAAC, RFC 4862) and a DNS server (RDNSS, RFC 8106).
func RouterAdvertisement(mac net.HardwareAddr, lifetime time.Duration, prefix netip.Prefix, dns netip.Addr) []byte {
	b := make([]byte, 16)
	b[0] = 134
	b[4] = 64 // current hop limit
	binary.BigEndian.PutUint16(b[6:8], uint16(lifetime/time.Second))
	b = append(b, 1, 1) // source link-layer address
	b = append(b, mac...)
	pi := make([]byte, 32)
	pi[0], pi[1], pi[2], pi[3] = 3, 4, uint8(prefix.Bits()), 0xc0 // on-link, autonomous
	binary.BigEndian.PutUint32(pi[4:8], 86400)
	binary.BigEndian.PutUint32(pi[8:12], 14400)
	p := prefix.Addr().As16()
	copy(pi[16:32], p[:])
	b = append(b, pi...)
	rd := make([]byte, 24)
	rd[0], rd[1] = 25, 3
	binary.BigEndian.PutUint32(rd[4:8], 1800)
	d := dns.As16()
	copy(rd[8:24], d[:])
	return append(b, rd...)
}

// Redirect is an ICMPv6 redirect (RFC 4861 4.5): traffic for dst is to go
// to target (whose MAC is mac).
func Redirect(target, dst netip.Addr, mac net.HardwareAddr) []byte {
	b := make([]byte, 40)
	b[0] = 137
	t, d := target.As16(), dst.As16()
	copy(b[8:24], t[:])
	copy(b[24:40], d[:])
	b = append(b, 2, 1) // target link-layer address
	return append(b, mac...)
}

// DHCPv6 message types (RFC 8415 7.3) a server sends.
const (
	DHCPv6Advertise = 2
	DHCPv6Reply     = 7
)

// DHCPv6 is a DHCPv6 message of type typ offering a DNS server
// (OPTION_DNS_SERVERS, RFC 3646) to transaction xid.
func DHCPv6(typ uint8, xid uint32, dns netip.Addr) []byte {
	b := []byte{typ, byte(xid >> 16), byte(xid >> 8), byte(xid)}
	d := dns.As16()
	b = append(b, 0, 23, 0, 16)
	return append(b, d[:]...)
}

// LinkLocal is the modified EUI-64 IPv6 link-local address of mac (RFC
// 4291 appendix A), the one Linux gives an interface by default.
func LinkLocal(mac net.HardwareAddr) netip.Addr {
	var a [16]byte
	a[0], a[1] = 0xfe, 0x80
	a[8], a[9], a[10] = mac[0]^0x02, mac[1], mac[2]
	a[11], a[12] = 0xff, 0xfe
	a[13], a[14], a[15] = mac[3], mac[4], mac[5]
	return netip.AddrFrom16(a)
}

// MulticastMAC is the Ethernet address IPv6 multicast group a maps to
// (RFC 2464 7).
func MulticastMAC(a netip.Addr) net.HardwareAddr {
	b := a.As16()
	return net.HardwareAddr{0x33, 0x33, b[12], b[13], b[14], b[15]}
}
