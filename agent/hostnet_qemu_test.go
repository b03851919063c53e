package agent_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/hostnet"
	"github.com/gitfleet/gitfleet/agent/qemu"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/tinyguest"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/netnstest"
)

// These tests run the engine with the QEMU backend and real host
// networking (testsupport/netnstest): bridges, taps, dnsmasq and nftables
// live in a network namespace the test made, and the tiny guest boots on
// them under TCG.

// netEngine is an engine over the QEMU backend with host networking, and
// the hostnet Manager's log.
type netEngine struct {
	eng  *agent.Engine
	logs *logtest.Hook
	spec desired.VMSpec
}

// netEngineGuest builds the tiny guest (before the namespace: a first
// build may need apt) and skips when the tools are missing.
func netEngineGuest(t *testing.T) *tinyguest.Guest {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a real VM; skipped with -short")
	}
	for _, bin := range []string{"qemu-system-x86_64", "qemu-img", "dnsmasq", "nft", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed", bin)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	g, err := tinyguest.Build(ctx, tinyguest.TestCacheDir())
	require.NoError(t, err, "build the tiny guest")
	return g
}

func newNetEngine(t *testing.T, g *tinyguest.Guest, opts ...func(*agent.EngineConfig)) *netEngine {
	t.Helper()
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", base, "64M").CombinedOutput()
	require.NoError(t, err, string(out))
	kernel, initrd, image := fileArtifact(t, g.Kernel), fileArtifact(t, g.Initrd), fileArtifact(t, base)
	store, err := agent.OpenStore(filepath.Join(dir, "state"))
	require.NoError(t, err)
	netLog, hook := logtest.NewNullLogger()
	netLog.SetLevel(logrus.DebugLevel)
	nets, err := hostnet.New(hostnet.Config{Dir: filepath.Join(dir, "networks"), Logger: netLog})
	require.NoError(t, err)
	prov, err := qemu.New(qemu.Config{CacheDir: filepath.Join(dir, "images"), MachineDir: store.VMDir, Accel: "tcg",
		RunAs: qemuUser(t), Networks: nets,
		Artifacts:        qemu.ArtifactPolicy{FileRoots: []string{filepath.Dir(g.Kernel), filepath.Dir(g.Initrd), dir}},
		PowerdownTimeout: 5 * time.Second, KillTimeout: 5 * time.Second, BootTimeout: 90 * time.Second, Logger: quietLog()})
	require.NoError(t, err)
	cfg := agent.EngineConfig{Host: testHost, Store: store, Provisioner: prov, MaxAttempts: 3, Log: quietLog()}
	for _, o := range opts {
		o(&cfg)
	}
	eng, err := agent.NewEngine(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		eng.Close(context.Background())
		_ = prov.Destroy(context.Background(), "web-01")
	})
	spec := desired.VMSpec{Host: testHost, VCPUs: 1, MemoryMB: 128, DiskGB: 1, Power: desired.PowerRunning, Image: &image,
		Kernel: &desired.Kernel{URL: kernel.URL, SHA256: kernel.SHA256, Initrd: &initrd, Cmdline: g.Cmdline}}
	return &netEngine{eng: eng, logs: hook, spec: spec}
}

func (n *netEngine) step(t *testing.T, s *snapshots.Snapshot) status.VM {
	t.Helper()
	require.NoError(t, n.eng.Tick(context.Background(), s))
	require.NoError(t, n.eng.Settle(context.Background()))
	return row(t, n.eng.Report(), "web-01")
}

func (n *netEngine) snapshot(network string, nets map[string]desired.Network) *snapshots.Snapshot {
	spec := n.spec
	spec.Network = network
	s := snap(1, snapshots.SnapshotVM{Name: "web-01", SpecHash: desired.SpecHash(spec), Spec: spec})
	return withNetworks(s, nets)
}

// The example fleet's "lan: {bridge: br0}" on a host that has no br0 yet:
// the VM waits (creating, no attempt spent, status naming the bridge)
// however many ticks pass, and boots at the first tick after an admin
// makes the bridge.
func TestVMOnAMissingBridgeBootsOnceTheBridgeExists(t *testing.T) {
	g := netEngineGuest(t)
	if !netnstest.Enter(t) {
		return
	}
	n := newNetEngine(t, g)
	s := n.snapshot("lan", map[string]desired.Network{"lan": {Bridge: "br0"}})
	for i := 0; i < 5; i++ {
		r := n.step(t, s)
		require.Equal(t, status.PhaseCreating, r.Phase, "tick %d: %s", i, r.LastError)
		assert.Equal(t, "boot: network lan: bridge br0 does not exist on this host: "+agent.ErrNetworkMissing.Error(), r.LastError)
	}

	for _, args := range [][]string{{"link", "add", "br0", "type", "bridge"}, {"link", "set", "br0", "up"}} {
		out, err := exec.Command("ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
	}
	r := n.step(t, s)
	assert.Contains(t, []string{status.PhaseBooting, status.PhaseReady}, r.Phase, "QEMU runs on br0: %s", r.LastError)
	assert.Empty(t, r.LastError)
	link, err := exec.Command("ip", "-o", "link", "show", "master", "br0").CombinedOutput()
	require.NoError(t, err, string(link))
	assert.Contains(t, string(link), hostnet.TapName("web-01"), "the VM's tap is a port of br0")
}

// The agent's first pass over a VM on a nat network starts dnsmasq once:
// the network is ensured by the tick and again by the VM's attach, whose
// new address reservation reaches the running dnsmasq without a restart.
// A restarted engine starts none.
func TestFirstPassOnANATNetworkStartsDnsmasqOnce(t *testing.T) {
	g := netEngineGuest(t)
	if !netnstest.Enter(t) {
		return
	}
	n := newNetEngine(t, g)
	s := n.snapshot("lab", map[string]desired.Network{"lab": {NAT: &desired.NAT{CIDR: "10.86.0.0/24"}}})
	starts := func() (count int) {
		for _, e := range n.logs.AllEntries() {
			if e.Message == "dnsmasq started" {
				count++
			}
		}
		return count
	}
	r := n.step(t, s)
	require.Contains(t, []string{status.PhaseBooting, status.PhaseReady}, r.Phase, r.LastError)
	assert.Equal(t, 1, starts(), "dnsmasq starts in the first pass")
	for i := 0; i < 3; i++ {
		n.step(t, s)
	}
	assert.Equal(t, 1, starts(), "dnsmasq starts after the first pass")
}

// A guest whose DHCP gets no answer (here a table of the test's own drops
// it) answers on its console but holds no lease: it has no address, so its
// VM is booting, not ready, and once readyTimeout has passed lastError
// says it holds no lease of its address. It showed ready with no address.
func TestVMWhoseGuestHoldsNoLeaseIsNotReady(t *testing.T) {
	g := netEngineGuest(t)
	if !netnstest.Enter(t) {
		return
	}
	n := newNetEngine(t, g, func(c *agent.EngineConfig) { c.ReadyTimeout = 5 * time.Second })
	block := exec.Command("nft", "-f", "-")
	block.Stdin = strings.NewReader("table bridge blockdhcp {\n\tchain c {\n\t\ttype filter hook prerouting priority -300; policy accept;\n" +
		"\t\tiifname \"" + hostnet.TapName("web-01") + "\" udp dport 67 drop\n\t}\n}\n")
	out, err := block.CombinedOutput()
	require.NoError(t, err, string(out))
	s := n.snapshot("lab", map[string]desired.Network{"lab": {NAT: &desired.NAT{CIDR: "10.122.0.0/24"}}})
	r := n.step(t, s)
	require.Contains(t, []string{status.PhaseBooting, status.PhaseReady}, r.Phase, r.LastError)
	deadline := time.Now().Add(2 * time.Minute)
	// The guest answers once its DHCP client gave up (some 20 s).
	for !strings.HasPrefix(r.LastError, "not ready: the guest holds no lease") && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		r = row(t, n.eng.Report(), "web-01")
	}
	assert.Equal(t, status.PhaseBooting, r.Phase, "the guest holds no lease")
	assert.Empty(t, r.IP)
	assert.True(t, strings.HasPrefix(r.LastError, "not ready: the guest holds no lease of its address: no lease of address 10.122.0."), r.LastError)
	assert.Equal(t, status.PhaseBooting, n.step(t, s).Phase, "a tick changes nothing")
}

// Host health that decides whether a nat guest's traffic flows is shown,
// and the guest keeps running: another firewall's table with a drop
// policy on the forward hook (what Docker installs), then a route over
// the network's CIDR that appears after it was made, are named on the
// network in the host's status, on the VM's note and in
// gitfleet_agent_network_degraded; once they are gone, all say so.
func TestHostHealthThatCutsAGuestOffIsShown(t *testing.T) {
	g := netEngineGuest(t)
	if !netnstest.Enter(t) {
		return
	}
	reg := prometheus.NewRegistry()
	m, err := agent.NewMetrics(reg)
	require.NoError(t, err)
	n := newNetEngine(t, g, func(c *agent.EngineConfig) { c.Metrics = m })
	nets := map[string]desired.Network{"lab": {NAT: &desired.NAT{CIDR: "10.123.0.0/24"}}}
	s := n.snapshot("lab", nets)
	r := n.step(t, s)
	for deadline := time.Now().Add(3 * time.Minute); r.Phase != status.PhaseReady && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		r = n.step(t, s)
	}
	require.Equal(t, status.PhaseReady, r.Phase, r.LastError)
	assert.Equal(t, []status.NetworkHealth{{Name: "lab"}}, n.eng.Report().Networks)
	assert.Equal(t, 0.0, value(t, reg, "gitfleet_agent_network_degraded", "network", "lab"))

	sh := func(args ...string) {
		t.Helper()
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		require.NoError(t, err, "%s: %s", strings.Join(args, " "), out)
	}
	sh("nft", "add table ip filter; add chain ip filter FORWARD { type filter hook forward priority 0; policy drop; }")
	r = n.step(t, s)
	st := n.eng.Report()
	require.Len(t, st.Networks, 1)
	assert.Equal(t, "table ip filter chain FORWARD on the forward hook has policy drop", st.Networks[0].Degraded)
	assert.Contains(t, r.Message, "network lab degraded: table ip filter chain FORWARD on the forward hook has policy drop")
	assert.Equal(t, status.PhaseReady, r.Phase, "the guest keeps running")
	assert.Equal(t, 1.0, value(t, reg, "gitfleet_agent_network_degraded", "network", "lab"))
	sh("nft", "delete table ip filter")

	sh("ip", "link", "add", "vpn0", "type", "veth", "peer", "name", "vpn0p")
	sh("ip", "link", "set", "vpn0p", "up")
	sh("ip", "link", "set", "vpn0", "up")
	sh("ip", "route", "add", "10.123.0.0/25", "dev", "vpn0")
	r = n.step(t, s)
	assert.Contains(t, r.Message, "network lab degraded: 10.123.0.0/24 overlaps the host's route to 10.123.0.0/25 (device vpn0, table main)")
	assert.Equal(t, "running", r.Power)
	sh("ip", "route", "del", "10.123.0.0/25", "dev", "vpn0")

	r = n.step(t, s)
	assert.NotContains(t, r.Message, "degraded")
	assert.Equal(t, []status.NetworkHealth{{Name: "lab"}}, n.eng.Report().Networks)
	assert.Equal(t, 0.0, value(t, reg, "gitfleet_agent_network_degraded", "network", "lab"))
}
