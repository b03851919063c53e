package agent

import (
	"context"
	"errors"
	"io"
	"time"
)

// DiskSnapshotter is implemented by a Provisioner that can read and write
// its VMs' disks for backups, restores and host moves (package
// agent/backup stores the streams in restic). Optional; agent/qemu
// implements it.
//
// A backup of a running VM is: SnapshotDisks (every disk at one instant,
// inside a guest-agent freeze when asked), then OpenSnapshotDisk for each
// disk in turn, then ReleaseSnapshot — on every path, failures included.
// A stopped VM (or a free volume) is read with ReadDisk (ReadVolume)
// instead. A restore writes with RestoreDisk while the VM is stopped.
//
// Concurrency: calls for different VMs may run at once. One VM has at
// most one snapshot at a time, and one open stream per disk; a second
// SnapshotDisks while one is held is ErrSnapshotBusy. SnapshotDisks,
// ReleaseSnapshot and RestoreDisk are serialized with the VM's Boot,
// Shutdown and Destroy; an open stream is not, and a VM that stops while
// a stream is read makes the stream fail (a backup made of it never
// counts).
//
// Recovery: a killed agent can leave a guest frozen or paused and the
// snapshot's pieces (block nodes, export, files) behind. SweepSnapshots
// thaws and resumes the guest and removes every piece; the backend runs it
// by itself before a VM's first snapshot and from Preflight, and it is
// idempotent.
type DiskSnapshotter interface {
	// SnapshotDisks takes a point-in-time view of every writable disk of
	// the running VM name (the root disk and its volumes) at one instant,
	// and returns what it holds. The guest keeps running throughout, but
	// for at most opts.FrozenMax frozen (with opts.Freeze and a guest
	// agent that answers) and a pause of a few milliseconds. It refuses
	// with ErrNoFleeceSpace when the view could need more space than the
	// VM's directory has free (up to the disks' virtual size), and never
	// lets the guest's own writes fail because of the view. Errors:
	// ErrNotRunning, ErrSnapshotBusy, ErrNoFleeceSpace, or transient ones
	// (QMP); on error nothing is left held and the guest is thawed.
	SnapshotDisks(ctx context.Context, name string, opts SnapshotOptions) (DiskSnapshot, error)
	// OpenSnapshotDisk streams one disk of the held snapshot as raw
	// bytes. It may be called again for the same disk (a retry) once the
	// previous stream is closed.
	OpenSnapshotDisk(ctx context.Context, name, disk string) (DiskStream, error)
	// ReleaseSnapshot gives back everything the snapshot holds (streams,
	// export, block nodes, files). Releasing a VM without a snapshot is a
	// no-op; it is bounded in time by itself, so it can run from a
	// deferred call with a fresh context.
	ReleaseSnapshot(ctx context.Context, name string) error
	// ReadDisk streams disk ("root" or the name of one of m.Volumes, the
	// volume file's base name) of the VM m, which must not be running: a
	// disk another process holds open for writing (a QEMU) is refused with
	// ErrDiskInUse.
	ReadDisk(ctx context.Context, m Machine, disk string) (DiskStream, error)
	// ReadVolume streams the volume file at path, which no running VM may
	// have attached (ErrDiskInUse).
	ReadVolume(ctx context.Context, path string) (DiskStream, error)
	// RestoreDisk writes stream (a raw disk, as a DiskStream gave it) as
	// disk r.Disk of the stopped VM r.Machine: into a new sparse file
	// beside the disk's place, checked against r.Size and r.SHA256, then
	// moved into place in one rename. A disk already there is
	// ErrDiskExists unless r.Replace, which keeps it beside the new one
	// as <file>.before-restore-<unix seconds>. Errors: ErrDiskExists,
	// ErrDiskInUse, ErrNotStopped, ErrRestoreMismatch (the stream's size
	// or sha256 was not the one asked for: nothing is moved into place).
	RestoreDisk(ctx context.Context, r RestoreRequest, stream io.Reader) (RestoredDisk, error)
	// SweepSnapshots thaws and resumes the guest of VM name and removes
	// what a snapshot of it left behind (see Recovery above).
	SweepSnapshots(ctx context.Context, name string) error
}

// Errors a DiskSnapshotter returns, for errors.Is.
var (
	ErrNotRunning      = errors.New("vm is not running")
	ErrNotStopped      = errors.New("vm is running: stop it first")
	ErrSnapshotBusy    = errors.New("vm already has a disk snapshot held")
	ErrNoFleeceSpace   = errors.New("not enough free space for a point-in-time view of the disks")
	ErrDiskInUse       = errors.New("disk is held by a running QEMU")
	ErrDiskExists      = errors.New("disk exists: restore with replace to keep it aside and replace it")
	ErrRestoreMismatch = errors.New("restored stream does not match its backup")
	ErrNoSuchDisk      = errors.New("no such disk")
)

// SnapshotOptions ask SnapshotDisks for a consistency. Freeze asks the
// guest's qemu-guest-agent to freeze its filesystems around the instant
// (guest-fsfreeze-freeze, then -thaw); without it, or without an agent
// that answers within FreezeTimeout (default 10 s), the view is
// crash-consistent. FrozenMax (default 5 s) is the hard bound on how long
// the guest stays frozen: it is thawed then whatever else happens, and a
// view not taken by then is crash-consistent. WhileFrozen, when not nil,
// runs while the guest is frozen, right before the instant, within the
// FrozenMax bound (a test's probe of application consistency); its error
// fails the snapshot.
type SnapshotOptions struct {
	Freeze        bool
	FreezeTimeout time.Duration
	FrozenMax     time.Duration
	WhileFrozen   func(ctx context.Context) error
}

// DiskSnapshot is a point-in-time view SnapshotDisks holds. Consistency
// is backup.ConsistencyApplication when the guest agent froze at least
// one filesystem for the instant, else backup.ConsistencyCrash, with
// Reason saying why when a freeze was asked. At is the instant, Frozen
// how long the guest was frozen (0 without a freeze) and Filesystems how
// many filesystems the guest agent froze. Disks are in the VM's order
// (root first).
type DiskSnapshot struct {
	Consistency string
	Reason      string
	At          time.Time
	Frozen      time.Duration
	Filesystems int
	Disks       []DiskInfo
}

// DiskInfo names one disk of a VM: "root" or a volume's name, and its
// virtual size in bytes (what the guest sees).
type DiskInfo struct {
	Name        string
	VirtualSize int64
}

// DiskStream is one disk as a raw byte stream of exactly Size bytes (the
// virtual size). Read returns io.EOF only after all Size bytes came and
// the reader behind it exited cleanly: a stream cut short, or whose
// reader failed, returns an error instead, so a consumer that stores
// until io.EOF never stores a partial disk. SHA256 is the lowercase hex
// sha256 of the bytes read, complete once Read returned io.EOF. Close
// stops the reader and must be called.
type DiskStream interface {
	io.ReadCloser
	Size() int64
	SHA256() string
}

// RestoreRequest is one disk to restore: Disk ("root" or a volume name
// among Machine.Volumes' base names) of Machine, whose stream must be
// Size bytes with sha256 SHA256 (lowercase hex) — a backup manifest's
// record of it. Replace allows replacing a disk that exists (it is kept
// aside).
type RestoreRequest struct {
	Machine Machine
	Disk    string
	Size    int64
	SHA256  string
	Replace bool
}

// RestoredDisk says where a restore put the disk and, with Replace, where
// the disk it replaced was kept ("" when there was none).
type RestoredDisk struct {
	Path    string
	KeptOld string
}
