package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/hostnet"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/netnstest"
)

// These tests boot the tiny guest on host networks inside a network
// namespace of their own (testsupport/netnstest): QEMU, its tap, the bridge
// and dnsmasq all live there, and nothing leaves it.

// netGuest builds the tiny guest before the test enters its namespace (a
// first build may need apt; the namespace has no way out), then checks
// the tools the namespace needs.
func netGuest(t *testing.T) {
	needQEMU(t)
	tinyGuest(t)
	for _, bin := range []string{"dnsmasq", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed", bin)
		}
	}
}

// netFixture is a provisioner with host networking over one state
// directory, as an agent has; again() makes another, as a restarted agent
// would.
type netFixture struct {
	t      *testing.T
	srv    *artifactServer
	cache  string
	vmRoot string
	netDir string
}

func newNetFixture(t *testing.T) *netFixture {
	root := t.TempDir()
	return &netFixture{t: t, srv: newArtifactServer(t), cache: filepath.Join(root, "images"),
		vmRoot: filepath.Join(root, "vms"), netDir: filepath.Join(root, "networks")}
}

func (f *netFixture) provisioner() (*Provisioner, *hostnet.Manager) {
	m, err := hostnet.New(hostnet.Config{Dir: f.netDir, Logger: quietLog().Logger})
	if err != nil {
		f.t.Fatal(err)
	}
	p := newTestProvisioner(f.t, f.cache, f.vmRoot, f.srv)
	p.cfg.Networks = m
	return p, m
}

func (f *netFixture) machine(name, network string, def desired.Network) agent.Machine {
	dir := filepath.Join(f.vmRoot, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		f.t.Fatal(err)
	}
	spec := guestSpec(f.t, f.srv)
	spec.Network = network
	return agent.Machine{Name: name, Dir: dir, Spec: spec, Networks: map[string]desired.Network{network: def}, InstanceID: "i-" + name}
}

func (f *netFixture) boot(p *Provisioner, m agent.Machine) {
	f.t.Helper()
	ctx := context.Background()
	if err := p.PrepareRootDisk(ctx, m); err != nil {
		f.t.Fatalf("PrepareRootDisk: %v", err)
	}
	if err := p.Boot(ctx, m); err != nil {
		f.t.Fatalf("Boot: %v: %s", err, p.FailureReason(m.Name))
	}
	f.t.Cleanup(func() { p.Destroy(context.Background(), m.Name) })
}

// exampleNetwork is network name of host hv-a in the example fleet
// (examples/fleet), so the tests prove the fleet people copy.
func exampleNetwork(t *testing.T, name string) desired.Network {
	fl, err := desired.LoadDir(filepath.Join("..", "..", "examples", "fleet"))
	if err != nil {
		t.Fatalf("load the example fleet: %v", err)
	}
	n, ok := fl.Hosts["hv-a"].Spec.Networks[name]
	if !ok {
		t.Fatalf("the example host hv-a has no network %q", name)
	}
	return n
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

func TestGuestOnNATNetworkGetsItsReservedLease(t *testing.T) {
	netGuest(t)
	if !netnstest.Enter(t) {
		return
	}
	f := newNetFixture(t)
	p, _ := f.provisioner()
	lab := exampleNetwork(t, "lab")
	cidr := netip.MustParsePrefix(lab.NAT.CIDR)
	nets := map[string]desired.Network{"lab": lab}
	ctx := context.Background()
	// The agent's tick reserves the address of every VM the snapshot
	// puts on the network before the network's dnsmasq starts, so the
	// guest's lease comes from the one dnsmasq the tick started.
	members := []agent.NetworkMember{{VM: "db-01", Network: "lab"}}
	if err := p.ReconcileNetworks(ctx, nets, members, map[string]bool{}); err != nil {
		t.Fatalf("ReconcileNetworks: %v", err)
	}
	started, _ := os.ReadFile(filepath.Join(f.netDir, "lab", hostnet.DnsmasqPid))
	m := f.machine("db-01", "lab", lab)
	f.boot(p, m)

	lines := strings.Join(guestLines(waitSerial(t, m.Dir, "tinyguest: ready")), "\n")
	addr := p.Address(m.Name)
	ip, err := netip.ParseAddr(addr.IP)
	if err != nil || !cidr.Contains(ip) {
		t.Fatalf("Address = %+v; want the lease in %s (guest said:\n%s)", addr, cidr, lines)
	}
	gw := lab.NAT.Gateway().String()
	for _, want := range []string{"lease eth0 ip=" + addr.IP + " router=" + gw, "ping " + gw + " ok"} {
		if !strings.Contains(lines, want) {
			t.Errorf("guest never said %q; it said:\n%s", want, lines)
		}
	}
	if addr.SSH != addr.IP+":22" {
		t.Errorf("SSH = %q; want %s:22 on the network", addr.SSH, addr.IP)
	}
	var hosts map[string]struct{ MAC, Addr string }
	b, _ := os.ReadFile(filepath.Join(f.netDir, "lab", hostnet.HostsFile))
	if err := json.Unmarshal(b, &hosts); err != nil || hosts[m.Name].Addr != addr.IP || hosts[m.Name].MAC != macFor(m.Name) {
		t.Errorf("reservations %s (%v); want %s at %s, the address the guest leased", b, err, macFor(m.Name), addr.IP)
	}
	if _, err := os.Stat(filepath.Join(m.Dir, PortFile)); !os.IsNotExist(err) {
		t.Errorf("a VM on a network has an SSH forward: %v", err)
	}
	pid := p.machines[m.Name].pid()
	dnsmasq, _ := os.ReadFile(filepath.Join(f.netDir, "lab", hostnet.DnsmasqPid))
	if string(dnsmasq) != string(started) {
		t.Errorf("dnsmasq pid %q after the VM attached; want %q, the one the tick started", dnsmasq, started)
	}

	t.Run("agent restart keeps guest, tap, bridge, dnsmasq and lease", func(t *testing.T) {
		p2, _ := f.provisioner()
		if err := p2.ReconcileNetworks(ctx, nets, members, map[string]bool{"lab": true}); err != nil {
			t.Fatalf("ReconcileNetworks: %v", err)
		}
		if !p2.Running(m.Name) {
			t.Fatalf("the guest does not run after the restart")
		}
		if err := p2.Boot(ctx, m); err != nil {
			t.Fatalf("Boot after restart: %v", err)
		}
		if got := p2.machines[m.Name].pid(); got != pid {
			t.Errorf("QEMU pid %d after restart; want %d", got, pid)
		}
		if got := p2.Address(m.Name); !reflect.DeepEqual(got, addr) {
			t.Errorf("Address after restart = %+v; want %+v", got, addr)
		}
		if b, _ := os.ReadFile(filepath.Join(f.netDir, "lab", hostnet.DnsmasqPid)); string(b) != string(dnsmasq) {
			t.Errorf("dnsmasq pid %q after restart; want %q", b, dnsmasq)
		}
		if n := strings.Count(serial(m.Dir), "tinyguest: init"); n != 1 {
			t.Errorf("guest booted %d times", n)
		}
	})

	t.Run("destroy removes the tap and the reservation", func(t *testing.T) {
		if err := p.Destroy(ctx, m.Name); err != nil {
			t.Fatal(err)
		}
		if _, err := netlink.LinkByName(hostnet.TapName(m.Name)); err == nil {
			t.Errorf("tap %s survived Destroy", hostnet.TapName(m.Name))
		}
		b, _ := os.ReadFile(filepath.Join(f.netDir, "lab", hostnet.HostsFile))
		if strings.Contains(string(b), m.Name) {
			t.Errorf("reservation survived Destroy: %s", b)
		}
	})
}

func TestGuestOnBridgeNetworkJoinsTheLAN(t *testing.T) {
	netGuest(t)
	if !netnstest.Enter(t) {
		return
	}
	// The LAN as an admin made it: br0 with the host's address, and a
	// DHCP server on it that gitfleet knows nothing of.
	dir := t.TempDir()
	run(t, "ip", "link", "add", "br0", "type", "bridge")
	run(t, "ip", "addr", "add", "192.168.60.1/24", "dev", "br0")
	run(t, "ip", "link", "set", "br0", "up")
	run(t, "dnsmasq", "--conf-file=/dev/null", "--port=0", "--interface=br0", "--bind-interfaces",
		"--dhcp-range=192.168.60.100,192.168.60.150,1h", "--dhcp-leasefile="+filepath.Join(dir, "lan.leases"),
		"--pid-file="+filepath.Join(dir, "lan.pid"))

	f := newNetFixture(t)
	p, _ := f.provisioner()
	lan := exampleNetwork(t, "lan")
	if lan.Bridge != "br0" {
		t.Fatalf("the example's lan is %+v; this test makes br0", lan)
	}
	if err := p.ReconcileNetworks(context.Background(), map[string]desired.Network{"lan": lan}, []agent.NetworkMember{{VM: "web-01", Network: "lan"}}, map[string]bool{}); err != nil {
		t.Fatalf("ReconcileNetworks: %v", err)
	}
	m := f.machine("web-01", "lan", lan)
	// The spec asks for a static address; the tiny guest has no cloud-init
	// and takes a lease from the LAN instead. Status shows where the guest
	// is, never what the spec asks.
	m.Spec.Static = &desired.StaticIP{Addresses: []string{"192.168.60.50/24"}}
	f.boot(p, m)
	if addr := p.Address(m.Name); addr.IP != "" {
		// QEMU has only just answered on QMP: the guest's kernel has not
		// even started, let alone talked to the LAN.
		t.Errorf("Address = %+v before the guest said anything; want none", addr)
	}
	_, seed, err := readSeedISO(filepath.Join(m.Dir, SeedFile))
	if err != nil || !strings.Contains(string(seed["network-config"]), `"192.168.60.50/24"`) {
		t.Errorf("the seed's network-config lacks the static address (%v):\n%s", err, seed["network-config"])
	}

	lines := strings.Join(guestLines(waitSerial(t, m.Dir, "tinyguest: ready")), "\n")
	for _, want := range []string{"lease eth0 ip=192.168.60.1", "ping 192.168.60.1 ok"} {
		if !strings.Contains(lines, want) {
			t.Errorf("guest never said %q; it said:\n%s", want, lines)
		}
	}
	addr := p.Address(m.Name)
	if !strings.Contains(lines, "lease eth0 ip="+addr.IP+" ") || addr.SSH != addr.IP+":22" {
		t.Errorf("Address = %+v; want the guest's LAN address from the neighbour table, not the spec's static one (guest said:\n%s)", addr, lines)
	}
	if _, err := netlink.LinkByName("gf-lan"); err == nil {
		t.Errorf("a bridge network made a bridge of its own")
	}
}

func TestLeavingANetworkDropsTheTapAndReservation(t *testing.T) {
	for _, bin := range []string{"dnsmasq", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed", bin)
		}
	}
	if !netnstest.Enter(t) {
		return
	}
	f := newNetFixture(t)
	p, _ := f.provisioner()
	lab := desired.Network{NAT: &desired.NAT{CIDR: "10.84.0.0/24"}}
	dir := filepath.Join(f.vmRoot, "app-01")
	os.MkdirAll(dir, 0o700)
	m := agent.Machine{Name: "app-01", Dir: dir, Spec: desired.VMSpec{Network: "lab"}, Networks: map[string]desired.Network{"lab": lab}}
	st, _ := p.machineState(m)
	ctx := context.Background()
	atts, err := p.attach(ctx, st, m)
	if err != nil || len(atts) != 1 {
		t.Fatalf("attach = %+v, %v", atts, err)
	}
	if _, err := netlink.LinkByName(atts[0].Tap); err != nil {
		t.Fatalf("tap: %v", err)
	}
	m.Spec.Network, m.Networks = "", nil
	if att, err := p.attach(ctx, st, m); err != nil || len(att) != 0 {
		t.Fatalf("attach to user-mode networking = %+v, %v", att, err)
	}
	if _, err := netlink.LinkByName(hostnet.TapName(m.Name)); err == nil {
		t.Errorf("the tap survived the move to user-mode networking")
	}
	if _, err := os.Stat(filepath.Join(dir, NetFile)); !os.IsNotExist(err) {
		t.Errorf("%s: %v; want it removed", NetFile, err)
	}
	b, _ := os.ReadFile(filepath.Join(f.netDir, "lab", hostnet.HostsFile))
	if strings.Contains(string(b), m.Name) {
		t.Errorf("reservation survived: %s", b)
	}
}

// A guest on QEMU's user-mode network reaches no guest of a nat network:
// its connections leave the host's own stack as QEMU's user, where the
// nat networks' forward rules never see them. The hostile guest is the
// tiny guest itself, on user-mode networking as QEMU's user, its
// user-data the attack (nc); the nat network's guest, and a machine
// beyond the host that the guest does reach, are network namespaces
// serving TCP.
func TestUserModeGuestReachesNoNATGuest(t *testing.T) {
	netGuest(t)
	testQEMUUser(t)
	if !netnstest.Enter(t) {
		return
	}
	f := newNetFixture(t)
	m, err := hostnet.New(hostnet.Config{Dir: f.netDir, Logger: quietLog().Logger})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{
		CacheDir: f.cache, Accel: AccelTCG, Artifacts: loopbackPolicy(), RunAs: DefaultQEMUUser, Networks: m,
		MachineDir:       func(n string) string { return filepath.Join(f.vmRoot, n) },
		PowerdownTimeout: 30 * time.Second, BootTimeout: 60 * time.Second, Logger: quietLog().Logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := p.Preflight(ctx); err != nil {
		t.Fatal(err)
	}
	lab := desired.Network{NAT: &desired.NAT{CIDR: "10.120.0.0/24"}}
	if err := p.ReconcileNetworks(ctx, map[string]desired.Network{"lab": lab}, nil, map[string]bool{}); err != nil {
		t.Fatalf("ReconcileNetworks: %v", err)
	}
	if err := m.Guard(ctx); err != nil {
		t.Fatalf("Guard: %v", err)
	}
	// The nat network's guest at 10.120.0.50, and a machine beyond the
	// host at 198.51.100.2.
	natNS, outNS := netnstest.Name()+"-n", netnstest.Name()+"-o"
	for _, c := range []struct{ ns, link, hostAddr, addr, route string }{
		{natNS, "vn", "", "10.120.0.50/24", "10.120.0.1"},
		{outNS, "uplink", "198.51.100.1/24", "198.51.100.2/24", ""},
	} {
		run(t, "ip", "netns", "add", c.ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", c.ns).Run() })
		run(t, "ip", "link", "add", c.link, "type", "veth", "peer", "name", "eth0", "netns", c.ns)
		if c.hostAddr != "" {
			run(t, "ip", "addr", "add", c.hostAddr, "dev", c.link)
		} else {
			run(t, "ip", "link", "set", c.link, "master", "gf-lab")
		}
		run(t, "ip", "link", "set", c.link, "up")
		run(t, "ip", "-n", c.ns, "addr", "add", c.addr, "dev", "eth0")
		run(t, "ip", "-n", c.ns, "link", "set", "eth0", "up")
		if c.route != "" {
			run(t, "ip", "-n", c.ns, "route", "add", "default", "via", c.route)
		}
	}
	conns := map[string]*atomic.Int32{}
	for _, c := range []struct{ ns, addr string }{{natNS, "10.120.0.50:7000"}, {outNS, "198.51.100.2:7001"}} {
		l, err := netnstest.Listen(c.ns, c.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		n := &atomic.Int32{}
		conns[c.addr] = n
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				n.Add(1)
				conn.Write([]byte("banner\n"))
				conn.Close()
			}
		}()
	}

	srv := f.srv
	spec := guestSpec(t, srv)
	spec.CloudInit = &desired.CloudInit{UserData: "#!/bin/sh\nsleep 1\n" +
		"for t in 10.120.0.50:7000 198.51.100.2:7001; do\n" +
		"  out=$(nc -w 5 ${t%:*} ${t#*:} </dev/null 2>&1)\n" +
		"  case \"$out\" in *banner*) echo \"reach $t yes\";; *) echo \"reach $t no\";; esac\n" +
		"done\n"}
	dir := filepath.Join(f.vmRoot, "roamer")
	os.MkdirAll(dir, 0o700)
	vm := agent.Machine{Name: "roamer", Dir: dir, Spec: spec, InstanceID: "i-roamer"}
	f.boot(p, vm)
	s := waitSerial(t, dir, "probe reach 198.51.100.2:7001")
	lines := strings.Join(guestLines(s), "\n")
	if !strings.Contains(lines, "probe reach 198.51.100.2:7001 yes") {
		t.Fatalf("the user-mode guest reaches nothing beyond the host (the check below proves nothing):\n%s", lines)
	}
	if !strings.Contains(lines, "probe reach 10.120.0.50:7000 no") || conns["10.120.0.50:7000"].Load() != 0 {
		t.Errorf("the user-mode guest reached a guest of nat network lab (%d connections):\n%s", conns["10.120.0.50:7000"].Load(), lines)
	}
}

// A destroyed VM's lease goes with it: the next VM given its address (on
// a full network, the only one free) leases it, and counts as leased. It
// did not: dnsmasq kept the lease ("not using configured address … because
// it is leased to <the destroyed VM's MAC>"), the new guest got no address
// and its status said ready.
func TestADestroyedVMsAddressGoesToTheNextVM(t *testing.T) {
	netGuest(t)
	if !netnstest.Enter(t) {
		return
	}
	f := newNetFixture(t)
	p, m := f.provisioner()
	lab := desired.Network{NAT: &desired.NAT{CIDR: "10.121.0.0/29"}} // .2 to .6
	ctx := context.Background()
	if err := p.ReconcileNetworks(ctx, map[string]desired.Network{"lab": lab}, nil, map[string]bool{}); err != nil {
		t.Fatalf("ReconcileNetworks: %v", err)
	}
	for i := 0; i < 4; i++ {
		name := fmt.Sprintf("filler-%d", i)
		hw, _ := net.ParseMAC(macFor(name))
		if err := m.Reserve("lab", lab, hostnet.NIC{VM: name, MAC: hw}); err != nil {
			t.Fatal(err)
		}
	}
	first := f.machine("first", "lab", lab)
	f.boot(p, first)
	lines := strings.Join(guestLines(waitSerial(t, first.Dir, "tinyguest: ready")), "\n")
	addr := p.Address(first.Name).IP
	if addr == "" || !strings.Contains(lines, "lease eth0 ip="+addr+" ") {
		t.Fatalf("the first guest's address %q; it said:\n%s", addr, lines)
	}
	if err := p.Destroy(ctx, first.Name); err != nil {
		t.Fatal(err)
	}

	next := f.machine("next", "lab", lab)
	f.boot(p, next)
	lines = strings.Join(guestLines(waitSerial(t, next.Dir, "tinyguest: ready")), "\n")
	if !strings.Contains(lines, "lease eth0 ip="+addr+" ") {
		t.Errorf("the next guest did not lease the destroyed VM's %s; it said:\n%s", addr, lines)
	}
	if err := p.Unleased(next.Name); err != nil {
		t.Errorf("Unleased = %v; want its lease", err)
	}
	if got := p.Address(next.Name).IP; got != addr {
		t.Errorf("Address = %q; want %s", got, addr)
	}
}
