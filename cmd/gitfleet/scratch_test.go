package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/internal/scratchdir"
)

// The controller's private clones left by a killed controller (a
// directory with an unlocked marker) are swept when the next one starts;
// directories of the same prefix that are not scratch directories, and
// another command's, stay. The new directory holds the clones and goes
// at exit.
func TestControllerSweepsClonesOfKilledControllers(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	stale := filepath.Join(tmp, controllerScratch+"killed")
	require.NoError(t, os.MkdirAll(filepath.Join(stale, "cache", "objects"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(stale, scratchdir.Marker), nil, 0o600))
	notOurs := filepath.Join(tmp, controllerScratch+"unmarked")
	require.NoError(t, os.Mkdir(notOurs, 0o700))
	plan, donePlan, err := scratchdir.Make(commandScratch)
	require.NoError(t, err)
	defer donePlan()

	var fc fleet.Config
	done, err := privateClones(&fc, nil)
	require.NoError(t, err)
	require.NoDirExists(t, stale)
	require.DirExists(t, notOurs)
	require.DirExists(t, plan)
	dir := filepath.Dir(fc.CacheDir)
	require.Equal(t, tmp, filepath.Dir(dir))
	require.Equal(t, dir, filepath.Dir(fc.TipsCacheDir))
	require.FileExists(t, filepath.Join(dir, scratchdir.Marker))
	done()
	require.NoDirExists(t, dir)
}
