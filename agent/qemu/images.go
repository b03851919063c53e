package qemu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
)

// ErrChecksumMismatch is wrapped (inside agent.Permanent) by a download
// whose content does not hash to the expected sha256.
var ErrChecksumMismatch = errors.New("sha256 mismatch")

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// imageCache keeps downloaded artifacts (disk images, kernels, initrds) as
// dir/<sha256>. A download streams into dir/<sha256>.partial while hashing
// and is renamed into place only when the hash matches, so a file named by
// its hash is always complete and verified. Concurrent requests for one
// hash share one download.
type imageCache struct {
	dir    string
	client *http.Client
	log    *logrus.Entry

	mu       sync.Mutex
	inflight map[string]*download
	// verified are the cached files this process has hashed and found
	// whole; a file is hashed once per process, at its first use.
	verified map[string]bool
}

// download is one running fetch; waiters block on done.
type download struct {
	done  chan struct{}
	err   error
	bytes atomic.Int64
	total atomic.Int64 // -1 while unknown
	// waiters counts callers that joined this download after it started.
	waiters atomic.Int32
}

func newImageCache(dir string, client *http.Client, log *logrus.Entry) *imageCache {
	return &imageCache{dir: dir, client: client, log: log, inflight: map[string]*download{}, verified: map[string]bool{}}
}

func (c *imageCache) path(sum string) string { return filepath.Join(c.dir, sum) }

// progress reports bytes fetched so far and the total (-1 when the server
// did not say) of the running download of sum.
func (c *imageCache) progress(sum string) (done, total int64, ok bool) {
	c.mu.Lock()
	d := c.inflight[sum]
	c.mu.Unlock()
	if d == nil {
		return 0, 0, false
	}
	return d.bytes.Load(), d.total.Load(), true
}

// fetch returns the path of the verified artifact a, downloading it when
// it is not cached yet. Errors that a retry cannot fix (bad sha256 in the
// spec, unsupported URL, checksum mismatch, HTTP 4xx) are agent.Permanent.
func (c *imageCache) fetch(ctx context.Context, a desired.Artifact) (string, error) {
	if !sha256Hex.MatchString(a.SHA256) {
		return "", agent.Permanent(fmt.Errorf("artifact %s: sha256 %q is not 64 lowercase hex digits", a.URL, a.SHA256))
	}
	dst := c.path(a.SHA256)
	if _, err := os.Stat(dst); err == nil {
		return dst, c.verify(dst, a.SHA256)
	}
	c.mu.Lock()
	d, running := c.inflight[a.SHA256]
	if !running {
		d = &download{done: make(chan struct{})}
		d.total.Store(-1)
		c.inflight[a.SHA256] = d
	} else {
		d.waiters.Add(1)
	}
	c.mu.Unlock()

	if !running {
		d.err = c.download(ctx, a, d)
		c.mu.Lock()
		delete(c.inflight, a.SHA256)
		c.mu.Unlock()
		close(d.done)
	} else {
		select {
		case <-d.done:
		case <-ctx.Done():
			return "", fmt.Errorf("wait for download of %s: %w", a.URL, ctx.Err())
		}
	}
	if d.err != nil {
		return "", d.err
	}
	c.mu.Lock()
	c.verified[a.SHA256] = true
	c.mu.Unlock()
	return dst, nil
}

// verify hashes a cached file the first time this process uses it. A file
// that no longer matches its name is damage on the host's disk: it is
// reported as a permanent error and left in place, since existing root disks
// may be overlays on it and replacing it would change what they read.
func (c *imageCache) verify(path, sum string) error {
	c.mu.Lock()
	ok := c.verified[sum]
	c.mu.Unlock()
	if ok {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("image cache: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("image cache: read %s: %w", path, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		return agent.Permanent(fmt.Errorf("image cache: %s is damaged: %w: expected %s, actual %s (move it aside to download it again; root disks backed by it may be damaged too)", path, ErrChecksumMismatch, sum, got))
	}
	c.mu.Lock()
	c.verified[sum] = true
	c.mu.Unlock()
	return nil
}

// download streams a into the cache, hashing on the way.
func (c *imageCache) download(ctx context.Context, a desired.Artifact, d *download) error {
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return fmt.Errorf("image cache %s: %w", c.dir, err)
	}
	log := c.log.WithFields(logrus.Fields{"url": redactURL(a.URL), "sha256": a.SHA256})
	src, size, err := c.open(ctx, a.URL)
	if err != nil {
		return err
	}
	defer src.Close()
	d.total.Store(size)

	partial := c.path(a.SHA256) + ".partial"
	f, err := os.OpenFile(partial, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("image cache: %w", err)
	}
	defer func() {
		f.Close()
		os.Remove(partial) // a no-op after the rename
	}()
	h := sha256.New()
	log.WithField("total", size).Info("download started")
	start := time.Now()
	lastLog := start
	buf := make([]byte, 1<<20)
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			if _, err := f.Write(buf[:n]); err != nil {
				return fmt.Errorf("download %s: write: %w", redactURL(a.URL), err)
			}
			h.Write(buf[:n])
			done := d.bytes.Add(int64(n))
			if time.Since(lastLog) >= 5*time.Second {
				lastLog = time.Now()
				log.WithFields(logrus.Fields{"done": done, "total": size}).Info("download progress")
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("download %s: %w", redactURL(a.URL), rerr)
		}
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != a.SHA256 {
		log.WithField("actual", got).Error("download checksum mismatch")
		return agent.Permanent(fmt.Errorf("download %s: %w: expected %s, actual %s", redactURL(a.URL), ErrChecksumMismatch, a.SHA256, got))
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("download %s: %w", redactURL(a.URL), err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("download %s: %w", redactURL(a.URL), err)
	}
	if err := os.Rename(partial, c.path(a.SHA256)); err != nil {
		return fmt.Errorf("download %s: %w", redactURL(a.URL), err)
	}
	log.WithFields(logrus.Fields{"bytes": d.bytes.Load(), "seconds": time.Since(start).Seconds()}).Info("download done")
	return nil
}

// open starts reading an http(s) or file URL and returns its size (-1 when
// unknown).
func (c *imageCache) open(ctx context.Context, raw string) (io.ReadCloser, int64, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, 0, agent.Permanent(fmt.Errorf("artifact URL %q: %w", redactURL(raw), err))
	}
	switch u.Scheme {
	case "file":
		f, err := os.Open(u.Path)
		if err != nil {
			return nil, 0, fmt.Errorf("open %s: %w", raw, err)
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, 0, fmt.Errorf("open %s: %w", raw, err)
		}
		return f, fi.Size(), nil
	case "http", "https":
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, raw, nil)
		if err != nil {
			return nil, 0, agent.Permanent(fmt.Errorf("artifact URL %q: %w", redactURL(raw), err))
		}
		resp, err := c.client.Do(req)
		if err != nil {
			return nil, 0, fmt.Errorf("download %s: %w", redactURL(raw), err)
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			err := fmt.Errorf("download %s: HTTP %s", redactURL(raw), resp.Status)
			if resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusRequestTimeout && resp.StatusCode != http.StatusTooManyRequests {
				return nil, 0, agent.Permanent(err)
			}
			return nil, 0, err
		}
		return resp.Body, resp.ContentLength, nil
	default:
		return nil, 0, agent.Permanent(fmt.Errorf("artifact URL %q: scheme %q not supported (http, https, file)", redactURL(raw), u.Scheme))
	}
}

// redactURL drops user info and query from a URL for logs and errors: both
// may carry tokens.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	u.User = nil
	if u.RawQuery != "" {
		u.RawQuery = "…"
	}
	return u.String()
}

// imageInfo is the part of `qemu-img info --output=json` we use.
type imageInfo struct {
	Format          string `json:"format"`
	VirtualSize     int64  `json:"virtual-size"`
	BackingFilename string `json:"backing-filename"`
}

// qemuImgInfo runs qemu-img info on path. -U reads an image a running QEMU
// holds locked.
func qemuImgInfo(ctx context.Context, qemuImg, path string) (*imageInfo, error) {
	out, err := exec.CommandContext(ctx, qemuImg, "info", "-U", "--output=json", path).Output()
	if err != nil {
		return nil, fmt.Errorf("qemu-img info %s: %w%s", path, err, stderrOf(err))
	}
	var info imageInfo
	if err := json.Unmarshal(out, &info); err != nil {
		return nil, fmt.Errorf("qemu-img info %s: %w", path, err)
	}
	return &info, nil
}

func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return ": " + string(trimTail(ee.Stderr, 2048))
	}
	return ""
}
