package hostnet

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gitfleet/gitfleet/desired"
)

// nic is one VM NIC as the tap filter holds it: the tap it enters its
// bridge by, the MAC the Manager gave it, whether the tap is on a nat
// network, and there the addresses it may speak from (its reservation's;
// none while it holds none). A VM with several NICs, VLANs or IPv6
// prefixes is several nics, each with its own tap, MAC and addresses.
type nic struct {
	Tap   string
	MAC   string
	NAT   bool
	Addrs []netip.Addr
}

// nics is the tap filter's view of every tap the Manager made (TapsFile),
// sorted by tap: a nat tap speaks from the addresses reserved for its MAC
// (a NIC's MAC is its identity: derived from the VM's name, reserved on
// one network at a time), so the filter follows every reservation change
// and renumbering, taps made before addresses were recorded with them
// included.
func (m *Manager) nics() ([]nic, error) {
	taps, err := m.readTaps()
	if err != nil {
		return nil, err
	}
	nets, err := m.natNetworks()
	if err != nil {
		return nil, err
	}
	reserved := map[string][]netip.Addr{}
	for _, name := range nets {
		hosts, err := m.readHosts(name)
		if err != nil {
			return nil, err
		}
		var s natSpec
		if err := readJSON(filepath.Join(m.netDir(name), SpecFile), &s); err != nil {
			return nil, err
		}
		p6, _ := s.nat().Prefix6()
		for _, r := range hosts {
			mac := parseMAC(r.MAC)
			reserved[mac] = append(reserved[mac], r.Addr)
			// On a network with an IPv6 prefix the guest speaks from
			// its SLAAC address too (and link-local, as everywhere).
			if hw, err := net.ParseMAC(mac); err == nil && p6.IsValid() {
				reserved[mac] = append(reserved[mac], desired.SLAAC(p6, hw))
			}
		}
	}
	out := make([]nic, 0, len(taps))
	for _, tap := range sortedKeys(taps) {
		r := taps[tap]
		n := nic{Tap: tap, MAC: parseMAC(r.MAC), NAT: r.NAT}
		if n.MAC == "" {
			return nil, fmt.Errorf("taps: tap %s: MAC %q is no MAC address", tap, r.MAC)
		}
		if n.NAT {
			n.Addrs = reserved[n.MAC]
			sort.Slice(n.Addrs, func(i, j int) bool { return n.Addrs[i].Less(n.Addrs[j]) })
		}
		out = append(out, n)
	}
	return out, nil
}

// renderTapFilter is the "bridge gitfleet" table for nics, replacing the
// table as renderNftables does. Every frame a tap brings into its bridge
// passes the chain of its NIC (nic_<tap>, dispatched by the tap's name),
// and every NIC speaks only with its own MAC, so no guest takes another's
// lease, neighbour entry or readiness with that VM's MAC (and the host's
// neighbour table, which addresses and readiness trust, holds a VM's MAC
// only for that VM's traffic). A NIC of a nat network is held to far
// more (natRules). A guest on a bridge network is a machine of the LAN:
// it may be the LAN's DHCP server or router.
func renderTapFilter(nics []nic) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table bridge %s\ndelete table bridge %s\n", NftTable, NftTable)
	if len(nics) == 0 {
		return b.String()
	}
	fmt.Fprintf(&b, "table bridge %s {\n", NftTable)
	b.WriteString("\tchain prerouting {\n\t\ttype filter hook prerouting priority filter; policy accept;\n")
	var jumps []string
	for _, n := range nics {
		jumps = append(jumps, fmt.Sprintf("%q : jump %s", n.Tap, nicChain(n.Tap)))
	}
	fmt.Fprintf(&b, "\t\tiifname vmap { %s }\n\t}\n", strings.Join(jumps, ", "))
	for _, n := range nics {
		fmt.Fprintf(&b, "\tchain %s {\n", nicChain(n.Tap))
		fmt.Fprintf(&b, "\t\tether saddr != %s drop\n", n.MAC)
		if n.NAT {
			for _, r := range natRules(n) {
				fmt.Fprintf(&b, "\t\t%s\n", r)
			}
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// nicChain is the name of the chain of the NIC with tap.
func nicChain(tap string) string { return "nic_" + tap }

// natRules hold a NIC of a nat network, whose only DHCP server and IPv6
// router is the network's dnsmasq, to what a guest there needs
// and nothing more. Its guest:
//   - sends only untagged IPv4, ARP and IPv6 (a VLAN tag would carry IPv4
//     past the rules below);
//   - claims no address but its own: ARP only with its own MAC and one of
//     its addresses as the sender (or 0.0.0.0 when probing one of its
//     own, RFC 5227), IPv4 only from its addresses, IPv6 only from a
//     link-local address, the unspecified one (duplicate address
//     detection) or, on a network with an IPv6 prefix, its SLAAC
//     address (desired.SLAAC of its MAC) — so no guest takes the
//     gateway's address or a neighbour's, in the neighbours' tables or the
//     host's;
//   - sends no DHCP server's message: none to a DHCP client's port, none
//     from a server's, and no BOOTREPLY (RFC 2131: op 2 with the DHCP
//     magic cookie) to any port, since a client on a packet socket (busybox
//     udhcpc) reads an answer from any source port;
//   - sends DHCP requests to dnsmasq only in its own name: a whole,
//     unfragmented BOOTREQUEST with Ethernet addresses, chaddr its own MAC
//     and no relay address (giaddr), so it can neither decline nor release
//     another's address nor ask in the name of clients that do not exist;
//     broadcast from any IPv4 source, as a client rebinding after a
//     renumbering does, else (a renewal unicast to dnsmasq) from its own
//     address only, so it sends no neighbour a datagram from another's
//     address; and at most 10 a second (bursts of 20), ten times what a client
//     retrying every second sends, so a guest neither keeps dnsmasq from
//     its neighbours nor makes it log more than about a kilobyte a second;
//   - sends no IPv6 router advertisement, redirect or router renumbering,
//     and no DHCPv6 server's message (to a client's port 546, or from a
//     server's 547).
func natRules(n nic) []string {
	var v4, v6 []string
	for _, a := range n.Addrs {
		if a.Is4() {
			v4 = append(v4, a.String())
		} else {
			v6 = append(v6, a.String())
		}
	}
	chaddr := "0x" + strings.ReplaceAll(n.MAC, ":", "")
	r := []string{"ether type != { ip, arp, ip6 } drop"}
	r = append(r, arpRules(n.MAC, v4)...)
	r = append(r,
		"udp dport 68 drop",
		"udp sport 67 drop",
		"meta l4proto udp @th,64,24 0x020106 @th,1952,32 0x63825363 drop",
		"ether type ip udp dport 67 ip frag-off & 0x3fff != 0 drop",
		"ether type ip udp dport 67 udp length < 248 drop",
		"ether type ip udp dport 67 @th,64,24 != 0x010106 drop",
		"ether type ip udp dport 67 @th,288,48 != "+chaddr+" drop",
		"ether type ip udp dport 67 @th,256,32 != 0 drop",
		"ether type ip udp dport 67 limit rate over 10/second burst 20 packets drop",
		"ether type ip udp sport 68 udp dport 67 ip daddr 255.255.255.255 accept",
	)
	if len(v4) == 0 {
		r = append(r, "ether type ip drop")
	} else {
		r = append(r, "ip saddr != { "+strings.Join(v4, ", ")+" } drop")
	}
	return append(r,
		"icmpv6 type { nd-router-advert, nd-redirect, 138 } drop",
		"udp dport 546 drop",
		"udp sport 547 drop",
		"ip6 saddr != { "+strings.Join(append([]string{"fe80::/10", "::"}, v6...), ", ")+" } drop",
	)
}

// arpRules hold a nat NIC's ARP to Ethernet and IPv4 with its own MAC as
// the sender's, and to its addresses v4 as the sender's (or the target of
// a probe from 0.0.0.0).
func arpRules(mac string, v4 []string) []string {
	if len(v4) == 0 {
		return []string{"ether type arp drop"}
	}
	own := "{ " + strings.Join(v4, ", ") + " }"
	return []string{
		"arp htype != 1 drop",
		"arp ptype != ip drop",
		"arp hlen != 6 drop",
		"arp plen != 4 drop",
		"arp saddr ether != " + mac + " drop",
		"arp saddr ip 0.0.0.0 arp daddr ip != " + own + " drop",
		"arp saddr ip != { 0.0.0.0, " + strings.Join(v4, ", ") + " } drop",
	}
}

// parseMAC is mac as nft and the kernel print it (six lower-case hex
// bytes), or "" when it is no Ethernet MAC address.
func parseMAC(mac string) string {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return ""
	}
	return hw.String()
}
