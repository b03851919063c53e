package main

import (
	"context"
	"os"
	"path/filepath"

	"github.com/gitfleet/gitfleet/gitsource"
)

// openScratch opens opts.URL with its cache in a private temporary
// directory (0700) that done removes. A clone in memory would hold every
// blob it fetched, however large — an unrelated binary in the repository,
// a forged file on a gitfleet branch — so no command keeps one there.
func openScratch(ctx context.Context, opts gitsource.Options) (repo *gitsource.Repo, done func(), err error) {
	tmp, err := os.MkdirTemp("", "gitfleet-")
	if err != nil {
		return nil, nil, err
	}
	opts.CacheDir = filepath.Join(tmp, "cache")
	repo, err = gitsource.Open(ctx, opts)
	if err != nil {
		os.RemoveAll(tmp)
		return nil, nil, err
	}
	return repo, func() { repo.Close(); os.RemoveAll(tmp) }, nil
}
