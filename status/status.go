package status

import (
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/hostfile"
)

// Status is one host's report, hosts/<host>.yaml on the status branch.
// Heartbeat increases on every write, so the controller judges liveness from
// changes of the file by its own clock, never from ObservedAt (the agent's
// clock, informational only). Secrets never appear here.
type Status struct {
	Host  string    `yaml:"host" json:"host"`
	Agent AgentInfo `yaml:"agent" json:"agent"`
	// Heartbeat increases by one on every write.
	Heartbeat  uint64    `yaml:"heartbeat" json:"heartbeat"`
	ObservedAt time.Time `yaml:"observedAt" json:"observedAt"`
	// LastSeenEpoch is the highest snapshot epoch this agent accepted.
	LastSeenEpoch uint64 `yaml:"lastSeenEpoch" json:"lastSeenEpoch"`
	// FenceViolation is true while the agent refuses the snapshot on the
	// branch and acts on nothing: its epoch is below LastSeenEpoch, or equal
	// to it with content other than what was accepted at that epoch. Only a
	// snapshot at a higher epoch (or the accepted content again) lifts it.
	FenceViolation bool `yaml:"fenceViolation" json:"fenceViolation"`
	// SnapshotError is why the last fetched snapshot was refused, if it was
	// (a fence violation, or a file that does not parse).
	SnapshotError string       `yaml:"snapshotError,omitempty" json:"snapshotError,omitempty"`
	VMs           []VM         `yaml:"vms" json:"vms"`
	Quarantined   []Quarantine `yaml:"quarantined" json:"quarantined"`
	// QuarantinedVolumes are the tombstoned volumes waiting for their
	// grace (and, on an agent that verifies snapshots, for the
	// controller's confirmation) before they are removed; Since is when
	// the agent's marker was written. Omitted when empty.
	QuarantinedVolumes []Quarantine `yaml:"quarantinedVolumes,omitempty" json:"quarantinedVolumes,omitempty"`
	// Destroyed are destroy acks, repeated on every write until the name
	// leaves the snapshot.
	Destroyed []string `yaml:"destroyed" json:"destroyed"`
	// Vanished are VMs this host still has although the accepted snapshot
	// no longer names them and holds no tombstone for them (a repository
	// restored from a backup, a hand-edited snapshots branch, a controller
	// bug). The agent never destroys such a VM; see Vanished. Omitted when
	// empty.
	Vanished []Vanished `yaml:"vanished,omitempty" json:"vanished,omitempty"`
	Volumes  []Volume   `yaml:"volumes" json:"volumes"`
	// Orphans are volume files on the host that no snapshot names; they are
	// reported and kept.
	Orphans []string `yaml:"orphans,omitempty" json:"orphans,omitempty"`
	// Suspended is set while the accepted snapshot's Host spec suspends
	// the host (spec.suspend): the agent keeps its guests as they are and
	// acts on nothing. Omitted when the host is not suspended.
	Suspended *Suspension `yaml:"suspended,omitempty" json:"suspended,omitempty"`
	// Networks are the host networks of the accepted snapshot's Host
	// spec, sorted by name, each with what on the host keeps its guests'
	// traffic from flowing (Degraded, "" when nothing the agent checks
	// does). Omitted when the host has none, or its agent checks none.
	Networks []NetworkHealth `yaml:"networks,omitempty" json:"networks,omitempty"`
}

// NetworkHealth is one host network as its agent finds the host: Degraded
// says why its guests' traffic does not flow (another firewall's drop on
// the forward path, a route over a nat network's CIDR, a missing bridge),
// "" when nothing the agent checks keeps it from flowing. The guests keep
// running either way.
type NetworkHealth struct {
	Name     string `yaml:"name" json:"name"`
	Degraded string `yaml:"degraded,omitempty" json:"degraded,omitempty"`
}

// DegradedNote is what a VM's row and its host's state say of network
// n while it is degraded, "" when it is not.
func DegradedNote(n NetworkHealth) string {
	if n.Degraded == "" {
		return ""
	}
	return "network " + n.Name + " degraded: " + n.Degraded
}

// Suspension is why a host's reconciliation is suspended: the epoch of the
// accepted snapshot that says so and the Host's spec.suspendReason (may be
// empty).
type Suspension struct {
	Epoch  uint64 `yaml:"epoch" json:"epoch"`
	Reason string `yaml:"reason,omitempty" json:"reason,omitempty"`
}

// AgentInfo describes the agent process that wrote a Status. BootID is the
// host's kernel boot id (/proc/sys/kernel/random/boot_id); Accel is "kvm" or
// "tcg". Arch is the architecture of the host's guests, "amd64" or
// "arm64" ("" from an agent that does not say), and Emulated is true when
// they run under TCG on a CPU of another architecture.
type AgentInfo struct {
	Version  string `yaml:"version" json:"version"`
	BootID   string `yaml:"bootID" json:"bootID"`
	Accel    string `yaml:"accel" json:"accel"`
	Arch     string `yaml:"arch,omitempty" json:"arch,omitempty"`
	Emulated bool   `yaml:"emulated,omitempty" json:"emulated,omitempty"`
}

// VM phases as reported in status. A VM that runs is booting until its
// guest proves it is up (an SSH banner, a qemu-guest-agent ping or the
// console marker line; for a VM given SSH keys only the banner, and only
// while sshd answers; docs/DESIGN.md, Readiness), then ready; a booting
// VM whose guest has not answered within the agent's readyTimeout stays
// booting with lastError saying so. Stopping is shown while a shutdown the
// spec asked for runs.
const (
	PhasePending     = "pending"
	PhaseCreating    = "creating"
	PhaseBooting     = "booting"
	PhaseReady       = "ready"
	PhaseStopping    = "stopping"
	PhaseStopped     = "stopped"
	PhaseFailed      = "failed"
	PhaseQuarantined = "quarantined"
	// PhaseRestarting is a created VM being shut down and booted again to
	// apply a spec edit that needs a restart (vCPUs, memory, network,
	// volumes, kernel); every new artifact was fetched and verified first.
	PhaseRestarting = "restarting"
)

// VM is one VM's observed state. IP is the guest address if known; SSH is the
// host:port forward that reaches the guest's port 22, if any. Message carries
// non-error notes for a person (for example that a changed image does not
// touch an existing root disk, or image download progress).
type VM struct {
	Name  string `yaml:"name" json:"name"`
	Phase string `yaml:"phase" json:"phase"`
	Power string `yaml:"power" json:"power"`
	IP    string `yaml:"ip,omitempty" json:"ip,omitempty"`
	SSH   string `yaml:"ssh,omitempty" json:"ssh,omitempty"`
	// NICs are the VM's NICs on host networks, in the spec's order (none
	// on user-mode networking).
	NICs      []NIC        `yaml:"nics,omitempty" json:"nics,omitempty"`
	LastError string       `yaml:"lastError" json:"lastError"`
	Message   string       `yaml:"message,omitempty" json:"message,omitempty"`
	SpecHash  desired.Hash `yaml:"specHash" json:"specHash"`
	// Backup is the state of the VM's scheduled backups, for a VM whose
	// spec asks for them (spec.backup); nil otherwise.
	Backup *Backup `yaml:"backup,omitempty" json:"backup,omitempty"`
}

// Backup is what the agent reports of a VM's scheduled backups
// (docs/DESIGN.md, "Scheduled backups"). Repository is the
// BackupRepository's name. LastSuccess is when the last whole backup
// started (the agent's clock), LastBackupID its gitfleet backup id (the
// gitfleet-backup= tag), LastSnapshot the restic id of its meta snapshot,
// Bytes the virtual bytes it read (every disk), BytesAdded what the
// repository grew by (restic's data_added, summed; both unsigned, as a
// status file's 64-bit integers are), DurationSeconds how long it took
// (whole seconds), Consistency "application" or "crash". NextDue is when
// the next backup is due (a retry after a failure included); LastError
// and LastFailure say why and when the last attempt failed, cleared by a
// success.
type Backup struct {
	Repository      string    `yaml:"repository" json:"repository"`
	LastSuccess     time.Time `yaml:"lastSuccess,omitempty" json:"lastSuccess,omitempty"`
	LastBackupID    string    `yaml:"lastBackupID,omitempty" json:"lastBackupID,omitempty"`
	LastSnapshot    string    `yaml:"lastSnapshot,omitempty" json:"lastSnapshot,omitempty"`
	Bytes           uint64    `yaml:"bytes,omitempty" json:"bytes,omitempty"`
	BytesAdded      uint64    `yaml:"bytesAdded,omitempty" json:"bytesAdded,omitempty"`
	DurationSeconds int64     `yaml:"durationSeconds,omitempty" json:"durationSeconds,omitempty"`
	Consistency     string    `yaml:"consistency,omitempty" json:"consistency,omitempty"`
	NextDue         time.Time `yaml:"nextDue,omitempty" json:"nextDue,omitempty"`
	LastError       string    `yaml:"lastError,omitempty" json:"lastError,omitempty"`
	LastFailure     time.Time `yaml:"lastFailure,omitempty" json:"lastFailure,omitempty"`
}

// NIC is one NIC of a VM on a host network: the network's name, the
// NIC's MAC address and the guest's IPv4 address and, on a nat network
// with an IPv6 prefix, its IPv6 address there as the agent last observed
// them ("" while unknown).
type NIC struct {
	Network string `yaml:"network" json:"network"`
	MAC     string `yaml:"mac" json:"mac"`
	IP      string `yaml:"ip,omitempty" json:"ip,omitempty"`
	IPv6    string `yaml:"ipv6,omitempty" json:"ipv6,omitempty"`
}

// Quarantine is a tombstoned VM that has been shut down and waits for its
// grace to pass before it is destroyed. Since is when the agent's on-disk
// marker was written.
type Quarantine struct {
	Name  string    `yaml:"name" json:"name"`
	Since time.Time `yaml:"since" json:"since"`
	// LastError is why the last shutdown or destroy of the quarantined VM
	// failed; empty when none did. The destroy is retried every tick.
	LastError string `yaml:"lastError,omitempty" json:"lastError,omitempty"`
	// DestroyAt is when the grace ends and the agent destroys the VM: Since
	// plus the agent's tombstoneGrace (its clock). Zero from an agent that
	// does not say.
	DestroyAt time.Time `yaml:"destroyAt,omitempty" json:"destroyAt,omitempty"`
	// Confirm is the nonce the agent gave this quarantine, set only by an
	// agent that verifies snapshots (controllerKeys): it destroys the
	// object only after the grace and once the snapshot it accepted
	// carries this nonce on the object's tombstone (its confirm), which
	// the controller copies there while the delete is pending in its
	// ledger. It is given once the grace has passed (empty before); a
	// new quarantine gets a new nonce (docs/DESIGN.md, "Delete
	// confirmation"). Empty from an agent that does not verify snapshots:
	// it destroys after the grace alone.
	Confirm string `yaml:"confirm,omitempty" json:"confirm,omitempty"`
	// Confirmed is true once the accepted snapshot carries Confirm.
	Confirmed bool `yaml:"confirmed,omitempty" json:"confirmed,omitempty"`
}

// AwaitsConfirmation reports whether the quarantined object waits for the
// controller to confirm its delete: it has a nonce the accepted snapshot
// does not carry yet. It is not destroyed, whatever its grace, until it
// does.
func (q Quarantine) AwaitsConfirmation() bool { return q.Confirm != "" && !q.Confirmed }

// Vanished is a VM absent from the accepted snapshot without a tombstone.
// The agent leaves it exactly as it is (a running VM keeps running) for
// vanishGrace, measured from Since; then it shuts it down gracefully and
// keeps it (record, root disk, volumes): Quarantined becomes true. It stays so
// until the VM reappears in a snapshot (it is reconciled again: booted when
// its spec says running) or a tombstone for it arrives (the normal delete:
// quarantine, tombstoneGrace from a fresh marker, destroy, ack). Only a
// tombstone, that is a reviewed delete, ever destroys it.
type Vanished struct {
	Name string `yaml:"name" json:"name"`
	// Since is when the agent first found the VM absent; it is kept in the
	// VM's record on the host, so an agent restart does not reset it.
	Since time.Time `yaml:"since" json:"since"`
	// Power is the power state last observed ("running" or "stopped").
	Power string `yaml:"power" json:"power"`
	// Quarantined is true once vanishGrace has passed and the VM was shut
	// down and kept.
	Quarantined bool `yaml:"quarantined" json:"quarantined"`
	// Reason says, for a person, why the VM is listed and what ends it.
	Reason string `yaml:"reason" json:"reason"`
	// LastError is why the last shutdown failed; it is retried every tick.
	LastError string `yaml:"lastError,omitempty" json:"lastError,omitempty"`
}

// Volume is one volume's observed state. Present is false only when the
// volume file is known to be absent; a stat error reads as present. SizeGB is
// in GiB.
type Volume struct {
	Name    string `yaml:"name" json:"name"`
	Present bool   `yaml:"present" json:"present"`
	SizeGB  int    `yaml:"sizeGB" json:"sizeGB"`
	// Error says why a present volume cannot be used or measured: the path
	// is not a regular file, is a symlink to nothing, or cannot be stat'ed.
	// Empty when the volume is a usable file or absent.
	Error string `yaml:"error,omitempty" json:"error,omitempty"`
}

// Branch is the default name of the status branch.
const Branch = "gitfleet/status"

// Path is where host's status lives on the status branch:
// hosts/<host>.yaml.
func Path(host string) string { return hostfile.Path(host) }

// SummaryPath is the controller's fleet summary on the status branch.
const SummaryPath = "README.md"

// VM returns the status row of the VM name, or nil when the status (which
// may be nil) has none. Quarantined and vanished VMs are listed apart and
// are not found here.
func (s *Status) VM(name string) *VM {
	if s == nil {
		return nil
	}
	return hostfile.Entry(s.VMs, name, func(e *VM) string { return e.Name })
}

// Volume returns the status row of the volume name, or nil when the status
// (which may be nil) has none.
func (s *Status) Volume(name string) *Volume {
	if s == nil {
		return nil
	}
	return hostfile.Entry(s.Volumes, name, func(e *Volume) string { return e.Name })
}
