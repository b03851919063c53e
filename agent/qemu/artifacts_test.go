package qemu

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
)

// connCounter counts the TCP connections a test server accepted: a refusal
// must happen before any connection is made.
type connCounter struct{ n atomic.Int32 }

func (c *connCounter) hook(_ net.Conn, s http.ConnState) {
	if s == http.StateNew {
		c.n.Add(1)
	}
}

// serveOn starts an HTTP server on addr (a loopback address with port 0).
func serveOn(t *testing.T, addr string, h http.Handler) (*httptest.Server, *connCounter) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("listen on %s: %v", addr, err)
	}
	cc := &connCounter{}
	srv := &httptest.Server{Listener: l, Config: &http.Server{Handler: h, ConnState: cc.hook}}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, cc
}

// Every file:// URL outside the configured roots is refused at the host,
// without reading the file and without publishing anything about it.
func TestArtifactFileURLsOutsideRootsAreRefused(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	secret := []byte("root:$6$secret-hash:19000:0:99999:7:::\n")
	secretPath := filepath.Join(outside, "shadow")
	os.WriteFile(secretPath, secret, 0o600)
	os.Symlink(secretPath, filepath.Join(root, "link-out"))
	os.Symlink(outside, filepath.Join(root, "dir-out"))
	good := []byte("an image under the root")
	os.WriteFile(filepath.Join(root, "good.img"), good, 0o644)

	cache := t.TempDir()
	c := newImageCache(cache, ArtifactPolicy{FileRoots: []string{root}}, quietLog())
	noRoots := newImageCache(cache, ArtifactPolicy{}, quietLog())
	for _, tc := range []struct {
		name string
		c    *imageCache
		url  string
	}{
		{"/etc/shadow", c, "file:///etc/shadow"},
		{"/etc/shadow with no roots configured", noRoots, "file:///etc/shadow"},
		{"a file beside the root", c, "file://" + secretPath},
		{"dot-dot out of the root", c, "file://" + root + "/../" + filepath.Base(outside) + "/shadow"},
		{"a symlink in the root to a file outside", c, "file://" + filepath.Join(root, "link-out")},
		{"a symlinked directory in the root", c, "file://" + filepath.Join(root, "dir-out", "shadow")},
		{"a missing file outside the root", c, "file:///nonexistent/x"},
		{"a file URL with a host", c, "file://otherhost" + filepath.Join(root, "good.img")},
		{"the root's own directory", c, "file://" + root},
		{"a file under the root with no roots configured", noRoots, "file://" + filepath.Join(root, "good.img")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// With the right hash the old code copied the file into the
			// cache and a guest read it; with a wrong one it published its
			// hash. Try both.
			for _, want := range []string{sum(secret), strings.Repeat("ab", 32)} {
				_, err := tc.c.fetch(context.Background(), desired.Artifact{URL: tc.url, SHA256: want})
				if err == nil {
					t.Fatal("fetch succeeded")
				}
				if !agent.IsPermanent(err) || !errors.Is(err, ErrArtifactRefused) {
					t.Errorf("error %v: want a permanent ErrArtifactRefused", err)
				}
				if strings.Contains(err.Error(), sum(secret)) && want != sum(secret) {
					t.Errorf("error %q publishes the file's hash", err)
				}
			}
			if left, _ := os.ReadDir(cache); len(left) > 0 {
				t.Errorf("cache holds %v after a refusal", left[0].Name())
			}
		})
	}
	t.Run("a file under the root is fetched", func(t *testing.T) {
		if _, err := c.fetch(context.Background(), desired.Artifact{URL: "file://" + filepath.Join(root, "good.img"), SHA256: sum(good)}); err != nil {
			t.Fatal(err)
		}
	})
}

// Downloads refuse the deny list's addresses before connecting, for the
// first request and for every redirect, unless the policy allows them.
func TestArtifactDownloadDenyList(t *testing.T) {
	data := []byte("internal service response")
	internal, internalConns := serveOn(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(data)
	}))
	redirector, _ := serveOn(t, "127.0.0.2:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, internal.URL+"/metrics", http.StatusFound)
	}))
	ctx := context.Background()

	t.Run("loopback refused by default", func(t *testing.T) {
		c := newImageCache(t.TempDir(), ArtifactPolicy{}, quietLog())
		_, err := c.fetch(ctx, desired.Artifact{URL: internal.URL + "/metrics", SHA256: sum(data)})
		if !agent.IsPermanent(err) || !errors.Is(err, ErrArtifactRefused) {
			t.Errorf("error %v: want a permanent ErrArtifactRefused", err)
		}
		if n := internalConns.n.Load(); n != 0 {
			t.Errorf("the refused server saw %d connections", n)
		}
	})
	t.Run("redirect to 127.0.0.1 refused", func(t *testing.T) {
		// The redirector is allowed, its target is not.
		c := newImageCache(t.TempDir(), ArtifactPolicy{AllowNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}}, quietLog())
		_, err := c.fetch(ctx, desired.Artifact{URL: redirector.URL + "/img", SHA256: sum(data)})
		if !agent.IsPermanent(err) || !errors.Is(err, ErrArtifactRefused) {
			t.Errorf("error %v: want a permanent ErrArtifactRefused", err)
		}
		if strings.Contains(err.Error(), internal.Listener.Addr().String()) {
			t.Errorf("error %q names the redirect's target", err)
		}
		if n := internalConns.n.Load(); n != 0 {
			t.Errorf("the redirect's target saw %d connections", n)
		}
	})
	t.Run("allowed network downloads", func(t *testing.T) {
		c := newImageCache(t.TempDir(), loopbackPolicy(), quietLog())
		if _, err := c.fetch(ctx, desired.Artifact{URL: redirector.URL + "/img", SHA256: sum(data)}); err != nil {
			t.Fatal(err)
		}
	})
}

func TestArtifactAddrAllowed(t *testing.T) {
	var p ArtifactPolicy
	for _, a := range []string{
		"127.0.0.1", "127.1.2.3", "::1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
		"fe80::1", "fc00::1", "fd00:ec2::254", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "0.0.0.0", "::",
		"100.64.0.1", "224.0.0.1", "255.255.255.255", "64:ff9b::a9fe:a9fe", "2002:7f00:1::",
	} {
		if p.addrAllowed(netip.MustParseAddr(a)) {
			t.Errorf("%s allowed by default", a)
		}
	}
	for _, a := range []string{"151.101.2.132", "2a04:4e42::644"} {
		if !p.addrAllowed(netip.MustParseAddr(a)) {
			t.Errorf("public address %s refused", a)
		}
	}
	p.AllowNetworks = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}
	if !p.addrAllowed(netip.MustParseAddr("10.0.0.7")) || p.addrAllowed(netip.MustParseAddr("10.0.1.7")) {
		t.Error("AllowNetworks does not allow exactly its range")
	}
}

// A size limit refuses an artifact by its Content-Length before reading
// it, and cuts off a body that grows past it.
func TestArtifactSizeLimit(t *testing.T) {
	big := make([]byte, 64<<10)
	srv, _ := serveOn(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/chunked" {
			w.(http.Flusher).Flush() // no Content-Length
		} else {
			w.Header().Set("Content-Length", strconv.Itoa(len(big)))
		}
		w.Write(big)
	}))
	p := loopbackPolicy()
	p.MaxSize = 16 << 10
	for _, path := range []string{"/sized", "/chunked"} {
		c := newImageCache(t.TempDir(), p, quietLog())
		_, err := c.fetch(context.Background(), desired.Artifact{URL: srv.URL + path, SHA256: sum(big)})
		if !agent.IsPermanent(err) || !errors.Is(err, ErrArtifactRefused) {
			t.Errorf("%s: error %v, want a permanent ErrArtifactRefused", path, err)
		}
		if left, _ := os.ReadDir(c.dir); len(left) > 0 {
			t.Errorf("%s: cache holds %s", path, left[0].Name())
		}
	}
}

// A download that stops sending fails as transient after the stall
// timeout (so the agent retries it within its budget), and meanwhile a VM
// that names the same sha256 by a good URL is neither blocked by it nor
// given its failure.
func TestArtifactHungDownload(t *testing.T) {
	data := []byte(strings.Repeat("image ", 8192))
	release := make(chan struct{})
	var hungRequests atomic.Int32
	srv, _ := serveOn(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/hung":
			hungRequests.Add(1)
			w.Header().Set("Content-Length", strconv.Itoa(len(data)))
			w.Write(data[:100])
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
		case "/good":
			w.Write(data)
		}
	}))
	defer close(release)
	p := loopbackPolicy()
	p.StallTimeout = 300 * time.Millisecond
	c := newImageCache(t.TempDir(), p, quietLog())
	hung := desired.Artifact{URL: srv.URL + "/hung", SHA256: sum(data)}
	good := desired.Artifact{URL: srv.URL + "/good", SHA256: sum(data)}

	hungErr := make(chan error, 1)
	go func() {
		_, err := c.fetch(context.Background(), hung)
		hungErr <- err
	}()
	for hungRequests.Load() == 0 {
		waitABit()
	}
	if _, err := c.fetch(context.Background(), good); err != nil {
		t.Fatalf("a good URL for the same sha256 failed while another hung: %v", err)
	}
	err := <-hungErr
	if err == nil || agent.IsPermanent(err) || !strings.Contains(err.Error(), "no data for") {
		t.Errorf("hung download: %v, want a transient stall error", err)
	}
	// The retry finds the image the good URL brought.
	if _, err := c.fetch(context.Background(), hung); err != nil {
		t.Errorf("retry after the stall: %v", err)
	}

	// Without a cached copy a retry downloads again.
	c = newImageCache(t.TempDir(), p, quietLog())
	before := hungRequests.Load()
	for i := 0; i < 2; i++ {
		if _, err := c.fetch(context.Background(), hung); err == nil || agent.IsPermanent(err) {
			t.Errorf("attempt %d: %v, want a transient error", i, err)
		}
	}
	if n := hungRequests.Load() - before; n != 2 {
		t.Errorf("two attempts made %d requests", n)
	}
}

// One URL's permanent failure is not another URL's for the same sha256.
func TestArtifactFailureIsNotShared(t *testing.T) {
	data := []byte("the real image")
	gate := make(chan struct{})
	srv, _ := serveOn(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/evil" {
			<-gate
			w.Write([]byte("something else"))
			return
		}
		w.Write(data)
	}))
	c := newImageCache(t.TempDir(), loopbackPolicy(), quietLog())
	evil := desired.Artifact{URL: srv.URL + "/evil?token=attacker", SHA256: sum(data)}
	good := desired.Artifact{URL: srv.URL + "/good", SHA256: sum(data)}
	evilErr := make(chan error, 1)
	go func() {
		_, err := c.fetch(context.Background(), evil)
		evilErr <- err
	}()
	for c.joined(evil) < 0 {
		waitABit()
	}
	goodErr := make(chan error, 1)
	go func() {
		_, err := c.fetch(context.Background(), good)
		goodErr <- err
	}()
	if err := <-goodErr; err != nil {
		t.Fatalf("good URL: %v", err)
	}
	close(gate)
	err := <-evilErr
	if !errors.Is(err, ErrChecksumMismatch) {
		t.Errorf("evil URL: %v, want its own checksum mismatch", err)
	} else if strings.Contains(err.Error(), "attacker") {
		t.Errorf("error %q carries the URL's query", err)
	}
}

// The policy is checked against the spec's URL on every use, not only on
// download: an artifact already in the cache (fetched by another VM from
// an allowed URL, or under an earlier policy) is used only when the URL
// this spec names is allowed now. Knowing an artifact's sha256 must not
// let a spec name a file outside the roots, or an address the policy
// denies, and get the cached content.
func TestArtifactPolicyIsCheckedOnEveryUse(t *testing.T) {
	root := t.TempDir()
	data := []byte("an image fetched from an allowed place")
	os.WriteFile(filepath.Join(root, "good.img"), data, 0o644)
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret.img"), data, 0o600)
	srv, conns := serveOn(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(data) }))
	cache := t.TempDir()
	allowed := ArtifactPolicy{FileRoots: []string{root}, AllowNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	if _, err := newImageCache(cache, allowed, quietLog()).fetch(context.Background(), desired.Artifact{URL: "file://" + filepath.Join(root, "good.img"), SHA256: sum(data)}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		policy ArtifactPolicy
		url    string
	}{
		{"a file outside the roots", allowed, "file://" + filepath.Join(outside, "secret.img")},
		{"a file:// URL once fileRoots is emptied", ArtifactPolicy{AllowNetworks: allowed.AllowNetworks}, "file://" + filepath.Join(root, "good.img")},
		{"a missing file outside the roots", allowed, "file:///nonexistent/secret.img"},
		{"a loopback address once allowNetworks no longer names it", ArtifactPolicy{FileRoots: allowed.FileRoots}, srv.URL + "/img"},
		{"a name that resolves to loopback", ArtifactPolicy{FileRoots: allowed.FileRoots}, "http://localhost:1/img"},
		{"a scheme no download takes", allowed, "ftp://mirror.example/img"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newImageCache(cache, tc.policy, quietLog()).fetch(context.Background(), desired.Artifact{URL: tc.url, SHA256: sum(data)})
			if !agent.IsPermanent(err) || !errors.Is(err, ErrArtifactRefused) {
				t.Errorf("the cached artifact was used for %s: error %v, want a permanent %v", tc.url, err, ErrArtifactRefused)
			}
		})
	}
	t.Run("an allowed URL uses the cache", func(t *testing.T) {
		c := newImageCache(cache, allowed, quietLog())
		for _, url := range []string{srv.URL + "/img", "file://" + filepath.Join(root, "moved-away.img")} {
			if _, err := c.fetch(context.Background(), desired.Artifact{URL: url, SHA256: sum(data)}); err != nil {
				t.Errorf("%s: %v", url, err)
			}
		}
		if n := conns.n.Load(); n != 0 {
			t.Errorf("the server saw %d connections for a cached artifact", n)
		}
	})
}

// A download goes on while a fetch waits for it, and ends, its partial
// file removed, once none does: a VM deleted while its create trickles an
// image (its pass's context cancelled) leaves neither a download running
// for up to DefaultDownloadTimeout nor a partial file behind. While
// another fetch still waits, the download goes on for it.
func TestDownloadEndsWhenNoFetchWaitsForIt(t *testing.T) {
	data := []byte(strings.Repeat("image ", 8192))
	var requests atomic.Int32
	gone := make(chan struct{}, 4)
	ended := make(chan struct{})
	srv, _ := serveOn(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		// One byte at a time, each well within the stall timeout.
		for i := 0; i < len(data); i++ {
			if _, err := w.Write(data[i : i+1]); err != nil {
				break
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				gone <- struct{}{}
				return
			case <-ended:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}))
	t.Cleanup(func() { close(ended) }) // before the server's Close
	cache := t.TempDir()
	c := newImageCache(cache, loopbackPolicy(), quietLog())
	art := desired.Artifact{URL: srv.URL + "/trickle", SHA256: sum(data)}
	partials := func() []string { m, _ := filepath.Glob(filepath.Join(cache, "*.partial-*")); return m }

	start := func() (context.CancelFunc, chan error) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { _, err := c.fetch(ctx, art); done <- err }()
		return cancel, done
	}
	cancelA, doneA := start()
	for requests.Load() == 0 || len(partials()) == 0 {
		waitABit()
	}
	cancelB, doneB := start()
	for _, _, ok := c.progress(art.SHA256); !ok; _, _, ok = c.progress(art.SHA256) {
		waitABit()
	}
	time.Sleep(200 * time.Millisecond) // B has joined
	cancelA()
	if err := <-doneA; !errors.Is(err, context.Canceled) {
		t.Errorf("the first fetch: %v, want its context's end", err)
	}
	select {
	case <-gone:
		t.Fatal("the download ended while another fetch still waited for it")
	case <-time.After(500 * time.Millisecond):
	}
	cancelB()
	<-doneB
	select {
	case <-gone:
	case <-time.After(30 * time.Second):
		t.Fatal("the download went on with no fetch waiting for it")
	}
	for deadline := time.Now().Add(30 * time.Second); len(partials()) > 0; waitABit() {
		if time.Now().After(deadline) {
			t.Fatalf("partial files left in the cache: %v", partials())
		}
	}
	if _, _, ok := c.progress(art.SHA256); ok {
		t.Error("progress still reports the ended download")
	}
}
