package qemu

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/hostnet"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/netnstest"
)

// A VM with NICs on two nat networks, the second with a fixed MAC, leases
// its reserved address on each (the tiny guest asks on eth0 itself; its
// user-data asks on eth1), Address lists both NICs with those leases, the
// seed's network-config matches each NIC by its MAC, and Destroy removes
// both taps and both reservations.
func TestGuestWithTwoNICsGetsAnAddressOnEach(t *testing.T) {
	netGuest(t)
	if !netnstest.Enter(t) {
		return
	}
	f := newNetFixture(t)
	p, _ := f.provisioner()
	lab := desired.Network{NAT: &desired.NAT{CIDR: "10.91.0.0/24"}}
	dmz := desired.Network{NAT: &desired.NAT{CIDR: "10.92.0.0/24"}}
	nets := map[string]desired.Network{"lab": lab, "dmz": dmz}
	const fixed = "52:54:00:91:92:01"
	ctx := context.Background()
	members := []agent.NetworkMember{{VM: "router", Network: "lab"}, {VM: "router", Network: "dmz", Index: 1, MAC: fixed}}
	if err := p.ReconcileNetworks(ctx, nets, members, map[string]bool{}); err != nil {
		t.Fatalf("ReconcileNetworks: %v", err)
	}
	m := f.machine("router", "lab", lab)
	m.Spec.Network = ""
	m.Spec.NICs = []desired.NIC{{Network: "lab"}, {Network: "dmz", MAC: fixed}}
	m.Networks = nets
	m.Spec.CloudInit = &desired.CloudInit{UserData: "#!/bin/sh\n" +
		"echo \"eth1 mac=$(cat /sys/class/net/eth1/address)\"\n" +
		"ifconfig eth1 up && udhcpc -i eth1 -t 20 -T 1 -n -q -s /etc/udhcpc.script\n" +
		"echo done\n"}
	f.boot(p, m)

	lines := strings.Join(guestLines(waitSerial(t, m.Dir, "probe done")), "\n")
	if !strings.Contains(lines, "probe eth1 mac="+fixed) {
		t.Fatalf("the guest's second NIC has not the fixed MAC %s:\n%s", fixed, lines)
	}
	for _, want := range []string{"lease eth0 ip=10.91.0.", "probe tinyguest: lease eth1 ip=10.92.0."} {
		if !strings.Contains(lines, want) {
			t.Errorf("the guest has no lease %q...:\n%s", want, lines)
		}
	}
	var a agent.Address
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if a = p.Address(m.Name); len(a.NICs) == 2 && a.NICs[0].IP != "" && a.NICs[1].IP != "" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(a.NICs) != 2 || a.NICs[0].Network != "lab" || a.NICs[1].Network != "dmz" || a.NICs[1].MAC != fixed || a.NICs[0].MAC != macFor(m.Name) {
		t.Fatalf("Address NICs = %+v; want lab (MAC %s) and dmz (MAC %s)", a.NICs, macFor(m.Name), fixed)
	}
	for i, pfx := range []string{"10.91.0.0/24", "10.92.0.0/24"} {
		ip, err := netip.ParseAddr(a.NICs[i].IP)
		if err != nil || !netip.MustParsePrefix(pfx).Contains(ip) || !strings.Contains(lines, "ip="+ip.String()) {
			t.Errorf("NIC %d address %q; want the guest's lease in %s:\n%s", i, a.NICs[i].IP, pfx, lines)
		}
	}
	if a.IP != a.NICs[0].IP {
		t.Errorf("Address IP %q; want the first NIC's %q", a.IP, a.NICs[0].IP)
	}

	// Every NIC's reservation is the MAC it leased with.
	for i, name := range []string{"lab", "dmz"} {
		b, _ := os.ReadFile(filepath.Join(f.netDir, name, hostnet.HostsFile))
		var hosts map[string]struct{ MAC, Addr string }
		if err := json.Unmarshal(b, &hosts); err != nil || hosts[m.Name].MAC != a.NICs[i].MAC || hosts[m.Name].Addr != a.NICs[i].IP {
			t.Errorf("%s reservations %s (%v); want %s at %s", name, b, err, a.NICs[i].MAC, a.NICs[i].IP)
		}
	}
	if err := p.Destroy(ctx, m.Name); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	for i := range 2 {
		if _, err := netlink.LinkByName(hostnet.NICTap(m.Name, i)); err == nil {
			t.Errorf("the tap of NIC %d survived Destroy", i)
		}
	}
	for _, name := range []string{"lab", "dmz"} {
		b, _ := os.ReadFile(filepath.Join(f.netDir, name, hostnet.HostsFile))
		if strings.Contains(string(b), m.Name) {
			t.Errorf("%s still reserves an address for the destroyed VM: %s", name, b)
		}
	}
}
