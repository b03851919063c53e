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

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/gitsource/gittest"
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
