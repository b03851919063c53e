package gitsource_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/peakrss"
)

// BenchmarkFetchPeakRSS prints the peak resident memory of a process that
// opens a cache and fetches one branch, for a repository with and without
// a 100 MB incompressible blob outside the files read, over the file and
// http transports, with the cache on disk (as the controller's and the
// agent's units keep it) and in memory. The figure is the child's own VmHWM: the memory a fetch costs does not depend on unrelated
// blobs when "with100MB" and "without" are within a few MB of each other
// on disk. (A memory cache holds every fetched object, so there it
// cannot.) Run with -benchtime=1x: each op is one fresh process.
func BenchmarkFetchPeakRSS(b *testing.B) {
	blob := make([]byte, 100<<20)
	if _, err := rand.Read(blob); err != nil {
		b.Fatal(err)
	}
	// "with100MBdeltas" holds three versions of the blob, which git
	// stores as one whole object and two deltas on it.
	for _, name := range []string{"without", "with100MB", "with100MBdeltas"} {
		dir := gittest.NewBare(b)
		files := map[string]string{"fleet/hv-a/web.yaml": "kind: VM\n"}
		if name != "without" {
			files["assets/disk.img"] = string(blob)
		}
		gittest.Commit(b, dir, gittest.Edit{Write: files})
		if name == "with100MBdeltas" {
			for i, at := range []int{len(blob) / 3, 2 * len(blob) / 3} {
				v := bytes.Clone(blob)
				copy(v[at:], fmt.Sprintf("version %d", i+2))
				gittest.Commit(b, dir, gittest.Edit{Write: map[string]string{"assets/disk.img": string(v)}})
			}
			gittest.Git(b, dir, "repack", "-a", "-d", "-q")
		}
		gittest.Commit(b, dir, gittest.Edit{Write: map[string]string{"fleet/hv-a/db.yaml": "kind: VM\n"}})
		url := gittest.Serve(b, filepath.Dir(dir)) + "/" + filepath.Base(dir)
		for _, remote := range []struct{ name, url string }{{"file", dir}, {"http", url}} {
			for _, store := range []string{"disk", "memory"} {
				b.Run(name+"/"+remote.name+"/"+store, func(b *testing.B) {
					for i := 0; i < b.N; i++ {
						cache := ""
						if store == "disk" {
							cache = filepath.Join(b.TempDir(), "cache")
						}
						b.ReportMetric(float64(fetchRSS(b, remote.url, cache))/1024, "MB-peak-RSS")
					}
				})
			}
		}
	}
}

// fetchRSS runs TestHelperFetch in a child process and returns its peak
// RSS in KiB, as the child reads it from its own /proc status (VmHWM)
// when done: rusage's Maxrss of a child counts the parent's memory at
// the fork.
func fetchRSS(tb testing.TB, url, cache string) int64 {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperFetch$")
	cmd.Env = append(os.Environ(), "GITSOURCE_HELPER_FETCH="+url+"\x1f"+cache)
	out, err := cmd.CombinedOutput()
	if err != nil {
		tb.Fatalf("fetch in a child process: %v\n%s", err, out)
	}
	kib, err := peakrss.Parse(out)
	if err != nil {
		tb.Fatalf("%v\n%s", err, out)
	}
	return kib
}

// TestHelperFetch opens the cache named in GITSOURCE_HELPER_FETCH
// (URL, cache dir and optionally the file to read, unit-separator
// separated), fetches main and reads one small file, in a process of its own, for BenchmarkFetchPeakRSS; it
// does nothing in a normal run.
func TestHelperFetch(t *testing.T) {
	args := os.Getenv("GITSOURCE_HELPER_FETCH")
	if args == "" {
		return
	}
	url, cache, _ := strings.Cut(args, "\x1f")
	file := "fleet/hv-a/web.yaml"
	if c, f, ok := strings.Cut(cache, "\x1f"); ok {
		cache, file = c, f
	}
	ctx := context.Background()
	r, err := gitsource.Open(ctx, gitsource.Options{URL: url, CacheDir: cache})
	if err != nil {
		t.Fatal(err)
	}
	tip, err := r.Fetch(ctx, "main")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadFile(tip, file); err != nil {
		t.Fatal(err)
	}
	if err := peakrss.Print(os.Stdout); err != nil {
		t.Fatal(err)
	}
}
