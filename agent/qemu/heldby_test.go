package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/agent/hostnet"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/netnstest"
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
	m, err := hostnet.New(hostnet.Config{Dir: filepath.Join(root, "networks"), Logger: quietLog().Logger})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{CacheDir: filepath.Join(root, "images"), Accel: AccelTCG,
		MachineDir: func(name string) string { return filepath.Join(root, "vms", name) },
		Logger:     quietLog().Logger, Networks: m})
	if err != nil {
		t.Fatal(err)
	}
	run(t, "ip", "link", "add", "br0", "type", "bridge")
	run(t, "ip", "addr", "add", "192.168.70.1/24", "dev", "br0")
	run(t, "ip", "link", "set", "br0", "up")
	lan := desired.Network{Bridge: "br0"}

	// peer is a machine on the LAN with mac and addr, serving an SSH
	// banner on port 22.
	peer := func(suffix, mac, addr string) {
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
	}
	// vm records a VM on the LAN with mac and a static address, as Boot
	// leaves it.
	vm := func(name, mac, static string) *vmState {
		st := p.state(name, "")
		os.MkdirAll(st.dir, 0o700)
		rec, _ := json.Marshal(netRecord{Network: "lan", Def: lan, Tap: hostnet.TapName(name), MAC: mac,
			Static: &desired.StaticIP{Addresses: []string{static + "/24"}}})
		if err := os.WriteFile(st.path(NetFile), rec, 0o644); err != nil {
			t.Fatal(err)
		}
		return st
	}
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
