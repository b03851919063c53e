package gitsource

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/go-git/go-git/v5/plumbing/transport"
	"golang.org/x/net/proxy"
)

// The ssh deadline. go-git's ssh transport dials with a context but runs the
// ssh handshake without one, so a server that accepts the connection and
// never answers held an operation forever. Its one hook on the connection
// is the proxy dialer: gitsource names a dialer of its own as the proxy of
// every ssh operation, which dials directly and gives the connection an
// absolute deadline of the operation's timeout (each operation opens its
// own connection), so the handshake, the ref advertisement and the pack
// all end by then.
const sshDeadlineScheme = "gitfleet-ssh-deadline"

func init() {
	proxy.RegisterDialerType(sshDeadlineScheme, func(u *url.URL, _ proxy.Dialer) (proxy.Dialer, error) {
		d, err := time.ParseDuration(u.Query().Get("timeout"))
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("ssh deadline dialer: bad timeout in %s", u)
		}
		return deadlineDialer{timeout: d}, nil
	})
}

// deadlineDialer dials TCP and sets the connection's deadline.
type deadlineDialer struct{ timeout time.Duration }

var _ proxy.ContextDialer = deadlineDialer{}

func (d deadlineDialer) Dial(network, addr string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, addr)
}

func (d deadlineDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	conn, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if err := conn.SetDeadline(time.Now().Add(d.timeout)); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return conn, nil
}

// proxyOptions are the proxy options of one operation with the remote:
// the deadline dialer for ssh, none for other transports.
func (r *Repo) proxyOptions() transport.ProxyOptions {
	ep, err := transport.NewEndpoint(r.url)
	if err != nil || ep.Protocol != "ssh" {
		return transport.ProxyOptions{}
	}
	return transport.ProxyOptions{URL: sshDeadlineScheme + "://deadline/?timeout=" + r.timeout().String()}
}
