package gitsource_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// BenchmarkStatusWriters50 measures status-branch throughput: 50 Repo
// instances (50 agents) each write their own hosts/<n>.yaml to one branch at
// once, through git http-backend. One benchmark op is one round in which
// every writer lands one commit; the figures are commits/s and the time of
// a round.
func BenchmarkStatusWriters50(b *testing.B) {
	const writers = 50
	ctx := context.Background()
	dir := gittest.NewBare(b)
	url := gittest.Serve(b, filepath.Dir(dir)) + "/" + filepath.Base(dir)
	repos := make([]*gitsource.Repo, writers)
	for i := range repos {
		r, err := gitsource.Open(ctx, gitsource.Options{URL: url, UpdateAttempts: 1000, Backoff: benchBackoff})
		require.NoError(b, err)
		repos[i] = r
	}
	var attempts sync.Map
	b.ResetTimer()
	start := time.Now()
	for round := 0; round < b.N; round++ {
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for i, r := range repos {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n := 0
				_, err := r.Update(ctx, "gitfleet/status", func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
					n++
					return map[string][]byte{fmt.Sprintf("hosts/%d.yaml", i): []byte(fmt.Sprintf("round: %d\n", round))}, "status", nil
				})
				attempts.Store(fmt.Sprint(round, "/", i), n)
				if err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	commits := float64(b.N * writers)
	total := 0
	attempts.Range(func(_, v any) bool { total += v.(int); return true })
	b.ReportMetric(commits/elapsed.Seconds(), "commits/s")
	b.ReportMetric(float64(total)/commits, "attempts/commit")
	b.ReportMetric(elapsed.Seconds()/float64(b.N), "s/round")
	files := gittest.Files(b, dir, "gitfleet/status")
	require.Len(b, files, writers)
}

var benchBackoff, _ = time.ParseDuration(envOr("GITSOURCE_BENCH_BACKOFF", "0s"))

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// BenchmarkUpdateHTTP is one uncontended Update (fetch, build, push) through
// git http-backend: the floor under the cost of a contended one.
func BenchmarkUpdateHTTP(b *testing.B) {
	ctx := context.Background()
	dir := gittest.NewBare(b)
	url := gittest.Serve(b, filepath.Dir(dir)) + "/" + filepath.Base(dir)
	r, err := gitsource.Open(ctx, gitsource.Options{URL: url})
	require.NoError(b, err)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_, err := r.Update(ctx, "gitfleet/status", setFile("hosts/a.yaml", fmt.Sprintf("n: %d\n", i)))
		require.NoError(b, err)
	}
}

// bigFleet commits 10,000 VM files over 1,000 host directories to a bare
// repository and returns it.
func bigFleet(b *testing.B) string {
	dir := gittest.NewBare(b)
	files := make(map[string]string, 10000)
	for h := 0; h < 1000; h++ {
		for v := 0; v < 10; v++ {
			files[fmt.Sprintf("fleet/hv-%04d/vm-%04d-%d.yaml", h, h, v)] = fmt.Sprintf("apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata: {name: vm-%04d-%d}\nspec: {host: hv-%04d, cpus: 2, memoryMB: 2048}\n", h, v, h)
		}
	}
	gittest.Commit(b, dir, gittest.Edit{Write: files})
	return dir
}

// BenchmarkTreeWalk10k: list a 10,000-file tree (paths, modes, sizes, blob
// IDs), as the controller does each pass; contents are not read. "cold"
// opens the cache afresh for each walk (as after a restart), "warm" walks
// with one Repo (as pass after pass).
func BenchmarkTreeWalk10k(b *testing.B) {
	ctx := context.Background()
	dir := bigFleet(b)
	cache := b.TempDir()
	r, err := gitsource.Open(ctx, gitsource.Options{URL: dir, CacheDir: cache})
	require.NoError(b, err)
	tip, err := r.Fetch(ctx, "main")
	require.NoError(b, err)
	b.Run("cold", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			r, err := gitsource.Open(ctx, gitsource.Options{URL: dir, CacheDir: cache})
			require.NoError(b, err)
			walk10k(b, r, tip)
			require.NoError(b, r.Close())
		}
	})
	b.Run("warm", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			walk10k(b, r, tip)
		}
	})
}

func walk10k(b *testing.B, r *gitsource.Repo, tip string) {
	{
		tr, err := r.Tree(tip, "fleet")
		require.NoError(b, err)
		n := 0
		require.NoError(b, tr.Walk(func(desired.File) error { n++; return nil }))
		require.Equal(b, 10000, n)
	}
}

// BenchmarkFetchOneFileCommit10k: fetch (and verify) a one-file commit on
// top of a 10,000-file tree already in the cache.
func BenchmarkFetchOneFileCommit10k(b *testing.B) {
	ctx := context.Background()
	dir := bigFleet(b)
	r, err := gitsource.Open(ctx, gitsource.Options{URL: dir, CacheDir: b.TempDir()})
	require.NoError(b, err)
	_, err = r.Fetch(ctx, "main")
	require.NoError(b, err)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		want := gittest.Commit(b, dir, gittest.Edit{Write: map[string]string{"fleet/hv-0001/vm-0001-1.yaml": fmt.Sprintf("n: %d\n", i)}})
		b.StartTimer()
		tip, err := r.Fetch(ctx, "main")
		require.NoError(b, err)
		require.Equal(b, want, tip)
	}
}
