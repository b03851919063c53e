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
	"github.com/gitfleet/gitfleet/internal/redact"
)

// ErrChecksumMismatch is wrapped (inside agent.Permanent) by a download
// whose content does not hash to the expected sha256.
var ErrChecksumMismatch = errors.New("sha256 mismatch")

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// imageCache keeps downloaded artifacts (disk images, kernels, initrds) as
// dir/<sha256>. A download streams into a temporary file in dir while
// hashing and is renamed into place only when the hash matches, so a file
// named by its hash is always complete and verified. Concurrent requests
// for one URL and sha256 share one download; requests naming the same
// sha256 by different URLs download apart, so one VM's bad or hung URL
// never fails or holds up another's. The directory is 0700 and its files
// 0600 (group-readable when the backend runs QEMU as another user, see
// Config.RunAs).
type imageCache struct {
	dir    string
	policy ArtifactPolicy
	client *http.Client
	log    *logrus.Entry

	mu       sync.Mutex
	inflight map[downloadKey]*download
	// verified are the cached files this process has hashed and found
	// whole; a file is hashed once per process, at its first use.
	verified map[string]bool
}

// downloadKey names one download: the same sha256 from two URLs is two
// downloads.
type downloadKey struct{ url, sum string }

// download is one running fetch; waiters block on done.
type download struct {
	done  chan struct{}
	err   error
	bytes atomic.Int64
	total atomic.Int64 // -1 while unknown
	// waiters counts callers that joined this download after it started.
	waiters atomic.Int32
	// waiting counts the callers waiting for it now, the one that started
	// it included (guarded by imageCache.mu); cancel ends it, which leave
	// does when waiting drops to 0.
	waiting int
	cancel  context.CancelCauseFunc
}

// errNobodyWaits ends a download no fetch waits for any more.
var errNobodyWaits = errors.New("download cancelled: no VM waits for it any more")

func newImageCache(dir string, policy ArtifactPolicy, log *logrus.Entry) *imageCache {
	policy = policy.withDefaults()
	return &imageCache{dir: dir, policy: policy, client: policy.client(), log: log,
		inflight: map[downloadKey]*download{}, verified: map[string]bool{}}
}

func (c *imageCache) path(sum string) string { return filepath.Join(c.dir, sum) }

// progress reports bytes fetched so far and the total (-1 when the server
// did not say) of a running download of sum (the one furthest along when
// several URLs are fetched for it).
func (c *imageCache) progress(sum string) (done, total int64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, d := range c.inflight {
		if k.sum == sum && (!ok || d.bytes.Load() > done) {
			done, total, ok = d.bytes.Load(), d.total.Load(), true
		}
	}
	return done, total, ok
}

// fetch returns the path of the verified artifact a, downloading it when
// it is not cached yet; a cached one is used only when the policy allows
// a's URL now (checkURL). Errors that a retry cannot fix (bad sha256 in the
// spec, a URL the policy refuses, checksum mismatch, HTTP 4xx, an artifact
// over the size limit) are agent.Permanent. The download runs under the
// policy's own deadline, apart from ctx: a caller that gives up (its ctx
// ends) leaves it running for the others that wait on it, and the last
// one to give up ends it (leave).
func (c *imageCache) fetch(ctx context.Context, a desired.Artifact) (string, error) {
	if !sha256Hex.MatchString(a.SHA256) {
		return "", agent.Permanent(fmt.Errorf("artifact %s: sha256 is not 64 lowercase hex digits", redact.URL(a.URL)))
	}
	dst := c.path(a.SHA256)
	if c.cached(dst) {
		// Allowed when it was downloaded says nothing of this URL now.
		if err := c.policy.checkURL(ctx, a.URL); err != nil {
			return "", err
		}
		if c.touch(dst) {
			return dst, c.verify(dst, a.SHA256)
		}
	}
	key := downloadKey{a.URL, a.SHA256}
	c.mu.Lock()
	d, running := c.inflight[key]
	if !running {
		d = c.start(key, a)
	} else {
		d.waiters.Add(1)
	}
	d.waiting++
	c.mu.Unlock()

	select {
	case <-d.done:
	case <-ctx.Done():
		c.leave(key, d)
		return "", fmt.Errorf("wait for download of %s: %w", redact.URL(a.URL), ctx.Err())
	}
	if d.err != nil {
		return "", d.err
	}
	return dst, nil
}

// start runs the download of a under key, in the background. c.mu held.
func (c *imageCache) start(key downloadKey, a desired.Artifact) *download {
	ctx, cancel := context.WithCancelCause(context.Background())
	d := &download{done: make(chan struct{}), cancel: cancel}
	d.total.Store(-1)
	c.inflight[key] = d
	go func() {
		defer cancel(nil)
		d.err = c.download(ctx, a, d)
		c.mu.Lock()
		if c.inflight[key] == d {
			delete(c.inflight, key)
		}
		if d.err == nil {
			c.verified[a.SHA256] = true
		}
		c.mu.Unlock()
		close(d.done)
	}()
	return d
}

// leave is a caller of fetch giving up waiting for d (its context ended).
// The last one to leave cancels the download (its partial file is
// removed) and takes it out of inflight at once, so a later fetch starts
// afresh instead of joining a download that is ending.
func (c *imageCache) leave(key downloadKey, d *download) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d.waiting--; d.waiting > 0 {
		return
	}
	d.cancel(errNobodyWaits)
	if c.inflight[key] == d {
		delete(c.inflight, key)
	}
}

// cached reports whether the artifact at path is in the cache now.
func (c *imageCache) cached(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// touch reports whether the artifact at path is cached and, when it is,
// marks it used now (its modification time) under c.mu, so collect, which
// removes artifacts unused for its grace under the same lock, cannot remove
// it while its caller goes on to use it.
func (c *imageCache) touch(path string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := os.Stat(path); err != nil {
		return false
	}
	// A cache the agent cannot write keeps working; the artifact's age
	// then counts from its last recorded use.
	_ = os.Chtimes(path, time.Time{}, time.Now())
	return true
}

// verify hashes a cached file the first time this process uses it. A file
// that no longer matches its name is damage on the host's disk: it is
// reported as a permanent error and left in place, since existing root disks
// may be overlays on it and replacing it would change what they read. The
// error never carries the hash the file has: only what it should have.
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
		return agent.Permanent(fmt.Errorf("image cache: %s is damaged: %w: expected %s (move it aside to download it again; root disks backed by it may be damaged too)", path, ErrChecksumMismatch, sum))
	}
	c.mu.Lock()
	c.verified[sum] = true
	c.mu.Unlock()
	return nil
}

// download streams a into the cache, hashing on the way, bounded by the
// policy's timeout, stall timeout and size limit, until ctx is cancelled
// (leave: no fetch waits for it). Content that does not verify is deleted
// and never described: the error says "sha256 mismatch" and nothing of
// what was received. Whatever ends it, its partial file is removed.
func (c *imageCache) download(ctx context.Context, a desired.Artifact, d *download) error {
	safe := redact.URL(a.URL)
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return fmt.Errorf("image cache %s: %w", c.dir, err)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, c.policy.Timeout,
		fmt.Errorf("download %s: not done within %s", safe, c.policy.Timeout))
	defer cancel()
	stallCtx, stall := context.WithCancelCause(ctx)
	defer stall(nil)
	src, size, err := c.open(stallCtx, a.URL)
	if err != nil {
		return err
	}
	defer src.Close()
	if size > c.policy.MaxSize {
		return agent.Permanent(fmt.Errorf("download %s: %w: %d bytes is over the limit of %d", safe, ErrArtifactRefused, size, c.policy.MaxSize))
	}
	d.total.Store(size)
	timer := time.AfterFunc(c.policy.StallTimeout, func() {
		stall(fmt.Errorf("download %s: no data for %s", safe, c.policy.StallTimeout))
	})
	defer timer.Stop()
	body := &stallReader{r: src, timer: timer, timeout: c.policy.StallTimeout}

	f, err := os.CreateTemp(c.dir, a.SHA256+".partial-")
	if err != nil {
		return fmt.Errorf("image cache: %w", err)
	}
	partial := f.Name()
	defer func() {
		f.Close()
		os.Remove(partial) // a no-op after the rename
	}()
	log := c.log.WithFields(logrus.Fields{"url": safe, "sha256": a.SHA256})
	log.WithField("total", size).Info("download started")
	start := time.Now()
	if err := c.receive(stallCtx, body, f, a, d, log); err != nil {
		return err
	}
	if err := os.Rename(partial, c.path(a.SHA256)); err != nil {
		return fmt.Errorf("download %s: %w", safe, err)
	}
	log.WithFields(logrus.Fields{"bytes": d.bytes.Load(), "seconds": time.Since(start).Seconds()}).Info("download done")
	return nil
}

// receive copies body into f, hashing it, and checks the hash and the
// size limit; an error of ctx (the stall timer's, the deadline's, or the
// cancel's) is returned as its cause.
func (c *imageCache) receive(ctx context.Context, body io.Reader, f *os.File, a desired.Artifact, d *download, log *logrus.Entry) error {
	safe := redact.URL(a.URL)
	h := sha256.New()
	lastLog := time.Now()
	buf := make([]byte, 1<<20)
	for {
		if cause := context.Cause(ctx); cause != nil {
			return cause // also between reads of a file://, which ctx does not interrupt
		}
		n, rerr := body.Read(buf)
		if n > 0 {
			done := d.bytes.Add(int64(n))
			if done > c.policy.MaxSize {
				return agent.Permanent(fmt.Errorf("download %s: %w: more than %d bytes", safe, ErrArtifactRefused, c.policy.MaxSize))
			}
			if _, err := f.Write(buf[:n]); err != nil {
				return fmt.Errorf("download %s: write: %w", safe, err)
			}
			h.Write(buf[:n])
			if time.Since(lastLog) >= 5*time.Second {
				lastLog = time.Now()
				log.WithFields(logrus.Fields{"done": done, "total": d.total.Load()}).Info("download progress")
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if cause := context.Cause(ctx); cause != nil {
				return cause
			}
			return fmt.Errorf("download %s: %s", safe, redact.Text(rerr.Error()))
		}
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != a.SHA256 {
		log.Error("download checksum mismatch")
		return agent.Permanent(fmt.Errorf("download %s: %w: expected %s", safe, ErrChecksumMismatch, a.SHA256))
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("download %s: %w", safe, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("download %s: %w", safe, err)
	}
	return nil
}

// open starts reading an http(s) or file URL the policy allows and returns
// its size (-1 when unknown).
func (c *imageCache) open(ctx context.Context, raw string) (io.ReadCloser, int64, error) {
	safe := redact.URL(raw)
	u, err := url.Parse(raw)
	if err != nil {
		return nil, 0, agent.Permanent(fmt.Errorf("artifact URL %s does not parse", safe))
	}
	switch u.Scheme {
	case "file":
		return c.policy.openFile(u)
	case "http", "https":
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, raw, nil)
		if err != nil {
			return nil, 0, agent.Permanent(fmt.Errorf("artifact URL %s: %s", safe, redact.Text(err.Error())))
		}
		resp, err := c.client.Do(req)
		if err != nil {
			if errors.Is(err, ErrArtifactRefused) {
				return nil, 0, agent.Permanent(fmt.Errorf("download %s: %w", safe, ErrArtifactRefused))
			}
			if cause := context.Cause(ctx); cause != nil {
				return nil, 0, cause
			}
			// The library's error quotes the URL (and a redirect's):
			// only its last part, the reason, is kept.
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err
			}
			return nil, 0, fmt.Errorf("download %s: %s", safe, redact.Text(err.Error()))
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			err := fmt.Errorf("download %s: HTTP %s", safe, resp.Status)
			if resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusRequestTimeout && resp.StatusCode != http.StatusTooManyRequests {
				return nil, 0, agent.Permanent(err)
			}
			return nil, 0, err
		}
		return resp.Body, resp.ContentLength, nil
	default:
		return nil, 0, agent.Permanent(fmt.Errorf("artifact URL %s: scheme %q not supported (http, https, file)", safe, u.Scheme))
	}
}

// imageInfo is the part of `qemu-img info --output=json` we use.
type imageInfo struct {
	Format          string `json:"format"`
	VirtualSize     int64  `json:"virtual-size"`
	BackingFilename string `json:"backing-filename"`
	FormatSpecific  struct {
		Type string `json:"type"`
		Data struct {
			DataFile string `json:"data-file"`
		} `json:"data"`
	} `json:"format-specific"`
}

// dataFile is a qcow2's external data file, "" when it has none.
func (i *imageInfo) dataFile() string { return i.FormatSpecific.Data.DataFile }

// qemuImgInfo runs qemu-img info on path read as format (never probed).
// -U reads an image a running QEMU holds locked.
func qemuImgInfo(ctx context.Context, qemuImg, path, format string) (*imageInfo, error) {
	out, err := exec.CommandContext(ctx, qemuImg, "info", "-U", "-f", format, "--output=json", path).Output()
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
