package hostnet

import (
	"net/netip"
	"strings"
	"testing"
)

// Each NIC has a chain of its own; a LAN NIC is held to its MAC alone, a
// nat NIC to its addresses too, and one whose MAC holds no reservation
// (yet) may send DHCP requests in its own name and no other IPv4 or ARP.
func TestTapFilterHoldsEachNICToItsOwn(t *testing.T) {
	rules := renderTapFilter([]nic{
		{Tap: "gftlan", MAC: "52:54:00:00:00:01"},
		{Tap: "gftnat", MAC: "52:54:00:00:00:02", NAT: true, Addrs: []netip.Addr{netip.MustParseAddr("10.77.0.9")}},
		{Tap: "gftnew", MAC: "52:54:00:00:00:03", NAT: true},
	})
	chain := func(tap string) string {
		_, rest, ok := strings.Cut(rules, "\tchain "+nicChain(tap)+" {\n")
		if !ok {
			t.Fatalf("no chain for %s:\n%s", tap, rules)
		}
		body, _, _ := strings.Cut(rest, "\t}\n")
		return body
	}
	if want := `iifname vmap { "gftlan" : jump nic_gftlan, "gftnat" : jump nic_gftnat, "gftnew" : jump nic_gftnew }`; !strings.Contains(rules, want) {
		t.Errorf("no dispatch %q:\n%s", want, rules)
	}
	if lan := chain("gftlan"); strings.TrimSpace(lan) != "ether saddr != 52:54:00:00:00:01 drop" {
		t.Errorf("the LAN NIC's chain holds more than its MAC:\n%s", lan)
	}
	nat := chain("gftnat")
	for _, want := range []string{
		"ether saddr != 52:54:00:00:00:02 drop",
		"arp saddr ip != { 0.0.0.0, 10.77.0.9 } drop",
		"ether type ip udp dport 67 @th,288,48 != 0x525400000002 drop",
		"ip saddr != { 10.77.0.9 } drop",
	} {
		if !strings.Contains(nat, want) {
			t.Errorf("the nat NIC's chain lacks %q:\n%s", want, nat)
		}
	}
	fresh := chain("gftnew")
	for _, want := range []string{"ether type arp drop", "ether type ip udp sport 68 udp dport 67 ip daddr 255.255.255.255 accept\n\t\tether type ip drop"} {
		if !strings.Contains(fresh, want) {
			t.Errorf("the chain of a NIC without a reservation lacks %q:\n%s", want, fresh)
		}
	}
	if empty := renderTapFilter(nil); strings.Contains(empty, "{") {
		t.Errorf("with no tap the table is not just deleted:\n%s", empty)
	}
}
