package qemu

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// A VM's directory is the agent's: owned by the agent's user (root on a
// host), mode 0700, never given to QEMU's user. QEMU opens every file it
// needs there (disks, seed, serial log, pidfile, its sockets) as root
// before it drops to Config.RunAs, and afterwards holds only those
// descriptors; its working directory is the VM's directory, which it then
// can no longer read or write. So nothing QEMU does after it dropped root
// can put a symbolic link, a FIFO or a hard link at a name the agent, or
// the next QEMU before it drops root, opens there. What QEMU can still
// change is the content of what it writes: the root disk (whose header
// checkRootDisk reads before any qemu-img or QEMU opens the disk) and its
// logs and channels (read with bounds, channel.go).

// claimDir makes the VM's directory dir the agent's again when it is not:
// an earlier version gave it to QEMU's user, who may have left anything at
// any name there. It is chowned back to the agent's user and made 0700, and
// what a compromised QEMU could have planted at the names the backend uses
// (anything but what the backend makes there: a regular file with one
// link, a socket, the seed's work directory) is removed, never followed;
// the root disk is left for checkRootDisk to refuse, since it holds the
// guest's data. It returns the names it removed. A missing directory is no
// error.
func claimDir(dir string) (removed []string, err error) {
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("VM directory %s: %w: it is %s", dir, ErrUnsafeFile, fileKind(fi.Mode()))
	}
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Uid) == os.Geteuid() {
		if fi.Mode().Perm() != 0o700 {
			return nil, os.Chmod(dir, 0o700)
		}
		return nil, nil
	}
	if err := os.Lchown(dir, os.Geteuid(), os.Getegid()); err != nil {
		return nil, fmt.Errorf("take back VM directory %s from uid %d: %w", dir, st.Uid, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("take back VM directory %s: %w", dir, err)
	}
	return sweepPlants(dir)
}

// sockets are the names in a VM's directory where QEMU makes a socket.
var sockets = map[string]bool{QMPSocket: true, QMPEventsSocket: true, QGASocket: true, SerialSocket: true, NBDSocket: true}

// sweepPlants removes, of ownedFiles in dir but the root disk, each entry
// that is not what the backend makes at its name.
func sweepPlants(dir string) ([]string, error) {
	var removed []string
	var errs []error
	for _, name := range ownedFiles {
		path := filepath.Join(dir, name)
		fi, err := os.Lstat(path)
		if err != nil || name == RootDiskFile || expected(name, fi) {
			continue
		}
		if err := os.RemoveAll(path); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name+" ("+fileKind(fi.Mode())+")")
	}
	return removed, errors.Join(errs...)
}

// expected reports whether fi is what the backend makes at name.
func expected(name string, fi fs.FileInfo) bool {
	switch {
	case sockets[name]:
		return fi.Mode()&fs.ModeSocket != 0
	case name == SeedFile+".work", name == TPMDir, name == TPMDir+".partial":
		return fi.IsDir()
	}
	return checkRegular(name, fi) == nil
}

// rootDisk is what checkRootDisk read from a root disk's header.
type rootDisk struct {
	// backing is the sha256 name of the cached artifact the disk is an
	// overlay on, "" when it has no backing file.
	backing string
	// virtualSize is the disk's size as the guest sees it, in bytes.
	virtualSize int64
}

// checkRootDisk reads the header of the qcow2 root disk at path (a regular
// file, openRegular) in Go, before qemu-img or QEMU opens it: QEMU writes
// the disk, header included, so a compromised QEMU could make it name any
// file of the host as its backing file (which QEMU opens as root, read-only,
// and shows the guest) or external data file (opened read-write). A backing
// file must be a cached artifact, named <cacheDir>/<sha256> by a clean
// absolute path, in format qcow2 or raw; an external data file or
// encryption is refused. Refusals wrap ErrImageNotSelfContained, or
// ErrUnsafeFile for what is not a regular file.
func checkRootDisk(path, cacheDir string) (rootDisk, error) {
	f, err := openRegular(path, os.O_RDONLY, 0)
	if err != nil {
		return rootDisk{}, fmt.Errorf("root disk: %w", err)
	}
	defer f.Close()
	d, err := readRootDiskHeader(f, cacheDir)
	if err != nil {
		return rootDisk{}, fmt.Errorf("root disk %s: %w", path, err)
	}
	return d, nil
}

// readRootDiskHeader reads and checks, as checkRootDisk says, the qcow2
// header at the start of f.
func readRootDiskHeader(f *os.File, cacheDir string) (rootDisk, error) {
	head := make([]byte, 64<<10)
	n, err := f.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return rootDisk{}, err
	}
	if !bytes.HasPrefix(head[:n], []byte(qcow2Magic)) {
		return rootDisk{}, fmt.Errorf("%w: not a qcow2 image", ErrImageNotSelfContained)
	}
	h, err := parseQCOW2(head[:n])
	if err != nil {
		return rootDisk{}, err
	}
	d := rootDisk{virtualSize: h.virtualSize}
	if h.backing != "" {
		if d.backing, err = cachedBacking(h, cacheDir); err != nil {
			return rootDisk{}, err
		}
	}
	return d, nil
}

// cachedBacking returns the sha256 name of h's backing file, which must be
// a cached artifact in cacheDir.
func cachedBacking(h qcow2Header, cacheDir string) (string, error) {
	name := h.backing
	if !filepath.IsAbs(name) || filepath.Clean(name) != name || filepath.Dir(name) != filepath.Clean(cacheDir) || !sha256Hex.MatchString(filepath.Base(name)) {
		return "", fmt.Errorf("%w: its backing file %q is not an image in the cache %s", ErrImageNotSelfContained, name, cacheDir)
	}
	if h.backingFormat != "" && h.backingFormat != formatQCOW2 && h.backingFormat != formatRaw {
		return "", fmt.Errorf("%w: its backing file's format is %q: want qcow2 or raw", ErrImageNotSelfContained, h.backingFormat)
	}
	return filepath.Base(name), nil
}

// qcow2Header is what parseQCOW2 reads of a qcow2 header.
type qcow2Header struct {
	version uint32
	// backingOffset and backingSize locate the backing file's name;
	// backing is that name ("" when none).
	backingOffset uint64
	backingSize   uint32
	backing       string
	// backingFormat is the backing-format extension's value, "" without
	// one; hasBackingFormat tells an empty one from none.
	backingFormat    string
	hasBackingFormat bool
	virtualSize      int64
}

// parseQCOW2 reads the qcow2 header h (the file's first bytes; QEMU's
// docs/interop/qcow2.txt) and refuses, wrapping ErrImageNotSelfContained,
// what no image of ours has: a version other than 2 or 3, encryption, an
// external data file (the incompatible feature bit or the header
// extension), a backing file name or extensions past h.
func parseQCOW2(h []byte) (qcow2Header, error) {
	var q qcow2Header
	if len(h) < qcow2V2HeaderLen {
		return q, fmt.Errorf("%w: qcow2 header truncated", ErrImageNotSelfContained)
	}
	be := binary.BigEndian
	q.version = be.Uint32(h[4:])
	if q.version != 2 && q.version != 3 {
		return q, fmt.Errorf("%w: qcow2 version %d: want 2 or 3", ErrImageNotSelfContained, q.version)
	}
	q.backingOffset, q.backingSize = be.Uint64(h[8:]), be.Uint32(h[16:])
	q.virtualSize = int64(be.Uint64(h[24:]))
	if crypt := be.Uint32(h[32:]); crypt != 0 {
		return q, fmt.Errorf("%w: qcow2 crypt_method is %d: encrypted images are not supported", ErrImageNotSelfContained, crypt)
	}
	if q.backingOffset != 0 || q.backingSize != 0 {
		end := q.backingOffset + uint64(q.backingSize)
		if q.backingOffset == 0 || q.backingSize == 0 || q.backingSize > 1023 || end > uint64(len(h)) {
			return q, fmt.Errorf("%w: qcow2 backing file name at %d, %d bytes: out of the header", ErrImageNotSelfContained, q.backingOffset, q.backingSize)
		}
		q.backing = string(h[q.backingOffset:end])
	}
	headerLen := uint32(qcow2V2HeaderLen)
	if q.version == 3 {
		if len(h) < 104 {
			return q, fmt.Errorf("%w: qcow2 v3 header truncated", ErrImageNotSelfContained)
		}
		if incompat := be.Uint64(h[72:]); incompat&qcow2IncompatDataFile != 0 {
			return q, fmt.Errorf("%w: qcow2 incompatible feature data-file is set: the image keeps its data in an external data file", ErrImageNotSelfContained)
		}
		headerLen = be.Uint32(h[100:])
	}
	return q, parseExtensions(h, int(headerLen), &q)
}

// parseExtensions reads the header extensions of h from off (type,
// length, data padded to 8 bytes, until the end marker) into q.
func parseExtensions(h []byte, off int, q *qcow2Header) error {
	be := binary.BigEndian
	for {
		if off < 0 || off+8 > len(h) {
			return fmt.Errorf("%w: qcow2 header extensions run past the first %d bytes", ErrImageNotSelfContained, len(h))
		}
		typ, length := be.Uint32(h[off:]), int(be.Uint32(h[off+4:]))
		if off+8+length > len(h) {
			return fmt.Errorf("%w: qcow2 header extension %#x runs past the first %d bytes", ErrImageNotSelfContained, typ, len(h))
		}
		switch typ {
		case qcow2ExtEnd:
			return nil
		case qcow2ExtDataFile:
			return fmt.Errorf("%w: qcow2 header extension data-file names an external data file", ErrImageNotSelfContained)
		case qcow2ExtBackingFormat:
			q.backingFormat, q.hasBackingFormat = strings.TrimRight(string(h[off+8:off+8+length]), "\x00"), true
		}
		off += 8 + (length+7)&^7
	}
}
