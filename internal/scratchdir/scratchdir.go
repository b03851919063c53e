// Package scratchdir makes the private temporary directories gitfleet's
// commands clone into, and sweeps the ones a killed process left behind.
//
// A command that clones into a temporary directory removes it when it
// ends; a process killed (SIGKILL, the OOM killer, a crash) cannot, and
// its clone — every file of the fleet, a copy of every blob — stays in
// the temporary directory for good. Each directory made here holds a
// marker file, .gitfleet-scratch, locked (flock, exclusive) by its process
// for as long as it lives; the kernel drops the lock when the process
// dies, however it dies. Sweep removes the directories under a prefix
// whose marker is no longer locked, and nothing else: not a directory
// without the marker, not one of another user, not a symbolic link, not
// one whose marker is no regular file (a named pipe, a device), not one
// whose process still runs.
//
//	dir, done, err := scratchdir.Make("gitfleet-controller-")
//	defer done()
//	scratchdir.Sweep("gitfleet-controller-", log) // at start: what killed runs left
package scratchdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sirupsen/logrus"
)

// Marker is the name of the locked file in a scratch directory.
const Marker = ".gitfleet-scratch"

// Make creates a directory in os.TempDir() named prefix followed by a
// random suffix, mode 0700, holding the locked marker. done releases the
// lock and removes the directory with everything in it; until then no
// Sweep removes it.
func Make(prefix string) (dir string, done func(), err error) {
	if prefix == "" || strings.ContainsRune(prefix, filepath.Separator) {
		return "", nil, fmt.Errorf("scratch directory prefix %q: must be a plain, non-empty name", prefix)
	}
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, err
	}
	// The marker is locked under another name, then renamed: a Sweep
	// never sees it unlocked.
	f, err := os.CreateTemp(dir, ".lock-")
	if err == nil {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			err = os.Rename(f.Name(), filepath.Join(dir, Marker))
		}
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("scratch directory %s: %w", dir, err)
	}
	return dir, func() {
		os.RemoveAll(dir)
		f.Close()
	}, nil
}

// Sweep removes the scratch directories in os.TempDir() named prefix…
// that a dead process left: directories (not links) of this user holding
// a marker that no process holds locked. It returns their paths. A
// directory it cannot judge or remove is left, and logged at warning
// level when log is set.
func Sweep(prefix string, log *logrus.Entry) []string {
	if prefix == "" {
		return nil
	}
	paths, err := filepath.Glob(filepath.Join(os.TempDir(), globEscape(prefix)+"*"))
	if err != nil {
		return nil
	}
	var swept []string
	for _, dir := range paths {
		stale, err := isStale(dir)
		if err == nil && stale {
			err = os.RemoveAll(dir)
			if err == nil {
				swept = append(swept, dir)
				if log != nil {
					log.WithField("dir", dir).Info("removed a temporary clone a killed process left behind")
				}
				continue
			}
		}
		if err != nil && log != nil {
			log.WithError(err).WithField("dir", dir).Warn("could not sweep a temporary clone")
		}
	}
	return swept
}

// isStale reports whether dir is a scratch directory of this user whose
// process is gone.
func isStale(dir string) (bool, error) {
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return false, nil
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Getuid() {
		return false, nil
	}
	// Only a regular file is a marker: opening a named pipe waits for a
	// writer, a device may act on being opened. O_NONBLOCK keeps a pipe
	// put in its place since the Lstat from waiting too.
	if mfi, err := os.Lstat(filepath.Join(dir, Marker)); err != nil || !mfi.Mode().IsRegular() {
		return false, nil
	}
	fd, err := syscall.Open(filepath.Join(dir, Marker), syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		// No marker: not ours (or made before markers existed).
		return false, nil
	}
	defer syscall.Close(fd)
	var mst syscall.Stat_t
	if err := syscall.Fstat(fd, &mst); err != nil || mst.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return false, nil
	}
	switch err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB); {
	case err == nil:
		// The lock is free because its process is gone, or because it
		// removed the directory itself and let go: then the marker is
		// unlinked, and nothing was left behind.
		if err := syscall.Fstat(fd, &mst); err != nil || mst.Nlink == 0 {
			return false, nil
		}
		return true, nil
	case errors.Is(err, syscall.EWOULDBLOCK):
		return false, nil // its process still runs
	default:
		return false, fmt.Errorf("lock %s: %w", filepath.Join(dir, Marker), err)
	}
}

// globEscape quotes the glob metacharacters of s.
func globEscape(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`)
	return r.Replace(s)
}
