package gitsource

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/sirupsen/logrus"
)

// cacheNames are the names git and go-git keep at the top of a bare
// repository; a name ending in .lock is git's too (a lock left behind).
var cacheNames = map[string]bool{
	"HEAD": true, "config": true, "description": true, "objects": true, "refs": true,
	"packed-refs": true, "shallow": true, "hooks": true, "info": true, "branches": true,
	"logs": true, "index": true, "FETCH_HEAD": true, "ORIG_HEAD": true,
}

// strays are the entries of a cache directory that are not git's: a note
// or an editor's backup someone left, a lost+found of the cache's own
// filesystem. They are not the cache's: Open uses the cache all the same
// (once, a stray refused every start), logs them, and never deletes them
// (a fresh clone keeps them, see keepStrays). Sorted.
func strays(ents []os.DirEntry) []string {
	var out []string
	for _, e := range ents {
		if name := e.Name(); !cacheNames[name] && !strings.HasSuffix(name, ".lock") {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// maxStraysLogged bounds the names one log line lists.
const maxStraysLogged = 10

// logStrays logs the strays of the cache dir, whose entries are ents.
func logStrays(dir string, ents []os.DirEntry, log *logrus.Entry) {
	s := strays(ents)
	if len(s) == 0 {
		return
	}
	names := strings.Join(s[:min(len(s), maxStraysLogged)], ", ")
	if len(s) > maxStraysLogged {
		names += fmt.Sprintf(" and %d more", len(s)-maxStraysLogged)
	}
	log.WithField("cache", dir).WithField("strays", names).Warn("the cache directory holds entries that are not git's; they are ignored and kept")
}

// keepStrays moves the strays of a cache moved aside to old (whose
// entries were ents) into a new directory at dir, before old is removed.
func keepStrays(old, dir string, ents []os.DirEntry) error {
	s := strays(ents)
	if len(s) == 0 {
		return nil
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	for _, name := range s {
		if err := os.Rename(filepath.Join(old, name), filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("keep %s out of the cache's removal: %w", name, err)
		}
	}
	return nil
}

// checkCacheDir decides what openStorage does with the cache dir whose
// entries are ents: init is true for a new cache (none, or only the
// strays a fresh clone's removeCache kept); a directory that is no cache
// is an error; a cache has its strays logged and what an interrupted git
// or a damaged pack left swept, and is opened.
func (r *Repo) checkCacheDir(dir string, ents []os.DirEntry, fresh bool) (init bool, err error) {
	if len(ents) == 0 || fresh && !isCache(ents) {
		return true, nil
	}
	if !isCache(ents) {
		return false, fmt.Errorf("cache dir %s is neither empty nor a git cache", dir)
	}
	logStrays(dir, ents, r.log)
	sweepLeftovers(dir, r.log)
	dropDamagedPacks(dir, r.log)
	return false, nil
}
