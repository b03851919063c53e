package hostnet

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/netnstest"
)

// Health reads the host as it is now, with real nftables, routes and
// bridges in the test's namespace: a foreign forward-hook drop in each
// of its shapes (Docker's ip filter FORWARD policy drop, an inet table's
// unconditional drop rule, a bridge-family chain), unless the chain
// accepts the network's bridge by name; a route that overlaps a nat
// network's CIDR after it was made; a missing bridge; and, with
// br_netfilter's call-iptables on, a routed-family drop on a bridge
// network too.
func TestHealthNamesWhatCutsTheGuestsOff(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	nets := map[string]desired.Network{"lab": {NAT: &desired.NAT{CIDR: "10.77.0.0/24"}}}
	if err := f.m.Reconcile(ctx, nets, nil); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	health := func(nets map[string]desired.Network, name string) string {
		t.Helper()
		return f.m.Health(ctx, nets)[name]
	}
	if h := health(nets, "lab"); h != "" {
		t.Fatalf("a fresh nat network is degraded: %s", h)
	}
	nft := func(script string) { t.Helper(); f.run("nft", script) }

	nft("add table ip filter; add chain ip filter FORWARD { type filter hook forward priority 0; policy drop; }")
	if h := health(nets, "lab"); !strings.Contains(h, "table ip filter chain FORWARD on the forward hook has policy drop") {
		t.Errorf("Docker's FORWARD policy drop: health = %q", h)
	}
	nft(`add rule ip filter FORWARD iifname "gf-lab" accept; add rule ip filter FORWARD oifname "gf-lab" accept`)
	if h := health(nets, "lab"); h != "" {
		t.Errorf("a drop chain that accepts the bridge by name: health = %q", h)
	}
	nft("delete table ip filter")

	nft("add table inet fw; add chain inet fw forwarding { type filter hook forward priority 0; }; add rule inet fw forwarding counter drop")
	if h := health(nets, "lab"); !strings.Contains(h, "table inet fw chain forwarding on the forward hook has a drop rule that matches every packet") {
		t.Errorf("an unconditional drop rule: health = %q", h)
	}
	nft("delete table inet fw")
	nft(`add table bridge lanfw; add chain bridge lanfw forwarding { type filter hook forward priority 0; }; add rule bridge lanfw forwarding oifname "gf-lab" drop`)
	if h := health(nets, "lab"); !strings.Contains(h, "table bridge lanfw chain forwarding on the forward hook has a drop rule that matches bridge gf-lab") {
		t.Errorf("a bridge-family drop naming the bridge: health = %q", h)
	}
	nft("delete table bridge lanfw")
	if h := health(nets, "lab"); h != "" {
		t.Fatalf("after the foreign tables went: health = %q", h)
	}

	// A VPN's route that appears after the network was made.
	f.run("ip", "link", "add", "vpn0", "type", "veth", "peer", "name", "vpn0p")
	f.run("ip", "link", "set", "vpn0p", "up")
	f.run("ip", "link", "set", "vpn0", "up")
	f.run("ip", "route", "add", "10.77.0.128/25", "dev", "vpn0")
	if h := health(nets, "lab"); !strings.Contains(h, "overlaps the host's route to 10.77.0.128/25 (device vpn0, table main)") {
		t.Errorf("an overlapping route: health = %q", h)
	}
	f.run("ip", "route", "del", "10.77.0.128/25", "dev", "vpn0")

	lan := map[string]desired.Network{"lan": {Bridge: "br-lan"}}
	if h := health(lan, "lan"); h != "bridge br-lan is missing" {
		t.Errorf("a missing bridge: health = %q", h)
	}
	f.run("ip", "link", "add", "br-lan", "type", "bridge")
	nft("add table ip filter; add chain ip filter FORWARD { type filter hook forward priority 0; policy drop; }")
	callIPT := "0"
	if b, err := os.ReadFile(bridgeCallIPTables); err == nil {
		callIPT = strings.TrimSpace(string(b))
	}
	switch h := health(lan, "lan"); {
	case callIPT != "1" && h != "":
		t.Errorf("a routed-family drop degrades a bridge network without call-iptables: %q", h)
	case callIPT == "1" && !strings.Contains(h, "(bridge-nf-call-iptables is 1: frames bridged on br-lan pass it)"):
		t.Errorf("call-iptables is 1: health = %q", h)
	}
	if callIPT != "1" {
		if err := os.WriteFile(bridgeCallIPTables, []byte("1"), 0o644); err != nil {
			t.Logf("bridge-nf-call-iptables cannot be set here (br_netfilter not loaded: %v); its case is not checked", err)
			return
		}
		defer os.WriteFile(bridgeCallIPTables, []byte(callIPT), 0o644)
		if h := health(lan, "lan"); !strings.Contains(h, "table ip filter chain FORWARD on the forward hook has policy drop (bridge-nf-call-iptables is 1: frames bridged on br-lan pass it)") {
			t.Errorf("call-iptables set to 1: health = %q", h)
		}
	}
}
