package qemu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
)

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func quietLog() *logrus.Entry {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l.WithField("component", "qemu")
}

// artifactServer serves files from a map and counts requests per path.
type artifactServer struct {
	*httptest.Server
	mu    sync.Mutex
	files map[string][]byte
	hits  map[string]int
	// gate, when set, holds each response after its first half.
	gate chan struct{}
}

func newArtifactServer(t testing.TB) *artifactServer {
	s := &artifactServer{files: map[string][]byte{}, hits: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		data, ok := s.files[r.URL.Path]
		s.hits[r.URL.Path]++
		gate := s.gate
		s.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		half := len(data) / 2
		w.Write(data[:half])
		if gate != nil {
			w.(http.Flusher).Flush()
			<-gate
		}
		w.Write(data[half:])
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *artifactServer) add(path string, data []byte) desired.Artifact {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.files[path] = data
	return desired.Artifact{URL: s.URL + path, SHA256: sum(data)}
}

func (s *artifactServer) count(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits[path]
}

// joined reports how many callers wait on the running download of a
// besides the one that started it.
func (c *imageCache) joined(a desired.Artifact) int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d := c.inflight[downloadKey{a.URL, a.SHA256}]; d != nil {
		return d.waiters.Load()
	}
	return -1
}

// loopbackPolicy allows downloads from test servers on 127.0.0.0/8,
// which the default policy refuses.
func loopbackPolicy() ArtifactPolicy {
	return ArtifactPolicy{AllowNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
}

func waitABit() { time.Sleep(5 * time.Millisecond) }

func TestImageCacheFetch(t *testing.T) {
	srv := newArtifactServer(t)
	data := []byte(strings.Repeat("disk image bytes ", 4096))
	good := srv.add("/img.raw", data)
	dir := t.TempDir()
	c := newImageCache(dir, loopbackPolicy(), quietLog())
	ctx := context.Background()

	t.Run("miss downloads and verifies", func(t *testing.T) {
		p, err := c.fetch(ctx, good)
		if err != nil {
			t.Fatal(err)
		}
		if p != filepath.Join(dir, good.SHA256) {
			t.Errorf("path %s", p)
		}
		got, _ := os.ReadFile(p)
		if string(got) != string(data) {
			t.Error("cached content differs")
		}
	})
	t.Run("hit does not download", func(t *testing.T) {
		before := srv.count("/img.raw")
		if _, err := c.fetch(ctx, good); err != nil {
			t.Fatal(err)
		}
		if n := srv.count("/img.raw"); n != before {
			t.Errorf("cache hit made %d requests", n-before)
		}
	})
	t.Run("wrong sha256 is permanent and never names what was received", func(t *testing.T) {
		wrong := strings.Repeat("ab", 32)
		_, err := c.fetch(ctx, desired.Artifact{URL: srv.URL + "/img.raw", SHA256: wrong})
		if err == nil {
			t.Fatal("mismatch accepted")
		}
		if !agent.IsPermanent(err) || !errors.Is(err, ErrChecksumMismatch) {
			t.Errorf("error %v: want permanent checksum mismatch", err)
		}
		if !strings.Contains(err.Error(), wrong) {
			t.Errorf("error %q does not name the expected hash", err)
		}
		// The actual hash would let a spec author learn a file's hash and
		// then commit it to have the file copied into a guest.
		if strings.Contains(err.Error(), good.SHA256) {
			t.Errorf("error %q publishes the hash of content that did not verify", err)
		}
		if _, err := os.Stat(filepath.Join(dir, wrong)); !os.IsNotExist(err) {
			t.Errorf("%s left in the cache: %v", wrong, err)
		}
		if left, _ := filepath.Glob(filepath.Join(dir, "*.partial*")); len(left) > 0 {
			t.Errorf("partial files left in the cache: %v", left)
		}
	})
	for _, tc := range []struct {
		name      string
		art       desired.Artifact
		permanent bool
	}{
		{"404 is permanent", desired.Artifact{URL: srv.URL + "/missing", SHA256: strings.Repeat("0", 64)}, true},
		{"bad sha256 syntax is permanent", desired.Artifact{URL: srv.URL + "/img.raw", SHA256: "XYZ"}, true},
		{"ftp is permanent", desired.Artifact{URL: "ftp://example.invalid/x", SHA256: strings.Repeat("1", 64)}, true},
		{"unreachable server is transient", desired.Artifact{URL: "http://127.0.0.1:1/x", SHA256: strings.Repeat("2", 64)}, false},
		{"file URL without allowed roots is permanent", desired.Artifact{URL: "file:///nonexistent/x", SHA256: strings.Repeat("3", 64)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.fetch(ctx, tc.art)
			if err == nil {
				t.Fatal("fetch succeeded")
			}
			if agent.IsPermanent(err) != tc.permanent {
				t.Errorf("IsPermanent(%v) = %v, want %v", err, agent.IsPermanent(err), tc.permanent)
			}
		})
	}
	t.Run("file URL under an allowed root", func(t *testing.T) {
		root := t.TempDir()
		src := filepath.Join(root, "local.img")
		content := []byte("local image")
		os.WriteFile(src, content, 0o644)
		c := newImageCache(dir, ArtifactPolicy{FileRoots: []string{root}}, quietLog())
		if _, err := c.fetch(ctx, desired.Artifact{URL: "file://" + filepath.Join(root, "missing"), SHA256: strings.Repeat("3", 64)}); err == nil || agent.IsPermanent(err) {
			t.Errorf("missing file under a root: %v, want a transient error", err)
		}
		p, err := c.fetch(ctx, desired.Artifact{URL: "file://" + src, SHA256: sum(content)})
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(p); string(got) != string(content) {
			t.Errorf("content %q", got)
		}
	})
}

// Concurrent requests for one image share one download, and progress is
// visible while it runs.
// A cached file is trusted by its name only after this process hashed it
// once: a damaged file is refused, named, and left in place.
func TestImageCacheVerifiesACachedFileOnFirstUse(t *testing.T) {
	srv := newArtifactServer(t)
	data := []byte(strings.Repeat("disk image bytes ", 4096))
	good := srv.add("/img.raw", data)
	dir := t.TempDir()
	if _, err := newImageCache(dir, loopbackPolicy(), quietLog()).fetch(context.Background(), good); err != nil {
		t.Fatal(err)
	}
	cached := filepath.Join(dir, good.SHA256)

	// An agent restart: a new cache over the same directory.
	c := newImageCache(dir, loopbackPolicy(), quietLog())
	if _, err := c.fetch(context.Background(), good); err != nil {
		t.Fatalf("intact cached file refused: %v", err)
	}
	if err := os.WriteFile(cached, []byte("not an image"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.fetch(context.Background(), good); err != nil {
		t.Fatalf("a file this process verified is hashed again: %v", err)
	}

	c = newImageCache(dir, loopbackPolicy(), quietLog())
	before := srv.count("/img.raw")
	_, err := c.fetch(context.Background(), good)
	if err == nil || !agent.IsPermanent(err) || !errors.Is(err, ErrChecksumMismatch) {
		t.Fatalf("damaged cached file: error %v, want a permanent checksum mismatch", err)
	}
	if !strings.Contains(err.Error(), cached) || !strings.Contains(err.Error(), good.SHA256) {
		t.Errorf("error %q does not name the file and its expected hash", err)
	}
	if strings.Contains(err.Error(), sum([]byte("not an image"))) {
		t.Errorf("error %q names the hash the damaged file has", err)
	}
	if got, _ := os.ReadFile(cached); string(got) != "not an image" {
		t.Error("the damaged file was replaced; overlays backed by it would change under their VMs")
	}
	if n := srv.count("/img.raw"); n != before {
		t.Errorf("a damaged cache downloaded again (%d requests)", n-before)
	}
}

func TestImageCacheSharedDownloadAndProgress(t *testing.T) {
	srv := newArtifactServer(t)
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	art := srv.add("/big.raw", data)
	gate := make(chan struct{})
	srv.gate = gate
	c := newImageCache(t.TempDir(), loopbackPolicy(), quietLog())

	const callers = 5
	var wg sync.WaitGroup
	var failures atomic.Int32
	for i := 0; i < callers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.fetch(context.Background(), art); err != nil {
				t.Error(err)
				failures.Add(1)
			}
		}()
	}
	// Wait until the download is half way (the server holds the rest) and
	// every caller has joined it.
	for {
		done, total, ok := c.progress(art.SHA256)
		if ok && done == int64(len(data)/2) && c.joined(art) == callers-1 {
			if total != int64(len(data)) {
				t.Errorf("progress total %d, want %d", total, len(data))
			}
			break
		}
		waitABit()
	}
	close(gate)
	wg.Wait()
	if n := srv.count("/big.raw"); n != 1 {
		t.Errorf("%d callers made %d requests, want 1", callers, n)
	}
	if _, _, ok := c.progress(art.SHA256); ok {
		t.Error("progress still reported after the download finished")
	}
}

func BenchmarkImageCache(b *testing.B) {
	srv := newArtifactServer(b)
	data := make([]byte, 64<<20)
	for i := range data {
		data[i] = byte(i)
	}
	art := srv.add("/bench.raw", data)
	b.Run("miss-64MiB", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for i := 0; i < b.N; i++ {
			c := newImageCache(b.TempDir(), loopbackPolicy(), quietLog())
			if _, err := c.fetch(context.Background(), art); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("hit", func(b *testing.B) {
		c := newImageCache(b.TempDir(), loopbackPolicy(), quietLog())
		if _, err := c.fetch(context.Background(), art); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := c.fetch(context.Background(), art); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func needQEMUImg(t testing.TB) string {
	p, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Skip("qemu-img not installed (apt-get install qemu-utils)")
	}
	return p
}

func TestPrepareRootDisk(t *testing.T) {
	qemuImg := needQEMUImg(t)
	srv := newArtifactServer(t)
	raw := make([]byte, 3<<20) // a 3 MiB raw "image"
	copy(raw, "raw image")
	rawArt := srv.add("/base.raw", raw)
	qcowPath := filepath.Join(t.TempDir(), "base.qcow2")
	if out, err := exec.Command(qemuImg, "create", "-q", "-f", "qcow2", qcowPath, "2G").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	qcow, _ := os.ReadFile(qcowPath)
	qcowArt := srv.add("/base.qcow2", qcow)
	kernelArt := srv.add("/vmlinuz", []byte("not really a kernel"))

	p, err := New(Config{CacheDir: t.TempDir(), Artifacts: loopbackPolicy(), Accel: AccelTCG, Logger: quietLog().Logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	info := func(path string) *imageInfo {
		t.Helper()
		i, err := qemuImgInfo(ctx, qemuImg, path, "qcow2")
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	backingFormat := func(path string) string {
		out, _ := exec.Command(qemuImg, "info", "-U", "--output=json", path).Output()
		if strings.Contains(string(out), `"backing-filename-format": "raw"`) {
			return "raw"
		}
		if strings.Contains(string(out), `"backing-filename-format": "qcow2"`) {
			return "qcow2"
		}
		return ""
	}

	for _, tc := range []struct {
		name        string
		spec        desired.VMSpec
		wantBacking string
		wantSize    int64
	}{
		{"raw image", desired.VMSpec{DiskGB: 1, Image: &rawArt}, "raw", 1 * gib},
		{"qcow2 image larger than diskGB keeps its size", desired.VMSpec{DiskGB: 1, Image: &qcowArt}, "qcow2", 2 * gib},
		{"kernel only: blank disk", desired.VMSpec{DiskGB: 1, Kernel: &desired.Kernel{URL: kernelArt.URL, SHA256: kernelArt.SHA256}}, "", 1 * gib},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := agent.Machine{Name: "vm", Dir: t.TempDir(), Spec: tc.spec, InstanceID: "i-1"}
			if err := p.PrepareRootDisk(ctx, m); err != nil {
				t.Fatal(err)
			}
			root := filepath.Join(m.Dir, RootDiskFile)
			i := info(root)
			if i.Format != "qcow2" || i.VirtualSize != tc.wantSize {
				t.Errorf("root disk %s of %d bytes, want qcow2 of %d", i.Format, i.VirtualSize, tc.wantSize)
			}
			if got := backingFormat(root); got != tc.wantBacking {
				t.Errorf("backing format %q, want %q", got, tc.wantBacking)
			}
			// Grown with the spec, never shrunk, never replaced.
			os.WriteFile(filepath.Join(m.Dir, "marker"), nil, 0o644)
			m.Spec.DiskGB = 3
			if err := p.PrepareRootDisk(ctx, m); err != nil {
				t.Fatal(err)
			}
			if got := info(root).VirtualSize; got != 3*gib {
				t.Errorf("after growing to 3 GiB: %d bytes", got)
			}
			m.Spec.DiskGB = 1
			if err := p.PrepareRootDisk(ctx, m); err != nil {
				t.Fatal(err)
			}
			if got := info(root).VirtualSize; got != 3*gib {
				t.Errorf("asking for 1 GiB shrank the disk to %d bytes", got)
			}
			p.mu.Lock()
			delete(p.machines, "vm") // next subtest reuses the name
			p.mu.Unlock()
		})
	}

	t.Run("image that is not a disk format is permanent", func(t *testing.T) {
		// A qcow2 with a backing file of its own would let a downloaded
		// image point QEMU at host files.
		dir := t.TempDir()
		child := filepath.Join(dir, "child.qcow2")
		if out, err := exec.Command(qemuImg, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", qcowPath, child).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		b, _ := os.ReadFile(child)
		art := srv.add("/child.qcow2", b)
		err := p.PrepareRootDisk(ctx, agent.Machine{Name: "bad", Dir: t.TempDir(), Spec: desired.VMSpec{DiskGB: 1, Image: &art}})
		if !agent.IsPermanent(err) {
			t.Errorf("image with a backing file: %v, want a permanent error", err)
		}
	})
}

// A VM waiting for a download reports its progress by name.
func TestVMProgress(t *testing.T) {
	needQEMUImg(t)
	srv := newArtifactServer(t)
	data := make([]byte, 256<<10)
	art := srv.add("/k", data)
	gate := make(chan struct{})
	srv.gate = gate
	p, err := New(Config{CacheDir: t.TempDir(), Artifacts: loopbackPolicy(), Accel: AccelTCG, Logger: quietLog().Logger})
	if err != nil {
		t.Fatal(err)
	}
	m := agent.Machine{Name: "vm", Dir: t.TempDir(), Spec: desired.VMSpec{DiskGB: 1, Kernel: &desired.Kernel{URL: art.URL, SHA256: art.SHA256}}}
	if _, _, ok := p.VMProgress("vm"); ok {
		t.Error("progress before any download")
	}
	errc := make(chan error, 1)
	go func() { errc <- p.PrepareRootDisk(context.Background(), m) }()
	for {
		if done, total, ok := p.VMProgress("vm"); ok && done == int64(len(data)/2) {
			if total != int64(len(data)) {
				t.Errorf("total %d, want %d", total, len(data))
			}
			break
		}
		waitABit()
	}
	close(gate)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if _, _, ok := p.VMProgress("vm"); ok {
		t.Error("progress still reported after the download")
	}
}

// TestAnEditedImageIsNotFetchedForAnExistingVM pins that an image edit,
// which is never applied to a created VM's root disk, is neither fetched
// nor able to fail the VM's later edits and boots: a wrong sha256 in it
// stages cleanly, while the image the disk is backed by is fetched again
// when it has left the cache.
func TestAnEditedImageIsNotFetchedForAnExistingVM(t *testing.T) {
	needQEMUImg(t)
	srv := newArtifactServer(t)
	raw := make([]byte, 1<<20)
	copy(raw, "the image the VM was created from")
	orig := srv.add("/orig.raw", raw)
	cache := t.TempDir()
	p, err := New(Config{CacheDir: cache, Artifacts: loopbackPolicy(), Accel: AccelTCG, Logger: quietLog().Logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m := agent.Machine{Name: "vm", Dir: t.TempDir(), Spec: desired.VMSpec{DiskGB: 1, Image: &orig}, InstanceID: "i-1"}
	if err := p.PrepareRootDisk(ctx, m); err != nil {
		t.Fatal(err)
	}

	edited := m
	edited.Spec.Image = &desired.Artifact{URL: srv.URL + "/other.raw", SHA256: strings.Repeat("ab", 32)}
	edited.Spec.MemoryMB = 256
	if err := p.Stage(ctx, edited); err != nil {
		t.Fatalf("Stage of an edit whose image is not applied: %v", err)
	}
	if err := p.PrepareRootDisk(ctx, edited); err != nil {
		t.Fatalf("PrepareRootDisk of an existing VM with an edited image: %v", err)
	}
	if n := srv.count("/other.raw"); n != 0 {
		t.Errorf("the edited image was requested %d times, want never", n)
	}

	// The image the disk is backed by is still the VM's own: gone from the
	// cache, it is fetched again.
	if err := os.Remove(filepath.Join(cache, orig.SHA256)); err != nil {
		t.Fatal(err)
	}
	before := srv.count("/orig.raw")
	if err := p.Stage(ctx, m); err != nil {
		t.Fatal(err)
	}
	if srv.count("/orig.raw") != before+1 {
		t.Errorf("the backing image left the cache and was not fetched again")
	}
}

// TestPreflightKeepsDownloadsInFlight pins that Preflight, which every
// create pass runs, never removes another VM's download in flight: only a
// killed agent's leftovers, once per process.
func TestPreflightKeepsDownloadsInFlight(t *testing.T) {
	needQEMUImg(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	srv := newArtifactServer(t)
	data := []byte(strings.Repeat("kernel bytes ", 1<<16))
	art := srv.add("/vmlinuz", data)
	cache := t.TempDir()
	leftover := filepath.Join(cache, strings.Repeat("0", 64)+".partial-1")
	if err := os.WriteFile(leftover, []byte("a killed agent's download"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{CacheDir: cache, Artifacts: loopbackPolicy(), Accel: AccelTCG, Logger: quietLog().Logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := p.Preflight(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(leftover); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a killed agent's half download was kept: %v", err)
	}

	gate := make(chan struct{})
	srv.mu.Lock()
	srv.gate = gate
	srv.mu.Unlock()
	got := make(chan error, 1)
	go func() {
		_, err := p.images.fetch(ctx, art)
		got <- err
	}()
	for {
		if m, _ := filepath.Glob(filepath.Join(cache, "*.partial-*")); len(m) > 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := p.Preflight(ctx); err != nil { // another VM's create pass
		t.Fatal(err)
	}
	close(gate)
	if err := <-got; err != nil {
		t.Fatalf("a download in flight failed after another Preflight: %v", err)
	}
}
