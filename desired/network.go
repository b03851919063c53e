package desired

import (
	"fmt"
	"net/netip"
)

// Limits of host networks.
const (
	// ManagedBridgePrefix starts the name of every bridge the agent makes
	// for a nat network: "gf-" and the network's name. A bridge network
	// may not name a device with this prefix.
	ManagedBridgePrefix = "gf-"
	// MaxNATNameLength is the longest name of a nat network, so that its
	// bridge name fits Linux's 15-character interface names.
	MaxNATNameLength = MaxBridgeLength - len(ManagedBridgePrefix)
	// MinNATPrefix and MaxNATPrefix bound a nat network's prefix length:
	// from /16 (65534 addresses) to /29 (the bridge and five guests).
	MinNATPrefix = 16
	MaxNATPrefix = 29
)

// MinVLAN and MaxVLAN bound a bridge network's VLAN id: 0 and 4095 are
// reserved by IEEE 802.1Q.
const (
	MinVLAN = 1
	MaxVLAN = 4094
)

// NATRanges are the ranges a nat network's CIDR must lie in: the private
// ranges of RFC 1918 and the shared address space of RFC 6598. The host
// routes a nat network's CIDR to the network's bridge, so any other range
// would hide addresses the host itself needs behind its guests: loopback
// (127.0.0.0/8), link-local with the cloud metadata service
// (169.254.169.254), multicast, reserved or anyone's public addresses (a
// guest holding 8.8.8.8 would answer the host's DNS queries).
var NATRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"),
}

// NATBridge is the bridge device of the nat network named network.
func NATBridge(network string) string { return ManagedBridgePrefix + network }

// Prefix parses the CIDR: an IPv4 network address with a prefix length
// from MinNATPrefix to MaxNATPrefix, inside one of NATRanges.
func (n NAT) Prefix() (netip.Prefix, error) {
	p, err := netip.ParsePrefix(n.CIDR)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR such as 10.77.0.0/24", n.CIDR)
	}
	switch {
	case !p.Addr().Is4():
		return netip.Prefix{}, fmt.Errorf("%q is not an IPv4 CIDR", n.CIDR)
	case p.Bits() < MinNATPrefix || p.Bits() > MaxNATPrefix:
		return netip.Prefix{}, fmt.Errorf("%q: the prefix length must be %d to %d", n.CIDR, MinNATPrefix, MaxNATPrefix)
	case p.Masked() != p:
		return netip.Prefix{}, fmt.Errorf("%q has host bits set; the network address is %s", n.CIDR, p.Masked())
	}
	for _, r := range NATRanges {
		if r.Contains(p.Addr()) && p.Bits() >= r.Bits() {
			return p, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("%q is not a private range: a nat network takes its addresses from 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 or 100.64.0.0/10, since the host routes the CIDR to its guests (loopback, link-local with the metadata service at 169.254.169.254, multicast or public addresses would be taken from the host)", n.CIDR)
}

// ULARange is the range a nat network's IPv6 prefix lies in: the locally
// assigned half of the unique local addresses (RFC 4193).
var ULARange = netip.MustParsePrefix("fd00::/8")

// Prefix6 parses IPv6: a /64 network address inside ULARange. It is
// invalid, with no error, when IPv6 is empty.
func (n NAT) Prefix6() (netip.Prefix, error) {
	if n.IPv6 == "" {
		return netip.Prefix{}, nil
	}
	p, err := netip.ParsePrefix(n.IPv6)
	switch {
	case err != nil || !p.Addr().Is6() || p.Addr().Is4In6():
		return netip.Prefix{}, fmt.Errorf("%q is not an IPv6 prefix such as fd00:77::/64", n.IPv6)
	case p.Bits() != 64:
		return netip.Prefix{}, fmt.Errorf("%q: the prefix length must be 64 (SLAAC takes a /64)", n.IPv6)
	case p.Masked() != p:
		return netip.Prefix{}, fmt.Errorf("%q has host bits set; the network address is %s", n.IPv6, p.Masked())
	case !ULARange.Contains(p.Addr()):
		return netip.Prefix{}, fmt.Errorf("%q is not a unique local prefix: a nat network's IPv6 prefix lies inside %s (RFC 4193), since the host routes it to its guests and masquerades it", n.IPv6, ULARange)
	}
	return p, nil
}

// Gateway6 is the first address of the IPv6 prefix: the bridge's, the
// guests' router and DNS server. Invalid without IPv6; it must parse.
func (n NAT) Gateway6() netip.Addr {
	p, _ := n.Prefix6()
	if !p.IsValid() {
		return netip.Addr{}
	}
	return p.Addr().Next()
}

// SLAAC is the address a guest whose NIC has MAC mac forms in prefix
// (a /64) by stateless autoconfiguration with its EUI-64 interface
// identifier (RFC 4291, appendix A): the MAC with ff:fe in its middle and
// the universal/local bit flipped. Invalid when mac is not 6 bytes.
func SLAAC(prefix netip.Prefix, mac []byte) netip.Addr {
	if len(mac) != 6 || !prefix.Addr().Is6() {
		return netip.Addr{}
	}
	a := prefix.Masked().Addr().As16()
	copy(a[8:], []byte{mac[0] ^ 0x02, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]})
	return netip.AddrFrom16(a)
}

// Gateway is the first address of the CIDR: the bridge's address, the
// guests' default route, DHCP and DNS server. The CIDR must parse.
func (n NAT) Gateway() netip.Addr {
	p, _ := n.Prefix()
	return p.Addr().Next()
}

// Broadcast is the last address of prefix p (IPv4).
func Broadcast(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v |= host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
