package adopt

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
)

// Sentinel errors callers test with errors.Is.
var (
	// ErrRunning: the original VM runs (libvirt says so, or another
	// process, such as the QEMU running it, holds a lock on its disk).
	ErrRunning = errors.New("the VM to import is running")
	// ErrUnsupportedDisk: the disk is not one the agent adopts (not a
	// regular file, not qcow2, a backing file, an external data file,
	// encryption).
	ErrUnsupportedDisk = errors.New("disk cannot be adopted")
	// ErrAlreadyStaged: a disk is staged for a VM of that name already.
	ErrAlreadyStaged = errors.New("a disk is already staged for this VM")
)

// qcow2Magic starts every qcow2 file.
const qcow2Magic = "QFI\xfb"

// inspectTimeout bounds one qemu-img info.
const inspectTimeout = 30 * time.Second

// Inspect refuses a plan whose original runs, and reads its disk: a
// regular file (not a symlink), qcow2 by its magic, not locked by another
// process (Locked), and self-contained by qemu-img info (no backing file,
// no external data file, not encrypted). It sets Spec.DiskGB from the
// disk's virtual size, rounded down (gitfleet never shrinks a disk, so the
// disk is left at its size; below 1 GiB it is 1, and the agent grows the
// disk to 1 GiB when it adopts it, which the report says). It writes
// nothing.
func Inspect(ctx context.Context, p *Plan, qemuImg string) error {
	if p.Running != "" {
		return fmt.Errorf("%w: %s", ErrRunning, p.Running)
	}
	if p.Disk == "" {
		return fmt.Errorf("%w: no root disk to adopt", ErrUnsupportedDisk)
	}
	if err := checkQCOW2File(p.Disk); err != nil {
		return err
	}
	if err := Locked(p.Disk); err != nil {
		return err
	}
	info, err := qemuImgInfo(ctx, qemuImg, p.Disk)
	if err != nil {
		return err
	}
	gb := info.VirtualSize >> 30
	note := ""
	switch {
	case gb < 1:
		gb = 1
		note = fmt.Sprintf("the disk is %d bytes; gitfleet's smallest disk is 1 GiB: the agent grows it to 1 GiB when it adopts it", info.VirtualSize)
	case info.VirtualSize%(1<<30) != 0:
		note = fmt.Sprintf("the disk is %d bytes, kept as it is (a disk never shrinks; a larger diskGB grows it)", info.VirtualSize)
	}
	p.Spec.DiskGB = int(gb)
	p.addPath(Mapped, "root disk's virtual size", p.Disk, "spec.diskGB", "%s", note)
	for i := range p.Volumes {
		if err := inspectVolume(p, &p.Volumes[i]); err != nil {
			return err
		}
	}
	return nil
}

// inspectVolume checks a raw disk to adopt as a Volume (a regular file,
// not locked by another process) and sets its SizeGB from its size,
// rounded down, at least 1: a present volume is never resized, so the
// file stays as it is.
func inspectVolume(p *Plan, v *VolumePlan) error {
	fi, err := os.Lstat(v.Disk)
	if err != nil {
		return fmt.Errorf("volume %s: %w", v.Name, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: %s (volume %s) is not a regular file (%s)", ErrUnsupportedDisk, v.Disk, v.Name, fi.Mode().Type())
	}
	if err := Locked(v.Disk); err != nil {
		return err
	}
	v.SizeGB = max(1, int(fi.Size()>>30))
	note := ""
	if fi.Size()%(1<<30) != 0 {
		note = fmt.Sprintf("the file is %d bytes, kept as it is (a present volume is never resized)", fi.Size())
	}
	p.addPath(Mapped, "volume "+v.Name+"'s size", v.Disk, "sizeGB", "%s", note)
	return nil
}

// checkQCOW2File checks path is a regular file that starts as qcow2
// does, read in Go before qemu-img opens it.
func checkQCOW2File(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: %s is not a regular file (%s)", ErrUnsupportedDisk, path, fi.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	defer f.Close()
	head := make([]byte, len(qcow2Magic))
	if _, err := io.ReadFull(f, head); err != nil || string(head) != qcow2Magic {
		return fmt.Errorf("%w: %s is not a qcow2 image: the agent runs qcow2 root disks; convert it first (qemu-img convert -O qcow2 %s NEW.qcow2, a copy)", ErrUnsupportedDisk, path, path)
	}
	return nil
}

// Locked returns ErrRunning when another process holds a lock on any
// byte of path. QEMU takes open file description locks on the images it
// has open (bytes 100 and up for the permissions it uses, 200 and up for
// those it shares), and libvirt's virtlockd takes fcntl locks: a probe
// with F_OFD_GETLK for a write lock over the whole file sees either, and
// takes none itself.
func Locked(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("lock probe: %w", err)
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: 0, Len: 0}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return fmt.Errorf("lock probe %s: %w", path, err)
	}
	if lk.Type != unix.F_UNLCK {
		who := "another process"
		if lk.Pid > 0 {
			who = fmt.Sprintf("process %d", lk.Pid)
		}
		return fmt.Errorf("%w: %s holds a lock on %s (bytes from %d): a QEMU runs the disk; shut the VM down first", ErrRunning, who, path, lk.Start)
	}
	return nil
}

// imageInfo is what qemu-img info --output=json says of an image.
type imageInfo struct {
	Format          string `json:"format"`
	VirtualSize     int64  `json:"virtual-size"`
	BackingFilename string `json:"backing-filename"`
	Encrypted       bool   `json:"encrypted"`
	FormatSpecific  struct {
		Data struct {
			DataFile string `json:"data-file"`
		} `json:"data"`
	} `json:"format-specific"`
}

// qemuImgInfo runs qemu-img info on a qcow2 file with its format given
// (nothing is probed) and --force-share (it takes no lock, so it neither
// fails on nor disturbs a disk another QEMU holds), and refuses an image
// that is not self-contained.
func qemuImgInfo(ctx context.Context, qemuImg, path string) (imageInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, qemuImg, "info", "--force-share", "-f", "qcow2", "--output=json", path)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return imageInfo{}, fmt.Errorf("qemu-img info %s: %v: %s", path, err, bytes.TrimSpace(stderr.Bytes()))
	}
	var info imageInfo
	if err := json.Unmarshal(out, &info); err != nil {
		return imageInfo{}, fmt.Errorf("qemu-img info %s: %w", path, err)
	}
	switch {
	case info.BackingFilename != "":
		return info, fmt.Errorf("%w: %s has the backing file %s: make it self-contained first (qemu-img convert -O qcow2, a copy)", ErrUnsupportedDisk, path, info.BackingFilename)
	case info.FormatSpecific.Data.DataFile != "":
		return info, fmt.Errorf("%w: %s keeps its data in %s", ErrUnsupportedDisk, path, info.FormatSpecific.Data.DataFile)
	case info.Encrypted:
		return info, fmt.Errorf("%w: %s is encrypted", ErrUnsupportedDisk, path)
	case info.VirtualSize <= 0:
		return info, fmt.Errorf("%w: qemu-img gives %s no size", ErrUnsupportedDisk, path)
	}
	return info, nil
}

// How Stage moved a disk.
const (
	// MethodRename: the state directory is on the disk's filesystem; the
	// disk's inode moved, and no byte of it was read or written.
	MethodRename = "rename"
	// MethodReflink: another filesystem that shares extents (btrfs, XFS):
	// a clone that copies no data; the original stays where it was.
	MethodReflink = "reflink"
	// MethodCopy: another filesystem: a full copy, checked by sha256
	// against the original, which stays where it was.
	MethodCopy = "copy"
	// MethodAlready: an earlier Stage put the disk there (UseStaged);
	// nothing moved, and Unstage leaves it.
	MethodAlready = "already"
)

// UseStaged points p at the disks an earlier Stage renamed into
// stateDir: for the root disk and each volume whose original path does
// not exist while a file is at its staged place, the plan's path becomes
// the staged one, so Inspect reads the staged disk and StagePlan leaves
// it (MethodAlready). It returns the staged paths it took, and fails
// only when the state directory's paths cannot be formed or looked at.
func (p *Plan) UseStaged(stateDir string) ([]string, error) {
	var took []string
	use := func(disk *string, dst string, err error) error {
		if err != nil {
			return err
		}
		if _, err := os.Lstat(*disk); !errors.Is(err, fs.ErrNotExist) {
			return nil // the original is there (or cannot be looked at: Inspect says why)
		}
		if _, err := os.Lstat(dst); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return fmt.Errorf("staged disk: %w", err)
		}
		*disk = dst
		took = append(took, dst)
		return nil
	}
	dst, err := agent.AdoptedDiskIn(stateDir, p.Name)
	if err := use(&p.Disk, dst, err); err != nil {
		return nil, err
	}
	for i := range p.Volumes {
		dst, err := agent.VolumePathIn(stateDir, p.Volumes[i].Name)
		if err := use(&p.Volumes[i].Disk, dst, err); err != nil {
			return nil, err
		}
	}
	return took, nil
}

// Staged is a disk Stage put in the state directory.
type Staged struct {
	Path, Original, Method string
}

// copyHook, when set by a test, runs after each chunk a copy writes and
// fails it by returning an error.
var copyHook func(written int64) error

// Stage puts the disk at original where the agent of stateDir takes it
// for VM name (agent.AdoptedDiskIn): by a rename when both are on one
// filesystem, else by a reflink clone or, where the filesystem has none,
// a copy checked against the original by sha256. A clone or copy is
// written beside its place and renamed there only when whole, and the
// original stays; a failure removes what it wrote. The original's bytes
// are never written. After staging, the staged disk is probed for locks
// once more (a QEMU that opened the original in between): then it is put
// back (Unstage) and ErrRunning returned.
func Stage(original, stateDir, name string) (Staged, error) {
	dst, err := agent.AdoptedDiskIn(stateDir, name)
	if err != nil {
		return Staged{}, err
	}
	return stageAt(original, dst)
}

// StageVolume is Stage for a disk adopted as the Volume called name: it
// goes to the agent's volumes directory (agent.VolumePathIn), where the
// agent takes a present file as the volume and never resizes, replaces
// or deletes it but for the Volume's own delete. Until the Volume object
// is merged the agent lists it as an orphan.
func StageVolume(original, stateDir, name string) (Staged, error) {
	dst, err := agent.VolumePathIn(stateDir, name)
	if err != nil {
		return Staged{}, err
	}
	return stageAt(original, dst)
}

// StagePlan stages p's root disk (Stage) and each of its volumes
// (StageVolume), in that order. When one fails, those staged before it
// are put back (Unstage), so nothing is left half-staged; the error says
// when a disk could not be put back.
func StagePlan(p *Plan, stateDir string) ([]Staged, error) {
	s, err := Stage(p.Disk, stateDir, p.Name)
	if err != nil {
		return nil, err
	}
	done := []Staged{s}
	for _, v := range p.Volumes {
		s, err := StageVolume(v.Disk, stateDir, v.Name)
		if err != nil {
			if uerr := UnstageAll(done); uerr != nil {
				return nil, fmt.Errorf("%w; putting the staged disks back failed: %v", err, uerr)
			}
			return nil, err
		}
		done = append(done, s)
	}
	return done, nil
}

// UnstageAll unstages staged in reverse order, each even when another
// failed, and returns the failures joined.
func UnstageAll(staged []Staged) error {
	var errs []error
	for i := len(staged) - 1; i >= 0; i-- {
		if err := staged[i].Unstage(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", staged[i].Original, err))
		}
	}
	return errors.Join(errs...)
}

// stageAt puts original at dst as Stage says.
func stageAt(original, dst string) (Staged, error) {
	if original == dst {
		return Staged{Path: dst, Original: original, Method: MethodAlready}, nil
	}
	if _, err := os.Lstat(dst); err == nil {
		return Staged{}, fmt.Errorf("%w: %s exists", ErrAlreadyStaged, dst)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return Staged{}, fmt.Errorf("stage: %w", err)
	}
	s := Staged{Path: dst, Original: original}
	var err error
	if sameFilesystem(original, filepath.Dir(dst)) {
		s.Method = MethodRename
		if err := renameNoReplace(original, dst); err != nil {
			return Staged{}, fmt.Errorf("stage %s: %w", original, err)
		}
	} else if s.Method, err = cloneOrCopy(original, dst); err != nil {
		return Staged{}, err
	}
	if err := Locked(dst); err != nil {
		if uerr := s.Unstage(); uerr != nil {
			return Staged{}, fmt.Errorf("%w; putting the disk back failed: %v", err, uerr)
		}
		return Staged{}, err
	}
	return s, nil
}

// Unstage undoes Stage: a renamed disk is renamed back to its original
// path; a clone or copy is removed (the original never left).
func (s Staged) Unstage() error {
	if s.Method == MethodAlready {
		return nil // staged before this run: it stays
	}
	if s.Method == MethodRename {
		if err := renameNoReplace(s.Path, s.Original); err != nil {
			return fmt.Errorf("unstage: %w", err)
		}
	} else if err := os.Remove(s.Path); err != nil {
		return fmt.Errorf("unstage: %w", err)
	}
	if filepath.Base(filepath.Dir(filepath.Dir(s.Path))) == "adopt" {
		os.Remove(filepath.Dir(s.Path)) // adopt/<vm>, empty again
	}
	return nil
}

// sameFilesystem reports whether a and dir are on one filesystem (one
// st_dev), where a rename moves a file without copying it.
func sameFilesystem(a, dir string) bool {
	var sa, sd syscall.Stat_t
	if syscall.Stat(a, &sa) != nil || syscall.Stat(dir, &sd) != nil {
		return false
	}
	return sa.Dev == sd.Dev
}

// cloneOrCopy writes original's bytes to dst through dst.partial: a
// reflink (FICLONE) where the filesystems share extents, else a copy
// checked by sha256.
func cloneOrCopy(original, dst string) (method string, err error) {
	partial := dst + ".partial"
	src, err := os.Open(original)
	if err != nil {
		return "", fmt.Errorf("stage: %w", err)
	}
	defer src.Close()
	out, err := os.OpenFile(partial, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("stage: %w", err)
	}
	defer func() {
		if err != nil {
			out.Close()
			os.Remove(partial)
		}
	}()
	method = MethodReflink
	if unix.IoctlFileClone(int(out.Fd()), int(src.Fd())) != nil {
		method = MethodCopy
		if err = copyChecked(out, src); err != nil {
			return "", fmt.Errorf("stage: copy %s: %w", original, err)
		}
	}
	if err = out.Sync(); err != nil {
		return "", fmt.Errorf("stage: %w", err)
	}
	if err = out.Close(); err != nil {
		return "", fmt.Errorf("stage: %w", err)
	}
	if err = renameNoReplace(partial, dst); err != nil {
		return "", fmt.Errorf("stage: %w", err)
	}
	return method, nil
}

// renameNoReplace renames from to to, failing (EEXIST) rather than
// replacing a file that appeared at to meanwhile (renameat2
// RENAME_NOREPLACE): staging never removes anything.
func renameNoReplace(from, to string) error {
	if err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE); err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	return nil
}

// copyChecked copies src to out and compares the sha256 of what it read
// with that of out read back.
func copyChecked(out, src *os.File) error {
	want := sha256.New()
	buf := make([]byte, 1<<20)
	var written int64
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			want.Write(buf[:n])
			if _, err := out.Write(buf[:n]); err != nil {
				return err
			}
			written += int64(n)
			if copyHook != nil {
				if err := copyHook(written); err != nil {
					return err
				}
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	got := sha256.New()
	if _, err := io.Copy(got, io.NewSectionReader(out, 0, written)); err != nil {
		return err
	}
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		return errors.New("the copy does not read back as the original")
	}
	return nil
}

// FromDisk is a Plan for a disk with no description beside it (a plain
// QEMU script's): the sizes, MAC and network are given, and the report
// says only what each maps to.
func FromDisk(disk string, vcpus, memoryMB int, mac string, opts Options) (*Plan, error) {
	if opts.Name == "" {
		return nil, fmt.Errorf("%w: a disk alone needs the VM's name", ErrInvalidSource)
	}
	abs, err := filepath.Abs(disk)
	if err != nil {
		return nil, err
	}
	p := &Plan{Name: opts.Name, Disk: abs}
	p.Spec = desired.VMSpec{Host: opts.Host, VCPUs: vcpus, MemoryMB: memoryMB, Network: opts.Network,
		MAC: mac, RootDisk: &desired.RootDisk{Adopt: true}}
	p.add(Mapped, "--name "+opts.Name, "metadata.name", "")
	p.add(Mapped, fmt.Sprintf("--cpus %d", vcpus), "spec.vcpus", "")
	p.add(Mapped, fmt.Sprintf("--memory %d", memoryMB), "spec.memoryMB", "MiB")
	p.addPath(Mapped, "--disk", abs, "spec.rootDisk.adopt", "staged by gitfleet import --stage into the agent's state directory; no host path is written")
	if mac != "" {
		p.add(Mapped, "--mac "+mac, "spec.mac", "")
	} else {
		p.add(Dropped, "no --mac", "spec.mac", "the NIC gets a MAC derived from the VM's name: give the guest's old MAC with --mac to keep its network identity")
	}
	if opts.Network != "" {
		p.add(Mapped, "--network "+opts.Network, "spec.network", "")
	}
	return p, nil
}
