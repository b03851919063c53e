package gitsource_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// TestConcurrentUse: one Repo (with a cache on disk) read, fetched and
// written from many goroutines at once while a person pushes; run with
// -race. Every read sees a whole tree.
func TestConcurrentUse(t *testing.T) {
	ctx := context.Background()
	rm := gittest.NewBare(t)
	files := map[string]string{}
	for i := 0; i < 20; i++ {
		files[fmt.Sprintf("vms/vm-%02d.yaml", i)] = fmt.Sprintf("n: %d\n", i)
	}
	gittest.Commit(t, rm, gittest.Edit{Write: files})
	r := open(t, gitsource.Options{URL: "file://" + rm, CacheDir: t.TempDir()})
	_, err := r.Fetch(ctx, "main")
	require.NoError(t, err)

	var wg sync.WaitGroup
	errs := make(chan error, 100)
	fail := func(err error) {
		if err != nil {
			errs <- err
		}
	}
	// Readers: fetch main and read it whole.
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < 10; n++ {
				tip, err := r.Fetch(ctx, "main")
				if err != nil {
					fail(err)
					return
				}
				tr, err := r.Tree(tip, "vms")
				if err != nil {
					fail(err)
					return
				}
				count := 0
				fail(tr.Walk(func(f desired.File) error {
					_, err := f.Read()
					count++
					return err
				}))
				if count < 20 {
					fail(fmt.Errorf("tree of %s has %d files, want at least 20", tip, count))
				}
				_, err = r.Diff("", tip)
				fail(err)
				fail(r.FirstParents(tip, func(*gitsource.Commit) (bool, error) { return true, nil }))
			}
		}()
	}
	// Writers on another branch, through the same Repo.
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < 5; n++ {
				_, err := r.Update(ctx, "gitfleet/status", setFile(fmt.Sprintf("hosts/%d.yaml", g), fmt.Sprint(n)))
				fail(err)
			}
		}()
	}
	// A person pushing to main meanwhile.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; n < 5; n++ {
			gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{fmt.Sprintf("vms/new-%d.yaml", n): "x\n"}})
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	assert.Equal(t, []string{"hosts/0.yaml", "hosts/1.yaml"}, gittest.Files(t, rm, "gitfleet/status"))
}
