package qemu

import (
	"context"
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
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/hostnet"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/netnstest"
)

// A VM's SSH readiness on a host network counts only the VM's own answer:
// another machine holding the VM's (static) address on the LAN, or the
// host itself holding it, answers with a banner, and the VM is not ready
// for it. No QEMU runs: the "guests" are network namespaces on the
// bridge, and the probe is the one the readiness loop calls.
func TestSSHReadinessOnANetworkCountsOnlyTheVMsMAC(t *testing.T) {
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox is not installed")
	}
	if !netnstest.Enter(t) {
		return
	}
	root := t.TempDir()
	p := networkedProvisioner(t, root, "")
	run(t, "ip", "link", "add", "br0", "type", "bridge")
	run(t, "ip", "addr", "add", "192.168.70.1/24", "dev", "br0")
	run(t, "ip", "link", "set", "br0", "up")
	lan := desired.Network{Bridge: "br0"}

	peer := func(suffix, mac, addr string) { bannerOnLAN(t, root, suffix, mac, addr, "") }
	vm := func(name, mac, static string) *vmState { return recordOnLAN(t, p, lan, name, mac, static) }
	peer("o", "52:54:00:00:70:01", "192.168.70.50") // another machine at web-01's address
	peer("w", "52:54:00:00:70:02", "192.168.70.51") // db-01 itself

	probe := func(st *vmState) error {
		var err error
		for i := 0; i < 50; i++ { // until the banner servers listen
			if _, err = p.probeSSH(context.Background(), st); err == nil || !strings.Contains(err.Error(), "connection refused") {
				return err
			}
			time.Sleep(100 * time.Millisecond)
		}
		return err
	}
	web := vm("web-01", "52:54:00:00:70:03", "192.168.70.50")
	if err := probe(web); !errors.Is(err, errAnotherHolder) || !refused(err) {
		t.Errorf("probe of web-01, whose address another machine holds = %v; want errAnotherHolder, counted as a refusal", err)
	}
	db := vm("db-01", "52:54:00:00:70:02", "192.168.70.51")
	if err := probe(db); err != nil {
		t.Errorf("probe of db-01, which answers at its address = %v; want nil", err)
	}
	// The host's own address: its own sshd (a listener here) is not the
	// guest.
	script := filepath.Join(root, "banner-host")
	os.WriteFile(script, []byte("#!/bin/sh\necho SSH-2.0-host\n"), 0o755)
	cmd := exec.Command("busybox", "nc", "-ll", "-p", "22", "-e", script)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	host := vm("app-01", "52:54:00:00:70:04", "192.168.70.1")
	if err := probe(host); !errors.Is(err, errAnotherHolder) {
		t.Errorf("probe of app-01, whose address is the host's = %v; want errAnotherHolder", err)
	}
}

// The host's guards against guests come back whatever removed or changed
// them while the agent runs: `systemctl restart nftables` flushes the
// whole ruleset, the guests' loopback guard and the nat networks' table
// with it. GuardHost, which the engine calls every tick, puts back both,
// and leaves them be when untouched.
func TestGuardHostRestoresFlushedTables(t *testing.T) {
	needQEMU(t)
	testQEMUUser(t)
	if _, err := exec.LookPath("dnsmasq"); err != nil {
		t.Skip("dnsmasq is not installed")
	}
	if !netnstest.Enter(t) {
		return
	}
	root := t.TempDir()
	p := networkedProvisioner(t, root, DefaultQEMUUser)
	ctx := context.Background()
	if err := p.Preflight(ctx); err != nil {
		t.Fatal(err)
	}
	nets := map[string]desired.Network{"lab": {NAT: &desired.NAT{CIDR: "10.93.0.0/24"}}}
	if err := p.ReconcileNetworks(ctx, nets, nil, map[string]bool{}); err != nil {
		t.Fatal(err)
	}
	list := func() string { // both tables, in this order
		var b strings.Builder
		for _, table := range []string{guardTable(p.user.uid), hostnet.NftTable} {
			out, err := exec.Command("nft", "list", "table", "inet", table).CombinedOutput()
			if err != nil {
				fmt.Fprintf(&b, "no table %s: %s\n", table, out)
			}
			b.Write(out)
		}
		return b.String()
	}
	want := list()
	if strings.Contains(want, "no table") {
		t.Fatalf("the guard or the nat table is missing:\n%s", want)
	}
	for _, tamper := range [][]string{
		{"flush", "ruleset"},
		{"flush", "chain", "inet", guardTable(p.user.uid), "output"},
		{"insert", "rule", "inet", guardTable(p.user.uid), "output", "accept"},
		{"delete", "table", "inet", hostnet.NftTable},
	} {
		run(t, "nft", tamper...)
		if err := p.GuardHost(ctx); err != nil {
			t.Fatalf("GuardHost after nft %s: %v", strings.Join(tamper, " "), err)
		}
		if got := list(); got != want {
			t.Errorf("after nft %s and GuardHost the ruleset is\n%s\nwant\n%s", strings.Join(tamper, " "), got, want)
		}
	}
	// Untouched, nothing is loaded again: the guard's table keeps its
	// handle (a reload would make a new one).
	handle := func() string {
		out, _ := exec.Command("nft", "-a", "list", "table", "inet", guardTable(p.user.uid)).CombinedOutput()
		return string(out)
	}
	before := handle()
	if err := p.GuardHost(ctx); err != nil {
		t.Fatal(err)
	}
	if after := handle(); after != before {
		t.Errorf("GuardHost reloaded an untouched guard:\n%s\nwas\n%s", after, before)
	}
}

// A VM given a free address never takes the one another VM of the same
// snapshot names as its static address, whichever name sorts first.
func TestStaticAddressesAreReservedBeforePickedOnes(t *testing.T) {
	for _, bin := range []string{"dnsmasq", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed", bin)
		}
	}
	if !netnstest.Enter(t) {
		return
	}
	root := t.TempDir()
	lab := desired.Network{NAT: &desired.NAT{CIDR: "10.95.0.0/24"}}
	nets := map[string]desired.Network{"lab": lab}
	// Where "a-dyn" lands on its own: the address "b-static" then claims.
	scratch, err := hostnet.New(hostnet.Config{Dir: filepath.Join(root, "scratch"), Logger: quietLog().Logger})
	if err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC(macFor("a-dyn"))
	if err := scratch.Reserve("lab", lab, hostnet.NIC{VM: "a-dyn", MAC: mac}); err != nil {
		t.Fatal(err)
	}
	var hosts map[string]struct{ Addr netip.Addr }
	b, _ := os.ReadFile(filepath.Join(root, "scratch", "lab", hostnet.HostsFile))
	if err := json.Unmarshal(b, &hosts); err != nil {
		t.Fatal(err)
	}
	taken := hosts["a-dyn"].Addr

	p := networkedProvisioner(t, root, "")
	members := []agent.NetworkMember{
		{VM: "a-dyn", Network: "lab"},
		{VM: "b-static", Network: "lab", Static: &desired.StaticIP{Addresses: []string{taken.String() + "/24"}}},
	}
	if err := p.ReconcileNetworks(context.Background(), nets, members, map[string]bool{}); err != nil {
		t.Fatalf("ReconcileNetworks: %v", err)
	}
	b, _ = os.ReadFile(filepath.Join(root, "networks", "lab", hostnet.HostsFile))
	hosts = nil
	if err := json.Unmarshal(b, &hosts); err != nil {
		t.Fatal(err)
	}
	if hosts["b-static"].Addr != taken || !hosts["a-dyn"].Addr.IsValid() || hosts["a-dyn"].Addr == taken {
		t.Errorf("reservations = %+v; want b-static at its static %s and a-dyn elsewhere", hosts, taken)
	}
}

// QEMU's user reaches no link-local address (the cloud metadata service,
// which would hand a user-mode guest the host's credentials through
// slirp), as it reaches no address of the host.
func TestGuardRefusesTheMetadataService(t *testing.T) {
	testQEMUUser(t)
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox is not installed")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv is not installed")
	}
	if !netnstest.Enter(t) {
		return
	}
	u, err := lookupQEMUUser(DefaultQEMUUser)
	if err != nil {
		t.Fatal(err)
	}
	if err := installGuard(context.Background(), "nft", u.uid); err != nil {
		t.Fatal(err)
	}
	md := netnstest.Name() + "-md"
	run(t, "ip", "netns", "add", md)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", md).Run() })
	run(t, "ip", "link", "add", "meta0", "type", "veth", "peer", "name", "eth0", "netns", md)
	run(t, "ip", "addr", "add", "169.254.0.1/16", "dev", "meta0")
	run(t, "ip", "link", "set", "meta0", "up")
	run(t, "ip", "netns", "exec", md, "ip", "addr", "add", "169.254.169.254/16", "dev", "eth0")
	run(t, "ip", "netns", "exec", md, "ip", "link", "set", "eth0", "up")
	script := filepath.Join(t.TempDir(), "md.sh")
	os.WriteFile(script, []byte("#!/bin/sh\necho host-credentials\n"), 0o755)
	srv := exec.Command("ip", "netns", "exec", md, "busybox", "nc", "-ll", "-p", "80", "-e", script)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	read := func(asQEMU bool) string {
		args := []string{"busybox", "nc", "-w", "2", "169.254.169.254", "80"}
		if asQEMU {
			args = append([]string{"setpriv", "--reuid", strconv.Itoa(u.uid), "--regid", strconv.Itoa(u.gid), "--clear-groups"}, args...)
		}
		var out []byte
		for i := 0; i < 20; i++ {
			out, _ = exec.Command(args[0], args[1:]...).CombinedOutput()
			if strings.Contains(string(out), "host-credentials") || asQEMU {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		return string(out)
	}
	if !strings.Contains(read(false), "host-credentials") {
		t.Fatal("root does not reach the metadata service: the check below proves nothing")
	}
	if out := read(true); strings.Contains(out, "host-credentials") {
		t.Errorf("QEMU's user read the metadata service: %s", out)
	}
}

// networkedProvisioner is a TCG provisioner keeping its images, machines
// and networks under root ("images", "vms", "networks"), running QEMU as
// runAs ("" for the agent's own user), with a hostnet manager of its own.
func networkedProvisioner(t *testing.T, root, runAs string) *Provisioner {
	t.Helper()
	m, err := hostnet.New(hostnet.Config{Dir: filepath.Join(root, "networks"), Logger: quietLog().Logger})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{CacheDir: filepath.Join(root, "images"), Accel: AccelTCG, RunAs: runAs,
		MachineDir: func(name string) string { return filepath.Join(root, "vms", name) },
		Logger:     quietLog().Logger, Networks: m})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// bannerOnLAN puts a network namespace on bridge br0 (a veth named
// v<suffix>) as a machine with mac at addr/24 serving an SSH banner
// ("SSH-2.0-<suffix>") on port 22, until the test ends. With gateway set
// it pings it once, so the host's neighbour table learns its MAC.
func bannerOnLAN(t *testing.T, root, suffix, mac, addr, gateway string) {
	t.Helper()
	ns := netnstest.Name() + "-" + suffix
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	run(t, "ip", "link", "add", "v"+suffix, "type", "veth", "peer", "name", "eth0", "netns", ns)
	run(t, "ip", "link", "set", "v"+suffix, "master", "br0", "up")
	run(t, "ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "address", mac, "up")
	run(t, "ip", "netns", "exec", ns, "ip", "addr", "add", addr+"/24", "dev", "eth0")
	script := filepath.Join(root, "banner-"+suffix)
	os.WriteFile(script, []byte("#!/bin/sh\necho SSH-2.0-"+suffix+"\n"), 0o755)
	cmd := exec.Command("ip", "netns", "exec", ns, "busybox", "nc", "-ll", "-p", "22", "-e", script)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if gateway != "" {
		exec.Command("ip", "netns", "exec", ns, "busybox", "ping", "-c", "1", "-W", "1", gateway).Run()
	}
}

// recordOnLAN writes the network record Boot leaves for VM name on
// network lan with mac and static address static/24, and returns its
// state.
func recordOnLAN(t *testing.T, p *Provisioner, lan desired.Network, name, mac, static string) *vmState {
	t.Helper()
	st := p.state(name, "")
	os.MkdirAll(st.dir, 0o700)
	rec, _ := json.Marshal(netRecord{Network: "lan", Def: lan, Tap: hostnet.TapName(name), MAC: mac,
		Static: &desired.StaticIP{Addresses: []string{static + "/24"}}})
	if err := os.WriteFile(st.path(NetFile), rec, 0o644); err != nil {
		t.Fatal(err)
	}
	return st
}
