package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/internal/redact"
)

// Defaults of ArtifactPolicy.
const (
	DefaultDownloadTimeout = 30 * time.Minute
	DefaultStallTimeout    = 60 * time.Second
	DefaultMaxArtifactSize = int64(64) << 30 // 64 GiB
	maxRedirects           = 5
)

// ErrArtifactRefused is wrapped (inside agent.Permanent) by a fetch the
// policy refuses: a file:// URL outside the allowed roots, an address on
// the deny list, a redirect to another scheme, an artifact over the size
// limit.
var ErrArtifactRefused = errors.New("artifact refused by the agent's policy")

// ArtifactPolicy says where the agent may fetch VM artifacts (images,
// kernels, initrds) from, and so which spec URLs may use an artifact
// already in the cache (checkURL). The agent runs as root: without a policy an
// artifact URL would read any host file or reach any service the host can.
// The zero value is the safe default: no file:// URL, http(s) only to
// public addresses, DefaultDownloadTimeout, DefaultStallTimeout and
// DefaultMaxArtifactSize.
type ArtifactPolicy struct {
	// FileRoots are the absolute directories under which file:// URLs may
	// name a regular file (after symlinks are resolved). Empty: every
	// file:// URL is refused.
	FileRoots []string
	// AllowNetworks are address ranges an http(s) download may reach
	// although the deny list (loopback, link-local and cloud metadata,
	// private, shared, multicast and reserved ranges, for IPv4 and IPv6)
	// names them: a mirror on the LAN, or 127.0.0.0/8 in tests.
	AllowNetworks []netip.Prefix
	// Timeout bounds one download from request to last byte (default
	// DefaultDownloadTimeout).
	Timeout time.Duration
	// StallTimeout fails a download that receives no byte for this long
	// (default DefaultStallTimeout); such a failure is transient.
	StallTimeout time.Duration
	// MaxSize is the largest artifact accepted, in bytes (default
	// DefaultMaxArtifactSize). A larger Content-Length is refused before
	// the body is read, and a body that grows past it is cut off.
	MaxSize int64
}

func (p ArtifactPolicy) withDefaults() ArtifactPolicy {
	if p.Timeout <= 0 {
		p.Timeout = DefaultDownloadTimeout
	}
	if p.StallTimeout <= 0 {
		p.StallTimeout = DefaultStallTimeout
	}
	if p.MaxSize <= 0 {
		p.MaxSize = DefaultMaxArtifactSize
	}
	return p
}

// deniedRanges are refused unless AllowNetworks names them, on top of what
// netip.Addr's predicates (loopback, link-local, private, multicast,
// unspecified) catch.
var deniedRanges = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),      // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),  // shared address space (carrier NAT)
	netip.MustParsePrefix("192.0.0.0/24"),   // IETF protocol assignments
	netip.MustParsePrefix("198.18.0.0/15"),  // benchmarking
	netip.MustParsePrefix("240.0.0.0/4"),    // reserved, and broadcast
	netip.MustParsePrefix("64:ff9b::/96"),   // NAT64: embeds any IPv4 address
	netip.MustParsePrefix("64:ff9b:1::/48"), // local-use NAT64
	netip.MustParsePrefix("2002::/16"),      // 6to4: embeds any IPv4 address
	netip.MustParsePrefix("fd00:ec2::/32"),  // cloud metadata over IPv6 (inside fc00::/7 as well)
	netip.MustParsePrefix("::ffff:0:0/96"),  // IPv4-mapped: checked unmapped, refused here if not
	netip.MustParsePrefix("100::/64"),       // discard-only
	netip.MustParsePrefix("2001:db8::/32"),  // documentation
	netip.MustParsePrefix("169.254.0.0/16"), // link-local, where cloud metadata lives
	netip.MustParsePrefix("fe80::/10"),      // link-local
	netip.MustParsePrefix("127.0.0.0/8"),    // loopback
	netip.MustParsePrefix("::1/128"),        // loopback
	netip.MustParsePrefix("10.0.0.0/8"),     // private
	netip.MustParsePrefix("172.16.0.0/12"),  // private
	netip.MustParsePrefix("192.168.0.0/16"), // private
	netip.MustParsePrefix("fc00::/7"),       // unique local
}

// addrAllowed reports whether a download may connect to a.
func (p ArtifactPolicy) addrAllowed(a netip.Addr) bool {
	a = a.Unmap()
	for _, n := range p.AllowNetworks {
		if n.Contains(a) {
			return true
		}
	}
	if a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsUnspecified() {
		return false
	}
	for _, n := range deniedRanges {
		if n.Contains(a) {
			return false
		}
	}
	return true
}

// control is the download dialer's Control hook: it runs after the name
// is resolved and before connect(2), for the first request and for every
// redirect alike, so no packet reaches a denied address.
func (p ArtifactPolicy) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: address %q", ErrArtifactRefused, address)
	}
	if !p.addrAllowed(ap.Addr()) {
		return fmt.Errorf("%w: %s is on the deny list (loopback, link-local, private or reserved); allow it in the agent's artifacts.allowNetworks if it is a trusted mirror", ErrArtifactRefused, ap.Addr())
	}
	return nil
}

// client is the HTTP client downloads use: no proxy from the environment
// (the proxy's address would be checked instead of the server's), every
// connection through control, redirects limited in number and to http(s).
func (p ArtifactPolicy) client() *http.Client {
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: p.control}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   30 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConns:          8,
	}
	return &http.Client{
		Transport: tr,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= maxRedirects {
				return fmt.Errorf("%w: more than %d redirects", ErrArtifactRefused, maxRedirects)
			}
			if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
				return fmt.Errorf("%w: redirect to scheme %q", ErrArtifactRefused, req.URL.Scheme)
			}
			if via[len(via)-1].URL.Scheme == "https" && req.URL.Scheme == "http" {
				return fmt.Errorf("%w: redirect from https to http", ErrArtifactRefused)
			}
			return nil
		},
	}
}

// openFile opens a file:// artifact when its path, with symlinks resolved,
// lies under one of FileRoots and is a regular file. The check is made on
// the opened file (/proc/self/fd), so a symlink swapped in after the check
// is caught too.
func (p ArtifactPolicy) openFile(u *url.URL) (*os.File, int64, error) {
	raw := redact.URL(u.String())
	real, err := p.checkFile(u)
	if err != nil {
		return nil, 0, err
	}
	if real == "" {
		return nil, 0, fmt.Errorf("open %s: file does not exist", raw)
	}
	f, err := os.OpenFile(real, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("open %s: %w", raw, errors.Unwrap(err))
	}
	// The file opened is the one checked: a directory swapped for a
	// symlink between the check and the open is caught here.
	if opened, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd())); err != nil || !p.underRoot(opened) {
		f.Close()
		return nil, 0, p.outsideRoots(raw)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("open %s: %w", raw, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, agent.Permanent(fmt.Errorf("%w: %s is not a regular file", ErrArtifactRefused, raw))
	}
	return f, fi.Size(), nil
}

// checkFile checks a file:// URL against FileRoots without opening it and
// returns its path with symlinks resolved, or "" when it names a missing
// file under a root. A path outside the roots is refused whether it exists
// or not, and whether it exists is not told.
func (p ArtifactPolicy) checkFile(u *url.URL) (string, error) {
	raw := redact.URL(u.String())
	if len(p.FileRoots) == 0 {
		return "", agent.Permanent(fmt.Errorf("%w: %s: file:// URLs are not allowed on this host (artifacts.fileRoots is empty)", ErrArtifactRefused, raw))
	}
	if u.Host != "" && u.Host != "localhost" {
		return "", agent.Permanent(fmt.Errorf("%w: %s: a file:// URL names no host", ErrArtifactRefused, raw))
	}
	if !filepath.IsAbs(u.Path) || filepath.Clean(u.Path) != u.Path {
		return "", agent.Permanent(fmt.Errorf("%w: %s: want a clean absolute path", ErrArtifactRefused, raw))
	}
	real, err := filepath.EvalSymlinks(u.Path)
	switch {
	case errors.Is(err, os.ErrNotExist) && p.underRoot(u.Path):
		return "", nil
	case err != nil || !p.underRoot(real):
		return "", p.outsideRoots(raw)
	}
	return real, nil
}

// checkURL checks raw against the policy as a download of it would be,
// without fetching it: a file:// URL under FileRoots (checkFile), an
// http(s) URL whose host is, or resolves to, at least one address the
// deny list and AllowNetworks let a download connect to. The image cache
// runs it before it uses an artifact it holds, so an artifact cached from
// an allowed URL is never used for a spec whose URL is not allowed now.
// A refusal is a permanent ErrArtifactRefused; a name that cannot be
// resolved is a transient error.
func (p ArtifactPolicy) checkURL(ctx context.Context, raw string) error {
	safe := redact.URL(raw)
	u, err := url.Parse(raw)
	if err != nil {
		return agent.Permanent(fmt.Errorf("artifact URL %s does not parse", safe))
	}
	switch u.Scheme {
	case "file":
		_, err := p.checkFile(u)
		return err
	case "http", "https":
	default:
		return agent.Permanent(fmt.Errorf("%w: %s: scheme %q not supported (http, https, file)", ErrArtifactRefused, safe, u.Scheme))
	}
	addrs, err := resolveHost(ctx, u.Hostname())
	if err != nil {
		return fmt.Errorf("check artifact URL %s against the policy: %s", safe, redact.Text(err.Error()))
	}
	for _, a := range addrs {
		if p.addrAllowed(a) {
			return nil
		}
	}
	return agent.Permanent(fmt.Errorf("%w: %s: its host is on the deny list (loopback, link-local, private or reserved); allow it in the agent's artifacts.allowNetworks if it is a trusted mirror", ErrArtifactRefused, safe))
}

// resolveHost is host's addresses: the address itself when host is one,
// else what the resolver says within 10 s.
func resolveHost(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

func (p ArtifactPolicy) outsideRoots(raw string) error {
	return agent.Permanent(fmt.Errorf("%w: %s is outside the directories file:// URLs may name (artifacts.fileRoots)", ErrArtifactRefused, raw))
}

// underRoot reports whether path (absolute) lies under one of FileRoots,
// each taken with its symlinks resolved.
func (p ArtifactPolicy) underRoot(path string) bool {
	for _, root := range p.FileRoots {
		if r, err := filepath.EvalSymlinks(root); err == nil {
			root = r
		}
		rel, err := filepath.Rel(root, path)
		if err == nil && rel != ".." && !strings.HasPrefix(rel, "../") && !filepath.IsAbs(rel) {
			return true
		}
	}
	return false
}

// stallReader fails a Read that waits longer than timeout for a byte, by
// cancelling the request's context.
type stallReader struct {
	r       io.Reader
	timer   *time.Timer
	timeout time.Duration
}

func (s *stallReader) Read(b []byte) (int, error) {
	n, err := s.r.Read(b)
	if n > 0 {
		s.timer.Reset(s.timeout)
	}
	return n, err
}
