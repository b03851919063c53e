package fleet

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// ErrCacheInUse is wrapped by New's error when another controller (another
// process, or a Controller of this one not closed yet) holds the lock of
// Config.CacheDir or Config.TipsCacheDir: two controllers sharing one
// clone would repair, compact and re-clone it under each other.
var ErrCacheInUse = errors.New("cache directory in use by another controller")

// cacheLock is an exclusive flock(2) on DIR.lock, the file beside a cache
// directory (beside, not in it: the directory itself may be cloned
// afresh, and holds only what git keeps). The kernel releases it when the
// process ends, however it ends.
type cacheLock struct{ f *os.File }

// lockCache takes the lock of the cache directory dir without waiting. The
// lock file records the holder's pid, for the error a second controller
// gets.
func lockCache(dir string) (*cacheLock, error) {
	path := filepath.Clean(dir) + ".lock"
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("lock cache %s: %w", dir, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock cache %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is locked (%s, held by pid %s); give each controller its own cache directory", ErrCacheInUse, dir, path, string(holder))
		}
		return nil, fmt.Errorf("lock cache %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())), 0)
	}
	return &cacheLock{f: f}, nil
}

// release gives the lock up.
func (l *cacheLock) release() {
	if l != nil {
		_ = syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
		_ = l.f.Close()
	}
}

// Close releases the locks of the controller's cache directories (the
// repositories stay usable until the process ends, but must not be used
// after Close). Run must have returned. Safe to call more than once.
func (c *Controller) Close() error {
	for _, l := range c.locks {
		l.release()
	}
	c.locks = nil
	return nil
}
