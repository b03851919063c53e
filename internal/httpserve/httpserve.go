// Package httpserve is the HTTP server of gitfleet's listeners (the
// controller's webhooks, and its and the agent's /metrics and /healthz):
// an http.Server with every timeout set, a cap on connections and a cap
// per client, so slow or idle clients cannot hold the process's file
// descriptors, and one client cannot take every connection. Serve
// untrusted requests (webhooks) and health checks on listeners of their
// own: a cap shared between them lets the first starve the second.
package httpserve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Options.
const (
	DefaultMaxConns          = 256
	DefaultMaxConnsPerClient = 16
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
)

// Options bound a listener.
// Zero values take the defaults.
type Options struct {
	// ReadHeaderTimeout bounds reading one request's headers, from the
	// moment the connection is accepted or the previous request ended
	// (default DefaultReadHeaderTimeout). A connection that sends nothing,
	// or its headers a byte at a time, is closed after it.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading one request, headers and body (default
	// DefaultReadTimeout): a body sent slowly holds the connection at
	// most this long.
	ReadTimeout time.Duration
	// WriteTimeout bounds writing one response (default
	// DefaultWriteTimeout).
	WriteTimeout time.Duration
	// IdleTimeout closes a kept-alive connection that starts no new request
	// (default DefaultIdleTimeout).
	IdleTimeout time.Duration
	// MaxConns caps the connections served at once (default
	// DefaultMaxConns); one over the cap is closed as soon as it is
	// accepted, so it holds no file descriptor.
	MaxConns int
	// MaxConnsPerClient caps the connections served at once from one
	// client (default DefaultMaxConnsPerClient, at most MaxConns): one
	// IPv4 address, or one IPv6 /64 (what one host is given). One over
	// it is closed as soon as it is accepted. Behind a reverse proxy
	// every client is the proxy.
	MaxConnsPerClient int
}

func (o Options) withDefaults() Options {
	if o.ReadHeaderTimeout <= 0 {
		o.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = DefaultReadTimeout
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.MaxConnsPerClient <= 0 {
		o.MaxConnsPerClient = DefaultMaxConnsPerClient
	}
	o.MaxConnsPerClient = min(o.MaxConnsPerClient, o.MaxConns)
	o.ReadHeaderTimeout = min(o.ReadHeaderTimeout, o.ReadTimeout)
	return o
}

// Server is an http.Server with every timeout set, a cap on connections
// and one per client.
type Server struct {
	srv *http.Server
	ln  *capListener
}

// NewServer serves h on ln under opts. Serve it with Serve; stop it with
// Shutdown.
func NewServer(ln net.Listener, h http.Handler, opts Options) *Server {
	opts = opts.withDefaults()
	return &Server{
		srv: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: opts.ReadHeaderTimeout,
			ReadTimeout:       opts.ReadTimeout,
			WriteTimeout:      opts.WriteTimeout,
			IdleTimeout:       opts.IdleTimeout,
			MaxHeaderBytes:    64 << 10,
		},
		ln: &capListener{Listener: ln, max: int64(opts.MaxConns), perClient: opts.MaxConnsPerClient, clients: map[string]int{}},
	}
}

// Serve serves until Shutdown; it returns nil after Shutdown.
func (s *Server) Serve() error {
	err := s.srv.Serve(s.ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops accepting and waits for requests under way until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// Open is the number of connections the server holds now.
func (s *Server) Open() int { return int(s.ln.open.Load()) }

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// capListener closes connections over its caps at once.
type capListener struct {
	net.Listener
	max  int64
	open atomic.Int64

	perClient int
	mu        sync.Mutex
	clients   map[string]int // open connections by clientKey
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key := clientKey(c.RemoteAddr())
		if !l.admitClient(key) {
			c.Close()
			continue
		}
		if !l.admit() {
			l.releaseClient(key)
			c.Close()
			continue
		}
		return &countedConn{Conn: c, l: l, client: key}, nil
	}
}

// clientKey is the client a connection counts against: its IPv4
// address, or its IPv6 address's /64.
func clientKey(a net.Addr) string {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return a.String()
	}
	ip := ap.Addr().Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// admitClient takes one of key's slots when it has one free.
func (l *capListener) admitClient(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.clients[key] >= l.perClient {
		return false
	}
	l.clients[key]++
	return true
}

func (l *capListener) releaseClient(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.clients[key]--; l.clients[key] <= 0 {
		delete(l.clients, key)
	}
}

// admit takes a slot when one is free. It never raises the count past max,
// not even for an instant, so Open never reads more than the cap.
func (l *capListener) admit() bool {
	for {
		n := l.open.Load()
		if n >= l.max {
			return false
		}
		if l.open.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// countedConn gives its slots back once, when closed.
type countedConn struct {
	net.Conn
	l      *capListener
	client string
	once   sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.l.open.Add(-1)
		c.l.releaseClient(c.client)
	})
	return c.Conn.Close()
}
