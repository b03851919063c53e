package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/hostnet"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/status"
	"github.com/google/renameio/v2"
)

// NetFile records, in a VM's directory, the host network its NIC was last
// attached to (JSON netRecord), so Address knows where to look for the
// guest's address after an agent restart. Absent for user-mode networking.
const NetFile = "network.json"

// HostNetworks attaches VMs to host networks; *hostnet.Manager implements
// it. Methods are safe for concurrent use.
type HostNetworks interface {
	// Attach ensures network name (def) and the tap of a VM's NIC nic on
	// it. See hostnet.Manager.Attach.
	Attach(ctx context.Context, name string, def desired.Network, nic hostnet.NIC) (hostnet.Attachment, error)
	// Check reports whether network name (def) can take a VM now,
	// changing nothing; hostnet.ErrBridgeMissing when a bridge network's
	// bridge does not exist. See hostnet.Manager.Check.
	Check(name string, def desired.Network) error
	// Detach removes VM vm's tap and address reservations.
	Detach(vm string) error
	// Address is the guest's IPv4 address on network name, invalid when
	// unknown.
	Address(name string, def desired.Network, mac net.HardwareAddr) netip.Addr
	// Address6 is the guest's IPv6 address on nat network name, invalid
	// when unknown; see hostnet.Manager.Address6.
	Address6(name string, def desired.Network, mac net.HardwareAddr) netip.Addr
	// Reserve records the address of a VM's NIC nic on nat network name
	// (def) without touching the network; see hostnet.Manager.Reserve.
	Reserve(name string, def desired.Network, nic hostnet.NIC) error
	// Holder is the MAC address of the machine holding addr on network
	// name, as the host's neighbour table knows it; nil when that cannot
	// be known. See hostnet.Manager.Holder.
	Holder(name string, def desired.Network, addr netip.Addr) (net.HardwareAddr, error)
	// Guard keeps the host's side of running guests in place (nftables
	// tables, dnsmasq); see hostnet.Manager.Guard.
	Guard(ctx context.Context) error
	// Reconcile makes the host's networks match nets; see
	// agent.NetworkReconciler.
	Reconcile(ctx context.Context, nets map[string]desired.Network, inUse map[string]bool) error
	// Unleased reports whether the guest with mac holds the lease of the
	// address nat network name reserves for it; see
	// hostnet.Manager.Unleased.
	Unleased(name string, mac net.HardwareAddr) error
	// UserMode names the uid QEMU runs as, whose sockets carry the
	// user-mode networking of VMs on no host network, to keep them off
	// every nat network; see hostnet.Manager.UserMode.
	UserMode(uid int)
	// Health says what on the host keeps each network's guests' traffic
	// from flowing; see hostnet.Manager.Health.
	Health(ctx context.Context, nets map[string]desired.Network) map[string]string
}

var (
	_ HostNetworks                = (*hostnet.Manager)(nil)
	_ agent.NetworkReconciler     = (*Provisioner)(nil)
	_ agent.LeaseReporter         = (*Provisioner)(nil)
	_ agent.NetworkHealthReporter = (*Provisioner)(nil)
)

// netRecord is NetFile's content: the VM's first NIC, and in More the
// others, in order.
type netRecord struct {
	Network string            `json:"network"`
	Def     desired.Network   `json:"def"`
	Tap     string            `json:"tap"`
	MAC     string            `json:"mac"`
	Static  *desired.StaticIP `json:"static,omitempty"`
	More    []netRecord       `json:"more,omitempty"`
}

// nics is every NIC r records, the first one first.
func (r *netRecord) nics() []netRecord {
	if r == nil {
		return nil
	}
	first := *r
	first.More = nil
	return append([]netRecord{first}, r.More...)
}

// NetworkHealth implements agent.NetworkHealthReporter through
// Config.Networks (hostnet.Manager.Health); nil without it.
func (p *Provisioner) NetworkHealth(ctx context.Context, nets map[string]desired.Network) map[string]string {
	if p.cfg.Networks == nil {
		return nil
	}
	return p.cfg.Networks.Health(ctx, nets)
}

// ReconcileNetworks hands the host's networks to Config.Networks, first
// reserving each member's address on its nat network (the MAC and static
// address its Boot would attach with; static addresses before picked
// ones), so that the network's dnsmasq
// starts once, with every reservation, instead of restarting as each VM
// attaches. Without Config.Networks, a host that names networks is an
// error (VMs on them cannot boot).
func (p *Provisioner) ReconcileNetworks(ctx context.Context, nets map[string]desired.Network, members []agent.NetworkMember, inUse map[string]bool) error {
	if p.cfg.Networks == nil {
		if len(nets) > 0 {
			return errors.New("host networks: this agent runs without host networking")
		}
		return nil
	}
	var errs []error
	// Static addresses first: a VM picked a free address must not take
	// the one another VM of the same snapshot names as its static one.
	ordered := make([]agent.NetworkMember, 0, len(members))
	for _, static := range []bool{true, false} {
		for _, m := range members {
			if def, ok := nets[m.Network]; ok && staticOn(def, m.Static).IsValid() == static {
				ordered = append(ordered, m)
			}
		}
	}
	for _, m := range ordered {
		def, ok := nets[m.Network]
		if !ok || def.NAT == nil {
			continue
		}
		hw, err := net.ParseMAC(desired.NICMAC(m.VM, m.Index, desired.NIC{MAC: m.MAC}))
		if err != nil {
			return err
		}
		nic := hostnet.NIC{VM: m.VM, Index: m.Index, MAC: hw, Static: staticOn(def, m.Static)}
		if err := p.cfg.Networks.Reserve(m.Network, def, nic); err != nil {
			errs = append(errs, fmt.Errorf("vm %s: %w", m.VM, err))
		}
	}
	return errors.Join(append(errs, p.cfg.Networks.Reconcile(ctx, nets, inUse))...)
}

// staticOn is the first static address of s inside nat network def's
// CIDR: the address the VM's reservation holds (invalid when none).
func staticOn(def desired.Network, s *desired.StaticIP) netip.Addr {
	if def.NAT == nil || s == nil {
		return netip.Addr{}
	}
	cidr, _ := def.NAT.Prefix()
	for _, a := range s.Addresses {
		if pfx, err := netip.ParsePrefix(a); err == nil && cidr.Contains(pfx.Addr()) {
			return pfx.Addr()
		}
	}
	return netip.Addr{}
}

// attach puts each of the VM's NICs on its host network, or leaves the
// VM on user-mode networking when the spec names none: then it returns
// no attachments. It records the choice in NetFile; a VM on host
// networks keeps no SSH forward.
func (p *Provisioner) attach(ctx context.Context, st *vmState, m agent.Machine) ([]hostnet.Attachment, error) {
	nics := m.Spec.Interfaces()
	if len(nics) == 0 {
		// Back to user-mode networking: drop the taps and reservations
		// of the networks the VM was on.
		if _, err := os.Stat(st.path(NetFile)); err == nil && p.cfg.Networks != nil {
			if err := p.cfg.Networks.Detach(m.Name); err != nil {
				return nil, err
			}
		}
		if err := os.Remove(st.path(NetFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		return nil, nil
	}
	if err := nicsUsable(m); err != nil {
		return nil, err
	}
	names := make([]string, len(nics))
	for i, nic := range nics {
		names[i] = nic.Network
	}
	var atts []hostnet.Attachment
	var recs []netRecord
	for i, nic := range nics {
		def, err := p.nicNetwork(m, nic)
		if err != nil {
			return nil, err
		}
		mac := desired.NICMAC(m.Name, i, nic)
		hw, err := net.ParseMAC(mac)
		if err != nil {
			return nil, agent.Permanent(fmt.Errorf("nic %d: %w", i, err))
		}
		att, err := p.cfg.Networks.Attach(ctx, nic.Network, def,
			hostnet.NIC{VM: m.Name, Index: i, MAC: hw, Static: staticOn(def, nic.Static), Networks: names})
		if err != nil {
			return nil, waitForNetwork(err)
		}
		atts = append(atts, att)
		recs = append(recs, netRecord{Network: nic.Network, Def: def, Tap: att.Tap, MAC: mac, Static: nic.Static})
	}
	rec := recs[0]
	rec.More = recs[1:]
	if err := p.recordNetwork(st, m.Name, rec); err != nil {
		return nil, err
	}
	return atts, nil
}

// nicsUsable refuses, permanently, NICs a snapshot's checks should have
// kept from the agent (desired.CheckNICs): too many, one MAC twice.
func nicsUsable(m agent.Machine) error {
	if probs := desired.CheckNICs(&m.Spec); len(probs) > 0 {
		return agent.Permanent(fmt.Errorf("%s: %s", probs[0].Field, probs[0].Msg))
	}
	return nil
}

// nicNetwork is the definition of the network NIC nic of m names.
func (p *Provisioner) nicNetwork(m agent.Machine, nic desired.NIC) (desired.Network, error) {
	def, ok := m.Networks[nic.Network]
	switch {
	case !ok:
		return def, agent.Permanent(fmt.Errorf("network %q: the host defines no such network", nic.Network))
	case p.cfg.Networks == nil:
		return def, agent.Permanent(fmt.Errorf("network %q: this agent runs without host networking", nic.Network))
	}
	return def, nil
}

// recordNetwork writes rec to the VM's NetFile and drops its user-mode
// SSH port.
func (p *Provisioner) recordNetwork(st *vmState, vm string, rec netRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := renameio.WriteFile(st.path(NetFile), b, 0o644, renameio.WithTempDir(st.dir)); err != nil {
		return fmt.Errorf("record network: %w", err)
	}
	if err := os.Remove(st.path(PortFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	p.mu.Lock()
	for port, owner := range p.ports {
		if owner == vm {
			delete(p.ports, port)
		}
	}
	p.mu.Unlock()
	return nil
}

// checkNetwork reports whether the host networks m's NICs name can take
// the VM now (Stage: an edit must not stop a VM for a network it cannot
// join); nil for user-mode networking.
func (p *Provisioner) checkNetwork(m agent.Machine) error {
	if err := nicsUsable(m); err != nil {
		return err
	}
	for _, nic := range m.Spec.Interfaces() {
		def, err := p.nicNetwork(m, nic)
		if err != nil {
			return err
		}
		if err := p.cfg.Networks.Check(nic.Network, def); err != nil {
			return waitForNetwork(err)
		}
	}
	return nil
}

// seedNICs are the NICs m's seed and command line give the VM, with the
// attachments atts of its NICs (nil before they are attached): for each
// NIC its MAC, model and static configuration with a nat network's
// defaults (staticFor); for a VM on user-mode networking one NIC.
func seedNICs(m agent.Machine, atts []hostnet.Attachment) []seedNIC {
	nics := m.Spec.Interfaces()
	if len(nics) == 0 {
		return []seedNIC{{mac: macOf(m.Name, m.Spec.MAC)}}
	}
	out := make([]seedNIC, len(nics))
	for i, nic := range nics {
		var att hostnet.Attachment
		if i < len(atts) {
			att = atts[i]
		}
		out[i] = seedNIC{mac: desired.NICMAC(m.Name, i, nic), static: staticFor(nic.Static, att), model: nic.Model}
	}
	return out
}

// waitForNetwork marks a missing bridge, a bridge that does not filter
// the VLANs a network names, and a nat network whose CIDR the host's own
// routes use, as agent.ErrNetworkMissing, which the engine
// waits for instead of spending a create attempt.
func waitForNetwork(err error) error {
	if errors.Is(err, hostnet.ErrBridgeMissing) || errors.Is(err, hostnet.ErrHostConflict) || errors.Is(err, hostnet.ErrNoVLANFiltering) {
		return fmt.Errorf("%w: %w", err, agent.ErrNetworkMissing)
	}
	return err
}

// staticFor is the static configuration the seed carries: the spec's,
// with a nat network's defaults filled in (its bridge as the gateway and
// DNS server). nil when the spec has none.
func staticFor(s *desired.StaticIP, att hostnet.Attachment) *desired.StaticIP {
	if s == nil {
		return nil
	}
	c := *s
	if att.Gateway.IsValid() {
		if c.Gateway4 == "" {
			c.Gateway4 = att.Gateway.String()
		}
		if c.Nameservers == nil || len(c.Nameservers.Addresses) == 0 {
			ns := desired.Nameservers{Addresses: []string{att.Gateway.String()}}
			if c.Nameservers != nil {
				ns.Search = c.Nameservers.Search
			}
			c.Nameservers = &ns
		}
	}
	return &c
}

// networkAddress is the address of a running VM on a host network, from
// NetFile, as observed from the guest: what Config.Networks observes (its
// lease, or the host's neighbour table), else what the guest's
// qemu-guest-agent last reported for its MAC, else its first static
// address if its sshd answered there in this boot (readiness probes it,
// staticSSH). A static address the guest has not answered at is not
// shown: the guest may not hold it (cloud-init applies network-config at
// an instance's first boot only). Invalid while the VM does not run or no
// address is known; ok is false for a VM on user-mode networking.
func (p *Provisioner) networkAddress(st *vmState) (ip netip.Addr, ok bool) {
	r, ok := p.netRecord(st)
	if !ok {
		return netip.Addr{}, false
	}
	if st.pid() == 0 || r == nil {
		return netip.Addr{}, true
	}
	if hw, err := net.ParseMAC(r.MAC); err == nil {
		if p.cfg.Networks != nil {
			if a := p.cfg.Networks.Address(r.Network, r.Def, hw); a.IsValid() {
				return a, true
			}
		}
		if a := p.guestAgentAddress(st, hw); a.IsValid() {
			return a, true
		}
	}
	if a := staticAddr(r); a.IsValid() {
		if w := st.currentWatch(); w != nil && w.readiness().Addr == netip.AddrPortFrom(a, 22).String() {
			return a, true
		}
	}
	return netip.Addr{}, true
}

// nicAddresses are the VM's NICs as NetFile records them, each with the
// guest's address there while the VM runs: what Config.Networks observes
// (its lease, or the host's neighbour table), else what its
// qemu-guest-agent reports for the NIC's MAC.
func (p *Provisioner) nicAddresses(st *vmState) []status.NIC {
	r, _ := p.netRecord(st)
	var out []status.NIC
	for _, n := range r.nics() {
		nic := status.NIC{Network: n.Network, MAC: n.MAC}
		if hw, err := net.ParseMAC(n.MAC); err == nil && st.pid() != 0 {
			var a netip.Addr
			if p.cfg.Networks != nil {
				a = p.cfg.Networks.Address(n.Network, n.Def, hw)
			}
			if !a.IsValid() {
				a = p.guestAgentAddress(st, hw)
			}
			if a.IsValid() {
				nic.IP = a.String()
			}
			if p.cfg.Networks != nil {
				if a6 := p.cfg.Networks.Address6(n.Network, n.Def, hw); a6.IsValid() {
					nic.IPv6 = a6.String()
				}
			}
		}
		out = append(out, nic)
	}
	return out
}

// Unleased implements agent.LeaseReporter: for each NIC of a VM that
// runs on a nat network and takes its address there by DHCP (no static
// address of its inside the network's CIDR, as NetFile records them), in
// order, why dnsmasq holds no lease of its reserved address for its MAC (Networks.Unleased; another
// MAC's lease holding it is agent.ErrAddressHeld too); nil otherwise.
func (p *Provisioner) Unleased(name string) error {
	st := p.state(name, "")
	if st == nil || p.cfg.Networks == nil || st.pid() == 0 {
		return nil
	}
	r, _ := p.netRecord(st)
	for _, n := range r.nics() {
		if n.Def.NAT == nil || staticOn(n.Def, n.Static).IsValid() {
			continue
		}
		hw, err := net.ParseMAC(n.MAC)
		if err != nil {
			continue
		}
		err = p.cfg.Networks.Unleased(n.Network, hw)
		if errors.Is(err, hostnet.ErrAddressHeld) {
			return fmt.Errorf("%w (%w)", err, agent.ErrAddressHeld)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// netRecord reads NetFile; ok is false when the VM is on user-mode
// networking (no NetFile), and the record nil when it cannot be read.
func (p *Provisioner) netRecord(st *vmState) (*netRecord, bool) {
	b, err := os.ReadFile(st.path(NetFile))
	if err != nil {
		return nil, false
	}
	var r netRecord
	if err := json.Unmarshal(b, &r); err != nil {
		p.log.WithField("vm", st.name).WithError(err).Warn("network record unreadable")
		return nil, true
	}
	return &r, true
}

// staticAddr is the first static address of r, invalid when none.
func staticAddr(r *netRecord) netip.Addr {
	if r == nil || r.Static == nil || len(r.Static.Addresses) == 0 {
		return netip.Addr{}
	}
	pfx, err := netip.ParsePrefix(r.Static.Addresses[0])
	if err != nil {
		return netip.Addr{}
	}
	return pfx.Addr()
}

// staticSSH is where the readiness probe looks for the sshd of a guest
// whose address is not observed yet but whose seed gives it a static
// address: port 22 of that address ("" when it has none).
func (p *Provisioner) staticSSH(st *vmState) string {
	r, _ := p.netRecord(st)
	if a := staticAddr(r); a.IsValid() {
		return netip.AddrPortFrom(a, 22).String()
	}
	return ""
}

// errAnotherHolder: the SSH banner read at a VM's address came from a
// machine whose MAC is not the VM's, or from the host itself: another
// guest, LAN machine or the host holds the address (a static address the
// guest never took, or one taken from it). The probe counts it as the guest refusing: the guest did not
// answer.
var errAnotherHolder = errors.New("answered by another machine")

// anotherHolder is errAnotherHolder for the machine that answered: its
// MAC address, or "host" for the host's own address.
type anotherHolder struct {
	holder string
	err    error
}

func (e *anotherHolder) Error() string { return e.err.Error() }
func (e *anotherHolder) Unwrap() error { return e.err }

// heldBy is who answered instead of the guest when err is
// errAnotherHolder ("" otherwise).
func heldBy(err error) string {
	var h *anotherHolder
	if errors.As(err, &h) {
		return h.holder
	}
	return ""
}

// heldByGuest checks that the machine that answered at addr ("ip:port")
// on the VM's host network is the VM: the host's neighbour table holds
// the VM's MAC for that address. It is nil for a VM on user-mode
// networking (its forward is its own), and when the host does not reach
// the address directly through the network's bridge (nothing can be
// known); it wraps errNoAddress when the table cannot be read or holds no
// entry for the address, so the answer counts for nothing either way.
func (p *Provisioner) heldByGuest(st *vmState, addr string) error {
	r, ok := p.netRecord(st)
	if !ok || p.cfg.Networks == nil {
		return nil
	}
	if r == nil {
		return fmt.Errorf("network record unreadable: %w", errNoAddress)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return err
	}
	want, err := net.ParseMAC(r.MAC)
	if err != nil {
		return err
	}
	mac, err := p.cfg.Networks.Holder(r.Network, r.Def, ap.Addr())
	switch {
	case errors.Is(err, hostnet.ErrHostAddress):
		return &anotherHolder{holder: "host", err: fmt.Errorf("%w: %w", errAnotherHolder, err)}
	case err != nil:
		return fmt.Errorf("%s: %w (%w)", ap.Addr(), err, errNoAddress)
	case mac == nil:
		return nil
	case !bytes.Equal(mac, want):
		return &anotherHolder{holder: mac.String(), err: fmt.Errorf("%s: %w (MAC %s), not the guest (MAC %s)", ap.Addr(), errAnotherHolder, mac, want)}
	}
	return nil
}
