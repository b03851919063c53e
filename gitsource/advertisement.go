package gitsource

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
)

// The ref advertisement bound. Protocol v0 (all go-git speaks) has the
// server list every ref it has before anything else, and go-git keeps the
// whole list in memory: a remote with four million refs cost 807 MB for a
// fetch of one branch. gitsource reads at most maxAdvertisement bytes of
// it over http(s) and the file transport; past that the operation fails
// with ErrTooManyRefs, a git failure like any other (the last good state
// stays), never cache damage. Over ssh go-git reads the advertisement from
// its own session, which gitsource cannot wrap: there the operation's
// deadline is the bound.

// maxAdvertisement is the most of a ref advertisement gitsource reads, in
// bytes: about 250,000 refs at the 60-70 bytes each takes (a hash, a name
// like refs/pull/12345/head, pkt-line framing), about 100 MB once decoded.
// A variable so that tests can lower it.
var maxAdvertisement int64 = 16 << 20

// ErrTooManyRefs: the remote advertised more than maxAdvertisement bytes
// of refs (hundreds of thousands of branches, tags or pull-request refs).
// Nothing in the cache changed; the fleet needs a repository with fewer
// refs (a mirror of the branches gitfleet reads serves).
var ErrTooManyRefs = errors.New("the remote advertises too many refs")

func init() {
	// go-git's http transport over a client whose responses to the ref
	// discovery request (GET …/info/refs) are cut at maxAdvertisement.
	// The endpoint options that need go-git to clone an *http.Transport
	// (client certificates, CA bundles, an http proxy in the URL) are not
	// used by gitsource; the environment's proxy settings still apply
	// through http.DefaultTransport.
	c := githttp.NewClient(&http.Client{Transport: advertisementLimit{next: http.DefaultTransport}})
	recordAdvertisements("http", c)
	recordAdvertisements("https", c)
}

// advertisementLimit is an http.RoundTripper that bounds the body of the
// smart-http ref discovery response, and the shallow lines of the
// upload-pack response.
type advertisementLimit struct{ next http.RoundTripper }

func (t advertisementLimit) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := t.next.RoundTrip(req)
	switch {
	case err != nil:
	case req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/info/refs"):
		res.Body = struct {
			io.Reader
			io.Closer
		}{limitAdvertisement(res.Body), res.Body}
	case req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/git-upload-pack"):
		// The answer to a fetch: its shallow lines are bounded too (see
		// limitShallow).
		res.Body = struct {
			io.Reader
			io.Closer
		}{limitShallow(res.Body), res.Body}
	}
	return res, err
}

// limitAdvertisement returns a reader of r that fails with ErrTooManyRefs
// once more than maxAdvertisement bytes were read from it.
func limitAdvertisement(r io.Reader) io.Reader {
	return &advertisementReader{r: r, left: maxAdvertisement}
}

type advertisementReader struct {
	r    io.Reader
	left int64
}

func (a *advertisementReader) Read(p []byte) (int, error) {
	if a.left <= 0 {
		return 0, fmt.Errorf("%w: more than %s of ref advertisement; gitfleet reads at most that (use a repository, or a mirror, with fewer branches, tags and pull-request refs)", ErrTooManyRefs, sizeText(maxAdvertisement))
	}
	if int64(len(p)) > a.left {
		p = p[:a.left]
	}
	n, err := a.r.Read(p)
	a.left -= int64(n)
	return n, err
}

// sizeText is n bytes in MiB, or KiB when less than one MiB.
func sizeText(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}
