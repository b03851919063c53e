package qemu

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/agent"
)

// listen serves each connection on 127.0.0.1 with serve and returns the
// address.
func listen(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
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
			go func() { defer c.Close(); serve(c) }()
		}
	}()
	return l.Addr().String()
}

func TestSSHBanner(t *testing.T) {
	tests := []struct {
		name  string
		serve func(net.Conn)
		ok    bool
	}{
		// QEMU's user-mode forward accepts before the guest listens, then
		// closes: that is no answer.
		{"forward with nothing behind it", func(net.Conn) {}, false},
		{"sshd", func(c net.Conn) { c.Write([]byte("SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n")) }, true},
		{"lines before the banner", func(c net.Conn) { c.Write([]byte("welcome\r\nSSH-2.0-x\r\n")) }, true},
		{"another protocol", func(c net.Conn) { c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")) }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := sshBanner(context.Background(), listen(t, tc.serve))
			if (err == nil) != tc.ok {
				t.Errorf("sshBanner: %v, want ok=%v", err, tc.ok)
			}
		})
	}
	t.Run("silent server is bounded by the context", func(t *testing.T) {
		addr := listen(t, func(net.Conn) { time.Sleep(time.Minute) })
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		if err := sshBanner(ctx, addr); err == nil {
			t.Error("a server that never speaks counted as sshd")
		}
	})
}

func TestConsoleScan(t *testing.T) {
	path := filepath.Join(t.TempDir(), SerialLog)
	c := newConsoleScan(path)
	write := func(s string, flag int) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|flag, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(s)
		f.Close()
	}
	found := func() bool { _, err := c.probe(context.Background()); return err == nil }
	if found() {
		t.Fatal("marker found in a missing log")
	}
	// The kernel echoes its command line and a guest may mention the
	// marker: only the marker alone on its line counts.
	write("[    0.000000] Command line: console=ttyS0 GITFLEET-GUEST-READY\r\nsay GITFLEET-GUEST-READY later\r\nGITFLEET-GUEST-", os.O_APPEND)
	if found() {
		t.Fatal("marker found inside other lines, or before its line ended")
	}
	write("READY\r\n", os.O_APPEND)
	if !found() {
		t.Fatal("marker split across two reads not found")
	}
	// QEMU truncates the log when it starts the VM again.
	c = newConsoleScan(path)
	write("boot\n", os.O_APPEND)
	found()
	write("x\n", os.O_TRUNC)
	if found() {
		t.Fatal("marker of an earlier boot found after the log was truncated")
	}
	write(agent.ConsoleReadyMarker+"\n", os.O_APPEND)
	if !found() {
		t.Fatal("marker after truncation not found")
	}
}

func TestReadyFileNamesItsBoot(t *testing.T) {
	path := filepath.Join(t.TempDir(), ReadyFile)
	at := time.Unix(1767000000, 123456789)
	if err := writeReadyFile(path, 4242, agent.Readiness{Ready: true, At: at, Via: agent.ReadySSH, Addr: "127.0.0.1:2201"}); err != nil {
		t.Fatal(err)
	}
	r, ok := readReadyFile(path, 4242)
	if !ok || !r.Ready || !r.At.Equal(at) || r.Via != agent.ReadySSH || r.Addr != "127.0.0.1:2201" {
		t.Errorf("read back %+v %v", r, ok)
	}
	if _, ok := readReadyFile(path, 4243); ok {
		t.Error("the answer of QEMU pid 4242 counted for pid 4243")
	}
}
