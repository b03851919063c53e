package httpserve

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// dialFrom connects to addr from the loopback address src (127.0.0.0/8
// is all this host's).
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// get sends one GET on c and reports whether a response came back.
func get(c net.Conn) bool {
	c.SetDeadline(time.Now().Add(20 * time.Second))
	io.WriteString(c, "GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	b, _ := io.ReadAll(c)
	return len(b) > 0
}

// One client holding its share of connections (idle, or sending a header
// a byte at a time) cannot take another's: a second client is served
// while the first is at its cap, the first's connection over the cap is
// closed at once, and a client sending its headers slowly is closed
// after ReadHeaderTimeout, well before ReadTimeout.
func TestPerClientCap(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		Options{ReadHeaderTimeout: 500 * time.Millisecond, ReadTimeout: time.Minute, MaxConns: 100, MaxConnsPerClient: 10})
	go srv.Serve()
	defer srv.Shutdown(context.Background())
	addr := srv.Addr().String()

	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range 10 {
		c := dialFrom(t, "127.0.0.1", addr)
		io.WriteString(c, "GET /x HTTP/1.1\r\nHo") // and no more
		held = append(held, c)
	}
	deadline := time.Now().Add(10 * time.Second)
	for srv.Open() < 10 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !get(dialFrom(t, "127.0.0.2", addr)) {
		t.Fatal("a second client was not served while the first held its cap")
	}
	if get(dialFrom(t, "127.0.0.1", addr)) {
		t.Fatal("a connection over the client's cap was served")
	}
	// The slow headers are cut at ReadHeaderTimeout: each held
	// connection ends long before the minute of ReadTimeout.
	start := time.Now()
	for i, c := range held {
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("connection %d sending its headers slowly still open after %v", i, time.Since(start))
			}
		}
	}
	if !get(dialFrom(t, "127.0.0.1", addr)) {
		t.Fatal("the first client is not served again once its connections closed")
	}
}
