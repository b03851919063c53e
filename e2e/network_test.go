package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent/hostnet"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/e2etest"
	"github.com/gitfleet/gitfleet/testsupport/netnstest"
)

// TestNATNetworkAcrossAnAgentRestart runs the controller and the agent in a
// network namespace of their own: a Host with a nat network and a VM on it
// come up with the agent's bridge, dnsmasq and rules, the status shows the
// guest's lease, and an agent killed and started again keeps the guest,
// its tap, the bridge, dnsmasq and the lease without starting anything
// twice.
func TestNATNetworkAcrossAnAgentRestart(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	for _, bin := range []string{"dnsmasq", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed", bin)
		}
	}
	if netnstest.Name() == "" {
		serveArtifacts(t) // build the tiny guest out here: the namespace has no way out
	}
	if !netnstest.Enter(t) {
		return
	}
	f := newFleet(t)
	f.startController()
	f.startAgent()
	const vm = "vm-n"
	cidr := netip.MustParsePrefix("10.87.0.0/24")
	vmFile := strings.Replace(f.art.vmFile(vm, "running", nil, false), "  power: running\n", "  power: running\n  network: lab\n", 1)
	f.push("add vm-n on a nat network", map[string]string{
		"hosts/e2e.yaml":      hostFile + "  networks: {lab: {nat: {cidr: " + cidr.String() + "}}}\n",
		"vms/" + vm + ".yaml": vmFile,
	})
	var ip netip.Addr
	f.waitFor("vm-n ready with its lease in status", func() (bool, string) {
		st := f.status()
		v := st.VM(vm)
		if v == nil || v.Phase != status.PhaseReady {
			return false, vmState(st, vm)
		}
		a, err := netip.ParseAddr(v.IP)
		ip = a
		return err == nil && cidr.Contains(a) && v.SSH == v.IP+":22", fmt.Sprintf("ip=%q ssh=%q", v.IP, v.SSH)
	})
	f.waitFor("vm-n's guest leased that address and reached its gateway", func() (bool, string) {
		s := f.serial(vm)
		return strings.Contains(s, "tinyguest: lease eth0 ip="+ip.String()+" router=10.87.0.1") &&
			strings.Contains(s, "tinyguest: ping 10.87.0.1 ok"), s
	})

	netDir := filepath.Join(f.stateDir, "networks", "lab")
	pids := f.guestPids(vm)
	require.Len(t, pids, 1)
	dnsmasqPid, err := os.ReadFile(filepath.Join(netDir, hostnet.DnsmasqPid))
	require.NoError(t, err)
	rules, err := exec.Command("nft", "list", "table", "inet", hostnet.NftTable).CombinedOutput()
	require.NoError(t, err, "%s", rules)

	// Kill the agent and start it again: the second start finds everything.
	f.kill9(f.agent)
	writes := e2etest.Writes(t, f.bare, host)
	f.startAgent()
	f.waitFor("the restarted agent wrote status twice", func() (bool, string) {
		n := writes()
		return n >= 2, fmt.Sprintf("%d writes", n)
	})
	v := f.status().VM(vm)
	require.NotNil(t, v)
	assert.Equal(t, status.PhaseReady, v.Phase)
	assert.Equal(t, ip.String(), v.IP, "the lease survives the restart")
	assert.Equal(t, pids, f.guestPids(vm), "the guest survives the restart")
	assert.Equal(t, 1, strings.Count(f.serial(vm), "tinyguest: init"), "the guest was not booted again")
	after, _ := os.ReadFile(filepath.Join(netDir, hostnet.DnsmasqPid))
	assert.Equal(t, string(dnsmasqPid), string(after), "dnsmasq adopted, not started again")
	assert.Equal(t, 1, countCmdline("--conf-file="+filepath.Join(netDir, hostnet.DnsmasqConf)), "one dnsmasq for the network")
	again, _ := exec.Command("nft", "list", "table", "inet", hostnet.NftTable).CombinedOutput()
	assert.Equal(t, string(rules), string(again), "the rules are not duplicated")
	ruleset, _ := exec.Command("nft", "list", "ruleset").CombinedOutput()
	assert.Equal(t, 1, strings.Count(string(ruleset), "table inet "+hostnet.NftTable+" {"), "one table of the network's rules (the QEMU guard's table is another)")
	_, err = os.Stat(filepath.Join("/sys/class/net", hostnet.TapName(vm)))
	assert.NoError(t, err, "the tap survives the restart")
	_, err = os.Stat("/sys/class/net/gf-lab/bridge")
	assert.NoError(t, err, "the bridge survives the restart")
}

// countCmdline counts the processes whose command line has arg.
func countCmdline(arg string) int {
	entries, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), arg+"\x00") {
			n++
		}
	}
	return n
}
