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
