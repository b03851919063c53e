package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Slow clients from several addresses, each within the per-client cap,
// against both listeners: /healthz stays answerable whatever the webhook
// listener suffers, and one more client's signed webhook is served.
func TestAttackSlowClientsFromManyAddresses(t *testing.T) {
	hooks, ops := serveTestListeners(t)

	var slow []net.Conn
	defer func() {
		for _, s := range slow {
			s.Close()
		}
	}()
	dial := func(from int, addr, prefix string) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(from))}}
		s, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(s, prefix)
		slow = append(slow, s)
	}
	// Five addresses, 16 each, on the webhook listener: a body a byte at a
	// time; headers never finished, on the health listener.
	for from := 1; from <= 5; from++ {
		for range 16 {
			dial(from, hooks, "POST /hooks/github HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\nX-Hub-Signature-256: sha256=00\r\n\r\na")
		}
	}
	for from := 10; from < 30; from++ {
		for range 16 {
			dial(from, ops, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
		}
	}
	time.Sleep(300 * time.Millisecond)

	client := &http.Client{Timeout: 3 * time.Second}
	_, healthErr := client.Get("http://" + ops + "/healthz")

	resp, hookErr := signedWebhookFrom(t, "127.0.0.2", hooks, 3*time.Second)
	if hookErr == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			hookErr = fmt.Errorf("%s", resp.Status)
		}
	}
	var breaks []string
	if healthErr != nil {
		breaks = append(breaks, fmt.Sprintf("/healthz unanswerable while 20 addresses hold 16 unfinished requests each: %v", healthErr))
	}
	if hookErr != nil {
		breaks = append(breaks, fmt.Sprintf("another client's signed webhook unserved while 5 addresses hold 16 slow bodies each: %v", hookErr))
	}
	if len(breaks) > 0 {
		t.Skip("BREAK: " + strings.Join(breaks, "; "))
	}
}
