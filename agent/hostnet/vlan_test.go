package hostnet

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/netnstest"
)

// kernelFiltersVLANs reports whether this kernel's bridges can filter
// VLANs (CONFIG_BRIDGE_VLAN_FILTERING), by trying on a bridge of the
// test's own network namespace: the VLAN tests skip without it.
func kernelFiltersVLANs(t *testing.T) bool {
	t.Helper()
	if err := exec.Command("ip", "link", "add", "vlprobe0", "type", "bridge").Run(); err != nil {
		t.Fatalf("make a probe bridge: %v", err)
	}
	defer exec.Command("ip", "link", "del", "vlprobe0").Run()
	return exec.Command("ip", "link", "set", "vlprobe0", "type", "bridge", "vlan_filtering", "1").Run() == nil
}

// A bridge network with a VLAN needs a bridge that filters VLANs: Attach
// and Check say so (ErrNoVLANFiltering, naming the bridge) and the agent
// never turns filtering on itself. On a filtering bridge the tap becomes
// an access port of the VLAN (its one VLAN, port VLAN id, untagged) and
// the bridge's other ports keep theirs.
func TestBridgeNetworkVLANNeedsAFilteringBridge(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	f.run("ip", "link", "add", "br0", "type", "bridge")
	f.run("ip", "link", "set", "br0", "up")
	lan := desired.Network{Bridge: "br0", VLAN: 20}
	mac, _ := net.ParseMAC("52:54:00:00:0c:01")
	_, err := f.m.Attach(ctx, "lan", lan, NIC{VM: "web-01", MAC: mac})
	if !errors.Is(err, ErrNoVLANFiltering) || !strings.Contains(err.Error(), "br0") {
		t.Fatalf("Attach on VLAN 20 of a bridge without VLAN filtering: %v; want ErrNoVLANFiltering naming br0", err)
	}
	if err := f.m.Check("lan", lan); !errors.Is(err, ErrNoVLANFiltering) {
		t.Fatalf("Check: %v; want ErrNoVLANFiltering", err)
	}
	if err := f.m.Check("lan", desired.Network{Bridge: "br0"}); err != nil {
		t.Fatalf("Check without a VLAN: %v", err)
	}
	if !kernelFiltersVLANs(t) {
		if _, err := os.Stat("/sys/class/net/br0/bridge/vlan_filtering"); err == nil {
			t.Fatal("the kernel refused vlan_filtering on a bridge yet has the setting")
		}
		if !strings.Contains(err.Error(), "CONFIG_BRIDGE_VLAN_FILTERING") {
			t.Errorf("the error does not say the kernel lacks VLAN filtering: %v", err)
		}
		t.Skip("this kernel has no bridge VLAN filtering (CONFIG_BRIDGE_VLAN_FILTERING): the access port itself is not tested")
	}
	if b, _ := os.ReadFile("/sys/class/net/br0/bridge/vlan_filtering"); strings.TrimSpace(string(b)) != "0" {
		t.Fatalf("the agent turned VLAN filtering on: %s", b)
	}
	// The host's own trunk port, VLANs 20 and 30 tagged.
	f.run("ip", "link", "set", "br0", "type", "bridge", "vlan_filtering", "1")
	f.run("ip", "link", "add", "trunk0", "type", "veth", "peer", "name", "trunk1")
	f.run("ip", "link", "set", "trunk0", "master", "br0", "up")
	f.run("bridge", "vlan", "add", "dev", "trunk0", "vid", "20")
	f.run("bridge", "vlan", "add", "dev", "trunk0", "vid", "30")
	trunkBefore := f.run("bridge", "vlan", "show", "dev", "trunk0")
	a, err := f.m.Attach(ctx, "lan", lan, NIC{VM: "web-01", MAC: mac})
	if err != nil {
		t.Fatalf("Attach on VLAN 20: %v", err)
	}
	tap, _ := netlink.LinkByName(a.Tap)
	all, err := netlink.BridgeVlanList()
	if err != nil {
		t.Fatal(err)
	}
	vlans := all[int32(tap.Attrs().Index)]
	if len(vlans) != 1 || vlans[0].Vid != 20 || !vlans[0].PortVID() || !vlans[0].EngressUntag() {
		t.Errorf("tap VLANs %v; want only 20, PVID, egress untagged", vlans)
	}
	if after := f.run("bridge", "vlan", "show", "dev", "trunk0"); after != trunkBefore {
		t.Errorf("the trunk's VLANs changed:\n%s\nwas\n%s", after, trunkBefore)
	}
	// Attach again, and to another VLAN: one VLAN on the tap each time.
	if _, err := f.m.Attach(ctx, "lan", desired.Network{Bridge: "br0", VLAN: 30}, NIC{VM: "web-01", MAC: mac}); err != nil {
		t.Fatalf("Attach on VLAN 30: %v", err)
	}
	all, _ = netlink.BridgeVlanList()
	if vlans := all[int32(tap.Attrs().Index)]; len(vlans) != 1 || vlans[0].Vid != 30 {
		t.Errorf("tap VLANs after the move to 30: %v; want only 30", vlans)
	}
}
