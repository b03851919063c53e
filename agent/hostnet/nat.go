package hostnet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/gitfleet/gitfleet/desired"
)

// reservation is one VM's address on a nat network.
type reservation struct {
	MAC  string     `json:"mac"`
	Addr netip.Addr `json:"addr"`
}

// natSpec is what spec.json records of a nat network.
type natSpec struct {
	CIDR string `json:"cidr"`
	IPv6 string `json:"ipv6,omitempty"`
}

// nat is the network s records.
func (s natSpec) nat() desired.NAT { return desired.NAT{CIDR: s.CIDR, IPv6: s.IPv6} }

func (m *Manager) netDir(name string) string { return filepath.Join(m.cfg.Dir, name) }

// ensureNAT makes nat network name real; see Reconcile. Steps, in order:
// the host's own addresses and devices (a CIDR that overlaps them, or a
// device of the bridge's name the Manager did not make, changes nothing),
// state directory, bridge, forwarding, nftables, dnsmasq.
func (m *Manager) ensureNAT(ctx context.Context, name string, n desired.NAT) error {
	prefix, err := n.Prefix()
	if err != nil {
		return err
	}
	prefix6, err := n.Prefix6()
	if err != nil {
		return err
	}
	if err := hostConflict(prefix, m.ours(name)); err != nil {
		return err
	}
	if prefix6.IsValid() {
		if err := hostConflict(prefix6, m.ours(name)); err != nil {
			return err
		}
	}
	dir := m.netDir(name)
	br := desired.NATBridge(name)
	if err := m.foreignBridge(name); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	spec, _ := json.Marshal(natSpec{CIDR: n.CIDR, IPv6: n.IPv6})
	if b, err := os.ReadFile(filepath.Join(dir, SpecFile)); err != nil || !bytes.Equal(b, spec) {
		if err := writeFile(filepath.Join(dir, SpecFile), spec); err != nil {
			return fmt.Errorf("state directory: %w", err)
		}
	}
	gw := n.Gateway()
	var gw6 netip.Prefix
	if prefix6.IsValid() {
		gw6 = netip.PrefixFrom(n.Gateway6(), prefix6.Bits())
	}
	if _, err := ensureBridge(br, netip.PrefixFrom(gw, prefix.Bits()), gw6); err != nil {
		return err
	}
	if err := enableForwarding(); err != nil {
		return err
	}
	if prefix6.IsValid() {
		if err := enableForwarding6(); err != nil {
			return err
		}
	}
	hosts, err := m.readHosts(name)
	if err != nil {
		return err
	}
	if renumber(prefix, hosts) {
		if err := m.writeHosts(name, hosts); err != nil {
			return err
		}
		m.log.WithField("network", name).WithField("cidr", prefix).Info("reservations renumbered into the new CIDR")
	}
	// The tap filter binds each guest to its reservation: loaded once
	// the reservations are final.
	if err := m.ensureNftables(ctx); err != nil {
		return err
	}
	return m.ensureDnsmasq(ctx, name, n, hosts)
}

// refreshDnsmasq gives the dnsmasq of each nat network of names that runs
// (or ran: it has a configuration) the network's current reservations,
// restarting it when they changed, so a lease of a reservation gone goes
// with it at once (startDnsmasq). A network never ensured is left to its
// first ensure.
func (m *Manager) refreshDnsmasq(ctx context.Context, names []string) error {
	var errs []error
	for _, name := range names {
		if _, err := os.Stat(filepath.Join(m.netDir(name), DnsmasqConf)); err != nil {
			continue
		}
		var s natSpec
		if err := readJSON(filepath.Join(m.netDir(name), SpecFile), &s); err != nil {
			errs = append(errs, err)
			continue
		}
		n := s.nat()
		if _, err := n.Prefix(); err != nil {
			errs = append(errs, fmt.Errorf("network %s: %w", name, err))
			continue
		}
		hosts, err := m.readHosts(name)
		if err == nil {
			err = m.ensureDnsmasq(ctx, name, n, hosts)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("network %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// foreignBridge reports (ErrHostConflict) a device of nat network name's
// bridge name that this Manager did not make: one that exists while the
// network has no spec file, which the Manager writes before it makes the
// bridge. The Manager never takes over, readdresses or deletes it.
func (m *Manager) foreignBridge(name string) error {
	br := desired.NATBridge(name)
	if _, err := os.Stat(filepath.Join(m.netDir(name), SpecFile)); !errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if _, err := netlink.LinkByName(br); err == nil {
		return fmt.Errorf("device %s exists and the agent did not make it: rename that device or the network (%w)", br, ErrHostConflict)
	}
	return nil
}

// renumber gives every reservation that is no guest address of prefix (the
// network's CIDR changed) a new one, and reports whether any changed.
// Guests move to it at their next DHCP renewal, when dnsmasq refuses the
// old address.
func renumber(prefix netip.Prefix, hosts map[string]reservation) bool {
	taken := map[netip.Addr]string{}
	for vm, r := range hosts {
		taken[r.Addr] = vm
	}
	changed := false
	for _, vm := range sortedKeys(hosts) {
		r := hosts[vm]
		if guestAddr(prefix, r.Addr) {
			continue
		}
		a, err := pick(prefix, vm, taken)
		if err != nil {
			continue // the network is full; the VM's next Attach reports it
		}
		delete(taken, r.Addr)
		taken[a] = vm
		r.Addr = a
		hosts[vm] = r
		changed = true
	}
	return changed
}

// guestAddr reports whether a is an address prefix can give a guest: inside
// it, and neither its network, first (the bridge's) nor broadcast address.
func guestAddr(prefix netip.Prefix, a netip.Addr) bool {
	return prefix.Contains(a) && a != prefix.Addr() && a != prefix.Addr().Next() && a != desired.Broadcast(prefix)
}

// enableForwarding turns IPv4 forwarding on (net.ipv4.ip_forward=1, for
// the whole network namespace: the kernel has no per-bridge switch that
// masquerading can use).
func enableForwarding() error {
	const f = "/proc/sys/net/ipv4/ip_forward"
	b, err := os.ReadFile(f)
	if err == nil && trim(b) == "1" {
		return nil
	}
	if err := os.WriteFile(f, []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("enable IPv4 forwarding: %w", err)
	}
	return nil
}

// enableForwarding6 turns IPv6 forwarding on for the whole network
// namespace (net.ipv6.conf.all.forwarding=1; the kernel forwards IPv6 by
// that switch alone). A forwarding host ignores router advertisements on
// every interface whose accept_ra is 1, so a host that takes its own
// IPv6 route from them would lose it: an interface with a route learned
// from an advertisement and accept_ra 1 is an ErrHostConflict, naming the
// interface and the setting that keeps its route (accept_ra=2), and
// forwarding is left off, as libvirt does.
func enableForwarding6() error {
	const f = "/proc/sys/net/ipv6/conf/all/forwarding"
	b, err := os.ReadFile(f)
	if err == nil && trim(b) == "1" {
		return nil
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Protocol: unix.RTPROT_RA}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return fmt.Errorf("enable IPv6 forwarding: list routes: %w", err)
	}
	for _, r := range routes {
		l, err := netlink.LinkByIndex(r.LinkIndex)
		if err != nil {
			continue
		}
		name := l.Attrs().Name
		ra, _ := os.ReadFile("/proc/sys/net/ipv6/conf/" + name + "/accept_ra")
		if trim(ra) == "1" {
			return fmt.Errorf("enable IPv6 forwarding: interface %s takes IPv6 route %s from router advertisements, which the kernel ignores once forwarding is on; set net.ipv6.conf.%s.accept_ra=2 to keep it (%w)", name, r.Dst, name, ErrHostConflict)
		}
	}
	if err := os.WriteFile(f, []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("enable IPv6 forwarding: %w", err)
	}
	return nil
}

// teardown removes nat network name: dnsmasq, bridge, its rules and its
// directory (leases and reservations with it).
func (m *Manager) teardown(ctx context.Context, name string) error {
	dir := m.netDir(name)
	if pid := m.dnsmasqPid(name); pid != 0 {
		if err := stopProcess(pid); err != nil {
			return fmt.Errorf("stop dnsmasq: %w", err)
		}
	}
	if err := deleteLink(desired.NATBridge(name)); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(dir, SpecFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := m.ensureNftables(ctx); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	m.log.WithField("network", name).Info("nat network removed")
	return nil
}

// readHosts reads nat network name's reservations by VM name.
func (m *Manager) readHosts(name string) (map[string]reservation, error) {
	hosts := map[string]reservation{}
	if err := readJSON(filepath.Join(m.netDir(name), HostsFile), &hosts); err != nil {
		return nil, fmt.Errorf("reservations: %w", err)
	}
	return hosts, nil
}

func (m *Manager) writeHosts(name string, hosts map[string]reservation) error {
	b, err := json.MarshalIndent(hosts, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(m.netDir(name), 0o700); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(m.netDir(name), HostsFile), append(b, '\n')); err != nil {
		return fmt.Errorf("reservations: %w", err)
	}
	return nil
}

// reserve returns VM vm's address on nat network name, recording it: see
// Attach. A changed MAC or static address replaces the old reservation.
func (m *Manager) reserve(name string, prefix netip.Prefix, vm string, mac net.HardwareAddr, static netip.Addr) (netip.Addr, error) {
	hosts, err := m.readHosts(name)
	if err != nil {
		return netip.Addr{}, err
	}
	taken := map[netip.Addr]string{}
	for other, r := range hosts {
		if other != vm {
			taken[r.Addr] = other
		}
	}
	old, had := hosts[vm]
	var addr netip.Addr
	switch {
	case static.IsValid():
		if other, ok := taken[static]; ok {
			return netip.Addr{}, fmt.Errorf("static address %s on network %s is reserved for VM %s", static, name, other)
		}
		addr = static
	case had && guestAddr(prefix, old.Addr):
		addr = old.Addr
	default:
		if addr, err = pick(prefix, vm, taken); err != nil {
			return netip.Addr{}, fmt.Errorf("network %s: %w", name, err)
		}
	}
	r := reservation{MAC: mac.String(), Addr: addr}
	if had && old == r {
		return addr, nil
	}
	hosts[vm] = r
	if err := m.writeHosts(name, hosts); err != nil {
		return netip.Addr{}, err
	}
	m.log.WithField("network", name).WithField("vm", vm).WithField("ip", addr).Info("address reserved")
	return addr, nil
}

// pick chooses a free guest address in prefix for vm: the host part starts
// at a position derived from the name (so a VM tends to get the same
// address on every host and after a re-create) and moves up past taken
// ones. The network, gateway (first) and broadcast addresses are never
// picked.
func pick(prefix netip.Prefix, vm string, taken map[netip.Addr]string) (netip.Addr, error) {
	size := uint32(1) << (32 - prefix.Bits())
	pool := size - 3 // minus network, gateway, broadcast
	h := sha256.Sum256([]byte("gitfleet-ip:" + vm))
	start := binary.BigEndian.Uint32(h[:4]) % pool
	base := binary.BigEndian.Uint32(prefix.Addr().AsSlice())
	for i := uint32(0); i < pool; i++ {
		host := 2 + (start+i)%pool
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], base+host)
		a := netip.AddrFrom4(b)
		if _, ok := taken[a]; !ok {
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no free address left in %s", prefix)
}

// renderDnsmasq is dnsmasq's configuration for nat network name: DHCP and
// DNS on its bridge only, and DHCP for the reserved MACs alone: a client
// no dhcp-host line names (tag "known") is ignored, as are the client
// identifiers and host names clients send, so a guest neither gets an
// address nor releases or renames a lease in another's name, nor makes
// dnsmasq answer (or log) the clients a flood makes up.
func (m *Manager) renderDnsmasq(name string, n desired.NAT, hosts map[string]reservation) []byte {
	dir := m.netDir(name)
	prefix, _ := n.Prefix()
	prefix6, _ := n.Prefix6()
	gw := n.Gateway()
	var b strings.Builder
	fmt.Fprintf(&b, "# gitfleet nat network %s (%s); rendered by the agent, do not edit\n", name, prefix)
	fmt.Fprintf(&b, "interface=%s\nbind-interfaces\nexcept-interface=lo\nlisten-address=%s\n", desired.NATBridge(name), gw)
	if prefix6.IsValid() {
		// Router advertisements of the prefix, for SLAAC, with this
		// dnsmasq as the DNS server (RDNSS) and stateless DHCPv6 for
		// the same: no address is leased over DHCPv6, so a guest's one
		// global address is its EUI-64 one, which the tap filter holds
		// it to.
		fmt.Fprintf(&b, "listen-address=%s\nenable-ra\n", n.Gateway6())
		fmt.Fprintf(&b, "dhcp-range=%s,ra-stateless,%d,1h\n", prefix6.Addr(), prefix6.Bits())
		fmt.Fprintf(&b, "dhcp-option=option6:dns-server,[%s]\n", n.Gateway6())
	}
	fmt.Fprintf(&b, "pid-file=%s\ndhcp-leasefile=%s\nlog-facility=%s\n", filepath.Join(dir, DnsmasqPid), filepath.Join(dir, LeasesFile), filepath.Join(dir, DnsmasqLog))
	mask := net.IP(net.CIDRMask(prefix.Bits(), 32)).String()
	fmt.Fprintf(&b, "dhcp-range=%s,static,%s,1h\n", prefix.Addr(), mask)
	fmt.Fprintf(&b, "dhcp-option=option:router,%s\ndhcp-option=option:dns-server,%s\n", gw, gw)
	// quiet-dhcp: dnsmasq logs only its errors, so a guest's leases write
	// nothing to the host's disk (what it still logs is bounded:
	// DnsmasqLogMax).
	b.WriteString("dhcp-authoritative\nno-hosts\ndomain-needed\nbogus-priv\nquiet-dhcp\n")
	b.WriteString("dhcp-ignore=tag:!known\ndhcp-ignore-clid\ndhcp-ignore-names\n")
	for _, vm := range sortedKeys(hosts) {
		r := hosts[vm]
		fmt.Fprintf(&b, "dhcp-host=%s,%s,%s\n", r.MAC, r.Addr, vm)
	}
	return []byte(b.String())
}

// ensureDnsmasq makes one dnsmasq run with the current configuration for
// nat network name: it adopts a running one whose configuration is
// unchanged, restarts one whose configuration changed (its leases stay in
// the lease file), and starts one when none runs.
func (m *Manager) ensureDnsmasq(ctx context.Context, name string, n desired.NAT, hosts map[string]reservation) error {
	conf := filepath.Join(m.netDir(name), DnsmasqConf)
	want := m.renderDnsmasq(name, n, hosts)
	have, _ := os.ReadFile(conf)
	pid := m.dnsmasqPid(name)
	if pid != 0 && bytes.Equal(have, want) {
		return nil
	}
	if pid != 0 {
		if err := stopProcess(pid); err != nil {
			return fmt.Errorf("restart dnsmasq: %w", err)
		}
	}
	if !bytes.Equal(have, want) {
		if err := writeFile(conf, want); err != nil {
			return fmt.Errorf("dnsmasq config: %w", err)
		}
	}
	return m.startDnsmasq(ctx, name)
}

// DnsmasqLogMax bounds, in bytes, every file a nat network's dnsmasq
// writes: its log (and so the disk a guest can make it fill between two
// of the agent's ticks) and its lease file (room for some 8,000 leases).
// dnsmasq runs with that file size limit (RLIMIT_FSIZE, with SIGXFSZ
// ignored: a write past it fails and dnsmasq goes on), and Guard moves a
// log past half of it to DnsmasqLog+".1" (replacing the older one), so a
// network's logs take at most twice DnsmasqLogMax.
const DnsmasqLogMax = 1 << 20

// startDnsmasq starts nat network name's dnsmasq with the configuration
// file it has, and waits (up to 10 s) for its pidfile. dnsmasq reads its
// lease file only as it starts: the leases of addresses no longer
// reserved for their MAC (a VM destroyed, moved or renumbered) are
// dropped from it first, so they neither outlive their VM in status nor
// keep their address from the VM it is reserved for now.
func (m *Manager) startDnsmasq(ctx context.Context, name string) error {
	conf := filepath.Join(m.netDir(name), DnsmasqConf)
	os.Remove(filepath.Join(m.netDir(name), DnsmasqPid))
	if err := m.pruneLeases(name); err != nil {
		return fmt.Errorf("start dnsmasq: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// dnsmasq forks into the background, writes its pidfile and the
	// parent exits: a session of its own keeps it out of the agent's
	// process group, so it outlives the agent like the guests. The shell
	// sets the file size limit (POSIX ulimit -f counts 512-byte blocks)
	// and ignores SIGXFSZ, which dnsmasq inherits through exec.
	limit := fmt.Sprintf("trap '' XFSZ && ulimit -f %d && exec \"$0\" \"$@\"", DnsmasqLogMax/512)
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", limit, m.cfg.Dnsmasq, "--conf-file="+conf)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("start dnsmasq: %v: %s", err, trim(out))
	}
	for m.dnsmasqPid(name) == 0 {
		if ctx.Err() != nil {
			return fmt.Errorf("start dnsmasq: no pidfile within 10s (see %s)", filepath.Join(m.netDir(name), DnsmasqLog))
		}
		time.Sleep(20 * time.Millisecond)
	}
	m.log.WithField("network", name).WithField("pid", m.dnsmasqPid(name)).Info("dnsmasq started")
	return nil
}

// dnsmasqPid is the pid of nat network name's dnsmasq when it runs: its
// pidfile names a live process whose command line carries this network's
// configuration file, so a reused pid never passes. 0 otherwise.
func (m *Manager) dnsmasqPid(name string) int {
	b, err := os.ReadFile(filepath.Join(m.netDir(name), DnsmasqPid))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(trim(b))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return 0
	}
	want := "--conf-file=" + filepath.Join(m.netDir(name), DnsmasqConf)
	for _, a := range strings.Split(string(cmdline), "\x00") {
		if a == want {
			return pid
		}
	}
	return 0
}

// capLog moves dnsmasq's log at path to path+".1" (replacing the older
// one) once it holds more than half of DnsmasqLogMax: copied, then
// truncated in place, since dnsmasq keeps it open and appends (O_APPEND)
// at the new end. Lines dnsmasq writes during the copy can be lost.
func capLog(path string) error {
	fi, err := os.Stat(path)
	if err != nil || fi.Size() <= DnsmasqLogMax/2 {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("dnsmasq log: %w", err)
	}
	if err := writeFile(path+".1", b); err != nil {
		return fmt.Errorf("dnsmasq log: %w", err)
	}
	if err := os.Truncate(path, 0); err != nil {
		return fmt.Errorf("dnsmasq log: %w", err)
	}
	return nil
}

// stopProcess sends SIGTERM to pid and waits up to 5 s for it to go, then
// SIGKILLs it.
func stopProcess(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return err
	}
	for i := 0; i < 250; i++ {
		if syscall.Kill(pid, 0) != nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// lease is one line of a dnsmasq lease file: "<expiry> <mac> <ip>
// <hostname> <client-id>", expiry in seconds since the epoch (0: never).
type lease struct {
	Expiry int64
	MAC    string
	Addr   netip.Addr
}

// readLeases reads the IPv4 leases of a dnsmasq lease file (none when it
// does not exist), with every line as it is, lease or not (nil for a line
// that is no IPv4 lease).
func readLeases(path string) (lines []string, leases []*lease, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if l == "" {
			continue
		}
		lines = append(lines, l)
		fields := strings.Fields(l)
		var le *lease
		if len(fields) >= 3 {
			exp, err1 := strconv.ParseInt(fields[0], 10, 64)
			a, err2 := netip.ParseAddr(fields[2])
			if mac := parseMAC(fields[1]); err1 == nil && err2 == nil && a.Is4() && mac != "" {
				le = &lease{Expiry: exp, MAC: mac, Addr: a}
			}
		}
		leases = append(leases, le)
	}
	return lines, leases, nil
}

// current reports whether l holds at now.
func (l *lease) current(now time.Time) bool { return l.Expiry == 0 || l.Expiry > now.Unix() }

// leaseFor finds mac's address in a dnsmasq lease file: of its leases,
// the one that ends last; invalid when there is none.
func leaseFor(path string, mac net.HardwareAddr) (netip.Addr, error) {
	_, leases, err := readLeases(path)
	var found netip.Addr
	var latest int64 = -1
	for _, l := range leases {
		if l == nil || l.MAC != mac.String() || l.Expiry < latest {
			continue
		}
		found, latest = l.Addr, l.Expiry
	}
	return found, err
}

// pruneLeases drops from nat network name's lease file every lease that
// is not of an address reserved for its MAC. Call it only while the
// network's dnsmasq does not run (it rewrites the file on every change).
func (m *Manager) pruneLeases(name string) error {
	hosts, err := m.readHosts(name)
	if err != nil {
		return err
	}
	reserved := map[string]bool{}
	for _, r := range hosts {
		reserved[parseMAC(r.MAC)+" "+r.Addr.String()] = true
	}
	path := filepath.Join(m.netDir(name), LeasesFile)
	lines, leases, err := readLeases(path)
	if err != nil {
		return fmt.Errorf("leases: %w", err)
	}
	var keep []string
	for i, l := range leases {
		if l != nil && !reserved[l.MAC+" "+l.Addr.String()] {
			m.log.WithField("network", name).WithField("mac", l.MAC).WithField("ip", l.Addr).Info("lease of an address no longer reserved for its MAC released")
			continue
		}
		keep = append(keep, lines[i]+"\n")
	}
	if len(keep) == len(lines) {
		return nil
	}
	if err := writeFile(path, []byte(strings.Join(keep, ""))); err != nil {
		return fmt.Errorf("leases: %w", err)
	}
	return nil
}

// ErrAddressHeld: the address a nat network reserves for a VM's MAC is
// leased to another MAC, so the VM's guest cannot have it. Unleased
// returns it wrapped, naming that MAC.
var ErrAddressHeld = errors.New("is leased to another MAC")

// ErrNoLease: dnsmasq holds no lease for a VM's MAC of the address its
// nat network reserves for it (the guest has not asked yet, or was
// refused), or no address is reserved for the MAC. Unleased returns it
// wrapped.
var ErrNoLease = errors.New("no lease")

// Unleased reports whether the guest whose NIC has mac holds the lease of
// the address nat network name reserves for that MAC, as dnsmasq's lease
// file says now: nil when it does; wrapping ErrAddressHeld, naming the
// holder's MAC, when a lease of the address that has not ended is another
// MAC's; wrapping ErrNoLease otherwise. It reads files only.
func (m *Manager) Unleased(name string, mac net.HardwareAddr) error {
	hosts, err := m.readHosts(name)
	if err != nil {
		return err
	}
	var addr netip.Addr
	for _, r := range hosts {
		if parseMAC(r.MAC) == mac.String() {
			addr = r.Addr
		}
	}
	if !addr.IsValid() {
		return fmt.Errorf("network %s reserves no address for MAC %s: %w", name, mac, ErrNoLease)
	}
	_, leases, err := readLeases(filepath.Join(m.netDir(name), LeasesFile))
	if err != nil {
		return fmt.Errorf("network %s: leases: %w", name, err)
	}
	now := time.Now()
	for _, l := range leases {
		if l == nil || l.Addr != addr || !l.current(now) {
			continue
		}
		if l.MAC == mac.String() {
			return nil
		}
		return fmt.Errorf("address %s reserved for MAC %s on network %s %w %s", addr, mac, name, ErrAddressHeld, l.MAC)
	}
	return fmt.Errorf("%w of address %s for MAC %s on network %s", ErrNoLease, addr, mac, name)
}
