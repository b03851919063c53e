package agent

import (
	"context"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/status"
)

// Machine is what a Provisioner needs to know about one VM. Dir is the VM's
// own directory under the state store (mode 0700), where a backend keeps its
// disks, sockets and logs; Volumes are absolute paths of the VM's volume
// files, in spec order, each already present when Boot is called.
type Machine struct {
	Name    string
	Dir     string
	Spec    desired.VMSpec
	Volumes []string
	// Networks are the definitions of the host networks the VM's NICs
	// (Spec.Interfaces) name, by name, from the snapshot's host spec. A
	// VM without NICs is on the backend's private user-mode network; a
	// NIC whose network is missing here names no network of the host (a
	// backend refuses to boot it, permanently).
	Networks map[string]desired.Network
	// InstanceID is stable for the VM's life (it changes only when the VM is
	// destroyed and created again); cloud-init keys first-boot work on it.
	InstanceID string
}

// Address is how a VM is reached: IP is the guest's address as the backend
// knows it, SSH a host:port that forwards to the guest's port 22. Either may
// be empty.
type Address struct {
	IP  string
	SSH string
	// NICs are the VM's NICs on host networks, in spec order, each with
	// the guest's address there when known.
	NICs []status.NIC
}

// Provisioner is the seam between the reconcile engine and a hypervisor. The
// engine calls it from one goroutine per VM, so implementations must be safe
// for concurrent use across VMs. Errors wrapped with Permanent fail a create
// at once; any other error is transient and retried within the budget.
//
// Implementations: package agent/qemu (QEMU), agent/inmem (in memory; testsupport/agenttest injects faults over it).
type Provisioner interface {
	// Preflight checks the host can run VMs at all (binaries, accelerator).
	Preflight(ctx context.Context) error
	// PrepareRootDisk fetches the image (cached by sha256) and creates the
	// root disk, or grows it to Spec.DiskGB. It never shrinks a disk and never
	// replaces an existing one. Idempotent. The engine calls it during a
	// create, and to apply a larger diskGB to a created VM, running or
	// not: a running VM's disk is grown online (the guest sees the new
	// size; growing its partition and filesystem is the guest's business).
	PrepareRootDisk(ctx context.Context, m Machine) error
	// Stage fetches and verifies everything a Boot of m would need (image,
	// kernel, initrd: downloaded into the cache, sha256 checked, the image
	// inspected) and renders m's cloud-init seed, without touching the VM:
	// a running VM keeps running. The engine calls it before it stops a
	// created VM to apply a spec edit, so an edit that cannot boot never
	// takes the running VM down. Idempotent; errors are classed as for
	// PrepareRootDisk (a checksum mismatch is Permanent).
	Stage(ctx context.Context, m Machine) error
	// Boot writes the cloud-init seed and starts the VM, attaching its
	// volumes. Booting a VM that runs is a no-op. A hypervisor that fails
	// to start makes the error carry its own output of that run. Errors
	// are not prefixed with the step: the engine names it ("boot: …").
	Boot(ctx context.Context, m Machine) error
	// Shutdown stops the VM gracefully (ACPI, then harder after timeouts).
	// Stopping a stopped VM is a no-op. Disks are kept.
	Shutdown(ctx context.Context, name string) error
	// Destroy stops the VM and removes everything the backend made for it
	// under its Dir — never a volume. Destroying an absent VM is a no-op.
	Destroy(ctx context.Context, name string) error
	// Running reports whether the VM's process runs (re-attaching after an
	// agent restart where needed).
	Running(name string) bool
	// Address reports how the VM is reached; empty when not (yet) known.
	Address(name string) Address
	// FailureReason is the backend's own account of why the VM's last
	// hypervisor run ended (the tail of its error output); empty when it
	// has none. The engine only logs it when it boots a lost VM again: a
	// failed Boot's error already carries the account of that boot's own
	// run, and an older run's output never belongs to a newer error.
	FailureReason(name string) string
	// Readiness reports whether the guest of the running VM has proved it
	// is up in its current boot, and, for a guest reached by SSH, still
	// answers (see Readiness). It reads memory only and never waits for
	// the guest: a backend probes in the background from Boot (or from
	// re-attaching after an agent restart) on, each probe bounded in time.
	// The zero Readiness means the VM does not run.
	Readiness(name string) Readiness
}

// Ways a guest proves it is up, as Readiness.Via and in logs.
const (
	// ReadySSH: an SSH identification line ("SSH-2.0-…", RFC 4253 4.2)
	// was read from the guest's port 22, at its address or its forward.
	ReadySSH = "ssh"
	// ReadyGuestAgent: qemu-guest-agent answered guest-ping over the
	// virtio-serial channel org.qemu.guest_agent.0.
	ReadyGuestAgent = "guest-agent"
	// ReadyConsole: the guest printed ConsoleReadyMarker as a line of its
	// own on its first serial port (for guests with neither sshd nor a
	// guest agent).
	ReadyConsole = "console"
)

// ConsoleReadyMarker is the line a guest without sshd or a guest agent
// prints on its first serial port (ttyS0), alone on its line, to declare
// itself ready: for example `echo GITFLEET-GUEST-READY >/dev/ttyS0`.
const ConsoleReadyMarker = "GITFLEET-GUEST-READY"

// Readiness is what a Provisioner knows of one VM's current boot.
//
// Booted is when the boot began (the hypervisor process started); zero
// when the VM does not run. SSHRequired is set for a guest meant to be
// reached by SSH (its spec gives cloudInit.sshAuthorizedKeys): only its
// SSH banner makes it ready, and Ready follows the banner — a refusal
// after an answer clears Ready and sets Refused (when it was seen) until
// the guest answers again. For any other guest Ready is set at its first
// answer, by any way, and stays set until the VM stops. At is when the
// guest first answered in this boot, Via how (ReadySSH, ReadyGuestAgent or
// ReadyConsole) and Addr, for ReadySSH, the host:port that answered.
// HeldBy is set with Refused when the refusal was another machine
// answering at Addr instead of the guest: its MAC address, or "host" for
// the host's own address ("" for a refusal of the guest's own sshd).
type Readiness struct {
	Booted      time.Time
	SSHRequired bool
	Ready       bool
	At          time.Time
	Via         string
	Addr        string
	Refused     time.Time
	HeldBy      string
}

// ProgressReporter is implemented by a Provisioner that downloads
// artifacts (images, kernels) during PrepareRootDisk or Boot: VMProgress
// reports the download the named VM waits for, in bytes fetched so far and
// the total (-1 when unknown); ok is false when it waits for none. The
// engine shows it as the status message of a VM being created. Optional.
type ProgressReporter interface {
	VMProgress(name string) (done, total int64, ok bool)
}

// LeaseReporter is implemented by a Provisioner that runs the DHCP server
// of a network its VMs join (a nat network's dnsmasq). Unleased reports,
// for VM name while it runs, why its guest holds no lease of the address
// the network reserves for it: nil when it holds it or takes none there (a
// static address, a bridge network, user-mode networking, a VM that does
// not run); wrapping ErrAddressHeld when another machine's lease holds
// the address. A guest that answered but holds no lease has no address
// anyone reaches it at: the engine shows it booting, not ready, and says
// why in lastError (at once when the address is held, after ReadyTimeout
// otherwise: a guest may answer before it asks for its lease). Unleased
// reads files only and never waits. Optional.
type LeaseReporter interface {
	Unleased(name string) error
}

// NetworkReconciler is implemented by a Provisioner that attaches VMs to
// host networks. The engine calls ReconcileNetworks on every tick with the
// snapshot's host networks (name -> definition), members, the VMs the
// snapshot wants on one of them (sorted by name), and inUse, the networks
// a VM record on this host names (running or not, desired or not), or nil
// when that is unknown (a record cannot be read): the Provisioner makes
// every network of nets exist, with what each member needs of it before
// its VM boots (its address reservation on a managed network, so the
// network's DHCP server starts once with every reservation rather than
// once per VM), and tears down a network it made before that nets lacks,
// unless inUse names it or is nil. Idempotent; an error is logged and the
// next tick tries again (a VM's Boot ensures its own network as well).
// Optional.
type NetworkReconciler interface {
	ReconcileNetworks(ctx context.Context, nets map[string]desired.Network, members []NetworkMember, inUse map[string]bool) error
}

// NetworkHealthReporter is implemented by a Provisioner that attaches VMs
// to host networks. NetworkHealth says, for each network of nets (the
// snapshot's host networks), what on the host now keeps its guests'
// traffic from flowing — another firewall's drop on the forward path, a
// route over a nat network's CIDR, a missing bridge — "" when nothing
// it checks does. The engine asks at every tick (the host suspended or
// not) and shows a reason on the network in the host's status, on each
// VM there and in gitfleet_agent_network_degraded; guests are left as
// they are. Bounded in time; changes nothing. Optional.
type NetworkHealthReporter interface {
	NetworkHealth(ctx context.Context, nets map[string]desired.Network) map[string]string
}

// HostGuard is implemented by a Provisioner that keeps host-side pieces
// its running guests rely on: firewall rules between the guests and the
// host (nftables tables that anyone with root can flush: `systemctl
// restart nftables` runs `flush ruleset`), DHCP servers. GuardHost puts
// back each one that is missing, dead or was changed since the
// Provisioner set it up, as it was, and changes nothing else. The engine
// calls it at every tick, the host suspended or not (it changes nothing
// of any guest), and logs its error.
type HostGuard interface {
	GuardHost(ctx context.Context) error
}

// NetworkMember is a NIC of a VM the snapshot wants on host network
// Network, with the static addresses it keeps (a created VM keeps those
// it was created with; nil when it has none). Index is the NIC's position
// among the VM's NICs (0-based), MAC its fixed MAC ("" when derived:
// desired.NICMAC).
type NetworkMember struct {
	VM      string
	Network string
	Static  *desired.StaticIP
	// Index is the NIC's place in the VM's NICs (VMSpec.Interfaces), 0
	// for the one-NIC form.
	Index int
	// MAC is the NIC's fixed MAC ("" derives one: desired.NICMAC).
	MAC string
}

// ImageCollector is implemented by a Provisioner that keeps a cache of
// downloaded artifacts (images, kernels, initrds). CollectImages removes
// every cached artifact that no VM in vms uses and that has gone unused
// for at least grace; an artifact is in use when a VM's spec names it or a
// VM's disk is backed by it (an edited image is not applied to an existing
// VM, so its disk keeps the old image as backing file). vms is every VM
// this host has a record of (created, quarantined, vanished) and every VM
// of the accepted snapshot, tombstoned ones included. A disk it cannot
// read is an error and nothing is removed: what it uses is unknown. The
// engine calls it from Tick, never while a record is unreadable.
// Optional.
type ImageCollector interface {
	CollectImages(ctx context.Context, vms []Machine, grace time.Duration) (ImageCollection, error)
}

// ImageCollection is what one CollectImages pass did: the artifacts it
// removed (by sha256) and their size in bytes, and the artifacts it kept
// and theirs.
type ImageCollection struct {
	Removed      []string
	RemovedBytes int64
	Kept         int
	KeptBytes    int64
}

// AccelReporter is implemented by a Provisioner that knows which
// accelerator its VMs run under ("kvm" or "tcg"), for the status file's
// agent.accel. Optional.
type AccelReporter interface {
	Accel() string
}

// ArchReporter is implemented by a Provisioner that knows the
// architecture of its guests ("amd64", "arm64") and whether they are
// emulated (TCG on a CPU of another architecture), for the status
// file's agent.arch and agent.emulated. Optional.
type ArchReporter interface {
	Arch() string
	Emulated() bool
}
