package gitsource

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/storage/memory"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/peakrss"
)

func countPacks(t *testing.T, cache string) (packs, loose int) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(cache, "objects", "pack"))
	require.NoError(t, err)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".pack") {
			packs++
		}
	}
	dirs, err := os.ReadDir(filepath.Join(cache, "objects"))
	require.NoError(t, err)
	for _, d := range dirs {
		if len(d.Name()) == 2 {
			fs, err := os.ReadDir(filepath.Join(cache, "objects", d.Name()))
			require.NoError(t, err)
			loose += len(fs)
		}
	}
	return packs, loose
}

// TestCompactKeepsEveryObject: a cache that accumulated packs and loose
// objects is merged down, and every commit, tree and blob stays readable.
func TestCompactKeepsEveryObject(t *testing.T) {
	defer func(p, l int) { maxPacks, maxLoose = p, l }(maxPacks, maxLoose)
	maxPacks, maxLoose = 4, 8
	ctx := context.Background()
	rm := gittest.NewBare(t)
	cache := t.TempDir()
	r, err := Open(ctx, Options{URL: rm, CacheDir: cache})
	require.NoError(t, err)
	var commits []string
	for i := 0; i < 12; i++ {
		if i%2 == 0 {
			// A person's commit: arrives as a pack.
			gittest.Commit(t, rm, Edit(fmt.Sprintf("vms/%d.yaml", i)))
			tip, err := r.Fetch(ctx, "main")
			require.NoError(t, err)
			commits = append(commits, tip)
		} else {
			// Our own commit: written as loose objects.
			tip, err := r.Update(ctx, "main", func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
				return map[string][]byte{fmt.Sprintf("hosts/%d.yaml", i): []byte(fmt.Sprint(i))}, "ours", nil
			})
			require.NoError(t, err)
			commits = append(commits, tip)
		}
		packs, loose := countPacks(t, cache)
		assert.LessOrEqual(t, packs, maxPacks+1, "after step %d", i)
		assert.LessOrEqual(t, loose, maxLoose+8, "after step %d", i)
	}
	// Everything is still there, from a fresh open of the cache too.
	for _, rr := range []*Repo{r, mustOpen(t, Options{URL: rm, CacheDir: cache})} {
		for i, c := range commits {
			tr, err := rr.Tree(c, "")
			require.NoError(t, err)
			n := 0
			require.NoError(t, tr.Walk(func(f desired.File) error {
				_, err := f.Read()
				n++
				return err
			}))
			assert.Equal(t, i+1, n, "files at commit %d", i)
		}
		var walked int
		require.NoError(t, rr.FirstParents(commits[len(commits)-1], func(*Commit) (bool, error) { walked++; return true, nil }))
		assert.Equal(t, len(commits), walked)
	}
}

// Edit is a one-file gittest edit.
func Edit(path string) gittest.Edit {
	return gittest.Edit{Write: map[string]string{path: path + "\n"}}
}

func mustOpen(t *testing.T, o Options) *Repo {
	t.Helper()
	r, err := Open(context.Background(), o)
	require.NoError(t, err)
	return r
}

// TestMemoryCacheIsBounded: a memory cache that keeps growing is cloned
// afresh (shallow here, so the fresh clone is small) and keeps working.
func TestMemoryCacheIsBounded(t *testing.T) {
	defer func(g int, f int64, s int) { growth, memoryFloor, maxShallow = g, f, s }(growth, memoryFloor, maxShallow)
	growth, memoryFloor, maxShallow = 2, 10, 1000
	ctx := context.Background()
	rm := gittest.NewBare(t)
	r, err := Open(ctx, Options{URL: rm, Depth: 1})
	require.NoError(t, err)
	for i := 0; i < 30; i++ {
		want := gittest.Commit(t, rm, Edit(fmt.Sprintf("hosts/%d.yaml", i)))
		tip, err := r.Fetch(ctx, "main")
		require.NoError(t, err)
		require.Equal(t, want, tip)
		data, err := r.ReadFile(tip, fmt.Sprintf("hosts/%d.yaml", i))
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprintf("hosts/%d.yaml\n", i), string(data))
	}
	r.mu.Lock()
	n := r.objectCount()
	r.mu.Unlock()
	// Depth 1 of a 30-file tree: 1 commit, 2 trees, 30 blobs, and less than
	// growth times that of leftovers.
	assert.Less(t, n, 2*33+1)
}

// TestMemoryCacheIsBoundedByBytes: a memory cache that grows by a few
// objects but many bytes a fetch (a 1 MiB file rewritten by every commit,
// as every publish of the controller rewrites its ledger) is cloned afresh
// once its object data passes the floor and four times its first clone,
// with the defaults; reads go on working. Bounded by objects, it kept
// every version.
func TestMemoryCacheIsBoundedByBytes(t *testing.T) {
	ctx := context.Background()
	rm := gittest.NewBare(t)
	gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"ledger.yaml": incompressible(t, 1<<20)}})
	r, err := Open(ctx, Options{URL: rm, Depth: 1})
	require.NoError(t, err)
	var highest int64
	for i := 0; i < 24; i++ {
		content := incompressible(t, 1<<20)
		want := gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"ledger.yaml": content}})
		tip, err := r.Fetch(ctx, "main")
		require.NoError(t, err)
		require.Equal(t, want, tip)
		data, err := r.ReadFile(tip, "ledger.yaml")
		require.NoError(t, err)
		require.Equal(t, content, string(data))
		r.mu.Lock()
		highest = max(highest, r.objectBytes())
		r.mu.Unlock()
	}
	// 25 MiB were fetched; the cache held at most the floor and the
	// version that passed it (commits and trees are a few hundred bytes).
	assert.LessOrEqual(t, highest, memoryFloor+(1<<20)+(64<<10))
}

// objectCount is the number of objects of a memory cache (0 for a cache on
// disk). Caller holds r.mu.
func (r *Repo) objectCount() int {
	if ms, ok := r.st.(*memory.Storage); ok {
		return len(ms.ObjectStorage.Objects)
	}
	return 0
}

// incompressible is n bytes of hex digits of random bytes.
func incompressible(t *testing.T, n int) string {
	b := make([]byte, n/2)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// TestShallowDiskCacheIsBounded: a shallow cache on disk is cloned afresh
// when its shallow list grows long, or its packs grow past their floor and
// a multiple of their size after the last clone; it keeps working.
func TestShallowDiskCacheIsBounded(t *testing.T) {
	defer func(g, s int, f int64) { growth, maxShallow, diskFloor = g, s, f }(growth, maxShallow, diskFloor)
	for _, tc := range []struct {
		name       string
		maxShallow int
		diskFloor  int64
	}{
		{"shallow list", 5, 1 << 40},
		{"size", 1 << 20, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			growth, maxShallow, diskFloor = 2, tc.maxShallow, tc.diskFloor
			ctx := context.Background()
			rm := gittest.NewBare(t)
			cache := t.TempDir()
			r, err := Open(ctx, Options{URL: rm, CacheDir: cache, Depth: 1})
			require.NoError(t, err)
			maxLines := 0
			for i := 0; i < 20; i++ {
				// Each commit rewrites a big file that does not compress,
				// so old tips weigh.
				noise := make([]byte, 4096)
				_, _ = rand.Read(noise)
				want := gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{
					"big": hex.EncodeToString(noise),
					"n":   fmt.Sprint(i),
				}})
				tip, err := r.Fetch(ctx, "main")
				require.NoError(t, err)
				require.Equal(t, want, tip)
				data, err := r.ReadFile(tip, "n")
				require.NoError(t, err)
				assert.Equal(t, fmt.Sprint(i), string(data))
				r.mu.Lock()
				sh, err := r.st.Shallow()
				r.mu.Unlock()
				require.NoError(t, err)
				maxLines = max(maxLines, len(sh))
			}
			packs, _ := countPacks(t, cache)
			assert.LessOrEqual(t, packs, maxPacks+1)
			if tc.name == "shallow list" {
				assert.LessOrEqual(t, maxLines, tc.maxShallow+1)
			} else {
				// 20 tips of over 4 KB each would be there without a fresh
				// clone.
				r.mu.Lock()
				size := packBytes(r.st.(*diskStorage))
				r.mu.Unlock()
				assert.Less(t, size, int64(20*1000))
			}
		})
	}
}

// BenchmarkCompactPeakRSS prints the peak resident memory of a process
// that compacts a cache on disk holding 400 loose blobs of 300 KiB (120
// MB: the ledgers of a few hundred publishing passes of a 10,000-VM
// fleet, as a controller's tips cache holds when it compacts): "before"
// is the peak before the compaction, "peak" the peak through it. When
// compact holds one object at a time, the two differ by the object cache
// (32 MiB at most) and the collector's slack, whatever the cache holds;
// holding every object, by twice what it holds. Run with -benchtime=1x:
// each op is one fresh process.
func BenchmarkCompactPeakRSS(b *testing.B) {
	for i := 0; i < b.N; i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperCompact$")
		cmd.Env = append(os.Environ(), "GITSOURCE_HELPER_COMPACT="+b.TempDir())
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("compact in a child process: %v\n%s", err, out)
		}
		var before int64
		if _, err := fmt.Sscanf(string(out), "before-kib: %d", &before); err != nil {
			b.Fatalf("no before-kib line: %v\n%s", err, out)
		}
		peak, err := peakrss.Parse(out)
		if err != nil {
			b.Fatalf("%v\n%s", err, out)
		}
		b.ReportMetric(float64(before)/1024, "MB-before")
		b.ReportMetric(float64(peak)/1024, "MB-peak-RSS")
	}
}

// TestHelperCompact is BenchmarkCompactPeakRSS's child; it does nothing
// in a normal run. GITSOURCE_HELPER_COMPACT names its cache directory.
func TestHelperCompact(t *testing.T) {
	dir := os.Getenv("GITSOURCE_HELPER_COMPACT")
	if dir == "" {
		return
	}
	r, err := Open(context.Background(), Options{URL: gittest.NewBare(t), CacheDir: filepath.Join(dir, "cache")})
	require.NoError(t, err)
	st := r.st.(*diskStorage)
	blob := make([]byte, 300<<10)
	for i := 0; i < 400; i++ {
		_, err := rand.Read(blob)
		require.NoError(t, err)
		obj := st.NewEncodedObject()
		obj.SetType(plumbing.BlobObject)
		w, err := obj.Writer()
		require.NoError(t, err)
		_, err = w.Write(blob)
		require.NoError(t, err)
		require.NoError(t, w.Close())
		_, err = st.SetEncodedObject(obj)
		require.NoError(t, err)
	}
	runtime.GC()
	before, err := peakrss.Self()
	require.NoError(t, err)
	fmt.Printf("before-kib: %d\n", before)
	defer func(l int) { maxLoose = l }(maxLoose)
	maxLoose = 100
	changed, err := compact(st)
	require.NoError(t, err)
	require.True(t, changed)
	_, loose := countPacks(t, filepath.Join(dir, "cache"))
	require.Zero(t, loose, "every loose object was packed")
	require.NoError(t, peakrss.Print(os.Stdout))
}
