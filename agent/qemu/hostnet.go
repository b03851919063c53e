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
	"github.com/google/renameio/v2"
)

// NetFile records, in a VM's directory, the host network its NIC was last
// attached to (JSON netRecord), so Address knows where to look for the
// guest's address after an agent restart. Absent for user-mode networking.
const NetFile = "network.json"

// HostNetworks attaches VMs to host networks; *hostnet.Manager implements
// it. Methods are safe for concurrent use.
type HostNetworks interface {
	// Attach ensures network name (def) and VM vm's tap on it; static is
	// the VM's static IPv4 on a nat network (invalid when none). See
	// hostnet.Manager.Attach.
	Attach(ctx context.Context, name string, def desired.Network, vm string, mac net.HardwareAddr, static netip.Addr) (hostnet.Attachment, error)
	// Check reports whether network name (def) can take a VM now,
	// changing nothing; hostnet.ErrBridgeMissing when a bridge network's
	// bridge does not exist. See hostnet.Manager.Check.
	Check(name string, def desired.Network) error
	// Detach removes VM vm's tap and address reservations.
	Detach(vm string) error
	// Address is the guest's IPv4 address on network name, invalid when
	// unknown.
	Address(name string, def desired.Network, mac net.HardwareAddr) netip.Addr
	// Reserve records VM vm's address on nat network name (def) without
	// touching the network; see hostnet.Manager.Reserve.
	Reserve(name string, def desired.Network, vm string, mac net.HardwareAddr, static netip.Addr) error
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

// netRecord is NetFile's content.
type netRecord struct {
	Network string            `json:"network"`
	Def     desired.Network   `json:"def"`
	Tap     string            `json:"tap"`
	MAC     string            `json:"mac"`
	Static  *desired.StaticIP `json:"static,omitempty"`
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
		hw, err := net.ParseMAC(macFor(m.VM))
		if err != nil {
			return err
		}
		if err := p.cfg.Networks.Reserve(m.Network, def, m.VM, hw, staticOn(def, m.Static)); err != nil {
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

// attach puts the VM's NIC on its host network, or leaves it on user-mode
// networking when the spec names none: then the returned attachment has
// no tap. It records the choice in NetFile; a VM on a host network keeps
// no SSH forward.
func (p *Provisioner) attach(ctx context.Context, st *vmState, m agent.Machine, mac string) (hostnet.Attachment, error) {
	if m.Spec.Network == "" {
		// Back to user-mode networking: drop the tap and reservation of
		// a network the VM was on.
		if _, err := os.Stat(st.path(NetFile)); err == nil && p.cfg.Networks != nil {
			if err := p.cfg.Networks.Detach(m.Name); err != nil {
				return hostnet.Attachment{}, err
			}
		}
		if err := os.Remove(st.path(NetFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return hostnet.Attachment{}, err
		}
		return hostnet.Attachment{}, nil
	}
	switch {
	case m.Network == nil:
		return hostnet.Attachment{}, agent.Permanent(fmt.Errorf("network %q: the host defines no such network", m.Spec.Network))
	case p.cfg.Networks == nil:
		return hostnet.Attachment{}, agent.Permanent(fmt.Errorf("network %q: this agent runs without host networking", m.Spec.Network))
	}
	hw, err := net.ParseMAC(mac)
	if err != nil {
		return hostnet.Attachment{}, err
	}
	att, err := p.cfg.Networks.Attach(ctx, m.Spec.Network, *m.Network, m.Name, hw, staticOn(*m.Network, m.Spec.Static))
	if err != nil {
		return att, waitForNetwork(err)
	}
	rec, err := json.Marshal(netRecord{Network: m.Spec.Network, Def: *m.Network, Tap: att.Tap, MAC: mac, Static: m.Spec.Static})
	if err != nil {
		return att, err
	}
	if err := renameio.WriteFile(st.path(NetFile), rec, 0o644, renameio.WithTempDir(st.dir)); err != nil {
		return att, fmt.Errorf("record network: %w", err)
	}
	if err := os.Remove(st.path(PortFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return att, err
	}
	p.mu.Lock()
	for port, owner := range p.ports {
		if owner == m.Name {
			delete(p.ports, port)
		}
	}
	p.mu.Unlock()
	return att, nil
}

// checkNetwork reports whether the host network m's spec names can take
// the VM now (Stage: an edit must not stop a VM for a network it cannot
// join); nil for user-mode networking.
func (p *Provisioner) checkNetwork(m agent.Machine) error {
	switch {
	case m.Spec.Network == "":
		return nil
	case m.Network == nil:
		return agent.Permanent(fmt.Errorf("network %q: the host defines no such network", m.Spec.Network))
	case p.cfg.Networks == nil:
		return agent.Permanent(fmt.Errorf("network %q: this agent runs without host networking", m.Spec.Network))
	}
	return waitForNetwork(p.cfg.Networks.Check(m.Spec.Network, *m.Network))
}

// waitForNetwork marks a missing bridge, and a nat network whose CIDR the
// host's own routes use, as agent.ErrNetworkMissing, which the engine
// waits for instead of spending a create attempt.
func waitForNetwork(err error) error {
	if errors.Is(err, hostnet.ErrBridgeMissing) || errors.Is(err, hostnet.ErrHostConflict) {
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

// Unleased implements agent.LeaseReporter: for a VM that runs on a nat
// network and takes its address there by DHCP (no static address of its
// inside the network's CIDR, as NetFile records them), why dnsmasq holds
// no lease of its reserved address for its MAC (Networks.Unleased; another
// MAC's lease holding it is agent.ErrAddressHeld too); nil otherwise.
func (p *Provisioner) Unleased(name string) error {
	st := p.state(name, "")
	if st == nil || p.cfg.Networks == nil || st.pid() == 0 {
		return nil
	}
	r, _ := p.netRecord(st)
	if r == nil || r.Def.NAT == nil || staticOn(r.Def, r.Static).IsValid() {
		return nil
	}
	hw, err := net.ParseMAC(r.MAC)
	if err != nil {
		return nil
	}
	err = p.cfg.Networks.Unleased(r.Network, hw)
	if errors.Is(err, hostnet.ErrAddressHeld) {
		return fmt.Errorf("%w (%w)", err, agent.ErrAddressHeld)
	}
	return err
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
