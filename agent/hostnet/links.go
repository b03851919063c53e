package hostnet

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/gitfleet/gitfleet/desired"
)

// bridgeLink returns the bridge device name; ErrBridgeMissing when there
// is no device of that name, another error when it is not a bridge.
func bridgeLink(name string) (netlink.Link, error) {
	l, err := netlink.LinkByName(name)
	if isNotFound(err) {
		return nil, fmt.Errorf("bridge %s %w", name, ErrBridgeMissing)
	}
	if err != nil {
		return nil, fmt.Errorf("bridge %s: %w", name, err)
	}
	if _, ok := l.(*netlink.Bridge); !ok {
		return nil, fmt.Errorf("%s is a %s device, not a bridge", name, l.Type())
	}
	return l, nil
}

// ensureBridge makes bridge name exist and be up with addr (the network's
// first address and prefix length) as its only IPv4 address, and addr6
// (the first address of its IPv6 prefix) as its only global IPv6 one, or
// none when addr6 is invalid (link-local addresses are the kernel's and
// kept). It creates the bridge when missing and errors when name is
// another kind of device.
func ensureBridge(name string, addr, addr6 netip.Prefix) (netlink.Link, error) {
	l, err := netlink.LinkByName(name)
	switch {
	case isNotFound(err):
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
			return nil, fmt.Errorf("create bridge %s: %w", name, err)
		}
		if l, err = netlink.LinkByName(name); err != nil {
			return nil, fmt.Errorf("bridge %s: %w", name, err)
		}
	case err != nil:
		return nil, fmt.Errorf("bridge %s: %w", name, err)
	}
	if _, ok := l.(*netlink.Bridge); !ok {
		return nil, fmt.Errorf("%s is a %s device, not a bridge; remove it or rename the network", name, l.Type())
	}
	if err := ensureAddr(l, netlink.FAMILY_V4, addr); err != nil {
		return nil, err
	}
	if err := ensureAddr(l, netlink.FAMILY_V6, addr6); err != nil {
		return nil, err
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(l); err != nil {
			return nil, fmt.Errorf("bridge %s: up: %w", name, err)
		}
	}
	return l, nil
}

// ensureAddr makes addr the one address of family on link l (for IPv6
// the one global address: link-local ones are kept), none when addr is
// invalid. An IPv6 address is added without duplicate address detection
// (the bridge's address is the network's own, and DAD would hold it
// tentative, unusable for dnsmasq, for a second).
func ensureAddr(l netlink.Link, family int, addr netip.Prefix) error {
	name := l.Attrs().Name
	have, err := netlink.AddrList(l, family)
	if err != nil {
		return fmt.Errorf("bridge %s: addresses: %w", name, err)
	}
	var want *net.IPNet
	if addr.IsValid() {
		want = &net.IPNet{IP: addr.Addr().AsSlice(), Mask: net.CIDRMask(addr.Bits(), addr.Addr().BitLen())}
	}
	found := false
	for _, a := range have {
		if family == netlink.FAMILY_V6 && a.IP.IsLinkLocalUnicast() {
			continue
		}
		if want != nil && a.IPNet.String() == want.String() {
			found = true
			continue
		}
		if err := netlink.AddrDel(l, &a); err != nil {
			return fmt.Errorf("bridge %s: remove old address %s: %w", name, a.IPNet, err)
		}
	}
	if want != nil && !found {
		a := &netlink.Addr{IPNet: want}
		if family == netlink.FAMILY_V6 {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrAdd(l, a); err != nil {
			return fmt.Errorf("bridge %s: add address %s: %w", name, want, err)
		}
	}
	return nil
}

// ensureTap makes tap name exist (persistent, so it outlives QEMU and the
// agent), be a port of br and be up. An existing tap is kept, moved to br
// when it is a port of another bridge; a tun device or a multi-queue tap
// under the name, which QEMU's single-queue tap cannot open (the kernel
// refuses it), is replaced. The name is the VM's own (TapName) and the
// VM's QEMU is not running while its tap is ensured.
func ensureTap(name string, br netlink.Link) error {
	l, err := netlink.LinkByName(name)
	if t, ok := l.(*netlink.Tuntap); err == nil && ok && (t.Mode != netlink.TUNTAP_MODE_TAP || t.Flags&netlink.TUNTAP_MULTI_QUEUE != 0) {
		if err := netlink.LinkDel(l); err != nil {
			return fmt.Errorf("replace tap %s (a %s device QEMU cannot open): %w", name, t.Mode, err)
		}
		l, err = netlink.LinkByName(name)
	}
	if isNotFound(err) {
		t := &netlink.Tuntap{
			LinkAttrs: netlink.LinkAttrs{Name: name},
			Mode:      netlink.TUNTAP_MODE_TAP,
			Flags:     netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR | netlink.TUNTAP_ONE_QUEUE,
		}
		if err := netlink.LinkAdd(t); err != nil {
			return fmt.Errorf("create tap %s: %w", name, err)
		}
		for _, f := range t.Fds {
			f.Close()
		}
		if l, err = netlink.LinkByName(name); err != nil {
			return fmt.Errorf("tap %s: %w", name, err)
		}
	} else if err != nil {
		return fmt.Errorf("tap %s: %w", name, err)
	}
	if _, ok := l.(*netlink.Tuntap); !ok {
		return fmt.Errorf("%s is a %s device, not a tap", name, l.Type())
	}
	if l.Attrs().MasterIndex != br.Attrs().Index {
		if err := netlink.LinkSetMaster(l, br); err != nil {
			return fmt.Errorf("tap %s: join bridge %s: %w", name, br.Attrs().Name, err)
		}
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("tap %s: up: %w", name, err)
		}
	}
	return nil
}

// deleteLink removes device name; a missing one is no error.
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// neighbourFor finds mac's IPv4 address in the host's neighbour table on
// bridge: of the entries the kernel holds as valid (not failed or
// incomplete), the one confirmed last. A guest that changed its address
// leaves entries for the old ones behind, for its MAC, until they expire.
func neighbourFor(bridge string, mac net.HardwareAddr) (netip.Addr, error) {
	l, err := netlink.LinkByName(bridge)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("bridge %s: %w", bridge, err)
	}
	neigh, err := netlink.NeighList(l.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("neighbours of %s: %w", bridge, err)
	}
	var best *netlink.Neigh
	var found netip.Addr
	for i, n := range neigh {
		a, ok := validIPv4(n)
		if !ok || !bytes.Equal(n.HardwareAddr, mac) {
			continue
		}
		// Confirmed and Updated count clock ticks ago: smaller is newer.
		if best == nil || n.Confirmed < best.Confirmed || n.Confirmed == best.Confirmed && n.Updated < best.Updated {
			best, found = &neigh[i], a
		}
	}
	return found, nil
}

// validIPv4 is the IPv4 address of neighbour entry n when the kernel holds
// it as valid (not failed or incomplete).
func validIPv4(n netlink.Neigh) (netip.Addr, bool) { return validNeigh(n, netlink.FAMILY_V4) }

// validNeigh is the address of neighbour entry n of family (netlink's
// FAMILY_V4 or FAMILY_V6) when the kernel holds it as valid.
func validNeigh(n netlink.Neigh, family int) (netip.Addr, bool) {
	if n.State&(unix.NUD_FAILED|unix.NUD_INCOMPLETE) != 0 {
		return netip.Addr{}, false
	}
	if family == netlink.FAMILY_V6 {
		return netip.AddrFromSlice(n.IP.To16())
	}
	return netip.AddrFromSlice(n.IP.To4())
}

// hostConflict reports the host's own use of an address of prefix: an
// address or route of any routing table on a device other than the
// bridges of the nat networks ours names (the network being made, and the
// others of the Host spec, which validation keeps apart), or a route
// without a device (unreachable, blackhole, multipath). Default routes do
// not count. The bridge of a nat network gets a route for its whole CIDR,
// more specific than most: a CIDR that overlaps the host's LAN, a VPN's
// range, its default gateway or a nat network kept only because a VM still
// uses it would take those addresses from their owner and give them to
// guests. nil when nothing conflicts; wraps ErrHostConflict when
// something does.
func hostConflict(prefix netip.Prefix, ours func(network string) bool) error {
	family := netlink.FAMILY_V4
	if prefix.Addr().Is6() {
		family = netlink.FAMILY_V6
	}
	routes, err := netlink.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("list the host's routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		ip := r.Dst.IP
		if family == netlink.FAMILY_V4 {
			ip = ip.To4()
		}
		dst, ok := netip.AddrFromSlice(ip)
		if !ok || ones == 0 || !netip.PrefixFrom(dst, ones).Overlaps(prefix) {
			continue
		}
		dev := "no device"
		if r.LinkIndex != 0 {
			l, err := netlink.LinkByIndex(r.LinkIndex)
			if err != nil {
				return fmt.Errorf("route %s: device %d: %w", r.Dst, r.LinkIndex, err)
			}
			dev = "device " + l.Attrs().Name
			if net, ok := strings.CutPrefix(l.Attrs().Name, desired.ManagedBridgePrefix); ok {
				if _, br := l.(*netlink.Bridge); br {
					if ours(net) {
						continue
					}
					return fmt.Errorf("%s overlaps nat network %s (bridge %s), which the Host spec no longer names but a VM still uses: choose another CIDR for this network (%w)", prefix, net, l.Attrs().Name, ErrHostConflict)
				}
			}
		}
		table := strconv.Itoa(r.Table)
		switch r.Table {
		case unix.RT_TABLE_MAIN:
			table = "main"
		case unix.RT_TABLE_LOCAL:
			table = "local"
		}
		return fmt.Errorf("%s overlaps the host's route to %s (%s, table %s): choose another CIDR for this network, or remove that route (%w)", prefix, netip.PrefixFrom(dst, ones), dev, table, ErrHostConflict)
	}
	return nil
}

// holder is the MAC address the host's neighbour table holds for addr on
// bridge, when the host reaches addr directly through bridge (its route to
// addr leaves by bridge without a gateway); nil when it does not (addr is
// routed elsewhere: the table says nothing of who holds it) or holds no
// valid entry for addr. ErrHostAddress when addr is the host's own.
func holder(bridge string, addr netip.Addr) (net.HardwareAddr, error) {
	l, err := netlink.LinkByName(bridge)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: %w", bridge, err)
	}
	routes, err := netlink.RouteGet(addr.AsSlice())
	if err != nil {
		return nil, fmt.Errorf("route to %s: %w", addr, err)
	}
	if len(routes) > 0 && routes[0].Type == unix.RTN_LOCAL {
		return nil, fmt.Errorf("%s is an address of this host %w", addr, ErrHostAddress)
	}
	if len(routes) == 0 || routes[0].LinkIndex != l.Attrs().Index || routes[0].Gw != nil {
		return nil, nil
	}
	family := netlink.FAMILY_V4
	if addr.Is6() {
		family = netlink.FAMILY_V6
	}
	neigh, err := netlink.NeighList(l.Attrs().Index, family)
	if err != nil {
		return nil, fmt.Errorf("neighbours of %s: %w", bridge, err)
	}
	for _, n := range neigh {
		if a, ok := validNeigh(n, family); ok && a == addr && len(n.HardwareAddr) > 0 {
			return n.HardwareAddr, nil
		}
	}
	return nil, nil
}

// bridgePorts counts the devices that are ports of bridge; 0 when the
// bridge does not exist.
func bridgePorts(bridge string) (int, error) {
	l, err := netlink.LinkByName(bridge)
	if isNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("bridge %s: %w", bridge, err)
	}
	links, err := netlink.LinkList()
	if err != nil {
		return 0, fmt.Errorf("list devices: %w", err)
	}
	n := 0
	for _, p := range links {
		if p.Attrs().MasterIndex == l.Attrs().Index {
			n++
		}
	}
	return n, nil
}

// ErrNoVLANFiltering: a bridge network names a VLAN and its bridge does
// not filter VLANs (vlan_filtering 0), or the kernel has no bridge VLAN
// filtering at all (CONFIG_BRIDGE_VLAN_FILTERING). The Manager never turns
// it on: the bridge, its other ports and their VLANs are the host's.
// Attach and Check return it wrapped, naming the bridge.
var ErrNoVLANFiltering = errors.New("does not filter VLANs")

// vlanFiltering reports whether bridge br filters VLANs, and its default
// port VLAN id (default_pvid; 0 when none), from sysfs; ErrNoVLANFiltering
// when the kernel has no VLAN filtering.
func vlanFiltering(br string) (bool, int, error) {
	dir := "/sys/class/net/" + br + "/bridge/"
	b, err := os.ReadFile(dir + "vlan_filtering")
	if errors.Is(err, os.ErrNotExist) {
		return false, 0, fmt.Errorf("bridge %s %w: this kernel has no bridge VLAN filtering (CONFIG_BRIDGE_VLAN_FILTERING)", br, ErrNoVLANFiltering)
	}
	if err != nil {
		return false, 0, fmt.Errorf("bridge %s: %w", br, err)
	}
	if trim(b) != "1" {
		return false, 0, nil
	}
	p, _ := os.ReadFile(dir + "default_pvid")
	pvid, _ := strconv.Atoi(trim(p))
	return true, pvid, nil
}

// checkVLAN reports whether bridge br can hold VLAN vid (1 to 4094): it
// filters VLANs (ErrNoVLANFiltering when not). Any bridge can hold vid 0.
func checkVLAN(br string, vid int) error {
	if vid == 0 {
		return nil
	}
	on, _, err := vlanFiltering(br)
	if err != nil {
		return err
	}
	if !on {
		return fmt.Errorf("bridge %s %w (vlan_filtering 0): turn it on with ip link set %s type bridge vlan_filtering 1, and give its trunk ports the VLAN", br, ErrNoVLANFiltering, br)
	}
	return nil
}

// ensureAccessVLAN makes tap, a port of bridge br, an access port of VLAN
// vid: vid its only VLAN, its port VLAN id, egress untagged. vid 0 puts
// it back in the bridge's default VLAN (default_pvid) on a bridge that
// filters VLANs, and changes nothing on one that does not. Only the tap's
// own VLANs change; the bridge's and its other ports' are left as they
// are.
func ensureAccessVLAN(br string, tap netlink.Link, vid int) error {
	if err := checkVLAN(br, vid); err != nil {
		return err
	}
	on, pvid, err := vlanFiltering(br)
	switch {
	case vid == 0 && (err != nil || !on):
		return nil
	case vid == 0:
		vid = pvid
	}
	all, err := netlink.BridgeVlanList()
	if err != nil {
		return fmt.Errorf("tap %s: VLANs: %w", tap.Attrs().Name, err)
	}
	have := false
	for _, v := range all[int32(tap.Attrs().Index)] {
		const pvidUntagged = nl.BRIDGE_VLAN_INFO_PVID | nl.BRIDGE_VLAN_INFO_UNTAGGED
		if int(v.Vid) == vid && v.Flags&pvidUntagged == pvidUntagged {
			have = true
			continue
		}
		if err := netlink.BridgeVlanDel(tap, v.Vid, false, false, false, true); err != nil {
			return fmt.Errorf("tap %s: remove VLAN %d: %w", tap.Attrs().Name, v.Vid, err)
		}
	}
	if vid == 0 || have {
		return nil
	}
	if err := netlink.BridgeVlanAdd(tap, uint16(vid), true, true, false, true); err != nil {
		return fmt.Errorf("tap %s: VLAN %d: %w", tap.Attrs().Name, vid, err)
	}
	return nil
}
