// Package secretfile reads a file that holds a private key, refusing it the
// way ssh refuses an identity file others could have read or replaced.
package secretfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// Read returns the contents of the private key file at path, at most limit
// bytes. what names the key in errors ("signing key", "age identity") and
// exposure says what a reader of the file could do with it ("others can
// read the private key"). The file must be a regular file, not a symbolic
// link (it is opened with O_NOFOLLOW) and not a FIFO or device (opened
// with O_NONBLOCK, so such a file is refused instead of waited on), that
// only its owner may read or write (mode 0600 or 0400), owned by root or
// by this process's user. A
// file longer than limit is refused as not a key file. Errors name the
// file and never quote its contents.
func Read(path, what, exposure string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("%s %s is a symbolic link: name the file itself", what, path)
		}
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s %s is not a regular file", what, path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%s %s has mode %04o: %s; chmod 600 %s", what, path, perm, exposure, path)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != os.Getuid() {
		return nil, fmt.Errorf("%s %s is owned by uid %d, neither root nor this process's user (%d)", what, path, st.Uid, os.Getuid())
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s %s is larger than %d bytes: not a key file", what, path, limit)
	}
	return data, nil
}
