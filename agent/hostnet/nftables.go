package hostnet

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/gitfleet/gitfleet/desired"
)

// NftTable is the name of the nftables tables the Manager owns: "inet
// gitfleet" (the nat networks) and "bridge gitfleet" (its taps). Only the
// Manager writes them; they are replaced whole on every change.
const NftTable = "gitfleet"

// gateway is the bridge address of the nat network with CIDR cidr (which
// the Manager checked when it made the network).
func gateway(cidr string) string {
	return desired.NAT{CIDR: cidr}.Gateway().String()
}

// LinkLocal4 is IPv4's link-local range. Guests of nat networks reach
// none of it: a link-local address is never routed, so all a guest finds
// there through the host is the host's own link, where a cloud's metadata
// service (169.254.169.254) answers the host's (masqueraded) requests with
// the host's credentials. (IPv6 link-local addresses are never
// forwarded.)
const LinkLocal4 = "169.254.0.0/16"

// renderNftables is the whole "inet gitfleet" table for the nat networks
// nets (by name), as one nft script that replaces the table
// atomically: declaring the table first makes "delete" succeed when it
// does not exist yet, and nft applies a script as one transaction.
//
// Per network: guests reach the host itself only for DHCP, DNS and ping
// at the bridge address (DHCP's broadcasts too), and nothing else reaches
// the bridge address but the host itself (input); the host's replies and the guests' own traffic, link-local
// destinations aside, are forwarded, nothing from outside — another nat
// network's guests included — starts a connection to a guest (forward); what
// leaves the network is masqueraded (postrouting). With userModeUID (not
// 0), that user's sockets reach no address of any nat network (output):
// they carry the user-mode networking of the VMs on no host network,
// whose connections leave the host's own stack, where the forward rules
// never see them.
//
// A network with an IPv6 prefix gets the same over IPv6 (inet6Rules):
// guests reach the host only for neighbour discovery, router
// solicitations, DHCPv6, DNS and ping at the bridge's IPv6 address, and
// their traffic from the prefix is forwarded and masqueraded (NAT66);
// a network without one forwards no IPv6 at all (the forward chain's
// last rule for its bridge drops it).
func renderNftables(nets map[string]desired.NAT, userModeUID int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s\ndelete table inet %s\n", NftTable, NftTable)
	if len(nets) == 0 {
		return []byte(b.String())
	}
	fmt.Fprintf(&b, "table inet %s {\n", NftTable)
	b.WriteString("\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n")
	for _, name := range sortedKeys(nets) {
		br, gw := desired.NATBridge(name), gateway(nets[name].CIDR)
		fmt.Fprintf(&b, "\t\tiifname %q ct state established,related accept\n", br)
		for _, r := range inet6Input(nets[name]) {
			fmt.Fprintf(&b, "\t\tiifname %q %s\n", br, r)
		}
		fmt.Fprintf(&b, "\t\tiifname %q ip daddr { %s, 255.255.255.255 } udp dport 67 accept\n", br, gw)
		fmt.Fprintf(&b, "\t\tiifname %q ip daddr %s udp dport 53 accept\n", br, gw)
		fmt.Fprintf(&b, "\t\tiifname %q ip daddr %s tcp dport 53 accept\n", br, gw)
		fmt.Fprintf(&b, "\t\tiifname %q ip daddr %s icmp type echo-request accept\n", br, gw)
		fmt.Fprintf(&b, "\t\tiifname %q drop\n", br)
		// The bridge address serves its guests and the host alone.
		fmt.Fprintf(&b, "\t\tiifname != { %q, \"lo\" } ip daddr %s drop\n", br, gw)
		if gw6 := nets[name].Gateway6(); gw6.IsValid() {
			fmt.Fprintf(&b, "\t\tiifname != { %q, \"lo\" } ip6 daddr %s drop\n", br, gw6)
		}
	}
	b.WriteString("\t}\n")
	b.WriteString("\tchain forward {\n\t\ttype filter hook forward priority filter; policy accept;\n")
	// Into a network first, for every network, then out of one: a
	// guest's own traffic, accepted on the way out, must not be accepted
	// into another nat network before that network's rules see it.
	// Traffic between the guests of one network is bridged, and passes
	// here only where br_netfilter is loaded (Docker loads it): it is
	// accepted as it is without.
	for _, name := range sortedKeys(nets) {
		br := desired.NATBridge(name)
		fmt.Fprintf(&b, "\t\tiifname %q oifname %q accept\n", br, br)
		fmt.Fprintf(&b, "\t\toifname %q ct state established,related accept\n", br)
		fmt.Fprintf(&b, "\t\toifname %q drop\n", br)
	}
	for _, name := range sortedKeys(nets) {
		br := desired.NATBridge(name)
		fmt.Fprintf(&b, "\t\tiifname %q ip daddr %s drop\n", br, LinkLocal4)
		fmt.Fprintf(&b, "\t\tiifname %q ip saddr %s accept\n", br, nets[name].CIDR)
		if p6, _ := nets[name].Prefix6(); p6.IsValid() {
			fmt.Fprintf(&b, "\t\tiifname %q ip6 saddr %s accept\n", br, p6)
		}
		fmt.Fprintf(&b, "\t\tiifname %q drop\n", br)
	}
	b.WriteString("\t}\n")
	b.WriteString(userModeGuard(nets, userModeUID))
	b.WriteString("\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n")
	for _, name := range sortedKeys(nets) {
		fmt.Fprintf(&b, "\t\tip saddr %s ip daddr != %s masquerade\n", nets[name].CIDR, nets[name].CIDR)
		if p6, _ := nets[name].Prefix6(); p6.IsValid() {
			fmt.Fprintf(&b, "\t\tip6 saddr %s ip6 daddr != %s masquerade\n", p6, p6)
		}
	}
	b.WriteString("\t}\n}\n")
	return []byte(b.String())
}

// inet6Input are the input rules, after the bridge's iifname, that let
// the guests of nat network n reach the host over IPv6: neighbour
// discovery and router solicitations (dnsmasq answers with an
// advertisement), DHCPv6 to the servers' multicast group or the bridge,
// DNS and ping at the bridge's address. The chain drops the rest. None
// without an IPv6 prefix.
func inet6Input(n desired.NAT) []string {
	gw6 := n.Gateway6()
	if !gw6.IsValid() {
		return nil
	}
	return []string{
		"icmpv6 type { nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert } ip6 hoplimit 255 accept",
		fmt.Sprintf("ip6 daddr { %s, ff02::1:2 } udp dport 547 accept", gw6),
		fmt.Sprintf("ip6 daddr %s udp dport 53 accept", gw6),
		fmt.Sprintf("ip6 daddr %s tcp dport 53 accept", gw6),
		fmt.Sprintf("ip6 daddr %s icmpv6 type echo-request accept", gw6),
	}
}

// userModeGuard is the output chain that keeps the sockets of uid (QEMU's
// user) off every address of the nat networks nets, IPv4 or IPv6; "" for
// uid 0.
func userModeGuard(nets map[string]desired.NAT, uid int) string {
	if uid == 0 {
		return ""
	}
	var v4, v6 []string
	for _, name := range sortedKeys(nets) {
		v4 = append(v4, nets[name].CIDR)
		if p6, _ := nets[name].Prefix6(); p6.IsValid() {
			v6 = append(v6, p6.String())
		}
	}
	var b strings.Builder
	b.WriteString("\tchain output {\n\t\ttype filter hook output priority filter; policy accept;\n")
	for i, cidrs := range [][]string{v4, v6} {
		if len(cidrs) > 0 {
			fmt.Fprintf(&b, "\t\tmeta skuid %d %s daddr { %s } reject\n", uid, []string{"ip", "ip6"}[i], strings.Join(cidrs, ", "))
		}
	}
	b.WriteString("\t}\n")
	return b.String()
}

// ensureNftables loads the tables for every nat network this Manager made
// (their spec files) and every tap it made (TapsFile) when they differ
// from the ones last loaded, or when the kernel's tables are not the ones
// loaded then: missing (a host reboot, a
// flush) or changed by anyone else (a chain flushed, a rule added or
// removed), since its drop rules are what keeps guests off the host. The
// kernel's listing of the table as loaded is kept beside the script
// (NftablesListFile) to compare with.
func (m *Manager) ensureNftables(ctx context.Context) error {
	made, err := m.natNetworks()
	if err != nil {
		return err
	}
	nets := map[string]desired.NAT{}
	for _, name := range made {
		var s natSpec
		if err := readJSON(filepath.Join(m.netDir(name), SpecFile), &s); err != nil {
			return err
		}
		nets[name] = s.nat()
	}
	nics, err := m.nics()
	if err != nil {
		return err
	}
	want := append(renderNftables(nets, m.userModeUID), renderTapFilter(nics)...)
	file, listFile := filepath.Join(m.cfg.Dir, NftablesFile), filepath.Join(m.cfg.Dir, NftablesListFile)
	have, _ := os.ReadFile(file)
	loaded, _ := os.ReadFile(listFile)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	live := m.listNftables(ctx)
	switch {
	case len(nets) == 0 && len(nics) == 0 && len(live) == 0:
		return nil // nothing to load, nothing loaded
	case bytes.Equal(have, want) && bytes.Equal(live, loaded):
		return nil
	}
	cmd := exec.CommandContext(ctx, m.cfg.Nft, "-f", "-")
	cmd.Stdin = bytes.NewReader(want)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nftables: %v: %s", err, trim(out))
	}
	if err := os.MkdirAll(m.cfg.Dir, 0o700); err != nil {
		return err
	}
	if err := writeFile(listFile, m.listNftables(ctx)); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	if err := writeFile(file, want); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	log := m.log.WithField("networks", len(nets)).WithField("taps", len(nics))
	if bytes.Equal(have, want) {
		log.Warn("nftables tables changed by someone else; loaded again")
		return nil
	}
	log.Info("nftables tables loaded")
	return nil
}

// listNftables is the kernel's listing of both tables ("" for a missing
// one).
func (m *Manager) listNftables(ctx context.Context) []byte {
	var b []byte
	for _, family := range []string{"inet", "bridge"} {
		out, err := exec.CommandContext(ctx, m.cfg.Nft, "list", "table", family, NftTable).Output()
		if err == nil {
			b = append(b, out...)
		}
	}
	return b
}
