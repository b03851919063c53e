package gitsource

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// openEmptyCache opens a cache on disk of an unused remote, for tests that
// hand its pack writer a pack of their own.
func openEmptyCache(t *testing.T, opts Options) (*Repo, *diskStorage, string) {
	t.Helper()
	cache := filepath.Join(t.TempDir(), "cache")
	opts.CacheDir = cache
	if opts.URL == "" {
		opts.URL = filepath.Join(t.TempDir(), "none.git")
	}
	r, err := Open(context.Background(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	return r, r.st.(*diskStorage), cache
}

// storePack writes pack through the cache's pack writer, as a fetch does,
// with ctx bounding the indexing.
func storePack(ctx context.Context, st *diskStorage, pack []byte) error {
	return st.during(ctx, func() error {
		w, err := st.PackfileWriter()
		if err != nil {
			return err
		}
		if _, err := w.Write(pack); err != nil {
			_ = w.Close()
			return err
		}
		return w.Close()
	})
}

// requireNothingLeft checks that a refused pack left no file behind: no
// pack, no index, no spill file.
func requireNothingLeft(t *testing.T, cache string) {
	t.Helper()
	left, _ := filepath.Glob(filepath.Join(cache, "objects", "pack", "*"))
	require.Empty(t, left)
}

// refChain is a blob and depth ref-deltas on it, each on the one before,
// stored deepest first (so each names a base that comes after it), and
// the hash of the deepest.
func refChain(t testing.TB, depth int) ([]craftObject, plumbing.Hash) {
	body := []byte("version 0\n")
	base := plumbing.ComputeHash(plumbing.BlobObject, body)
	objs := []craftObject{{typ: plumbing.BlobObject, data: body}}
	for i := 1; i <= depth; i++ {
		next := append(body[:len(body):len(body)], fmt.Sprintf("v%d\n", i)...)
		objs = append(objs, craftObject{ref: base, data: deltaOf(len(body), len(body), fmt.Sprintf("v%d\n", i))})
		body = next
		base = plumbing.ComputeHash(plumbing.BlobObject, body)
	}
	for i, j := 0, len(objs)-1; i < j; i, j = i+1, j-1 {
		objs[i], objs[j] = objs[j], objs[i]
	}
	return objs, base
}

// Ref-delta chains resolve once each, whatever their order in the pack:
// a chain of git's maximum depth stored deepest first indexes, and every
// object of it reads back; one delta deeper is refused with its own
// error naming the object, not taken for a timeout or for cache damage.
func TestDeepRefDeltaChains(t *testing.T) {
	ctx := context.Background()
	objs, deepest := refChain(t, maxDeltaDepth)
	r, st, _ := openEmptyCache(t, Options{})
	require.NoError(t, storePack(ctx, st, craftPack(t, objs)))
	r.mu.Lock()
	data, err := r.readBlob(deepest)
	r.mu.Unlock()
	require.NoError(t, err)
	require.True(t, strings.HasSuffix(string(data), fmt.Sprintf("v%d\n", maxDeltaDepth)))

	objs, _ = refChain(t, maxDeltaDepth+1)
	_, st, cache := openEmptyCache(t, Options{})
	err = storePack(ctx, st, craftPack(t, objs))
	require.ErrorIs(t, err, ErrPackRefused)
	require.Contains(t, err.Error(), "delta chain deeper than 4095")
	require.Contains(t, err.Error(), "object at offset 12", "names the deepest delta, the first in the pack")
	require.False(t, repairable(err), "a refused pack is no cache damage: %v", err)
	requireNothingLeft(t, cache)
}

// Deltas that never resolve (their bases are absent, or name each other
// in a cycle) are refused with an error that says so and names one.
func TestUnresolvableDeltasRefused(t *testing.T) {
	a := plumbing.ComputeHash(plumbing.BlobObject, []byte("a"))
	b := plumbing.ComputeHash(plumbing.BlobObject, []byte("b"))
	for name, objs := range map[string][]craftObject{
		"base not in the pack":  {{typ: plumbing.BlobObject, data: []byte("x")}, {ref: a, data: deltaOf(1, 1, "y")}},
		"two naming each other": {{ref: a, data: deltaOf(1, 1, "b")}, {ref: b, data: deltaOf(1, 1, "a")}},
	} {
		_, st, cache := openEmptyCache(t, Options{})
		err := storePack(context.Background(), st, craftPack(t, objs))
		require.ErrorIs(t, err, ErrPackRefused, name)
		require.Contains(t, err.Error(), "never resolve", name)
		require.False(t, repairable(err), name)
		requireNothingLeft(t, cache)
	}
}

// bomb is a pack of 64 KiB of zeros and a delta on it that copies the
// whole base n times: a few kilobytes that expand to n × 64 KiB.
func bomb(t testing.TB, n int) []byte {
	base := make([]byte, 0x10000)
	d := binary.AppendUvarint(binary.AppendUvarint(nil, uint64(len(base))), uint64(n*len(base)))
	for i := 0; i < n; i++ {
		d = append(d, 0x80) // copy 0x10000 bytes from offset 0
	}
	return craftPack(t, []craftObject{{typ: plumbing.BlobObject, data: base}, {ofs: 1, data: d}})
}

// A delta bomb (a small pack whose delta expands past the spill limit)
// fails the fetch with ErrPackRefused naming the object and the limit,
// leaves no spill file, and is not taken for a full disk or cache damage.
func TestDeltaBombRefused(t *testing.T) {
	pack := bomb(t, 512) // 32 MiB from a pack of a few KiB
	_, st, cache := openEmptyCache(t, Options{MaxSpill: 8 << 20})
	err := storePack(context.Background(), st, pack)
	t.Logf("a %d-byte pack expanding to 32 MiB: %v", len(pack), err)
	require.ErrorIs(t, err, ErrPackRefused)
	require.Contains(t, err.Error(), "the object at offset")
	require.Contains(t, err.Error(), "spill limit of 8 MiB")
	require.False(t, repairable(err))
	require.False(t, isUnwritable(err), "not blamed on the disk")
	requireNothingLeft(t, cache)

	// The same pack within a limit that holds it indexes.
	_, st, _ = openEmptyCache(t, Options{MaxSpill: 64 << 20})
	require.NoError(t, storePack(context.Background(), st, pack))
	require.Equal(t, DefaultMaxSpill, spillLimit(0, 1<<20), "the floor for a small pack")
	require.Equal(t, int64(8<<30), spillLimit(0, 2<<30), "four times a large pack")
}

// A delta bomb fetched from a real git server (git upload-pack sends the
// delta as it is stored) fails the fetch with ErrPackRefused, over the
// file transport and http, leaves no spill file and is not repaired.
func TestFetchedDeltaBombRefused(t *testing.T) {
	const copies = 512 // 32 MiB
	h := plumbing.NewHasher(plumbing.BlobObject, copies<<16)
	zeros := make([]byte, 1<<16)
	for i := 0; i < copies; i++ {
		h.Write(zeros)
	}
	d := binary.AppendUvarint(binary.AppendUvarint(nil, 1<<16), copies<<16)
	for i := 0; i < copies; i++ {
		d = append(d, 0x80)
	}
	pack, commit := commitPack(t, []craftObject{{typ: plumbing.BlobObject, data: zeros}, {ofs: 1, data: d}},
		map[string]plumbing.Hash{"zeros": plumbing.ComputeHash(plumbing.BlobObject, zeros), "bomb": h.Sum()})
	dir := bareFromPack(t, pack, commit)
	url := gittest.Serve(t, filepath.Dir(dir)) + "/" + filepath.Base(dir)
	for name, remote := range map[string]string{"file": dir, "http": url} {
		cache := filepath.Join(t.TempDir(), "cache")
		r, err := Open(context.Background(), Options{URL: remote, CacheDir: cache, MaxSpill: 8 << 20})
		require.NoError(t, err)
		_, err = r.Fetch(context.Background(), "main")
		t.Logf("%s: %v", name, err)
		require.ErrorIs(t, err, ErrPackRefused, name)
		require.Contains(t, err.Error(), "expands past the spill limit", name)
		left, _ := filepath.Glob(filepath.Join(cache, "objects", "pack", "*"))
		require.Empty(t, left, name)
		r.Close()
	}
}

// Indexing a fetched pack honours the fetch's context: a cancelled or
// expired one stops it with the context's error, and nothing is stored.
func TestPackIndexingHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for name, pack := range map[string][]byte{
		"whole objects": craftPack(t, []craftObject{{typ: plumbing.BlobObject, data: []byte("a")}}),
		"deltas":        bomb(t, 64),
	} {
		_, st, cache := openEmptyCache(t, Options{})
		err := storePack(ctx, st, pack)
		require.ErrorIs(t, err, context.Canceled, name)
		requireNothingLeft(t, cache)
	}
	_, st, _ := openEmptyCache(t, Options{})
	require.NoError(t, storePack(context.Background(), st, bomb(t, 64)))
}

// BenchmarkRefDeltaChain indexes a chain of 1,000 ref-deltas stored
// deepest first (each naming a base that comes after it in the pack): the
// cost of a chain is its length, where resolving round after round cost
// its length squared.
func BenchmarkRefDeltaChain(b *testing.B) {
	objs, _ := refChain(b, 1000)
	pack := craftPack(b, objs)
	dir := b.TempDir()
	for i := 0; i < b.N; i++ {
		f, err := os.Create(filepath.Join(dir, "tmp_pack"))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := f.Write(pack); err != nil {
			b.Fatal(err)
		}
		if _, err := f.Seek(0, 0); err != nil {
			b.Fatal(err)
		}
		if _, _, err := indexPack(context.Background(), f, int64(len(pack)), DefaultMaxSpill); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}
