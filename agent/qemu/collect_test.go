package qemu

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
)

// cached puts data in the cache under its sha256, last used age ago.
func cached(t *testing.T, cache string, data []byte, age time.Duration) string {
	t.Helper()
	s := sum(data)
	path := filepath.Join(cache, s)
	require.NoError(t, os.WriteFile(path, data, 0o600))
	at := time.Now().Add(-age)
	require.NoError(t, os.Chtimes(path, at, at))
	return s
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

// TestCollectImagesKeepsWhatDisksAndSpecsUse: an artifact stays while a
// spec names it or a root disk is backed by it (here an image the spec no
// longer names: edits do not re-image a VM), or while it was used within
// the grace; the rest goes. A root disk that cannot be read stops the
// whole pass before anything is removed.
func TestCollectImagesKeepsWhatDisksAndSpecsUse(t *testing.T) {
	needQEMUImg(t)
	ctx := context.Background()
	srv := newArtifactServer(t)
	img := srv.add("/base.raw", make([]byte, 1<<20))
	cache := t.TempDir()
	p, err := New(Config{CacheDir: cache, Artifacts: loopbackPolicy(), Accel: AccelTCG, Logger: quietLog().Logger})
	require.NoError(t, err)
	web := agent.Machine{Name: "web-01", Dir: t.TempDir(), Spec: desired.VMSpec{Host: "hv-a", VCPUs: 1, MemoryMB: 128, DiskGB: 1, Image: &img}}
	require.NoError(t, p.PrepareRootDisk(ctx, web))
	old := time.Now().Add(-48 * time.Hour)
	require.NoError(t, os.Chtimes(filepath.Join(cache, img.SHA256), old, old))

	unused := cached(t, cache, []byte("unused for two days"), 48*time.Hour)
	recent := cached(t, cache, []byte("unused for an hour"), time.Hour)
	kernel := cached(t, cache, []byte("a kernel"), 48*time.Hour)
	partial := filepath.Join(cache, unused+".partial-1")
	require.NoError(t, os.WriteFile(partial, []byte("half"), 0o600))
	require.NoError(t, os.Chtimes(partial, old, old))

	edited := web
	edited.Spec.Image = &desired.Artifact{URL: srv.URL + "/new.raw", SHA256: sum([]byte("never fetched"))}
	db := agent.Machine{Name: "db-01", Dir: t.TempDir(), Spec: desired.VMSpec{Host: "hv-a", VCPUs: 1, MemoryMB: 128, DiskGB: 1,
		Kernel: &desired.Kernel{URL: srv.URL + "/k", SHA256: kernel}}}
	vms := []agent.Machine{edited, db}

	res, err := p.CollectImages(ctx, vms, 24*time.Hour)
	require.NoError(t, err)
	assert.Equal(t, []string{unused}, res.Removed)
	assert.Equal(t, int64(len("unused for two days")), res.RemovedBytes)
	assert.Equal(t, 3, res.Kept)
	assert.False(t, exists(filepath.Join(cache, unused)))
	for _, keep := range []string{img.SHA256, recent, kernel} {
		assert.True(t, exists(filepath.Join(cache, keep)), keep)
	}
	assert.True(t, exists(partial), "a download's temporary is not the collector's")
	fi, err := os.Stat(filepath.Join(cache, img.SHA256))
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now(), fi.ModTime(), time.Hour, "an artifact in use counts as used now")

	bad := agent.Machine{Name: "bad-01", Dir: t.TempDir()}
	require.NoError(t, os.WriteFile(filepath.Join(bad.Dir, RootDiskFile), []byte("not a qcow2"), 0o600))
	recentPath := filepath.Join(cache, recent)
	require.NoError(t, os.Chtimes(recentPath, old, old))
	_, err = p.CollectImages(ctx, append(vms, bad), 24*time.Hour)
	assert.ErrorContains(t, err, "bad-01")
	assert.True(t, exists(recentPath), "nothing is removed while a disk's backing file is unknown")

	// The VM is destroyed: its image goes once unused for the grace.
	require.NoError(t, p.Destroy(ctx, web.Name))
	require.NoError(t, os.Chtimes(filepath.Join(cache, img.SHA256), old, old))
	res, err = p.CollectImages(ctx, []agent.Machine{db}, 24*time.Hour)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{img.SHA256, recent}, res.Removed)
	assert.True(t, exists(filepath.Join(cache, kernel)))
}

// A fetch that finds its artifact cached marks it used, so a collection
// right after it keeps the artifact even with a zero grace.
func TestFetchMarksACachedArtifactUsed(t *testing.T) {
	cache := t.TempDir()
	c := newImageCache(cache, loopbackPolicy(), quietLog())
	data := []byte("an image")
	s := cached(t, cache, data, 72*time.Hour)
	_, err := c.fetch(context.Background(), desired.Artifact{URL: "http://127.0.0.1:1/x", SHA256: s})
	require.NoError(t, err)
	res, err := c.collect(map[string]bool{}, time.Minute, time.Now())
	require.NoError(t, err)
	assert.Empty(t, res.Removed)
	assert.True(t, exists(filepath.Join(cache, s)))
}
