package snapshots

import (
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/hostfile"
)

// MaxSnapshotBytes is the largest snapshot file (hosts/<host>.yaml on the
// snapshots branch) an agent or the controller reads: 64 MiB. A bigger
// one, forged or broken, is refused by its size before it is read.
const MaxSnapshotBytes = 64 << 20

// Bounds of snapshot epochs (docs/DESIGN.md, "Epoch bounds").
const (
	// MaxEpoch is 2^53, exact in a float64 and so in any JSON reader: no
	// epoch reaches it.
	MaxEpoch uint64 = 1 << 53
	// EpochRoom is how many epochs an agent keeps in reserve above any it
	// accepts: 2^32, more than a century of publishes at one a second.
	EpochRoom uint64 = 1 << 32
	// MaxAcceptedEpoch is the highest epoch an agent accepts and the
	// controller publishes or follows: MaxEpoch - EpochRoom. A snapshot
	// above it (forged, or written by a broken controller) would leave the
	// agent no room to accept the next one, so it is refused like a fence
	// violation.
	MaxAcceptedEpoch = MaxEpoch - EpochRoom
)

// Snapshot is one host's desired state as the controller publishes it at
// hosts/<host>.yaml on the gitfleet/snapshots branch (docs/DESIGN.md, Branches and
// files). Epoch strictly increases per host and is never reused; an agent
// refuses a snapshot whose epoch is below the last it accepted (the fence).
//
// A missing file means "no snapshot yet"; a Snapshot with no VMs is a real,
// empty desired state. The two are never confused.
type Snapshot struct {
	Host   string         `yaml:"host" json:"host"`
	Epoch  uint64         `yaml:"epoch" json:"epoch"`
	Source SnapshotSource `yaml:"source" json:"source"`
	// HostSpec is the Host object's spec (capacity, networks), for admission
	// and network attachment on the agent.
	HostSpec desired.HostSpec `yaml:"hostSpec" json:"hostSpec"`
	VMs      []SnapshotVM     `yaml:"vms" json:"vms"`
	Volumes  []SnapshotVolume `yaml:"volumes" json:"volumes"`
	// BackupRepositories are the BackupRepository objects whose spec.hosts
	// list the host, sorted by name: where its VMs back up to and restore
	// from (a VM's spec.backup.repository names one). Left out when none.
	BackupRepositories []SnapshotBackupRepository `yaml:"backupRepositories,omitempty" json:"backupRepositories,omitempty"`
}

// SnapshotBackupRepository is a backup repository as a host's snapshot
// carries it: its name, restic's location with no secret in it (the
// host's agent configuration names the password and credential files
// under Name), and whether this host runs its maintenance (prune, check).
type SnapshotBackupRepository struct {
	Name        string `yaml:"name" json:"name"`
	URL         string `yaml:"url" json:"url"`
	Maintenance bool   `yaml:"maintenance,omitempty" json:"maintenance,omitempty"`
}

// BackupRepository returns the snapshot's repository called name, or nil.
func (s *Snapshot) BackupRepository(name string) *SnapshotBackupRepository {
	if s == nil {
		return nil
	}
	return hostfile.Entry(s.BackupRepositories, name, func(e *SnapshotBackupRepository) string { return e.Name })
}

// SnapshotSource names the desired-state commit a snapshot was computed from.
type SnapshotSource struct {
	Commit desired.Hash `yaml:"commit" json:"commit"`
	Branch string       `yaml:"branch" json:"branch"`
}

// SnapshotVM is one VM in a snapshot. SpecHash is the lowercase hex sha256 of
// the spec's canonical JSON encoding (desired.SpecHash). A tombstoned VM is a pending
// delete; its last spec is kept so an un-delete restores it unchanged.
type SnapshotVM struct {
	Name       string         `yaml:"name" json:"name"`
	SpecHash   desired.Hash   `yaml:"specHash" json:"specHash"`
	Spec       desired.VMSpec `yaml:"spec" json:"spec"`
	Tombstoned bool           `yaml:"tombstoned" json:"tombstoned"`
	Tombstone  *Tombstone     `yaml:"tombstone,omitempty" json:"tombstone,omitempty"`
}

// SnapshotVolume is one volume in a snapshot. SizeGB is in GiB.
type SnapshotVolume struct {
	Name       string     `yaml:"name" json:"name"`
	SizeGB     int        `yaml:"sizeGB" json:"sizeGB"`
	Tombstoned bool       `yaml:"tombstoned" json:"tombstoned"`
	Tombstone  *Tombstone `yaml:"tombstone,omitempty" json:"tombstone,omitempty"`
}

// Tombstone says who removed an object and when: the desired-state commit
// that removed it (found on the first-parent history), its author and author
// time (RFC 3339), and the epoch that first published it. Rewritten, when
// true, flags a removal attributed to a rewritten history's new head: the
// controller publishes it false (a rewrite retains what it dropped, see
// package fleet), and readers show a true one as such (docs/DESIGN.md,
// Refinements).
//
// Confirm is the nonce the host's agent gave its quarantine of the object
// (status.Quarantine.Confirm), copied by the controller from the host's
// status while the tombstone is pending in its ledger: an agent that
// verifies snapshots destroys the object only when the snapshot it
// accepted carries the nonce of its own quarantine (docs/DESIGN.md,
// "Delete confirmation"). Empty until the controller has confirmed.
type Tombstone struct {
	Commit    desired.Hash `yaml:"commit" json:"commit"`
	Author    string       `yaml:"author" json:"author"`
	Time      string       `yaml:"time" json:"time"`
	Epoch     uint64       `yaml:"epoch" json:"epoch"`
	Rewritten bool         `yaml:"rewritten,omitempty" json:"rewritten,omitempty"`
	Confirm   string       `yaml:"confirm,omitempty" json:"confirm,omitempty"`
}

// ConfirmLen is the length of a confirmation nonce: 32 lowercase hex
// digits, 128 random bits.
const ConfirmLen = 32

// ValidConfirm reports whether s has the shape of a confirmation nonce
// (ConfirmLen lowercase hex digits). A status is input anyone who can push
// its branch may forge: the controller copies only nonces of this shape.
func ValidConfirm(s string) bool {
	if len(s) != ConfirmLen {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Confirms reports whether the tombstone t (which may be nil) confirms the
// quarantine whose nonce is nonce: both are set and equal.
func (t *Tombstone) Confirms(nonce string) bool {
	return t != nil && nonce != "" && t.Confirm == nonce
}

// VM returns the snapshot's entry for the VM name, or nil when the snapshot
// (which may be nil) has none.
func (s *Snapshot) VM(name string) *SnapshotVM {
	if s == nil {
		return nil
	}
	return hostfile.Entry(s.VMs, name, func(e *SnapshotVM) string { return e.Name })
}

// Volume returns the snapshot's entry for the volume name, or nil when the
// snapshot (which may be nil) has none.
func (s *Snapshot) Volume(name string) *SnapshotVolume {
	if s == nil {
		return nil
	}
	return hostfile.Entry(s.Volumes, name, func(e *SnapshotVolume) string { return e.Name })
}
