package main

import (
	"context"
	"path/filepath"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/internal/scratchdir"
)

// openScratch opens opts.URL with its cache in a private temporary
// directory (0700) that done removes. A clone in memory would hold every
// blob it fetched, however large — an unrelated binary in the repository,
// a forged file on a gitfleet branch — so no command keeps one there. The
// directories of commands that were killed are swept first (see
// scratchdir).
func openScratch(ctx context.Context, opts gitsource.Options) (repo *gitsource.Repo, done func(), err error) {
	scratchdir.Sweep(commandScratch, nil)
	tmp, remove, err := scratchdir.Make(commandScratch)
	if err != nil {
		return nil, nil, err
	}
	opts.CacheDir = filepath.Join(tmp, "cache")
	repo, err = gitsource.Open(ctx, opts)
	if err != nil {
		remove()
		return nil, nil, err
	}
	return repo, func() { repo.Close(); remove() }, nil
}

// commandScratch names the private directories of plan and status.
const commandScratch = "gitfleet-scratch-"
