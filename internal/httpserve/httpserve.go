// Package httpserve is the HTTP server of gitfleet's listeners (the
// controller's webhooks and /metrics, the agent's /metrics and /healthz):
// an http.Server with every timeout set and a cap on connections, so slow
// or idle clients cannot hold the process's file descriptors.
package httpserve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Options.
const (
	DefaultMaxConns     = 256
	DefaultReadTimeout  = 30 * time.Second
	DefaultWriteTimeout = 30 * time.Second
	DefaultIdleTimeout  = 60 * time.Second
)

// Options bound a listener.
// Zero values take the defaults.
type Options struct {
	// ReadTimeout bounds reading one request, headers and body, from the
	// moment the connection is accepted or the previous request ended
	// (default DefaultReadTimeout). A connection that sends nothing is
	// closed after it.
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
}

func (o Options) withDefaults() Options {
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
	return o
}

// Server is an http.Server with every timeout set and a cap on
// connections.
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
			ReadHeaderTimeout: opts.ReadTimeout,
			ReadTimeout:       opts.ReadTimeout,
			WriteTimeout:      opts.WriteTimeout,
			IdleTimeout:       opts.IdleTimeout,
			MaxHeaderBytes:    64 << 10,
		},
		ln: &capListener{Listener: ln, max: int64(opts.MaxConns)},
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

// capListener closes connections over its cap at once.
type capListener struct {
	net.Listener
	max  int64
	open atomic.Int64
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if !l.admit() {
			c.Close()
			continue
		}
		return &countedConn{Conn: c, l: l}, nil
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

// countedConn gives its slot back once, when closed.
type countedConn struct {
	net.Conn
	l    *capListener
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}
