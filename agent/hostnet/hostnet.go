// Package hostnet owns the host side of VM networking: the host networks a
// Host spec names, a tap per VM NIC, and the addresses guests get on them.
//
// A bridge network is an existing host bridge (the LAN): the Manager only
// checks that it exists and adds taps to it; it never creates, changes or
// deletes the bridge. A nat network is the Manager's own: bridge
// gf-<name> holding the CIDR's first address, one dnsmasq for DHCP and DNS
// that answers the reserved MACs alone, IPv4 forwarding, and the nftables
// table "inet gitfleet" (masquerading out of the host, an input rule that
// lets guests reach the host only for DHCP, DNS and ping, and, with
// UserMode, an output rule that keeps QEMU's user-mode networking off the
// nat networks).
//
// Every tap the Manager makes is a NIC of a VM, held by the table "bridge
// gitfleet" to the MAC the VM's NIC was given; on a nat network also to
// the addresses reserved for that MAC, and away from every DHCP, DHCPv6
// and IPv6 router's message (tapfilter.go): a guest there is a client of
// its network and nothing more.
//
// Everything the Manager keeps lives under Config.Dir, one directory per
// nat network:
//
//	<dir>/<network>/spec.json     the network as last ensured (CIDR)
//	<dir>/<network>/hosts.json    address reservations: VM name -> MAC, IPv4
//	<dir>/<network>/dnsmasq.conf  dnsmasq's configuration, rendered from both
//	<dir>/<network>/dnsmasq.pid   dnsmasq's pidfile
//	<dir>/<network>/leases        dnsmasq's lease file
//	<dir>/<network>/dnsmasq.log   dnsmasq's log (at most DnsmasqLogMax)
//	<dir>/<network>/dnsmasq.log.1 the log before, moved aside by Guard
//	<dir>/nftables.conf           the table last loaded
//	<dir>/nftables.list           the kernel's listing of it then
//	<dir>/taps.json               the taps made: tap -> the VM's MAC
//
// Every operation is idempotent and safe to repeat after a crash or an
// agent restart: an existing bridge, tap, reservation or table is kept; a
// dnsmasq that runs with the current configuration (found by pidfile and
// its command line) is adopted, never started twice; one that died is
// started again. dnsmasq and the taps outlive the agent, like the guests.
//
// A Manager is safe for concurrent use; its operations are serialized. It
// reads and writes no branch file: the agent hands it the networks of the
// Host spec its snapshot carries.
package hostnet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"

	"github.com/gitfleet/gitfleet/desired"
)

// Files of a nat network's directory, and the Manager's own.
const (
	SpecFile     = "spec.json"
	HostsFile    = "hosts.json"
	DnsmasqConf  = "dnsmasq.conf"
	DnsmasqPid   = "dnsmasq.pid"
	LeasesFile   = "leases"
	DnsmasqLog   = "dnsmasq.log"
	NftablesFile = "nftables.conf"
	// NftablesListFile is the kernel's listing of the table as last
	// loaded (nft list table inet gitfleet), to find it changed.
	NftablesListFile = "nftables.list"
	// TapsFile records the taps the Manager made: tap -> the MAC of the
	// VM's NIC and whether the tap is on a nat network (JSON tapRecord),
	// for the tap filter, which takes a nat tap's addresses from the
	// reservations of its MAC.
	TapsFile = "taps.json"
)

// ErrBridgeMissing: the bridge a bridge network names is not a device of
// this host (yet). The Manager never creates it; Attach, Check and
// Reconcile return it wrapped, with the bridge's name.
var ErrBridgeMissing = errors.New("does not exist on this host")

// ErrHostConflict: a nat network would take what the host itself uses:
// its CIDR overlaps an address or route of the host's (its LAN, a VPN, a
// container network), or a device of its bridge's name exists that the
// Manager did not make. The Manager leaves such a network unmade,
// changing nothing, until the conflict goes; Attach, Check and Reconcile
// return it wrapped, naming the route or the device.
var ErrHostConflict = errors.New("conflict with the host's own network")

// ErrHostAddress: an address is one of the host's own, so no guest holds
// it (Holder).
var ErrHostAddress = errors.New("(no guest holds it)")

// TapPrefix starts the name of every tap the Manager makes.
const TapPrefix = "gft"

// TapName is the tap of VM vm's first NIC: TapPrefix and 12 hex digits
// of the sha256 of the name, 15 characters (Linux's limit), the same on
// every call, so a restarted agent finds the tap it made.
func TapName(vm string) string { return NICTap(vm, 0) }

// NICTap is the tap of NIC index i (0-based) of VM vm: TapName for the
// first, and for the others the same from the name with "#<i>" after it.
func NICTap(vm string, i int) string {
	seed := "gitfleet-tap:" + vm
	if i > 0 {
		seed += "#" + strconv.Itoa(i)
	}
	h := sha256.Sum256([]byte(seed))
	return TapPrefix + hex.EncodeToString(h[:])[:12]
}

// NIC is the NIC of a VM that Attach and Reserve put on a network.
type NIC struct {
	// VM is the VM's name.
	VM string
	// Index is the NIC's position among the VM's NICs (0-based); it
	// names the tap (NICTap).
	Index int
	// MAC is the NIC's MAC address; the tap filter holds the guest to it.
	MAC net.HardwareAddr
	// Static is the VM's static IPv4 on a nat network, invalid when none.
	Static netip.Addr
	// Networks are the networks of all the VM's NICs, in order: Attach
	// releases the VM's reservations on every other nat network, and
	// removes the taps of NICs past the last. nil keeps only the network
	// attached to, as for a VM of one NIC.
	Networks []string
}

// Config configures a Manager. Zero values take the defaults given.
type Config struct {
	// Dir holds the state of the nat networks (created 0700). Required.
	Dir string
	// Dnsmasq is the dnsmasq binary (default: found in PATH).
	Dnsmasq string
	// Nft is the nft binary (default: found in PATH).
	Nft string
	// Logger receives the Manager's logs (default: logrus' standard
	// logger), with component=hostnet.
	Logger logrus.FieldLogger
}

// Manager ensures host networks and VM taps. See the package comment.
type Manager struct {
	cfg Config
	log *logrus.Entry
	mu  sync.Mutex
	// named holds the nat networks the last Reconcile was given (nil
	// before the first): their bridges are no conflict for each other.
	named map[string]bool
	// userModeUID is QEMU's user, whose sockets reach no nat network
	// (UserMode); 0 for none.
	userModeUID int
}

// UserMode names uid, the user QEMU runs as (-runas), whose sockets carry
// the user-mode networking of the VMs on no host network: their
// connections leave the host's own stack, where the nat networks' forward
// rules never see them, so the table "inet gitfleet" refuses every
// connection of that user to an address of a nat network (its CIDR, the
// bridge's address included). 0, the default, names none (QEMU that runs
// as root or as the agent's own user, which the agent warns of). The rule
// is loaded at the next operation that ensures the tables (Reconcile,
// Attach, Guard); call UserMode before the first.
func (m *Manager) UserMode(uid int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.userModeUID = uid
}

// ours reports whether the bridge of nat network net is no conflict for
// nat network name: its own, or another the Host spec names. Before the
// first Reconcile every nat network counts as named.
func (m *Manager) ours(name string) func(string) bool {
	return func(net string) bool { return net == name || m.named == nil || m.named[net] }
}

// Attachment is where a VM's NIC was attached.
type Attachment struct {
	// Tap is the tap device QEMU opens (-netdev tap,ifname=Tap).
	Tap string
	// Bridge is the bridge the tap is a port of.
	Bridge string
	// Address is the VM's reserved address on a nat network (its dnsmasq
	// host entry); invalid on a bridge network.
	Address netip.Addr
	// Gateway is the nat network's bridge address: the guest's default
	// route and DNS server; invalid on a bridge network.
	Gateway netip.Addr
	// Prefix is the nat network's CIDR; invalid on a bridge network.
	Prefix netip.Prefix
}

// New checks cfg and returns a Manager. It changes nothing on the host.
func New(cfg Config) (*Manager, error) {
	if cfg.Dir == "" {
		return nil, errors.New("hostnet: Config.Dir is required")
	}
	if cfg.Dnsmasq == "" {
		cfg.Dnsmasq = "dnsmasq"
	}
	if cfg.Nft == "" {
		cfg.Nft = "nft"
	}
	if cfg.Logger == nil {
		cfg.Logger = logrus.StandardLogger()
	}
	return &Manager{cfg: cfg, log: cfg.Logger.WithField("component", "hostnet")}, nil
}

// Reconcile makes the host's networks match nets, a Host spec's networks.
// First a nat network this Manager made that nets no longer names is torn
// down (dnsmasq stopped, bridge and rules removed, its directory deleted)
// unless inUse names it (a VM record still lists it; when nets now names
// it as a bridge network, only while a tap is still a port of its bridge)
// or inUse is nil (what VMs use is unknown: nothing is torn down), so a
// network renamed in the
// spec can take the CIDR of the one it replaced. Then every nat network is
// ensured (bridge and address, forwarding, nftables, a running dnsmasq:
// one that died is started again), unless its CIDR overlaps the host's own
// addresses and routes or a kept network (ErrHostConflict: nothing is
// changed for it), and every bridge network's bridge is checked to exist.
// It tries every network and returns the errors joined.
func (m *Manager) Reconcile(ctx context.Context, nets map[string]desired.Network, inUse map[string]bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	names := sortedKeys(nets)
	m.named = map[string]bool{}
	for _, name := range names {
		if nets[name].NAT != nil {
			m.named[name] = true
		}
	}
	// Unused networks go first: a network renamed in the spec may take
	// the CIDR of the one it replaces.
	made, err := m.natNetworks()
	if err != nil {
		errs = append(errs, err)
	}
	for _, name := range made {
		n, named := nets[name]
		if named && n.NAT != nil {
			continue
		}
		used := inUse == nil || inUse[name]
		// A name the spec now gives a bridge network: the VMs that name
		// it move to the bridge as they boot, and the nat network is
		// used only while a tap is still a port of its bridge.
		if named && inUse != nil && used {
			ports, err := bridgePorts(desired.NATBridge(name))
			if err != nil {
				errs = append(errs, fmt.Errorf("network %s: %w", name, err))
				continue
			}
			used = ports > 0
		}
		if used {
			m.log.WithField("network", name).Info("network no longer named by the host but still used by a VM; kept")
			continue
		}
		if err := m.teardown(ctx, name); err != nil {
			errs = append(errs, fmt.Errorf("network %s: teardown: %w", name, err))
		}
	}
	for _, name := range names {
		n := nets[name]
		var err error
		if n.NAT != nil {
			err = m.ensureNAT(ctx, name, *n.NAT)
		} else {
			_, err = bridgeLink(n.Bridge)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("network %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// Attach ensures network name (def) and the tap of nic on it, up and a
// port of the network's bridge, and returns the attachment. On a nat
// network it also reserves the VM's address for nic.MAC: nic.Static when
// valid (the VM's static address; an error when another VM holds it),
// else the address reserved before, else a free one chosen from the VM's
// name; the tap filter holds the guest to that address. A VM moved off a
// nat network (none of nic.Networks) loses its reservation and lease
// there (see Detach), and the taps of NICs it no longer has are removed.
// Attaching an attached NIC is a no-op that returns the same attachment.
func (m *Manager) Attach(ctx context.Context, name string, def desired.Network, nic NIC) (Attachment, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var a Attachment
	vm, mac, static := nic.VM, nic.MAC, nic.Static
	keep := nic.Networks
	if keep == nil {
		keep = []string{name}
	}
	left, err := m.release(vm, keep...)
	if err != nil {
		return a, err
	}
	if err := m.dropTaps(ctx, vm, max(len(keep), nic.Index+1)); err != nil {
		return a, err
	}
	if err := m.refreshDnsmasq(ctx, left); err != nil {
		return a, err
	}
	if def.NAT != nil {
		prefix, err := def.NAT.Prefix()
		if err != nil {
			return a, err
		}
		addr, err := m.reserve(name, prefix, vm, mac, static)
		if err != nil {
			return a, err
		}
		if err := m.ensureNAT(ctx, name, *def.NAT); err != nil {
			return a, fmt.Errorf("network %s: %w", name, err)
		}
		a.Bridge, a.Address, a.Gateway, a.Prefix = desired.NATBridge(name), addr, def.NAT.Gateway(), prefix
	} else {
		a.Bridge = def.Bridge
	}
	br, err := bridgeLink(a.Bridge)
	if err != nil {
		return a, fmt.Errorf("network %s: %w", name, err)
	}
	a.Tap = NICTap(vm, nic.Index)
	if err := ensureTap(a.Tap, br); err != nil {
		return a, fmt.Errorf("network %s: %w", name, err)
	}
	if def.NAT == nil {
		tap, err := netlink.LinkByName(a.Tap)
		if err == nil {
			err = ensureAccessVLAN(a.Bridge, tap, def.VLAN)
		}
		if err != nil {
			return a, fmt.Errorf("network %s: %w", name, err)
		}
	}
	if err := m.recordTap(ctx, a.Tap, tapRecord{MAC: mac.String(), NAT: def.NAT != nil}); err != nil {
		return a, fmt.Errorf("network %s: %w", name, err)
	}
	return a, nil
}

// tapRecord is what TapsFile records of one tap.
type tapRecord struct {
	// MAC is the MAC address of the VM's NIC.
	MAC string `json:"mac"`
	// NAT is set for a tap on a nat network.
	NAT bool `json:"nat,omitempty"`
}

// readTaps reads TapsFile.
func (m *Manager) readTaps() (map[string]tapRecord, error) {
	taps := map[string]tapRecord{}
	if err := readJSON(filepath.Join(m.cfg.Dir, TapsFile), &taps); err != nil {
		return nil, fmt.Errorf("taps: %w", err)
	}
	return taps, nil
}

// recordTap records tap as r (r.MAC "" removes it) in TapsFile, and loads
// the tap filter.
func (m *Manager) recordTap(ctx context.Context, tap string, r tapRecord) error {
	taps, err := m.readTaps()
	if err != nil {
		return err
	}
	if taps[tap] != r {
		if r.MAC == "" {
			delete(taps, tap)
		} else {
			taps[tap] = r
		}
		if err := m.writeTaps(taps); err != nil {
			return err
		}
	}
	return m.ensureNftables(ctx)
}

// writeTaps writes taps to TapsFile.
func (m *Manager) writeTaps(taps map[string]tapRecord) error {
	b, err := json.MarshalIndent(taps, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(m.cfg.Dir, 0o700); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(m.cfg.Dir, TapsFile), append(b, '\n')); err != nil {
		return fmt.Errorf("taps: %w", err)
	}
	return nil
}

// Check reports whether network name (def) can take a VM now, changing
// nothing: a bridge network's bridge must exist (ErrBridgeMissing when it
// does not); a nat network's CIDR must not overlap the host's own
// addresses and routes, nor its bridge's name be a device the Manager did
// not make (ErrHostConflict when either is).
func (m *Manager) Check(name string, def desired.Network) error {
	if def.NAT != nil {
		prefix, err := def.NAT.Prefix()
		if err != nil {
			return err
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if err := m.foreignBridge(name); err != nil {
			return fmt.Errorf("network %s: %w", name, err)
		}
		if err := hostConflict(prefix, m.ours(name)); err != nil {
			return fmt.Errorf("network %s: %w", name, err)
		}
		return nil
	}
	if _, err := bridgeLink(def.Bridge); err != nil {
		return fmt.Errorf("network %s: %w", name, err)
	}
	if err := checkVLAN(def.Bridge, def.VLAN); err != nil {
		return fmt.Errorf("network %s: %w", name, err)
	}
	return nil
}

// Reserve records VM vm's address on nat network name (def) as Attach
// would (static, else the one reserved before, else a free one), without
// making the network or a tap: the agent reserves the addresses of every
// VM a snapshot puts on a network before it ensures the network, so its
// dnsmasq starts with all of them. A bridge network takes no reservation.
func (m *Manager) Reserve(name string, def desired.Network, nic NIC) error {
	if def.NAT == nil {
		return nil
	}
	prefix, err := def.NAT.Prefix()
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	_, err = m.reserve(name, prefix, nic.VM, nic.MAC, nic.Static)
	return err
}

// Detach removes the taps of all VM vm's NICs and its address
// reservations, and releases its leases: the dnsmasq of each network it
// leaves restarts at once without them (in its lease file and its
// memory), so the VM's address is free for the next VM it is reserved
// for. Detaching a VM that has none is a no-op.
func (m *Manager) Detach(vm string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	ctx := context.Background()
	if err := m.dropTaps(ctx, vm, 0); err != nil {
		return fmt.Errorf("detach %s: %w", vm, err)
	}
	left, err := m.release(vm)
	if err != nil {
		return fmt.Errorf("detach %s: %w", vm, err)
	}
	if err := m.refreshDnsmasq(ctx, left); err != nil {
		return fmt.Errorf("detach %s: %w", vm, err)
	}
	return nil
}

// dropTaps removes the taps of VM vm's NICs from index from on (up to
// desired.MaxNICs) and their records; a tap that does not exist is
// skipped.
func (m *Manager) dropTaps(ctx context.Context, vm string, from int) error {
	taps, err := m.readTaps()
	if err != nil {
		return err
	}
	changed := false
	for i := from; i < desired.MaxNICs; i++ {
		tap := NICTap(vm, i)
		if err := deleteLink(tap); err != nil {
			return err
		}
		if _, ok := taps[tap]; ok {
			delete(taps, tap)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if err := m.writeTaps(taps); err != nil {
		return err
	}
	return m.ensureNftables(ctx)
}

// release drops VM vm's reservations on every nat network but those of
// keep, and returns the networks that lost one: their dnsmasq is to be
// refreshed (refreshDnsmasq), which releases the VM's lease there.
func (m *Manager) release(vm string, keep ...string) ([]string, error) {
	nets, err := m.natNetworks()
	if err != nil {
		return nil, err
	}
	var left []string
	for _, name := range nets {
		if slices.Contains(keep, name) {
			continue
		}
		hosts, err := m.readHosts(name)
		if err != nil {
			return left, err
		}
		if _, ok := hosts[vm]; !ok {
			continue
		}
		delete(hosts, vm)
		if err := m.writeHosts(name, hosts); err != nil {
			return left, err
		}
		left = append(left, name)
	}
	return left, nil
}

// Address reports the IPv4 address of the guest whose NIC has mac on
// network name: on a nat network its lease from dnsmasq's lease file; else
// (a bridge network, or a guest configured statically) the host's
// neighbour table entry for mac on the network's bridge, which the host
// learns once the guest talks to it. Invalid when unknown.
func (m *Manager) Address(name string, def desired.Network, mac net.HardwareAddr) netip.Addr {
	bridge := def.Bridge
	if def.NAT != nil {
		a, err := leaseFor(filepath.Join(m.cfg.Dir, name, LeasesFile), mac)
		if err != nil {
			m.log.WithField("network", name).WithError(err).Warn("read leases")
		}
		if a.IsValid() {
			return a
		}
		bridge = desired.NATBridge(name)
	}
	a, err := neighbourFor(bridge, mac)
	if err != nil {
		m.log.WithField("network", name).WithError(err).Debug("neighbour lookup")
	}
	return a
}

// Address6 reports the IPv6 address of the guest whose NIC has mac on
// nat network name (def) when the network has an IPv6 prefix: its SLAAC
// address (desired.SLAAC, the one global address the tap filter lets it
// use) once the host's neighbour table holds mac for it, which it does
// after the guest talked to the host from it. Invalid otherwise.
func (m *Manager) Address6(name string, def desired.Network, mac net.HardwareAddr) netip.Addr {
	if def.NAT == nil {
		return netip.Addr{}
	}
	p6, err := def.NAT.Prefix6()
	if err != nil || !p6.IsValid() {
		return netip.Addr{}
	}
	a := desired.SLAAC(p6, mac)
	got, err := holder(desired.NATBridge(name), a)
	if err != nil || got.String() != mac.String() {
		return netip.Addr{}
	}
	return a
}

// Guard keeps in place what the guests that run rely on from the host,
// changing nothing of what the networks are: the nftables tables (loaded
// again when missing or changed, see ensureNftables: their drop rules keep
// guests off the host and off each other) and the dnsmasq of every nat
// network this Manager made (one that died is started again with the
// configuration and leases it had, so guests renew their leases), whose
// log it keeps within DnsmasqLogMax. The agent calls it every tick, the
// host suspended or not.
func (m *Manager) Guard(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	errs := []error{m.ensureNftables(ctx)}
	made, err := m.natNetworks()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, name := range made {
		if err := capLog(filepath.Join(m.netDir(name), DnsmasqLog)); err != nil {
			errs = append(errs, fmt.Errorf("network %s: %w", name, err))
		}
		if m.dnsmasqPid(name) != 0 {
			continue
		}
		if _, err := os.Stat(filepath.Join(m.netDir(name), DnsmasqConf)); err != nil {
			continue // never started: Reconcile renders and starts it
		}
		m.log.WithField("network", name).Warn("dnsmasq is gone; starting it again")
		if err := m.startDnsmasq(ctx, name); err != nil {
			errs = append(errs, fmt.Errorf("network %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// Holder reports the MAC address of the machine that holds addr on
// network name (def), as the host's neighbour table knows it: nil when
// the host does not reach addr directly through the network's bridge (a
// bridge network whose subnet the host has no address in: nothing can be
// known) or holds no entry for it yet; ErrHostAddress when addr is the
// host's own. After the host talked to addr, a
// MAC other than a VM's says another machine answered at the VM's
// address.
func (m *Manager) Holder(name string, def desired.Network, addr netip.Addr) (net.HardwareAddr, error) {
	bridge := def.Bridge
	if def.NAT != nil {
		bridge = desired.NATBridge(name)
	}
	mac, err := holder(bridge, addr)
	if err != nil {
		return nil, fmt.Errorf("network %s: %w", name, err)
	}
	return mac, nil
}

// natNetworks lists the nat networks this Manager made: the directories
// under Dir holding a spec file.
func (m *Manager) natNetworks() ([]string, error) {
	entries, err := os.ReadDir(m.cfg.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list networks: %w", err)
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join(m.cfg.Dir, e.Name(), SpecFile)); err == nil {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// writeFile writes data to path through path+".partial" and a rename.
func writeFile(path string, data []byte) error {
	tmp := path + ".partial"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// readJSON reads path into v; a missing file leaves v as it is.
func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

func trim(b []byte) string { return strings.TrimSpace(string(b)) }
