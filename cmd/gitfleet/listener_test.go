package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/cmd/gitfleet/internal/config"
	"github.com/gitfleet/gitfleet/fleet"
)

// 300 connections that send a webhook's headers and then a body one byte
// at a time, never finishing, do not keep /healthz and /metrics from
// answering at once: they are served apart (--listen) from the webhooks
// (--webhook-listen). (On one listener, the 256 connections it served at
// once were all the slow ones'.) A webhook sent to --listen is told where
// they are served.
func TestSlowWebhookClientsDoNotStarveHealthz(t *testing.T) {
	hooks, ops := serveTestListeners(t)

	var slow []net.Conn
	defer func() {
		for _, s := range slow {
			s.Close()
		}
	}()
	for range 300 {
		s, err := net.Dial("tcp", hooks)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(s, "POST /hooks/github HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\nX-Hub-Signature-256: sha256=00\r\n\r\na")
		slow = append(slow, s)
	}
	time.Sleep(200 * time.Millisecond) // the server accepted them all

	client := &http.Client{Timeout: 10 * time.Second}
	for _, path := range []string{"/healthz", "/metrics"} {
		resp, err := client.Get("http://" + ops + path)
		if err != nil {
			t.Fatalf("GET %s while 300 slow webhook clients are connected: %v", path, err)
		}
		resp.Body.Close()
		if path == "/metrics" && resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %s", path, resp.Status)
		}
	}
	// The webhook listener serves another client: the slow one holds
	// only its share of connections.
	resp, err := signedWebhookFrom(t, "127.0.0.2", hooks, 10*time.Second)
	if err != nil {
		t.Fatalf("a signed webhook from another client while the slow one is connected: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Errorf("a signed webhook from another client: %s", resp.Status)
	}

	resp, err = client.Post("http://"+ops+"/hooks/github", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "--webhook-listen") {
		t.Errorf("a webhook on --listen: %s %q", resp.Status, body)
	}
}

// serveTestListeners serves a controller of a fresh CLI fleet on two
// loopback listeners, webhooks (secret "s3cret") apart from /healthz and
// /metrics, until the test ends, and returns their addresses.
func serveTestListeners(t *testing.T) (hooks, ops string) {
	t.Helper()
	ctl, err := fleet.New(fleet.Config{URL: cliFleet(t), Path: "fleet"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctl.Close() })
	c := config.DefaultController()
	c.Listen, c.WebhookListen = "127.0.0.1:0", "127.0.0.1:0"
	c.WebhookSecret = "s3cret"
	srv, err := serveHTTP(ctl, &c, logrus.New())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return srv.hooks.Addr().String(), srv.ops.Addr().String()
}

// signedWebhookFrom posts a GitHub push webhook signed with the test
// listeners' secret to hooks, from the loopback address from, within
// timeout.
func signedWebhookFrom(t *testing.T, from, hooks string, timeout time.Duration) (*http.Response, error) {
	t.Helper()
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}).DialContext}}
	mac := hmac.New(sha256.New, []byte("s3cret"))
	mac.Write([]byte("{}"))
	req, err := http.NewRequest(http.MethodPost, "http://"+hooks+"/hooks/github", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac.Sum(nil)))
	return client.Do(req)
}
