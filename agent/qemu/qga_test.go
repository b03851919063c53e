package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/netnstest"
)

// startQGA runs the real qemu-guest-agent on this host, listening on a unix
// socket as it would on the guest's virtio-serial port, and returns the
// socket's path.
func startQGA(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("qemu-ga")
	if err != nil {
		if bin, err = exec.LookPath("/usr/sbin/qemu-ga"); err != nil {
			t.Skip("qemu-ga not installed (qemu-guest-agent; scripts/install-deps.sh installs it)")
		}
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, QGASocket)
	cmd := exec.Command(bin, "-m", "unix-listen", "-p", sock, "-f", filepath.Join(dir, "qga.pid"), "-t", dir)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(sock); err == nil {
			return sock
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("qemu-ga never made its socket")
	return ""
}

func TestQGACallRealAgent(t *testing.T) {
	sock := startQGA(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := qgaCall(ctx, sock, "guest-ping", nil, nil); err != nil {
		t.Fatalf("guest-ping: %v", err)
	}
	var ifs []GuestInterface
	if err := qgaCall(ctx, sock, "guest-network-get-interfaces", nil, &ifs); err != nil {
		t.Fatalf("guest-network-get-interfaces: %v", err)
	}
	var lo bool
	for _, i := range ifs {
		for _, a := range i.Addresses {
			if i.Name == "lo" && a.Type == "ipv4" && a.Address == "127.0.0.1" && a.Prefix == 8 {
				lo = true
			}
		}
	}
	if !lo {
		t.Errorf("no lo 127.0.0.1/8 among %+v", ifs)
	}
	err := qgaCall(ctx, sock, "guest-no-such-command", nil, nil)
	if err == nil || !strings.Contains(err.Error(), "CommandNotFound") {
		t.Errorf("unknown command: err %v, want the agent's CommandNotFound", err)
	}
}

// fakeQGA accepts one connection on a unix socket and runs serve on it.
func fakeQGA(t *testing.T, serve func(r *bufio.Reader, c net.Conn)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), QGASocket)
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		serve(bufio.NewReader(c), c)
	}()
	return sock
}

func TestQGACallSkipsStaleReplies(t *testing.T) {
	// The channel still holds the reply to an abandoned call and an old
	// sync: both are dropped; only the answer after this call's sync counts.
	sock := fakeQGA(t, func(r *bufio.Reader, c net.Conn) {
		b, _ := r.ReadBytes('\n')
		var req struct {
			Arguments struct{ ID int64 } `json:"arguments"`
		}
		json.Unmarshal([]byte(strings.TrimLeft(string(b), "\xff")), &req)
		c.Write([]byte("{\"return\": [{\"name\": \"stale\"}]}\n\xff{\"return\": 7}\n"))
		reply, _ := json.Marshal(map[string]any{"return": req.Arguments.ID})
		c.Write(append([]byte{0xff}, append(reply, '\n')...))
		r.ReadBytes('\n')
		c.Write([]byte(`{"return": [{"name": "eth0", "hardware-address": "52:54:00:12:34:56", "ip-addresses": [{"ip-address-type": "ipv4", "ip-address": "192.0.2.7", "prefix": 24}]}]}` + "\n"))
	})
	var ifs []GuestInterface
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := qgaCall(ctx, sock, "guest-network-get-interfaces", nil, &ifs); err != nil {
		t.Fatal(err)
	}
	if len(ifs) != 1 || ifs[0].Name != "eth0" || ifs[0].MAC != "52:54:00:12:34:56" || len(ifs[0].Addresses) != 1 || ifs[0].Addresses[0].Address != "192.0.2.7" {
		t.Errorf("got %+v, want eth0 with 192.0.2.7", ifs)
	}
}

func TestQGACallSilentGuestIsBounded(t *testing.T) {
	// A channel with no agent behind it accepts and never answers, as
	// QEMU's chardev does for a guest without qemu-guest-agent.
	sock := fakeQGA(t, func(r *bufio.Reader, c net.Conn) { r.ReadBytes('\n'); time.Sleep(time.Minute) })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- qgaCall(ctx, sock, "guest-ping", nil, nil) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("guest-ping answered with no agent behind the channel")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("guest-ping not bounded by its context")
	}
}

func TestAddressForMAC(t *testing.T) {
	mac, _ := net.ParseMAC("52:54:00:aa:bb:cc")
	ifs := []GuestInterface{
		{Name: "lo", MAC: "00:00:00:00:00:00", Addresses: []GuestIPAddress{{Type: "ipv4", Address: "127.0.0.1", Prefix: 8}}},
		{Name: "eth1", MAC: "52:54:00:00:00:01", Addresses: []GuestIPAddress{{Type: "ipv4", Address: "198.51.100.7", Prefix: 24}}},
		{Name: "nic0", MAC: "52:54:00:AA:BB:CC", Addresses: []GuestIPAddress{
			{Type: "ipv6", Address: "fe80::5054:ff:feaa:bbcc", Prefix: 64},
			{Type: "ipv4", Address: "169.254.3.4", Prefix: 16},
			{Type: "ipv4", Address: "192.0.2.10", Prefix: 24},
		}},
	}
	if got := addressForMAC(ifs, mac); got != netip.MustParseAddr("192.0.2.10") {
		t.Errorf("addressForMAC = %v, want 192.0.2.10 (the NIC's global IPv4, MAC compared case-blind)", got)
	}
	if got := addressForMAC(ifs[:2], mac); got.IsValid() {
		t.Errorf("addressForMAC without the VM's NIC = %v, want none", got)
	}
}

// TestBridgeGuestAddressFromGuestAgent runs the real qemu-guest-agent in a
// network namespace whose veth NIC carries the VM's MAC and an address,
// as a guest on a bridge network would, and checks that Address reports
// that address when the host's neighbour table knows none.
func TestBridgeGuestAddressFromGuestAgent(t *testing.T) {
	if !netnstest.Enter(t) {
		return
	}
	const name = "bridged-1"
	mac := macFor(name)
	for _, args := range [][]string{
		{"link", "add", "gfnic0", "address", mac, "type", "veth", "peer", "name", "gfnic1"},
		{"addr", "add", "192.0.2.10/24", "dev", "gfnic0"},
		{"link", "set", "gfnic0", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	sock := startQGA(t)
	dir := filepath.Dir(sock)
	// A stand-in for the VM's QEMU: a live process whose command line names
	// the VM and its pidfile, as Boot's QEMU does.
	pidfile := filepath.Join(dir, PidFile)
	stand := exec.Command("sh", "-c", "sleep 600", "qemu", "-name", "guest="+name, "-pidfile", pidfile)
	if err := stand.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stand.Process.Kill(); stand.Wait() })
	if err := os.WriteFile(pidfile, []byte(strconv.Itoa(stand.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(netRecord{Network: "lan", Def: desired.Network{Bridge: "br0"}, Tap: "gft0", MAC: mac})
	if err := os.WriteFile(filepath.Join(dir, NetFile), rec, 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{CacheDir: t.TempDir(), Accel: AccelTCG, Logger: quietLog().Logger,
		MachineDir: func(string) string { return dir }})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		a := p.Address(name)
		if a.IP == "192.0.2.10" {
			if a.SSH != "192.0.2.10:22" {
				t.Errorf("ssh = %q, want 192.0.2.10:22", a.SSH)
			}
			return
		}
		if a.IP != "" {
			t.Fatalf("Address = %+v, want the guest agent's 192.0.2.10", a)
		}
		if time.Now().After(deadline) {
			t.Fatalf("Address never learned the guest agent's address (last %+v)", a)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
