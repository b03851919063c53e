package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// The agent runs as root and opens files in each VM's directory, whose
// content a guest or QEMU writes (logs, the root disk) and which an
// earlier version gave to QEMU's user (who could put anything at any name
// there). Every such open goes through the helpers below: a symbolic
// link, a FIFO, a device, a directory or a second hard link where a
// regular file is expected is refused with ErrUnsafeFile before anything
// is read or written through it, and never followed; a file is never
// truncated or created by path over whatever is there (createRegular
// removes the name first). A socket is checked to be one, and connected
// to through the inode checked (dialSocket).

// ErrUnsafeFile is wrapped by an open of a file in a VM's directory that
// is not what the backend makes there: a symbolic link, a FIFO, a device,
// a directory or a file with more than one link where a regular file is
// expected, anything but a socket where a socket is.
var ErrUnsafeFile = errors.New("not a file the backend made")

// fileKind describes a file mode for an ErrUnsafeFile message.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m.IsDir():
		return "a directory"
	case m.IsRegular():
		return "a regular file"
	}
	return "a special file"
}

// checkRegular refuses fi unless it is a regular file with one link.
func checkRegular(path string, fi fs.FileInfo) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: %w: it is %s", path, ErrUnsafeFile, fileKind(fi.Mode()))
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink != 1 {
		return fmt.Errorf("%s: %w: it has %d links (a hard link to another file)", path, ErrUnsafeFile, st.Nlink)
	}
	return nil
}

// openRegular opens the regular file at path with flag (os.O_RDONLY,
// os.O_RDWR|os.O_CREATE, ...) and perm. What is at path is checked with
// lstat before it is opened (so a FIFO or a device is never opened), the
// open does not follow a symbolic link and does not block, and the file
// opened is checked again; anything but a regular file with one link is
// refused with ErrUnsafeFile. A missing file is fs.ErrNotExist unless flag
// creates it.
func openRegular(path string, flag int, perm os.FileMode) (*os.File, error) {
	before, err := os.Lstat(path)
	switch {
	case err == nil:
		if err := checkRegular(path, before); err != nil {
			return nil, err
		}
	case !errors.Is(err, fs.ErrNotExist) || flag&os.O_CREATE == 0:
		return nil, err
	}
	f, err := os.OpenFile(path, flag|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, perm)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("%s: %w: it is a symbolic link", path, ErrUnsafeFile)
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil {
		err = checkRegular(path, fi)
	}
	if err == nil && before != nil && !os.SameFile(before, fi) {
		err = fmt.Errorf("%s: %w: it was replaced while being opened", path, ErrUnsafeFile)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// readRegular reads the regular file at path (openRegular), which must
// hold at most max bytes.
func readRegular(path string, max int64) ([]byte, error) {
	f, err := openRegular(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, max)
	}
	return b, nil
}

// readTail reads at most the last n bytes of the regular file at path
// (openRegular), however large it is.
func readTail(path string, n int64) ([]byte, error) {
	f, err := openRegular(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	off := max(fi.Size()-n, 0)
	return io.ReadAll(io.NewSectionReader(f, off, n))
}

// createRegular makes a new, empty regular file at path (mode perm,
// opened write-only), removing whatever had that name first: a symbolic
// link or hard link planted there is removed, never written through.
func createRegular(path string, perm os.FileMode) (*os.File, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, perm)
}

// writeAtomic writes data to path through path+".partial"
// (createRegular) and a rename, so a reader sees the old content or the
// new, never a part, and nothing planted at either name is written
// through.
func writeAtomic(path string, data []byte, perm os.FileMode) error {
	tmp := path + ".partial"
	f, err := createRegular(tmp, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// maxSunPath is the usable length of a unix socket path on Linux: sun_path
// holds 108 bytes including the terminating NUL. dialSocket reaches longer
// paths too.
const maxSunPath = 107

// dialSocket connects to the unix socket at path within ctx. The socket
// is opened with O_PATH|O_NOFOLLOW and must be a socket with one link (a
// symbolic link planted at its name, to another VM's socket or a host
// service's, is refused); the connection goes through
// /proc/self/fd/N of that descriptor, so the inode checked is the one
// reached, and a path longer than sun_path allows works too.
func dialSocket(ctx context.Context, path string) (net.Conn, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return nil, fmt.Errorf("%s: %w: it is a symbolic link", path, ErrUnsafeFile)
	case st.Mode&unix.S_IFMT != unix.S_IFSOCK:
		return nil, fmt.Errorf("%s: %w: it is not a socket", path, ErrUnsafeFile)
	case st.Nlink != 1:
		return nil, fmt.Errorf("%s: %w: it has %d links", path, ErrUnsafeFile, st.Nlink)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) {
			err = oe.Err
		}
		return nil, fmt.Errorf("connect %s: %w", path, err)
	}
	return conn, nil
}
