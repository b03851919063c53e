package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
)

// DefaultStateDir is where the agent keeps its state unless configured
// otherwise.
const DefaultStateDir = "/var/lib/gitfleet"

// Sentinel errors callers test with errors.Is.
var (
	// ErrInvalidName: a VM or volume name is not an RFC 1123 DNS label. It is
	// never joined into a path.
	ErrInvalidName = errors.New("not a DNS label")
	// ErrHostMismatch: the state directory belongs to another host. A
	// mistyped host name would otherwise read that host's snapshot and
	// quarantine every VM of this one.
	ErrHostMismatch = errors.New("state directory belongs to another host")
	// ErrRecordUnreadable: a VM directory exists but its record cannot be
	// read or decoded. The VM is left alone until the record is readable
	// again; it is never created over.
	ErrRecordUnreadable = errors.New("vm record unreadable")
)

// Store layout under its root (every directory 0700, every file 0600):
//
//	vms/<name>/record.json   one Record per VM; the provisioner owns the rest of vms/<name>/
//	volumes/<name>           a volume file (sparse, raw)
//	volumes/<name>.partial   a volume being created; renamed into place when complete
//	volumes/<name>.tombstone when the volume's tombstone was first seen (RFC 3339), then "confirm <nonce>" once its grace has passed when deletes need confirmation
//	snapshot.json            the last accepted snapshot
//	epoch                    the highest snapshot epoch accepted (decimal)
//	accepted                 "<epoch> <sha256>": the hash of the snapshot accepted at that epoch
//	heartbeat                the last status heartbeat written (decimal)
//	signature-seen           "<commit> <RFC 3339>": the snapshots commit whose signature was last accepted, and when it was first seen
//	host                     the host this directory belongs to
const (
	vmsDirName      = "vms"
	adoptDirName    = "adopt"
	adoptedDiskName = "root.qcow2"
	volumesDirName  = "volumes"
	recordFile      = "record.json"
	snapshotFile    = "snapshot.json"
	epochFile       = "epoch"
	acceptedFile    = "accepted"
	heartbeatFile   = "heartbeat"
	seenFile        = "signature-seen"
	hostFile        = "host"
	partialSuffix   = ".partial"
	tombstoneSuffix = ".tombstone"
)

// Store is the agent's state on disk. Every write is atomic (temporary file,
// fsync, rename, fsync of the directory), so a crash leaves either the old or
// the new content, never a torn file. A Store is safe for concurrent use as
// long as no two goroutines write the same VM's record, which the engine
// guarantees by giving each VM one worker.
type Store struct {
	root string
	// removeHook, when set (by tests), runs before every removal of
	// RemoveVM and fails it by returning an error.
	removeHook func(path string) error
}

// OpenStore opens the state directory root, creating it (and its vms and
// volumes directories) with mode 0700 when missing, and tightening the mode
// of an existing root to 0700.
func OpenStore(root string) (*Store, error) {
	if root == "" {
		root = DefaultStateDir
	}
	for _, d := range []string{root, filepath.Join(root, vmsDirName), filepath.Join(root, volumesDirName)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("open state store: %w", err)
		}
	}
	if err := os.Chmod(root, 0o700); err != nil {
		return nil, fmt.Errorf("open state store: %w", err)
	}
	return &Store{root: root}, nil
}

// AdoptedDiskIn is where gitfleet import --stage puts the disk the VM
// called name adopts, under the state directory root:
// <root>/adopt/<name>/root.qcow2, on the filesystem of the VMs'
// directories, so that taking it into the VM's directory is a rename. It
// fails with ErrInvalidName when name is not a DNS label.
func AdoptedDiskIn(root, name string) (string, error) {
	if err := checkName("vm", name); err != nil {
		return "", err
	}
	return filepath.Join(root, adoptDirName, name, adoptedDiskName), nil
}

// VolumePathIn is the file of the volume called name under the state
// directory root, as Store.VolumePath gives it, for a writer that does not
// open the store (gitfleet import --stage). It fails with ErrInvalidName
// when name is not a DNS label.
func VolumePathIn(root, name string) (string, error) {
	if err := checkName("volume", name); err != nil {
		return "", err
	}
	return filepath.Join(root, volumesDirName, name), nil
}

// AdoptedDisk is AdoptedDiskIn of this store. The name must have passed
// validName.
func (s *Store) AdoptedDisk(name string) string {
	return filepath.Join(s.root, adoptDirName, name, adoptedDiskName)
}

// Root is the state directory.
func (s *Store) Root() string { return s.root }

// VMDirIn is the directory of VM name under the state directory root, as
// Store.VMDir gives it, for a reader that does not open the store (gitfleet
// console). It fails with ErrInvalidName when name is not a DNS label.
func VMDirIn(root, name string) (string, error) {
	if err := checkName("vm", name); err != nil {
		return "", err
	}
	return filepath.Join(root, vmsDirName, name), nil
}

// VMDir is the directory of the VM called name. The name must have passed
// validName.
func (s *Store) VMDir(name string) string { return filepath.Join(s.root, vmsDirName, name) }

// RecordPath is where the VM's record lives.
func (s *Store) RecordPath(name string) string { return filepath.Join(s.VMDir(name), recordFile) }

// VolumesDir holds every volume file of this host.
func (s *Store) VolumesDir() string { return filepath.Join(s.root, volumesDirName) }

// VolumePath is the file of the volume called name. The name must have
// passed validName.
func (s *Store) VolumePath(name string) string { return filepath.Join(s.VolumesDir(), name) }

// Record is what the agent remembers about one VM between passes and across
// restarts: the spec it last applied, how far its create got, and the
// quarantine marker. It holds the spec's cloud-init secrets, so it is written
// 0600 under a 0700 directory and never logged.
type Record struct {
	Name string `json:"name"`
	// InstanceID is random, fixed at first create; cloud-init keys its
	// first-boot work on it.
	InstanceID string `json:"instanceID"`
	// Spec and SpecHash are the spec last applied to the VM.
	Spec     desired.VMSpec `json:"spec"`
	SpecHash desired.Hash   `json:"specHash"`
	// RestoredFrom is the backup id the VM's disks were restored from
	// (spec.restore), set once every disk is in place: a retry of the
	// create does not restore again.
	RestoredFrom string `json:"restoredFrom,omitempty"`
	// RootImage is the sha256 of the image the root disk was made from.
	// A later image change leaves the disk as it is.
	RootImage string `json:"rootImage,omitempty"`
	// BootID is the host boot id when the create completed, and after every
	// boot since: the create's completion witness. Empty means the create
	// never finished and is run again (whatever files exist).
	BootID string `json:"bootID,omitempty"`
	// Attempts counts failed create attempts of SpecHash, or, while EditHash
	// is set, failed attempts to apply that edit; Failed is set when they
	// reach the budget or a permanent error occurs. A new SpecHash (or a
	// new edit) resets both.
	Attempts int  `json:"attempts"`
	Failed   bool `json:"failed,omitempty"`
	// EditHash is the SpecHash of an edit of a created VM that could not
	// be applied yet (an artifact that does not fetch or verify, a
	// shutdown that fails): the VM keeps running on Spec meanwhile. Empty
	// when no edit is pending.
	EditHash desired.Hash `json:"editHash,omitempty"`
	// Reserved is what the VM holds of the host's capacity once admitted;
	// nil before admission and after quarantine.
	Reserved *Reservation `json:"reserved,omitempty"`
	// DiskGB is the size the root disk was prepared at (GiB); it only grows.
	DiskGB int `json:"diskGB,omitempty"`
	// Power is the power state observed at the end of the last pass
	// ("running" or "stopped").
	Power string `json:"power,omitempty"`
	// Phase is the last phase a pass ended in (status.Phase*).
	Phase     string `json:"phase"`
	LastError string `json:"lastError,omitempty"`
	Message   string `json:"message,omitempty"`
	// IP and SSH are the last non-empty address the provisioner reported.
	IP  string `json:"ip,omitempty"`
	SSH string `json:"ssh,omitempty"`
	// NICs are the VM's NICs on host networks with the last non-empty
	// address reported for each.
	NICs []status.NIC `json:"nics,omitempty"`
	// QuarantinedAt is the marker of a pending delete: when the VM was shut
	// down for its tombstone. The tombstone grace is measured from it, by the
	// engine's clock. It is cleared when the tombstone leaves the snapshot
	// without the VM coming back (the VM then counts as vanished), so a
	// tombstone that returns later gets a whole new grace.
	QuarantinedAt *time.Time `json:"quarantinedAt,omitempty"`
	// Confirm is the nonce of the quarantine that QuarantinedAt marks,
	// set when the engine requires confirmation of deletes
	// (EngineConfig.ConfirmDeletes): the VM is destroyed only once the
	// accepted snapshot's tombstone carries it (snapshots.Tombstone.Confirm).
	// It is made once the grace has passed (never inside it, so no
	// confirmation predates an un-delete within the grace) and cleared
	// with the marker, so a new quarantine gets a new nonce and a restart
	// keeps the one reported.
	Confirm string `json:"confirm,omitempty"`
	// VanishedAt is when the VM was first found absent from the accepted
	// snapshot without a tombstone. The vanish grace is measured from it;
	// after the grace the VM is shut down and kept, never destroyed. It is
	// cleared when the VM reappears or its tombstone arrives.
	VanishedAt *time.Time `json:"vanishedAt,omitempty"`
	// DestroyedAt is when the provisioner's Destroy of the VM succeeded. It
	// is saved after Destroy and before RemoveVM, so a removal that fails or
	// is cut short by a kill leaves a record that says the root disk is
	// gone: a tombstone still present only finishes the removal, and an
	// un-delete runs the whole create again (new InstanceID, fresh root
	// disk) instead of booting a disk that no longer exists.
	DestroyedAt *time.Time `json:"destroyedAt,omitempty"`
	CreatedAt   time.Time  `json:"createdAt"`
}

// Reservation is the share of the host's capacity a VM holds: vCPUs and
// memory in MiB.
type Reservation struct {
	VCPUs    int `json:"vcpus"`
	MemoryMB int `json:"memoryMB"`
}

// LoadRecords reads every VM record. A directory whose record is missing,
// unreadable or undecodable lands in bad (wrapping ErrRecordUnreadable) and
// never in recs, except an empty directory, which a create left before its
// first record and which reads as absent. The error is for the vms directory
// itself; recs and bad are still valid for what could be read.
func (s *Store) LoadRecords() (recs map[string]*Record, bad map[string]error, err error) {
	recs = map[string]*Record{}
	bad = map[string]error{}
	entries, err := os.ReadDir(filepath.Join(s.root, vmsDirName))
	if err != nil {
		return recs, bad, fmt.Errorf("list vm records: %w", err)
	}
	for _, ent := range entries {
		name := ent.Name()
		if !ent.IsDir() || !validName(name) {
			continue
		}
		rec, err := s.LoadRecord(name)
		switch {
		case err == nil:
			recs[name] = rec
		case errors.Is(err, fs.ErrNotExist):
			// an empty directory: a create that never saved its record
		default:
			bad[name] = err
		}
	}
	return recs, bad, nil
}

// LoadRecord reads one VM's record. It returns an error matching
// fs.ErrNotExist only when the VM's directory is absent or empty; a
// directory with files but no readable record is ErrRecordUnreadable.
func (s *Store) LoadRecord(name string) (*Record, error) {
	if err := checkName("vm", name); err != nil {
		return nil, err
	}
	data, err := readRecordFile(s.RecordPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		ents, derr := os.ReadDir(s.VMDir(name))
		if errors.Is(derr, fs.ErrNotExist) || (derr == nil && len(ents) == 0) {
			return nil, fmt.Errorf("vm %s: %w", name, fs.ErrNotExist)
		}
		return nil, fmt.Errorf("vm %s: no %s beside the VM's files: %w", name, recordFile, ErrRecordUnreadable)
	}
	if err != nil {
		return nil, fmt.Errorf("vm %s: %v: %w", name, err, ErrRecordUnreadable)
	}
	var rec Record
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("vm %s: decode %s: %v: %w", name, s.RecordPath(name), err, ErrRecordUnreadable)
	}
	if rec.Name != name {
		return nil, fmt.Errorf("vm %s: record names %q: %w", name, rec.Name, ErrRecordUnreadable)
	}
	return &rec, nil
}

// maxRecordBytes bounds a VM record read from disk, in bytes: a record is
// a spec (whose user-data is at most a few MiB) and a few fields.
const maxRecordBytes = 64 << 20

// readRecordFile reads the record at path, which must be a regular file
// with one link of at most maxRecordBytes. An earlier version gave the
// VM's directory to QEMU's user, who could have put anything at its name:
// what is there is checked with lstat before it is opened (a FIFO is never
// opened), the open follows no symbolic link and does not block, and the
// file opened is checked again.
func readRecordFile(path string) ([]byte, error) {
	before, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !before.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file: it is %s", path, fileType(before.Mode()))
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || !os.SameFile(before, fi) || st == nil || st.Nlink != 1 {
		return nil, fmt.Errorf("%s is not a regular file with one link", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxRecordBytes+1))
	if err == nil && len(data) > maxRecordBytes {
		err = fmt.Errorf("%s is larger than %d bytes", path, maxRecordBytes)
	}
	return data, err
}

// fileType names the type of a file mode that is not a regular file's.
func fileType(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a directory"
	}
	return "a special file"
}

// SaveRecord writes rec atomically to its VM's directory, creating the
// directory when needed.
func (s *Store) SaveRecord(rec *Record) error {
	if err := checkName("vm", rec.Name); err != nil {
		return err
	}
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return fmt.Errorf("encode record %s: %w", rec.Name, err)
	}
	if err := os.MkdirAll(s.VMDir(rec.Name), 0o700); err != nil {
		return fmt.Errorf("save record %s: %w", rec.Name, err)
	}
	if err := writeFileAtomic(s.RecordPath(rec.Name), data); err != nil {
		return fmt.Errorf("save record %s: %w", rec.Name, err)
	}
	return nil
}

// RemoveVM deletes the VM's directory: every other entry first, then the
// record, then the directory itself. The engine calls it only after the
// provisioner's Destroy succeeded. A failure half-way leaves the record
// readable, so the VM is still known, nothing is acked, and the destroy is
// retried on the next tick; a directory already gone is no error.
func (s *Store) RemoveVM(name string) error {
	if err := checkName("vm", name); err != nil {
		return err
	}
	dir := s.VMDir(name)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove vm %s: %w", name, err)
	}
	for _, ent := range ents {
		if ent.Name() == recordFile {
			continue
		}
		if err := s.removeAll(filepath.Join(dir, ent.Name())); err != nil {
			return fmt.Errorf("remove vm %s: %w", name, err)
		}
	}
	if err := s.removeAll(filepath.Join(dir, recordFile)); err != nil {
		return fmt.Errorf("remove vm %s: %w", name, err)
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove vm %s: %w", name, err)
	}
	return syncDir(filepath.Join(s.root, vmsDirName))
}

// removeAll is os.RemoveAll unless a test replaced it.
func (s *Store) removeAll(path string) error {
	if s.removeHook != nil {
		if err := s.removeHook(path); err != nil {
			return err
		}
	}
	return os.RemoveAll(path)
}

// ClaimHost binds the state directory to host on first use and afterwards
// returns ErrHostMismatch for any other host.
func (s *Store) ClaimHost(host string) error {
	path := filepath.Join(s.root, hostFile)
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := writeFileAtomic(path, []byte(host+"\n")); err != nil {
			return fmt.Errorf("claim state directory for %s: %w", host, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("read %s: %w", path, err)
	}
	if owner := strings.TrimSpace(string(data)); owner != host {
		return fmt.Errorf("%s is host %q's, not %q (remove %s only if the host was renamed): %w", s.root, owner, host, path, ErrHostMismatch)
	}
	return nil
}

// LoadSnapshot returns the last accepted snapshot, or nil when none was ever
// accepted.
func (s *Store) LoadSnapshot() (*snapshots.Snapshot, error) {
	data, err := os.ReadFile(filepath.Join(s.root, snapshotFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read accepted snapshot: %w", err)
	}
	var snap snapshots.Snapshot
	if err := json.Unmarshal(data, &snap); err != nil {
		return nil, fmt.Errorf("decode accepted snapshot %s: %w", filepath.Join(s.root, snapshotFile), err)
	}
	return &snap, nil
}

// SaveSnapshot records snap as the last accepted snapshot.
func (s *Store) SaveSnapshot(snap *snapshots.Snapshot) error {
	data, err := json.Marshal(snap)
	if err != nil {
		return fmt.Errorf("encode accepted snapshot: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(s.root, snapshotFile), data); err != nil {
		return fmt.Errorf("save accepted snapshot: %w", err)
	}
	return nil
}

// ResetEpoch lowers the accepted epoch from exactly from to to (to <
// from), the reviewed way to make an agent trust a lower epoch again
// (docs/DESIGN.md, "Resetting an agent's epoch"). It forgets what was
// accepted: the accepted snapshot when its epoch is above to, and the
// record of its content. It does nothing and returns false when the
// accepted epoch is not from, so a reset left in the configuration never
// acts twice. The epoch is written last: a crash before it leaves the
// reset to the next start.
func (s *Store) ResetEpoch(from, to uint64) (bool, error) {
	if to >= from {
		return false, fmt.Errorf("reset epoch: to (%d) must be below from (%d)", to, from)
	}
	last, err := s.LastEpoch()
	if err != nil || last != from {
		return false, err
	}
	snap, err := s.LoadSnapshot()
	if err != nil || (snap != nil && snap.Epoch > to) {
		if err := os.Remove(filepath.Join(s.root, snapshotFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("reset epoch: %w", err)
		}
	}
	if err := os.Remove(filepath.Join(s.root, acceptedFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("reset epoch: %w", err)
	}
	if err := syncDir(s.root); err != nil {
		return false, fmt.Errorf("reset epoch: %w", err)
	}
	if err := s.SaveEpoch(to); err != nil {
		return false, fmt.Errorf("reset epoch: %w", err)
	}
	return true, nil
}

// LastEpoch is the highest snapshot epoch accepted on this host, 0 when none.
func (s *Store) LastEpoch() (uint64, error) { return s.readCounter(epochFile) }

// SaveEpoch records epoch as the highest accepted.
func (s *Store) SaveEpoch(epoch uint64) error { return s.writeCounter(epochFile, epoch) }

// AcceptedHash returns the epoch and hash SaveAcceptedHash last recorded;
// 0 and "" when none was.
func (s *Store) AcceptedHash() (epoch uint64, hash string, err error) {
	path := filepath.Join(s.root, acceptedFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, "", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("read %s: %w", path, err)
	}
	f := strings.Fields(string(data))
	if len(f) != 2 {
		return 0, "", fmt.Errorf("read %s: want \"<epoch> <sha256>\", got %q", path, strings.TrimSpace(string(data)))
	}
	if epoch, err = strconv.ParseUint(f[0], 10, 64); err != nil {
		return 0, "", fmt.Errorf("read %s: %w", path, err)
	}
	return epoch, f[1], nil
}

// SaveAcceptedHash records hash (SnapshotHash) as the content of the
// snapshot accepted at epoch, so a different snapshot at the same epoch is
// recognized as a fence violation, also after a restart.
func (s *Store) SaveAcceptedHash(epoch uint64, hash string) error {
	path := filepath.Join(s.root, acceptedFile)
	if err := writeFileAtomic(path, []byte(strconv.FormatUint(epoch, 10)+" "+hash+"\n")); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// SignatureSeen returns the snapshots commit SaveSignatureSeen last
// recorded and when it was first seen; "" when none was.
func (s *Store) SignatureSeen() (commit string, at time.Time, err error) {
	path := filepath.Join(s.root, seenFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", time.Time{}, nil
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("read %s: %w", path, err)
	}
	f := strings.Fields(string(data))
	if len(f) != 2 {
		return "", time.Time{}, fmt.Errorf("read %s: want \"<commit> <RFC 3339 time>\", got %q", path, strings.TrimSpace(string(data)))
	}
	if at, err = time.Parse(time.RFC3339Nano, f[1]); err != nil {
		return "", time.Time{}, fmt.Errorf("read %s: %w", path, err)
	}
	return f[0], at, nil
}

// SaveSignatureSeen records commit, a snapshots commit whose signature
// the agent accepted, and at, when it first saw it: a controller key's
// validity is judged then, after a restart too (docs/DESIGN.md, "Signed
// snapshots").
func (s *Store) SaveSignatureSeen(commit string, at time.Time) error {
	path := filepath.Join(s.root, seenFile)
	if err := writeFileAtomic(path, []byte(commit+" "+at.UTC().Format(time.RFC3339Nano)+"\n")); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Heartbeat is the last status heartbeat this host wrote, 0 when none.
func (s *Store) Heartbeat() (uint64, error) { return s.readCounter(heartbeatFile) }

// SaveHeartbeat records the last status heartbeat.
func (s *Store) SaveHeartbeat(n uint64) error { return s.writeCounter(heartbeatFile, n) }

func (s *Store) readCounter(file string) (uint64, error) {
	path := filepath.Join(s.root, file)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	return n, nil
}

func (s *Store) writeCounter(file string, n uint64) error {
	path := filepath.Join(s.root, file)
	if err := writeFileAtomic(path, []byte(strconv.FormatUint(n, 10)+"\n")); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// writeFileAtomic replaces path with data: a temporary file in the same
// directory, fsync, rename, fsync of the directory. Mode 0600.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	fail := func(err error) error {
		_ = f.Close()
		_ = os.Remove(tmp)
		return err
	}
	if err := f.Chmod(0o600); err != nil {
		return fail(err)
	}
	if _, err := f.Write(data); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return syncDir(dir)
}

// syncDir makes a rename or removal in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
