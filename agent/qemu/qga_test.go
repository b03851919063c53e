package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
