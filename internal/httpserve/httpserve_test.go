package httpserve

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// 3,000 connections that send nothing (or a request's first bytes and no
// more) are all closed by the server after the read timeout, and the
// server never holds more than its cap at once.
func TestServerClosesIdleConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const maxConns = 100
	srv := NewServer(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) }),
		Options{ReadTimeout: time.Second, WriteTimeout: time.Second, IdleTimeout: time.Second, MaxConns: maxConns})
	go srv.Serve()
	defer srv.Shutdown(context.Background())

	const n = 3000
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	start := time.Now()
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		if i%2 == 1 {
			// A slow body: headers promise more than ever comes.
			io.WriteString(c, "POST /hooks/github HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nab")
		}
		conns = append(conns, c)
		if open := srv.Open(); open > maxConns {
			t.Fatalf("server holds %d connections, over its cap of %d", open, maxConns)
		}
	}
	// Every connection is closed by the server: a read ends (EOF, or a
	// reset) instead of blocking. The deadline only bounds a broken server.
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(time.Minute))
		if _, err := io.Copy(io.Discard, c); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("connection %d still open after a minute", i)
			}
		}
	}
	t.Logf("%d idle connections closed %s after the first was opened", n, time.Since(start).Round(100*time.Millisecond))
	deadline := time.Now().Add(time.Minute)
	for srv.Open() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("server still counts %d open connections", srv.Open())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
