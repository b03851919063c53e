package hostileguest

import (
	"encoding/binary"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// BOOTP operations (RFC 951): a client's request, a server's reply.
const (
	BootRequest = 1
	BootReply   = 2
)

// DHCP message types (RFC 2132 9.6).
const (
	DHCPDiscover = 1
	DHCPOffer    = 2
	DHCPRequest  = 3
	DHCPDecline  = 4
	DHCPAck      = 5
	DHCPNak      = 6
	DHCPRelease  = 7
)

// DHCP options (RFC 2132) the attacks use.
const (
	OptSubnetMask  = 1
	OptRouter      = 3
	OptDNS         = 6
	OptRequestedIP = 50
	OptLeaseTime   = 51
	OptMessageType = 53
	OptServerID    = 54
	OptClientID    = 61
)

// magicCookie starts a DHCP message's options (RFC 2131 3).
const magicCookie = 0x63825363

// Option is one DHCP option, code and data.
type Option struct {
	Code uint8
	Data []byte
}

// AddrOption is option code carrying addresses (router, DNS, server id).
func AddrOption(code uint8, addrs ...netip.Addr) Option {
	var b []byte
	for _, a := range addrs {
		v := a.As4()
		b = append(b, v[:]...)
	}
	return Option{code, b}
}

// DHCP is a DHCP message (RFC 2131 2) over Ethernet: the fixed fields the
// attacks set and the options in order (the message type is one of them:
// Option{OptMessageType, []byte{DHCPDiscover}}).
type DHCP struct {
	Op     uint8
	XID    uint32
	Flags  uint16 // 0x8000: the client asks for broadcast answers
	CIAddr netip.Addr
	YIAddr netip.Addr
	SIAddr netip.Addr
	GIAddr netip.Addr
	CHAddr net.HardwareAddr
	Opts   []Option
}

// Marshal is the message as a UDP payload: 236 bytes of fixed fields,
// the magic cookie, the options and an end option, padded to 300 bytes
// as BOOTP clients expect.
func (d DHCP) Marshal() []byte {
	b := make([]byte, 240)
	b[0], b[1], b[2] = d.Op, 1, 6 // Ethernet, 6-byte addresses
	binary.BigEndian.PutUint32(b[4:8], d.XID)
	binary.BigEndian.PutUint16(b[10:12], d.Flags)
	for i, a := range []netip.Addr{d.CIAddr, d.YIAddr, d.SIAddr, d.GIAddr} {
		if a.IsValid() {
			v := a.As4()
			copy(b[12+4*i:16+4*i], v[:])
		}
	}
	copy(b[28:44], d.CHAddr)
	binary.BigEndian.PutUint32(b[236:240], magicCookie)
	for _, o := range d.Opts {
		b = append(b, o.Code, uint8(len(o.Data)))
		b = append(b, o.Data...)
	}
	b = append(b, 255)
	for len(b) < 300 {
		b = append(b, 0)
	}
	return b
}

// ParseDHCP reads a DHCP message from a UDP payload; ok is false when b
// is none (too short, no magic cookie).
func ParseDHCP(b []byte) (d DHCP, ok bool) {
	if len(b) < 240 || binary.BigEndian.Uint32(b[236:240]) != magicCookie {
		return d, false
	}
	d.Op, d.XID, d.Flags = b[0], binary.BigEndian.Uint32(b[4:8]), binary.BigEndian.Uint16(b[10:12])
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte(b[i : i+4])) }
	d.CIAddr, d.YIAddr, d.SIAddr, d.GIAddr = addr(12), addr(16), addr(20), addr(24)
	d.CHAddr = net.HardwareAddr(append([]byte(nil), b[28:34]...))
	for o := b[240:]; len(o) > 0; {
		switch o[0] {
		case 0:
			o = o[1:]
			continue
		case 255:
			return d, true
		}
		if len(o) < 2 || len(o) < 2+int(o[1]) {
			return d, true
		}
		d.Opts = append(d.Opts, Option{o[0], append([]byte(nil), o[2:2+o[1]]...)})
		o = o[2+o[1]:]
	}
	return d, true
}

// Option is the data of option code, nil when absent.
func (d DHCP) Option(code uint8) []byte {
	for _, o := range d.Opts {
		if o.Code == code {
			return o.Data
		}
	}
	return nil
}

// Type is the message's DHCP message type, 0 when it has none.
func (d DHCP) Type() uint8 {
	if t := d.Option(OptMessageType); len(t) == 1 {
		return t[0]
	}
	return 0
}

// Frame is a captured frame, parsed as far as the attacks need.
type Frame struct {
	Raw       []byte
	Dst, Src  net.HardwareAddr
	EtherType uint16
	// IPSrc and IPDst are the addresses of an IPv4 or IPv6 packet (of the
	// sender and target of an ARP packet); invalid otherwise.
	IPSrc, IPDst netip.Addr
	// Proto is the IPv4 or IPv6 (without extension headers) upper-layer
	// protocol.
	Proto uint8
	// SrcPort and DstPort are a UDP datagram's ports.
	SrcPort, DstPort uint16
	// Payload is a UDP datagram's payload, an ICMP or ICMPv6 message, or
	// an ARP packet.
	Payload []byte
}

// Parse parses an Ethernet frame; what it cannot read stays zero.
func Parse(b []byte) Frame {
	f := Frame{Raw: b}
	if len(b) < 14 {
		return f
	}
	f.Dst, f.Src, f.EtherType = net.HardwareAddr(b[0:6]), net.HardwareAddr(b[6:12]), binary.BigEndian.Uint16(b[12:14])
	p := b[14:]
	switch f.EtherType {
	case EtherARP:
		if len(p) >= 28 {
			f.IPSrc, f.IPDst = netip.AddrFrom4([4]byte(p[14:18])), netip.AddrFrom4([4]byte(p[24:28]))
			f.Payload = p[:28]
		}
	case EtherIPv4:
		if len(p) < 20 || p[0]>>4 != 4 {
			return f
		}
		ihl := int(p[0]&0x0f) * 4
		f.IPSrc, f.IPDst, f.Proto = netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20])), p[9]
		if len(p) >= ihl {
			f.transport(p[ihl:])
		}
	case EtherIPv6:
		if len(p) < 40 {
			return f
		}
		f.IPSrc, f.IPDst, f.Proto = netip.AddrFrom16([16]byte(p[8:24])), netip.AddrFrom16([16]byte(p[24:40])), p[6]
		f.transport(p[40:])
	}
	return f
}

func (f *Frame) transport(p []byte) {
	switch f.Proto {
	case unix.IPPROTO_UDP:
		if len(p) >= 8 {
			f.SrcPort, f.DstPort, f.Payload = binary.BigEndian.Uint16(p[0:2]), binary.BigEndian.Uint16(p[2:4]), p[8:]
		}
	default:
		f.Payload = p
	}
}

// DHCP is the DHCP message the frame carries over UDP; ok is false when
// it carries none.
func (f Frame) DHCP() (DHCP, bool) {
	if f.Proto != unix.IPPROTO_UDP || f.EtherType != EtherIPv4 {
		return DHCP{}, false
	}
	return ParseDHCP(f.Payload)
}
