package gitsource

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/peakrss"
)

// smallOverLarge is a pack of one commit whose tree holds a large blob
// (base bytes of zeros, a few KiB once compressed), a small fleet file
// stored as a delta on it (a copy of its first 64 bytes and a line), and
// a large file stored as a delta of many small inserts (8 MiB of delta
// instructions). It returns the pack, the commit and the small file's
// contents. git itself would not pair such sizes; a remote may.
func smallOverLarge(t testing.TB, base int) ([]byte, string, string) {
	big := make([]byte, base)
	small := string(big[:64]) + "kind: VM\n"
	var huge []byte
	ins := bytes.Repeat([]byte{'x'}, 127)
	hugeDelta := binary.AppendUvarint(nil, uint64(base))
	hugeDelta = binary.AppendUvarint(hugeDelta, uint64(127*(8<<20)/128))
	for i := 0; i < (8<<20)/128; i++ {
		hugeDelta = append(append(hugeDelta, 127), ins...)
		huge = append(huge, ins...)
	}
	pack, commit := commitPack(t, []craftObject{
		{typ: plumbing.BlobObject, data: big},
		{ofs: 1, data: deltaOf(base, 64, "kind: VM\n")},
		{ofs: 2, data: hugeDelta},
	}, map[string]plumbing.Hash{
		"big.img":   plumbing.ComputeHash(plumbing.BlobObject, big),
		"huge.yaml": plumbing.ComputeHash(plumbing.BlobObject, huge),
		"web.yaml":  plumbing.ComputeHash(plumbing.BlobObject, []byte(small)),
	})
	return pack, commit, small
}

// allocated is the bytes op allocates on the heap (all of it, freed or
// not: a figure that does not depend on the collector's timing).
func allocated(op func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	op()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A small file stored as a delta on a large blob reads back without the
// base in memory, and a tree listing learns each file's size from the
// object and delta headers alone, without inflating the delta: neither
// allocates anything like the base (16 MiB) or the delta's instructions
// (8 MiB). A file over the limit is refused from its size.
func TestSmallDeltaOverLargeBaseReadsBounded(t *testing.T) {
	const base = 16 << 20
	pack, commit, small := smallOverLarge(t, base)
	r, st, cache := openEmptyCache(t, Options{})
	require.NoError(t, storePack(context.Background(), st, pack))

	tree, err := r.Tree(commit, "")
	require.NoError(t, err)
	sizes := map[string]int64{}
	n := allocated(func() {
		err = tree.Walk(func(f desired.File) error {
			sizes[f.Path] = f.Size
			return nil
		})
	})
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"big.img": base, "huge.yaml": 127 * (8 << 20) / 128, "web.yaml": int64(len(small))}, sizes)
	t.Logf("listing the tree allocated %d KiB", n>>10)
	require.Less(t, n, uint64(1<<20), "sizes come from headers, nothing is inflated whole")
	var data []byte
	n = allocated(func() { data, err = r.ReadFileMax(commit, "web.yaml", desired.MaxFileSize) })
	require.NoError(t, err)
	require.Equal(t, small, string(data))
	t.Logf("reading a %d-byte file stored as a delta on a %d MiB blob allocated %d KiB", len(small), base>>20, n>>10)
	require.Less(t, n, uint64(4<<20), "the base is not read into memory")

	_, err = r.ReadFileMax(commit, "huge.yaml", desired.MaxFileSize)
	require.ErrorIs(t, err, ErrFileTooLarge)

	requireNoSpill(t, cache)
}

// requireNoSpill checks that no spill file is left in the cache.
func requireNoSpill(t *testing.T, cache string) {
	t.Helper()
	left, _ := filepath.Glob(cache + "/objects/pack/tmp_*")
	require.Empty(t, left, "spill files are removed")
}

// BenchmarkReadSmallDeltaPeakRSS prints the peak resident memory of a
// process that fetches one branch into a cache on disk and reads a
// 73-byte fleet file, stored whole ("without") or as a delta on an
// incompressible 100 MB blob ("with100MBbase"), over the file transport.
// The two are within a few MB of each other when the base is never read
// into memory. Run with -benchtime=1x: each op is one fresh process.
func BenchmarkReadSmallDeltaPeakRSS(b *testing.B) {
	big := make([]byte, 100<<20)
	if _, err := rand.Read(big); err != nil {
		b.Fatal(err)
	}
	small := string(big[:64]) + "kind: VM\n"
	for _, name := range []string{"without", "with100MBbase"} {
		objs := []craftObject{{typ: plumbing.BlobObject, data: []byte(small)}}
		files := map[string]plumbing.Hash{"web.yaml": plumbing.ComputeHash(plumbing.BlobObject, []byte(small))}
		if name == "with100MBbase" {
			objs = []craftObject{{typ: plumbing.BlobObject, data: big}, {ofs: 1, data: deltaOf(len(big), 64, "kind: VM\n")}}
			files["disk.img"] = plumbing.ComputeHash(plumbing.BlobObject, big)
		}
		pack, commit := commitPack(b, objs, files)
		dir := bareFromPack(b, pack, commit)
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				cmd := exec.Command(os.Args[0], "-test.run=^TestHelperFetch$")
				cmd.Env = append(os.Environ(), "GITSOURCE_HELPER_FETCH="+dir+"\x1f"+filepath.Join(b.TempDir(), "cache")+"\x1fweb.yaml")
				out, err := cmd.CombinedOutput()
				if err != nil {
					b.Fatalf("fetch and read in a child process: %v\n%s", err, out)
				}
				kib, err := peakrss.Parse(out)
				if err != nil {
					b.Fatalf("%v\n%s", err, out)
				}
				b.ReportMetric(float64(kib)/1024, "MB-peak-RSS")
			}
		})
	}
}
