package hostnet

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/netnstest"
)

func TestTapNameIsStableAndFits(t *testing.T) {
	a, b := TapName("web-01"), TapName("web-01")
	if a != b || len(a) != 15 || !strings.HasPrefix(a, TapPrefix) {
		t.Fatalf("TapName = %q, %q; want one stable 15-character name", a, b)
	}
	if TapName("web-02") == a {
		t.Fatalf("two VMs share tap %q", a)
	}
}

func TestPickSkipsTakenAndReservedAddresses(t *testing.T) {
	p := netip.MustParsePrefix("10.77.0.0/29") // .2 to .6 are guests
	taken := map[netip.Addr]string{}
	for i := 0; i < 5; i++ {
		a, err := pick(p, "vm", taken)
		if err != nil {
			t.Fatalf("pick %d: %v", i, err)
		}
		if !p.Contains(a) || a == p.Addr() || a == p.Addr().Next() || a == desired.Broadcast(p) {
			t.Fatalf("pick %d = %s: not a guest address of %s", i, a, p)
		}
		if _, dup := taken[a]; dup {
			t.Fatalf("pick %d = %s again", i, a)
		}
		taken[a] = "x"
	}
	if a, err := pick(p, "vm", taken); err == nil {
		t.Fatalf("pick on a full network = %s; want an error", a)
	}
}

func TestLeaseForTakesTheLatestLeaseOfTheMAC(t *testing.T) {
	f := filepath.Join(t.TempDir(), "leases")
	os.WriteFile(f, []byte("100 52:54:00:00:00:01 10.77.0.9 a *\n300 52:54:00:00:00:02 10.77.0.5 b 01:52\n200 52:54:00:00:00:02 10.77.0.4 b *\n"), 0o600)
	mac, _ := net.ParseMAC("52:54:00:00:00:02")
	a, err := leaseFor(f, mac)
	if err != nil || a != netip.MustParseAddr("10.77.0.5") {
		t.Fatalf("leaseFor = %v, %v; want 10.77.0.5", a, err)
	}
	other, _ := net.ParseMAC("52:54:00:00:00:03")
	if a, _ := leaseFor(f, other); a.IsValid() {
		t.Fatalf("leaseFor unknown MAC = %s", a)
	}
}

// fixture is a Manager inside the test's network namespace, with busybox
// for the "guest" namespaces the test adds.
type fixture struct {
	t   *testing.T
	dir string
	m   *Manager
}

func newFixture(t *testing.T) *fixture {
	for _, bin := range []string{"dnsmasq", "nft", "busybox"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed", bin)
		}
	}
	f := &fixture{t: t, dir: t.TempDir()}
	f.m = f.manager()
	return f
}

func (f *fixture) manager() *Manager {
	log := logrus.New()
	log.SetOutput(os.Stderr)
	m, err := New(Config{Dir: filepath.Join(f.dir, "networks"), Logger: log})
	if err != nil {
		f.t.Fatal(err)
	}
	return m
}

func (f *fixture) run(name string, args ...string) string {
	f.t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		f.t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// peer makes a namespace standing in for a guest (or a machine on the
// LAN): a veth pair whose outer end joins bridge and whose inner end, eth0
// with mac, lives in the new namespace. It returns the namespace's name.
func (f *fixture) peer(suffix, bridge, mac string) string {
	f.t.Helper()
	ns := netnstest.Name() + "-" + suffix
	f.run("ip", "netns", "add", ns)
	f.t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	outer := "v" + suffix
	f.run("ip", "link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", ns)
	f.run("ip", "link", "set", outer, "master", bridge, "up")
	f.run("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "address", mac, "up")
	f.run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
	return ns
}

// dhcp runs busybox udhcpc in ns and returns the address it was given.
func (f *fixture) dhcp(ns string) netip.Addr {
	f.t.Helper()
	script := filepath.Join(f.dir, "udhcpc.sh")
	os.WriteFile(script, []byte("#!/bin/sh\ncase \"$1\" in bound|renew)\n"+
		"  busybox ifconfig \"$interface\" \"$ip\" netmask \"$subnet\" up\n"+
		"  for r in $router; do busybox route add default gw \"$r\" dev \"$interface\"; break; done\n"+
		"  echo \"leased $ip\";;\nesac\n"), 0o755)
	out := f.run("ip", "netns", "exec", ns, "busybox", "udhcpc", "-i", "eth0", "-t", "10", "-T", "1", "-n", "-q", "-s", script)
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(l, "leased "); ok {
			return netip.MustParseAddr(strings.TrimSpace(rest))
		}
	}
	f.t.Fatalf("udhcpc in %s got no lease:\n%s", ns, out)
	return netip.Addr{}
}

func (f *fixture) try(ns string, args ...string) error {
	return exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).Run()
}

func dnsmasqProcesses(t *testing.T, conf string) int {
	entries, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), "--conf-file="+conf) {
			n++
		}
	}
	return n
}

func TestNATNetworkServesGuestsAndIsolatesTheHost(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	nets := map[string]desired.Network{"lab": {NAT: &desired.NAT{CIDR: "10.77.0.0/24"}}}
	if err := f.m.Reconcile(ctx, nets, nil); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	// The bridge carries the CIDR's first address.
	br, err := netlink.LinkByName("gf-lab")
	if err != nil {
		t.Fatalf("bridge gf-lab: %v", err)
	}
	addrs, _ := netlink.AddrList(br, netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IPNet.String() != "10.77.0.1/24" {
		t.Fatalf("gf-lab addresses = %v; want 10.77.0.1/24", addrs)
	}

	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	a, err := f.m.Attach(ctx, "lab", nets["lab"], NIC{VM: "web-01", MAC: mac})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	tap, err := netlink.LinkByName(a.Tap)
	if err != nil || tap.Attrs().MasterIndex != br.Attrs().Index {
		t.Fatalf("tap %s: %v; want a port of gf-lab", a.Tap, err)
	}
	if !a.Prefix.Contains(a.Address) || a.Gateway != netip.MustParseAddr("10.77.0.1") {
		t.Fatalf("attachment = %+v", a)
	}

	// A guest with the VM's MAC gets the reserved address from dnsmasq.
	guest := f.peer("g", "gf-lab", mac.String())
	if got := f.dhcp(guest); got != a.Address {
		t.Fatalf("guest leased %s; want the reserved %s", got, a.Address)
	}
	if got := f.m.Address("lab", nets["lab"], mac); got != a.Address {
		t.Fatalf("Address = %s; want the lease %s", got, a.Address)
	}

	// A guest configured statically takes no lease: its address is learned
	// from the neighbour table once it talks to the host.
	smac, _ := net.ParseMAC("52:54:00:12:34:57")
	static := f.peer("s", "gf-lab", smac.String())
	f.run("ip", "netns", "exec", static, "ip", "addr", "add", "10.77.0.200/24", "dev", "eth0")
	f.run("ip", "netns", "exec", static, "busybox", "ping", "-c", "1", "-W", "2", "10.77.0.1")
	if got := f.m.Address("lab", nets["lab"], smac); got != netip.MustParseAddr("10.77.0.200") {
		t.Errorf("Address of a static guest = %s; want 10.77.0.200 from the neighbour table", got)
	}

	// The guest reaches the gateway by ping, and a machine beyond the
	// host only through masquerading: the uplink namespace has no route
	// back to 10.77.0.0/24.
	if err := f.try(guest, "busybox", "ping", "-c", "1", "-W", "2", "10.77.0.1"); err != nil {
		t.Errorf("guest cannot ping its gateway: %v", err)
	}
	up := netnstest.Name() + "-u"
	f.run("ip", "netns", "add", up)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", up).Run() })
	f.run("ip", "link", "add", "uplink", "type", "veth", "peer", "name", "eth0", "netns", up)
	f.run("ip", "addr", "add", "198.51.100.1/24", "dev", "uplink")
	f.run("ip", "link", "set", "uplink", "up")
	f.run("ip", "netns", "exec", up, "ip", "addr", "add", "198.51.100.2/24", "dev", "eth0")
	f.run("ip", "netns", "exec", up, "ip", "link", "set", "eth0", "up")
	if err := f.try(guest, "busybox", "ping", "-c", "1", "-W", "3", "198.51.100.2"); err != nil {
		t.Errorf("guest cannot reach beyond the host (masquerading): %v", err)
	}

	// A host service is out of the guests' reach, on the bridge address
	// and on the host's other addresses alike; the host itself reaches it.
	port := hostService(t, "0.0.0.0:0")
	for _, target := range []string{"10.77.0.1", "198.51.100.1"} {
		if f.reaches(guest, target, itoa(port), "host service") {
			t.Errorf("guest reached a host service on %s:%d", target, port)
		}
	}
	if out, err := exec.Command("busybox", "nc", "-w", "2", "10.77.0.1", itoa(port)).CombinedOutput(); !strings.Contains(string(out), "host service") {
		t.Errorf("the host cannot reach its own service (the check above proves nothing): %v: %s", err, out)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// hostService listens on addr in the host's namespace, answers every
// connection with "host service", and returns its port; it stops with
// the test.
func hostService(t *testing.T, addr string) int {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("host service\n"))
			c.Close()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

func syscallAlive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func TestNATNetworkSurvivesARestartWithoutDuplicates(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	nets := map[string]desired.Network{"lab": {NAT: &desired.NAT{CIDR: "10.78.0.0/24"}}}
	mac, _ := net.ParseMAC("52:54:00:ab:cd:ef")
	if err := f.m.Reconcile(ctx, nets, nil); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	first, err := f.m.Attach(ctx, "lab", nets["lab"], NIC{VM: "db-01", MAC: mac})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	guest := f.peer("g", "gf-lab", mac.String())
	leased := f.dhcp(guest)
	pid := f.m.dnsmasqPid("lab")
	rules := f.run("nft", "list", "table", "inet", NftTable)

	// A second agent start: a new Manager over the same state directory.
	for i := 0; i < 2; i++ {
		m := f.manager()
		if err := m.Reconcile(ctx, nets, map[string]bool{"lab": true}); err != nil {
			t.Fatalf("Reconcile after restart: %v", err)
		}
		again, err := m.Attach(ctx, "lab", nets["lab"], NIC{VM: "db-01", MAC: mac})
		if err != nil || again != first {
			t.Fatalf("Attach after restart = %+v, %v; want %+v", again, err, first)
		}
		if got := m.dnsmasqPid("lab"); got != pid {
			t.Fatalf("dnsmasq pid %d after restart; want the adopted %d", got, pid)
		}
		if n := dnsmasqProcesses(t, filepath.Join(f.dir, "networks", "lab", DnsmasqConf)); n != 1 {
			t.Fatalf("%d dnsmasq processes for the network; want 1", n)
		}
		if got := f.run("nft", "list", "table", "inet", NftTable); got != rules {
			t.Fatalf("nft table changed on restart:\n%s\nwant\n%s", got, rules)
		}
		if got := m.Address("lab", nets["lab"], mac); got != leased {
			t.Fatalf("lease after restart = %s; want %s", got, leased)
		}
	}
	if out := f.run("nft", "list", "ruleset"); strings.Count(out, "table inet "+NftTable) != 1 {
		t.Fatalf("ruleset holds the table more than once:\n%s", out)
	}

	// A dnsmasq that died is started again; the lease is kept.
	if err := stopProcess(pid); err != nil {
		t.Fatal(err)
	}
	if err := f.manager().Reconcile(ctx, nets, nil); err != nil {
		t.Fatalf("Reconcile after dnsmasq died: %v", err)
	}
	if p := f.m.dnsmasqPid("lab"); p == 0 || p == pid {
		t.Fatalf("dnsmasq pid = %d after it died (was %d); want a new one", p, pid)
	}
	if got := f.dhcp(guest); got != leased {
		t.Fatalf("guest leased %s after dnsmasq restarted; want %s", got, leased)
	}
}

func TestNATNetworkIsTornDownOnlyWhenUnused(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	nets := map[string]desired.Network{"lab": {NAT: &desired.NAT{CIDR: "10.79.0.0/24"}}}
	if err := f.m.Reconcile(ctx, nets, nil); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	pid := f.m.dnsmasqPid("lab")
	if err := f.m.Reconcile(ctx, nil, map[string]bool{"lab": true}); err != nil {
		t.Fatalf("Reconcile without the network, in use: %v", err)
	}
	if _, err := netlink.LinkByName("gf-lab"); err != nil || f.m.dnsmasqPid("lab") != pid {
		t.Fatalf("a network in use was torn down: %v", err)
	}
	if err := f.m.Reconcile(ctx, nil, nil); err != nil || f.m.dnsmasqPid("lab") != pid {
		t.Fatalf("Reconcile while use is unknown: %v; want the network kept", err)
	}
	if err := f.m.Reconcile(ctx, nil, map[string]bool{}); err != nil {
		t.Fatalf("Reconcile without the network: %v", err)
	}
	if _, err := netlink.LinkByName("gf-lab"); err == nil {
		t.Errorf("bridge gf-lab is still there")
	}
	if syscallAlive(pid) {
		t.Errorf("dnsmasq %d still runs", pid)
	}
	if exec.Command("nft", "list", "table", "inet", NftTable).Run() == nil {
		t.Errorf("table inet %s is still there", NftTable)
	}
	if _, err := os.Stat(filepath.Join(f.dir, "networks", "lab")); !os.IsNotExist(err) {
		t.Errorf("network directory: %v; want it removed", err)
	}
}

func TestBridgeNetworkAttachesToTheExistingBridgeOnly(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	lan := desired.Network{Bridge: "br0"}
	mac, _ := net.ParseMAC("52:54:00:00:0b:01")
	if _, err := f.m.Attach(ctx, "lan", lan, NIC{VM: "web-01", MAC: mac}); !errors.Is(err, ErrBridgeMissing) || !strings.Contains(err.Error(), "br0 does not exist") {
		t.Fatalf("Attach to a missing bridge: %v; want ErrBridgeMissing, naming it", err)
	}
	if err := f.m.Check("lan", lan); !errors.Is(err, ErrBridgeMissing) {
		t.Fatalf("Check of a missing bridge: %v; want ErrBridgeMissing", err)
	}
	if err := f.m.Reconcile(ctx, map[string]desired.Network{"lan": lan}, nil); err == nil {
		t.Fatalf("Reconcile with a missing bridge: no error")
	}
	if _, err := netlink.LinkByName("br0"); err == nil {
		t.Fatalf("the agent created br0")
	}

	// The LAN: br0 with the host's address on it, as the admin made it.
	f.run("ip", "link", "add", "br0", "type", "bridge")
	f.run("ip", "addr", "add", "192.168.50.1/24", "dev", "br0")
	f.run("ip", "link", "set", "br0", "up")
	before := f.run("ip", "-4", "-o", "addr", "show", "br0")
	if err := f.m.Check("lan", lan); err != nil {
		t.Fatalf("Check of br0 once it exists: %v", err)
	}
	if err := f.m.Reconcile(ctx, map[string]desired.Network{"lan": lan}, nil); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	a, err := f.m.Attach(ctx, "lan", lan, NIC{VM: "web-01", MAC: mac})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	br, _ := netlink.LinkByName("br0")
	tap, err := netlink.LinkByName(a.Tap)
	if err != nil || tap.Attrs().MasterIndex != br.Attrs().Index {
		t.Fatalf("tap %s: %v; want a port of br0", a.Tap, err)
	}
	if a.Address.IsValid() {
		t.Errorf("a bridge network reserved %s; the LAN assigns addresses", a.Address)
	}

	// The guest's address is learned from the neighbour table once it
	// talks to the host.
	guest := f.peer("g", "br0", "52:54:00:00:0b:02")
	gmac, _ := net.ParseMAC("52:54:00:00:0b:02")
	if got := f.m.Address("lan", lan, gmac); got.IsValid() {
		t.Fatalf("Address before any traffic = %s", got)
	}
	f.run("ip", "netns", "exec", guest, "ip", "addr", "add", "192.168.50.23/24", "dev", "eth0")
	f.run("ip", "netns", "exec", guest, "busybox", "ping", "-c", "1", "-W", "2", "192.168.50.1")
	if got := f.m.Address("lan", lan, gmac); got != netip.MustParseAddr("192.168.50.23") {
		t.Fatalf("Address = %s; want 192.168.50.23 from the neighbour table", got)
	}

	// Detach removes the tap and leaves the bridge as it was.
	if err := f.m.Detach("web-01"); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if _, err := netlink.LinkByName(a.Tap); err == nil {
		t.Errorf("tap %s is still there", a.Tap)
	}
	exec.Command("ip", "link", "del", "vg").Run()
	if after := f.run("ip", "-4", "-o", "addr", "show", "br0"); after != before {
		t.Errorf("br0 changed:\n%s\nwas\n%s", after, before)
	}
}

func TestAVMMovedToAnotherNetworkLeavesTheFirst(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	a := desired.Network{NAT: &desired.NAT{CIDR: "10.82.0.0/24"}}
	b := desired.Network{NAT: &desired.NAT{CIDR: "10.83.0.0/24"}}
	mac, _ := net.ParseMAC("52:54:00:00:0c:01")
	if _, err := f.m.Attach(ctx, "one", a, NIC{VM: "app-01", MAC: mac}); err != nil {
		t.Fatalf("Attach one: %v", err)
	}
	static := netip.MustParseAddr("10.83.0.40")
	att, err := f.m.Attach(ctx, "two", b, NIC{VM: "app-01", MAC: mac, Static: static})
	if err != nil {
		t.Fatalf("Attach two: %v", err)
	}
	if att.Address != static {
		t.Errorf("reserved %s on two; want the static %s", att.Address, static)
	}
	one, _ := f.m.readHosts("one")
	if _, ok := one["app-01"]; ok {
		t.Errorf("app-01 keeps its reservation on one: %v", one)
	}
	br, _ := netlink.LinkByName("gf-two")
	tap, err := netlink.LinkByName(att.Tap)
	if err != nil || tap.Attrs().MasterIndex != br.Attrs().Index {
		t.Fatalf("tap %s: %v; want it moved to gf-two", att.Tap, err)
	}
	conf, _ := os.ReadFile(filepath.Join(f.dir, "networks", "two", DnsmasqConf))
	if !strings.Contains(string(conf), "dhcp-host="+mac.String()+",10.83.0.40,app-01") {
		t.Errorf("dnsmasq of two lacks app-01's static reservation:\n%s", conf)
	}
	// Another VM may not take that static address.
	other, _ := net.ParseMAC("52:54:00:00:0c:02")
	if _, err := f.m.Attach(ctx, "two", b, NIC{VM: "app-02", MAC: other, Static: static}); err == nil || !strings.Contains(err.Error(), "app-01") {
		t.Errorf("a second VM took app-01's static address: %v", err)
	}
}

func TestRenumberingANATNetworkMovesItsReservations(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	f := newFixture(t)
	ctx := context.Background()
	mac, _ := net.ParseMAC("52:54:00:00:0d:01")
	old := desired.Network{NAT: &desired.NAT{CIDR: "10.90.0.0/24"}}
	if _, err := f.m.Attach(ctx, "lab", old, NIC{VM: "app-01", MAC: mac}); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	renumbered := desired.Network{NAT: &desired.NAT{CIDR: "10.91.0.0/24"}}
	if err := f.m.Reconcile(ctx, map[string]desired.Network{"lab": renumbered}, map[string]bool{"lab": true}); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	hosts, _ := f.m.readHosts("lab")
	p := netip.MustParsePrefix("10.91.0.0/24")
	if r := hosts["app-01"]; !guestAddr(p, r.Addr) {
		t.Errorf("app-01 reserved %s after renumbering; want an address of %s", r.Addr, p)
	}
	br, _ := netlink.LinkByName("gf-lab")
	addrs, _ := netlink.AddrList(br, netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IPNet.String() != "10.91.0.1/24" {
		t.Errorf("gf-lab addresses = %v; want only 10.91.0.1/24", addrs)
	}
	guest := f.peer("g", "gf-lab", mac.String())
	if got := f.dhcp(guest); got != hosts["app-01"].Addr {
		t.Errorf("guest leased %s; want the renumbered %s", got, hosts["app-01"].Addr)
	}
	rules := f.run("nft", "list", "table", "inet", NftTable)
	if !strings.Contains(rules, "10.91.0.0/24") || strings.Contains(rules, "10.90.0.0/24") {
		t.Errorf("rules do not follow the new CIDR:\n%s", rules)
	}
}
