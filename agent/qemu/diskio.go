package qemu

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/backup"
)

// Files in a VM's directory are QEMU's user's to replace (the directory
// is that user's), so every file the backup code makes or reads there is
// opened relative to a descriptor of the directory, never following a
// symbolic link, and must be a regular file.

// openVMDir opens dir itself (not a link to it).
func openVMDir(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", dir, err)
	}
	return fd, nil
}

// createVMFile makes dir/name anew (whatever was at name is unlinked
// first: a leftover of ours, or something planted), mode 0600, owned by u
// when given (QEMU opens it itself).
func createVMFile(dir, name string, u *qemuUser) (*os.File, error) {
	dfd, err := openVMDir(dir)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	if err := unix.Unlinkat(dfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("clear %s: %w", name, err)
	}
	fd, err := unix.Openat(dfd, name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", name, err)
	}
	if u != nil {
		if err := unix.Fchown(fd, u.uid, u.gid); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("give %s to %s: %w", name, u.name, err)
		}
	}
	return os.NewFile(uintptr(fd), filepath.Join(dir, name)), nil
}

// writeVMFile writes data to a new dir/name (createVMFile), synced.
func writeVMFile(dir, name string, data []byte, u *qemuUser) error {
	f, err := createVMFile(dir, name, u)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// readVMFile reads dir/name, a regular file of at most limit bytes.
func readVMFile(dir, name string, limit int64) ([]byte, error) {
	dfd, err := openVMDir(dir)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, os.ErrNotExist
		}
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", name)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && int64(len(b)) > limit {
		err = fmt.Errorf("%s is larger than %d bytes", name, limit)
	}
	return b, err
}

// removeVMFile unlinks dir/name (never following it); gone is fine.
func removeVMFile(dir, name string) error {
	dfd, err := openVMDir(dir)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := unix.Unlinkat(dfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	return nil
}

// openDisk opens a disk file to read: not a symbolic link, a regular
// file, and writable by no one but root (or this process's user), so its
// contents cannot change under the reader.
func openDisk(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open disk: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, err
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		err = fmt.Errorf("disk %s is not a regular file", path)
	case st.Uid != 0 && int(st.Uid) != os.Geteuid():
		err = fmt.Errorf("disk %s is owned by uid %d: only root's disks are read", path, st.Uid)
	case st.Mode&0o022 != 0:
		err = fmt.Errorf("disk %s is writable by others (mode %04o)", path, st.Mode&0o7777)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// hexName is an image cache entry's name.
var hexName = regexp.MustCompile(`^[0-9a-f]{64}$`)

// diskGeometry returns the virtual size of disk f in format, and for a
// qcow2 the backing file its header names ("" for none), which must be
// an image of the cache. Encryption and an external data file are
// refused.
func (p *Provisioner) diskGeometry(f *os.File, format string) (int64, string, error) {
	if format == formatRaw {
		fi, err := f.Stat()
		if err != nil {
			return 0, "", err
		}
		return fi.Size(), "", nil
	}
	head := make([]byte, 64<<10)
	n, err := f.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, "", err
	}
	head = head[:n]
	if len(head) < qcow2V2HeaderLen || string(head[:4]) != qcow2Magic {
		return 0, "", errors.New("not a qcow2 image")
	}
	be := binary.BigEndian
	size := int64(be.Uint64(head[24:]))
	if be.Uint32(head[32:]) != 0 {
		return 0, "", errors.New("encrypted qcow2")
	}
	if be.Uint32(head[4:]) >= 3 && len(head) >= 80 && be.Uint64(head[72:])&qcow2IncompatDataFile != 0 {
		return 0, "", errors.New("qcow2 with an external data file")
	}
	off, blen := be.Uint64(head[8:]), uint64(be.Uint32(head[16:]))
	if off == 0 {
		return size, "", nil
	}
	if blen > 1023 || off+blen > uint64(len(head)) {
		return 0, "", errors.New("qcow2 backing file name out of bounds")
	}
	backing := string(head[off : off+blen])
	if filepath.Dir(backing) != filepath.Clean(p.cfg.CacheDir) || !hexName.MatchString(filepath.Base(backing)) {
		return 0, "", fmt.Errorf("qcow2 backing file %q is not an image of the cache %s", backing, p.cfg.CacheDir)
	}
	return size, backing, nil
}

// diskPlace is where disk of m lives and in which format: "root" is the
// VM's qcow2, any other name one of m.Volumes (raw) by base name.
func diskPlace(st *vmState, m agent.Machine, disk string) (dir, name, format string, err error) {
	if disk == "root" {
		return st.dir, RootDiskFile, formatQCOW2, nil
	}
	for _, v := range m.Volumes {
		if filepath.Base(v) == disk {
			return filepath.Dir(v), disk, formatRaw, nil
		}
	}
	return "", "", "", fmt.Errorf("%w %q of vm %s", agent.ErrNoSuchDisk, disk, m.Name)
}

// ReadDisk implements agent.DiskSnapshotter.
func (p *Provisioner) ReadDisk(ctx context.Context, m agent.Machine, disk string) (agent.DiskStream, error) {
	st, err := p.machineState(m)
	if err != nil {
		return nil, err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.pid() != 0 {
		return nil, fmt.Errorf("read disk %s of %s: %w (take a snapshot of a running VM)", disk, m.Name, agent.ErrDiskInUse)
	}
	dir, name, format, err := diskPlace(st, m, disk)
	if err != nil {
		return nil, err
	}
	s, err := p.fileStream(ctx, filepath.Join(dir, name), format, disk)
	if err != nil {
		return nil, fmt.Errorf("read disk %s of %s: %w", disk, m.Name, err)
	}
	return s, nil
}

// ReadVolume implements agent.DiskSnapshotter.
func (p *Provisioner) ReadVolume(ctx context.Context, path string) (agent.DiskStream, error) {
	name := filepath.Base(path)
	if err := backup.CheckName("volume", name); err != nil {
		return nil, err
	}
	s, err := p.fileStream(ctx, path, formatRaw, name)
	if err != nil {
		return nil, fmt.Errorf("read volume %s: %w", path, err)
	}
	return s, nil
}

// Suffixes of the files a restore makes beside a disk.
const (
	restorePartial = ".restore-partial"
	keptSuffix     = ".before-restore-"
)

// RestoreDisk implements agent.DiskSnapshotter.
func (p *Provisioner) RestoreDisk(ctx context.Context, r agent.RestoreRequest, stream io.Reader) (agent.RestoredDisk, error) {
	st, err := p.machineState(r.Machine)
	if err != nil {
		return agent.RestoredDisk{}, err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	fail := func(err error) (agent.RestoredDisk, error) {
		return agent.RestoredDisk{}, fmt.Errorf("restore disk %s of %s: %w", r.Disk, r.Machine.Name, err)
	}
	if st.pid() != 0 {
		return fail(agent.ErrNotStopped)
	}
	if r.Size <= 0 || !hexName.MatchString(r.SHA256) {
		return fail(fmt.Errorf("size %d and sha256 %q: want the backup's record of the disk", r.Size, r.SHA256))
	}
	dir, name, format, err := diskPlace(st, r.Machine, r.Disk)
	if err != nil {
		return fail(err)
	}
	exists, err := diskExists(ctx, p.cfg.QEMUImg, dir, name, format)
	if err != nil {
		return fail(err)
	}
	if exists && !r.Replace {
		return fail(agent.ErrDiskExists)
	}
	partial, err := p.writeRestored(ctx, dir, name+restorePartial, format, r, stream)
	if err != nil {
		removeVMFile(dir, name+restorePartial)
		return fail(err)
	}
	defer partial.Close()
	out := agent.RestoredDisk{Path: filepath.Join(dir, name)}
	if exists {
		out.KeptOld = filepath.Join(dir, name+keptSuffix+strconv.FormatInt(time.Now().Unix(), 10))
	}
	if err := placeRestored(dir, name, partial, out.KeptOld); err != nil {
		removeVMFile(dir, name+restorePartial)
		return fail(err)
	}
	p.log.WithField("vm", r.Machine.Name).WithField("disk", r.Disk).WithField("kept", out.KeptOld).Info("disk restored")
	return out, nil
}

// diskExists reports whether dir/name exists; when it does it must be a
// regular file that no running QEMU holds (qemu-img info takes QEMU's
// image lock: a held disk is refused with agent.ErrDiskInUse).
func diskExists(ctx context.Context, qemuImg, dir, name, format string) (bool, error) {
	f, err := openDisk(filepath.Join(dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return true, err
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, qemuImg, "info", "-f", format, "/dev/fd/3")
	cmd.ExtraFiles = []*os.File{f}
	if out, err := cmd.CombinedOutput(); err != nil {
		if bytes.Contains(out, []byte("lock")) {
			return true, fmt.Errorf("%w: %s", agent.ErrDiskInUse, trimTail(out, 512))
		}
		return true, fmt.Errorf("qemu-img info: %v: %s", err, trimTail(out, 512))
	}
	return true, nil
}

// writeRestored writes stream into dir/partial in format, sparse, and
// checks its size and sha256 against r. A qcow2 is written as a sparse raw
// file first and converted (qemu-img convert skips its holes), through
// descriptors: qemu-img never opens a name in dir.
func (p *Provisioner) writeRestored(ctx context.Context, dir, partial, format string, r agent.RestoreRequest, stream io.Reader) (*os.File, error) {
	if format == formatRaw {
		f, err := createVMFile(dir, partial, nil)
		if err != nil {
			return nil, err
		}
		if err := writeSparse(f, stream, r.Size, r.SHA256); err != nil {
			f.Close()
			return nil, err
		}
		return f, nil
	}
	raw, err := createVMFile(dir, partial+".raw", nil)
	if err != nil {
		return nil, err
	}
	defer removeVMFile(dir, partial+".raw")
	defer raw.Close()
	if err := writeSparse(raw, stream, r.Size, r.SHA256); err != nil {
		return nil, err
	}
	f, err := createVMFile(dir, partial, nil)
	if err != nil {
		return nil, err
	}
	for _, args := range [][]string{
		{"create", "-q", "-f", formatQCOW2, "/dev/fd/3", strconv.FormatInt(r.Size, 10)},
		{"convert", "-n", "-f", formatRaw, "-O", formatQCOW2, "/dev/fd/4", "/dev/fd/3"},
	} {
		cmd := exec.CommandContext(ctx, p.cfg.QEMUImg, args...)
		cmd.ExtraFiles = []*os.File{f, raw}
		if out, err := cmd.CombinedOutput(); err != nil {
			f.Close()
			return nil, fmt.Errorf("qemu-img %s: %v: %s", args[0], err, trimTail(out, 512))
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// sparseBlock is the unit writeSparse skips when it is all zeroes.
const sparseBlock = 64 << 10

// writeSparse copies stream to f, seeking over blocks of zeroes (f stays
// sparse there), then sets f's size to size and syncs it. The stream must
// be exactly size bytes with the given sha256, or agent.ErrRestoreMismatch.
func writeSparse(f *os.File, stream io.Reader, size int64, sum string) error {
	h := sha256.New()
	buf := make([]byte, sparseBlock)
	zero := make([]byte, sparseBlock)
	var n int64
	for {
		k, err := io.ReadFull(stream, buf)
		if k > 0 {
			if n+int64(k) > size {
				return fmt.Errorf("%w: stream longer than %d bytes", agent.ErrRestoreMismatch, size)
			}
			h.Write(buf[:k])
			if !bytes.Equal(buf[:k], zero[:k]) {
				if _, werr := f.WriteAt(buf[:k], n); werr != nil {
					return werr
				}
			}
			n += int64(k)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read the restore stream: %w", err)
		}
	}
	if got := hex.EncodeToString(h.Sum(nil)); n != size || got != sum {
		return fmt.Errorf("%w: %d bytes with sha256 %s, want %d with %s", agent.ErrRestoreMismatch, n, got, size, sum)
	}
	if err := f.Truncate(size); err != nil {
		return err
	}
	return f.Sync()
}

// placeRestored moves dir/<name>.restore-partial (open as f) to
// dir/name: one rename over the old disk after a hard link keeps it as
// kept, or, with no old disk, a hard link that fails if a disk appeared
// meanwhile. It then checks the name holds f's inode.
func placeRestored(dir, name string, f *os.File, kept string) error {
	dfd, err := openVMDir(dir)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	partial := name + restorePartial
	if kept != "" {
		if err := unix.Linkat(dfd, name, dfd, filepath.Base(kept), 0); err != nil {
			return fmt.Errorf("keep the old disk: %w", err)
		}
		if err := unix.Renameat(dfd, partial, dfd, name); err != nil {
			return fmt.Errorf("move the restored disk into place: %w", err)
		}
	} else {
		if err := unix.Linkat(dfd, partial, dfd, name, 0); err != nil {
			return fmt.Errorf("move the restored disk into place: %w", err)
		}
		unix.Unlinkat(dfd, partial, 0)
	}
	var want, got unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &want); err != nil {
		return err
	}
	if err := unix.Fstatat(dfd, name, &got, unix.AT_SYMLINK_NOFOLLOW); err != nil || got.Ino != want.Ino || got.Dev != want.Dev {
		return fmt.Errorf("%s was replaced while it was moved into place", name)
	}
	return unix.Fsync(dfd)
}
