// Package qemu is the agent's QEMU backend: an agent.Provisioner that runs
// each VM as a qemu-system-x86_64 process (q35, virtio disk and net, a
// NoCloud seed; qemu-system-aarch64 and virt on an arm64 host, arch.go)
// that outlives the agent and is re-attached after an agent restart. A VM
// boots SeaBIOS, a direct kernel, or UEFI chosen from QEMU's firmware
// descriptors (firmware.go), optionally with Secure Boot and a TPM 2.0 of
// its own (tpm.go). A VM's one NIC is on the host network its spec names (a tap
// from Config.Networks), or else on QEMU's user-mode network with an SSH
// port forwarded on 127.0.0.1.
//
// Everything the backend keeps for a VM lives in the VM's directory
// (agent.Machine.Dir):
//
//	root.qcow2   root disk: qcow2 overlay on the cached image, or blank
//	seed.iso     NoCloud seed, ISO9660 labelled cidata
//	qemu.pid     QEMU's pidfile
//	qmp.sock     QMP monitor socket
//	qmp-events.sock
//	             a second QMP monitor, kept connected for its events (events.go)
//	qga.sock     host end of the guest agent's virtio-serial channel
//	ready        the first answer of the current boot (pid, how, when)
//	serial.log   the guest's first serial port, kept across restarts (console.go)
//	serial.log.1 the previous serial log, once serial.log passed SerialLogMax
//	serial.sock  the first serial port's socket, for one console at a time
//	console.lock held by the attached console
//	qemu.log     QEMU's own stdout and stderr (FailureReason's source)
//	ssh-port     the forwarded SSH port on 127.0.0.1, kept across restarts
//	network.json the host network the NIC is on (absent on user-mode networking)
//	backup-snapshot.json, backup-fleece-N.raw, backup-nbd.sock
//	             a disk snapshot held for a backup (fleece.go)
//	uefi-vars.fd the VM's UEFI variables, made once from the firmware's
//	             template and never overwritten (firmware.go)
//	tpm/         the VM's TPM 2.0 state, owned by QEMU's user (tpm.go)
//	swtpm.pid, swtpm.log
//	             the VM's swtpm, which runs while its QEMU does
//	root.qcow2.before-restore-<unix time>
//	             a root disk a restore replaced (diskio.go); Destroy leaves it,
//	             for an operator to remove once the restore is proven
//
// Destroy removes exactly these files and nothing else; volumes are never
// touched. Downloaded artifacts live in Config.CacheDir as <sha256>; root
// disks are overlays backed by them, so a cached image must not be removed
// while a VM's root disk uses it.
//
// QEMU runs confined: under its seccomp sandbox, and with Config.RunAs as
// an unprivileged user behind an nftables guard that keeps guests off the
// host's own addresses (see confine.go), in a directory that stays the
// agent's, where every open refuses what the backend did not make
// (vmdir.go, vmfile.go). What a guest or QEMU sends is read with bounds
// (channel.go). Artifacts are fetched under an
// ArtifactPolicy, and images are inspected (inspectImage) before qemu-img
// or QEMU opens them.
//
// QEMU is started in a session of its own with its output going to
// qemu.log, so it outlives the agent; a restarted agent finds it again by
// pidfile, /proc/PID/cmdline (which must name the VM and its pidfile, so a
// reused pid never passes) and QMP query-status.
//
// It reads and writes no branch file: the agent hands it each VM's spec from
// the snapshot, and reports what it observes in the host's status.
package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/internal/sealed"
)

// Files the backend makes in a VM's directory.
const (
	RootDiskFile = "root.qcow2"
	SeedFile     = "seed.iso"
	PidFile      = "qemu.pid"
	QMPSocket    = "qmp.sock"
	SerialLog    = "serial.log"
	QEMULog      = "qemu.log"
	PortFile     = "ssh-port"
	QGASocket    = "qga.sock"
	ReadyFile    = "ready"
	// PidRecordFile is the agent's own record of the QEMU it started,
	// "<pid> <start time>\n", the start time in clock ticks after boot as
	// field 22 of /proc/<pid>/stat gives it. QEMU keeps PidFile open for
	// as long as it runs, so a compromised QEMU can rewrite that one, and
	// its own command line too; this file no QEMU holds, and the start
	// time names one process, whatever pid reuse or the process makes of
	// its command line.
	PidRecordFile = "qemu.pid.agent"
)

// ownedFiles are what Destroy removes from a VM's directory.
var ownedFiles = []string{
	RootDiskFile, RootDiskFile + ".partial", SeedFile, SeedFile + ".partial", SeedFile + ".work",
	PidFile, QMPSocket, QMPEventsSocket, SerialLog, SerialLogOld, SerialLogOld + ".partial", SerialSocket, ConsoleLock, QEMULog, PortFile, NetFile, NetFile + ".partial",
	QGASocket, ReadyFile, ReadyFile + ".partial", SnapshotMarker, NBDSocket, PidRecordFile, PidRecordFile + ".partial",
	UEFIVarsFile, UEFIVarsFile + ".partial", TPMDir, TPMDir + ".partial", SWTPMPidFile, SWTPMPidFile + ".partial", SWTPMLog,
}

// Config configures the QEMU backend. Zero values take the defaults given.
type Config struct {
	// CacheDir holds downloaded images, kernels and initrds by sha256.
	// Required.
	CacheDir string
	// MachineDir maps a VM name to its directory, for calls that only
	// carry the name (Running, Address, Shutdown, Destroy, FailureReason)
	// about a VM this Provisioner has not seen in PrepareRootDisk or Boot
	// yet — typically right after an agent restart. Without it such a VM
	// reads as not running and Shutdown/Destroy of it are no-ops.
	MachineDir func(name string) string
	// AdoptedDisk maps a VM name to where its adopted root disk is staged
	// (agent.Store.AdoptedDisk: the state directory's adopt/<name>/root.qcow2).
	// Nil refuses every VM whose spec says rootDisk.adopt, permanently.
	AdoptedDisk func(name string) string
	// Accel is "auto" (default), "kvm" or "tcg". Auto picks KVM only when
	// /proc/cpuinfo shows vmx or svm (on arm64: always) and /dev/kvm opens
	// read-write, and TCG for guests of an Arch other than the agent's.
	Accel string
	// Arch is the architecture of the host's guests, "amd64" or "arm64"
	// ("": the agent's own, runtime.GOARCH). It picks QEMU's binary
	// (qemu-system-x86_64, qemu-system-aarch64), the default machine
	// (q35, virt) and the firmware's target; a VM or kernel of another
	// architecture is refused before boot.
	Arch string
	// QEMU is the QEMU system emulator (default: Arch's, found in PATH).
	QEMU string
	// FirmwareDirs are where QEMU's firmware descriptors are read from
	// for VMs with firmware uefi (default DefaultFirmwareDirs).
	FirmwareDirs []string
	// SWTPM is the swtpm binary that emulates the TPM of VMs with tpm:
	// true (default: found in PATH).
	SWTPM string
	// SWTPMSetup is the swtpm_setup binary that makes a VM's new TPM
	// state (default: found in PATH).
	SWTPMSetup string
	// QEMUImg is the qemu-img binary (default: found in PATH).
	QEMUImg string
	// BootTimeout bounds how long Boot waits for QEMU to write its pidfile
	// and answer on QMP (default 30 s).
	BootTimeout time.Duration
	// PowerdownTimeout is how long Shutdown waits for the guest to power
	// off after an ACPI powerdown before it asks QEMU to quit (default 60 s).
	PowerdownTimeout time.Duration
	// KillTimeout is how long each harder step (QMP quit, SIGTERM) gets
	// before the next (default 5 s).
	KillTimeout time.Duration
	// SystemdScope opts in to running each VM in its own transient systemd
	// scope (systemd-run --scope --unit gitfleet-vm-<name>) when systemd is
	// detected, so restarting the agent's unit leaves the guests alone.
	// Without it QEMU only gets a session of its own, and the agent's unit
	// needs KillMode=process for its VMs to survive a restart of the unit.
	SystemdScope bool
	// RunAs is the unprivileged system user QEMU drops to once it has
	// opened its files (-runas). With it, Preflight installs an nftables
	// guard (nft must be installed) that refuses connections from that
	// user to any address of the host, so a guest cannot reach the host's
	// loopback services through user-mode networking's gateway
	// (10.0.2.2), and has Networks refuse that user every address of the
	// nat networks (hostnet.Manager.UserMode), so a guest on user-mode
	// networking reaches no guest there. QEMU opens its files as root
	// before it drops to that user; each VM's directory stays the agent's
	// (0700), so that user can put nothing there (vmdir.go).
	// "" is DefaultQEMUUser when the agent runs as root, and no drop
	// when it does not (QEMU then runs as the agent's own unprivileged
	// user, without the guard, which needs root). "root" keeps QEMU root
	// and the guard off: guests then reach the host's 127.0.0.1, and
	// Preflight warns.
	RunAs string
	// NoSandbox turns QEMU's seccomp sandbox (-sandbox on,...) off; it is
	// on by default.
	NoSandbox bool
	// NFT is the nft binary (default: found in PATH).
	NFT string
	// Artifacts says where images, kernels and initrds may be fetched
	// from; the zero value allows no file:// URL and no download from a
	// loopback, link-local or private address (see ArtifactPolicy).
	Artifacts ArtifactPolicy
	// Networks attaches VMs whose spec names a network to the host's
	// networks (see package agent/hostnet). Without it such a VM fails to
	// boot with a permanent error; VMs without a network use QEMU's
	// user-mode networking either way.
	Networks HostNetworks
	// AgeIdentity is this host's age identities: Boot and Stage decrypt a
	// VM's spec.cloudInit.encryptedUserData with them into the seed's
	// user-data (see Provisioner.userData). nil: such a VM's seed cannot
	// be built, unless it has a seed of its own already.
	AgeIdentity *sealed.Keyring
	// Logger receives the backend's logs (default: logrus' standard logger),
	// with component=qemu.
	Logger logrus.FieldLogger

	// cpuinfo and kvmDev are the files accel detection reads (tests).
	cpuinfo, kvmDev string
}

// Provisioner runs VMs with QEMU. It is safe for concurrent use; calls for
// one VM are serialized.
type Provisioner struct {
	cfg    Config
	arch   archInfo
	accel  string
	scope  bool
	log    *logrus.Entry
	images *imageCache
	user   *qemuUser // nil: QEMU runs as the agent's user

	mu       sync.Mutex
	machines map[string]*vmState
	ports    map[int]string // forwarded SSH port -> VM name

	// sweepOnce removes a killed agent's half-done downloads once per
	// process, before the first create's fetch: every create pass runs
	// Preflight, and a later sweep would delete downloads in flight.
	sweepOnce sync.Once

	// guardList is the kernel's listing of the loopback guard's table as
	// last loaded (nil before), to find it removed or changed.
	guardMu   sync.Mutex
	guardList []byte
}

// vmState is what the Provisioner remembers about one VM in memory; all of
// it can be rebuilt from the VM's directory.
type vmState struct {
	mu   sync.Mutex // serializes operations on this VM
	name string
	dir  string
	// exit is set when a QEMU this Provisioner started exited: a summary
	// of its exit status for FailureReason.
	exitMu sync.Mutex
	exit   string
	// starts counts the QEMUs this Provisioner started for the VM, so the
	// exit of an older one is not taken for the newest one's.
	starts int
	// fetching is the sha256 of the artifact the VM waits for ("" or nil
	// when none).
	fetching atomic.Value
	// watch probes the current boot's readiness (ready.go); resetAt is
	// when the QEMU of resetPid last reset its guest (events.go).
	watchMu  sync.Mutex
	watch    *bootWatch
	resetPid int
	resetAt  time.Time
	// qgaMu serializes conversations on the guest agent's channel.
	qgaMu sync.Mutex
	// guestAddr is the address the guest agent last reported (qga.go).
	guestAddr guestAddr
	// snap is the disk snapshot held for a backup (fleece.go), nil when
	// none; guarded by mu.
	snap *heldSnapshot
}

var (
	_ agent.Provisioner = (*Provisioner)(nil)
	_ agent.HostGuard   = (*Provisioner)(nil)
)

// New checks cfg and returns a Provisioner. It resolves the binaries and
// the accelerator but starts nothing; Preflight checks the host further.
func New(cfg Config) (*Provisioner, error) {
	if cfg.CacheDir == "" {
		return nil, errors.New("qemu: Config.CacheDir is required")
	}
	arch, err := hostArch(cfg.Arch)
	if err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	if cfg.QEMU == "" {
		cfg.QEMU = arch.binary
	}
	if cfg.FirmwareDirs == nil {
		cfg.FirmwareDirs = DefaultFirmwareDirs
	}
	if cfg.SWTPM == "" {
		cfg.SWTPM = "swtpm"
	}
	if cfg.SWTPMSetup == "" {
		cfg.SWTPMSetup = "swtpm_setup"
	}
	if cfg.QEMUImg == "" {
		cfg.QEMUImg = "qemu-img"
	}
	if cfg.BootTimeout <= 0 {
		cfg.BootTimeout = 30 * time.Second
	}
	if cfg.PowerdownTimeout <= 0 {
		cfg.PowerdownTimeout = 60 * time.Second
	}
	if cfg.KillTimeout <= 0 {
		cfg.KillTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = logrus.StandardLogger()
	}
	if cfg.cpuinfo == "" {
		cfg.cpuinfo = "/proc/cpuinfo"
	}
	if cfg.kvmDev == "" {
		cfg.kvmDev = "/dev/kvm"
	}
	// Root disks name their backing file by its absolute path in the
	// cache, which checkRootDisk compares with it.
	cache, err := filepath.Abs(cfg.CacheDir)
	if err != nil {
		return nil, fmt.Errorf("qemu: Config.CacheDir: %w", err)
	}
	cfg.CacheDir = cache
	p := &Provisioner{cfg: cfg, arch: arch, machines: map[string]*vmState{}, ports: map[int]string{}}
	p.log = cfg.Logger.WithField("component", "qemu")
	switch cfg.Accel {
	case "", AccelAuto:
		p.accel = detectAccel(cfg.cpuinfo, cfg.kvmDev)
		if string(arch.arch) != runtime.GOARCH {
			p.accel = AccelTCG // KVM runs only the host CPU's own architecture
		}
	case AccelKVM, AccelTCG:
		p.accel = cfg.Accel
	default:
		return nil, fmt.Errorf("qemu: accel %q: want auto, kvm or tcg", cfg.Accel)
	}
	p.scope = cfg.SystemdScope && underSystemd()
	if p.user, err = lookupQEMUUser(cfg.RunAs); err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	if cfg.NFT == "" {
		cfg.NFT = "nft"
		p.cfg.NFT = "nft"
	}
	p.images = newImageCache(cfg.CacheDir, cfg.Artifacts, p.log)
	return p, nil
}

// underSystemd reports whether systemd can put a VM in a scope of its own:
// this process runs in a unit (INVOCATION_ID) or systemd is the init
// (/run/systemd/system), and systemd-run is installed.
func underSystemd() bool {
	_, err := os.Stat("/run/systemd/system")
	if err != nil && os.Getenv("INVOCATION_ID") == "" {
		return false
	}
	_, err = exec.LookPath("systemd-run")
	return err == nil
}

// Accel is the accelerator VMs run with: "kvm" or "tcg" (for status).
func (p *Provisioner) Accel() string { return p.accel }

// VMProgress reports the download the named VM's PrepareRootDisk or Boot
// is waiting for, as Progress does; ok is false when it waits for none.
func (p *Provisioner) VMProgress(name string) (done, total int64, ok bool) {
	st := p.state(name, "")
	if st == nil {
		return 0, 0, false
	}
	sum, _ := st.fetching.Load().(string)
	if sum == "" {
		return 0, 0, false
	}
	return p.images.progress(sum)
}

// Progress reports a running download of the artifact with this sha256:
// bytes fetched so far and the total (-1 when the server did not say). ok
// is false when no download of it is running.
func (p *Provisioner) Progress(sha256 string) (done, total int64, ok bool) {
	return p.images.progress(sha256)
}

// Preflight checks that QEMU and qemu-img run, that the cache directory is
// writable, and that the chosen accelerator is available; with a QEMU
// user it loads the guests' guard and names that user to Networks.
func (p *Provisioner) Preflight(ctx context.Context) error {
	for _, bin := range []string{p.cfg.QEMU, p.cfg.QEMUImg} {
		out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
		if err != nil {
			if tail := trimTail(out, 512); len(tail) > 0 {
				return fmt.Errorf("%s --version: %v: %s", bin, err, tail)
			}
			return fmt.Errorf("%s --version: %w", bin, err)
		}
	}
	if err := os.MkdirAll(p.cfg.CacheDir, 0o700); err != nil {
		return fmt.Errorf("image cache: %w", err)
	}
	probe, err := os.CreateTemp(p.cfg.CacheDir, ".probe-")
	if err != nil {
		return fmt.Errorf("image cache not writable: %w", err)
	}
	probe.Close()
	os.Remove(probe.Name())
	if err := os.Chmod(p.cfg.CacheDir, 0o700); err != nil {
		return fmt.Errorf("image cache: %w", err)
	}
	// Downloads a killed agent left half done, once: later calls run while
	// this process's own downloads are in flight.
	p.sweepOnce.Do(func() {
		if stale, err := filepath.Glob(filepath.Join(p.cfg.CacheDir, "*.partial-*")); err == nil {
			for _, f := range stale {
				os.Remove(f)
			}
		}
	})
	if p.user != nil {
		if err := p.ensureGuard(ctx, true); err != nil {
			return err
		}
		if p.cfg.Networks != nil {
			p.cfg.Networks.UserMode(p.user.uid)
		}
	} else {
		p.log.WithField("uid", os.Geteuid()).Warn("qemu runs as the agent's user without a guard: guests reach the host's 127.0.0.1 through 10.0.2.2 (run the agent as root with qemu.user set)")
	}
	if p.accel == AccelKVM {
		f, err := os.OpenFile(p.cfg.kvmDev, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("accel kvm: %w", err)
		}
		f.Close()
	}
	return nil
}

// state returns the remembered state of a VM, learning its directory from
// dir (non-empty when the caller has an agent.Machine) or from
// Config.MachineDir. nil when the VM's directory is unknown.
func (p *Provisioner) state(name, dir string) *vmState {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.machines[name]
	if st == nil {
		if dir == "" && p.cfg.MachineDir != nil {
			dir = p.cfg.MachineDir(name)
		}
		if dir == "" {
			return nil
		}
		st = &vmState{name: name, dir: dir}
		p.machines[name] = st
		// The first this process sees of the VM: its directory may be
		// one an earlier version gave to QEMU's user, and a killed agent
		// may have left a disk snapshot in it.
		if err := p.claim(st); err != nil {
			p.log.WithField("vm", name).WithError(err).Warn("VM directory")
		}
		p.sweepAtStart(st)
	}
	if dir != "" && st.dir != dir {
		st.dir = dir
	}
	return st
}

// machineState is state for a VM being prepared or booted: m.Dir is where
// its files go, and a Machine without one is a permanent error.
func (p *Provisioner) machineState(m agent.Machine) (*vmState, error) {
	st := p.state(m.Name, m.Dir)
	if st == nil {
		return nil, agent.Permanent(fmt.Errorf("vm %s: no directory", m.Name))
	}
	return st, nil
}

func (st *vmState) path(file string) string { return filepath.Join(st.dir, file) }

// pid returns the pid of this VM's QEMU when it is alive, 0 otherwise:
// the one PidRecordFile names, when its start time is still that
// process's. Without that record (a QEMU an earlier version started),
// the pidfile, which alone is not trusted: /proc/PID/cmdline must carry
// this VM's -name and this VM's pidfile path, so a pid reused by another
// process never reads as the VM.
func (st *vmState) pid() int {
	rec, err := readRegular(st.path(PidRecordFile), 64)
	if err == nil {
		return recordedPid(rec)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return 0
	}
	b, err := readRegular(st.path(PidFile), 32)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	if !cmdlineNames(pid, st.name, st.path(PidFile)) {
		return 0
	}
	return pid
}

// recordPid writes the PidRecordFile at path for process pid, which must be
// alive.
func recordPid(path string, pid int) error {
	start, ok := procStart(pid)
	if !ok {
		return fmt.Errorf("record qemu pid %d: the process is gone", pid)
	}
	return writeAtomic(path, []byte(fmt.Sprintf("%d %d\n", pid, start)), 0o600)
}

// recordedPid is the pid a PidRecordFile's content rec names when that
// process is alive and started when rec says, else 0.
func recordedPid(rec []byte) int {
	f := strings.Fields(string(rec))
	if len(f) != 2 {
		return 0
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil || pid <= 0 {
		return 0
	}
	if start, ok := procStart(pid); !ok || strconv.FormatUint(start, 10) != f[1] {
		return 0
	}
	return pid
}

// procStart is the start time of process pid, in clock ticks after boot
// (field 22 of /proc/<pid>/stat, which the process cannot change); ok is
// false when it is gone or a zombie.
func procStart(pid int) (uint64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')') // the name before it may hold anything
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:])) // from field 3, the state
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return 0, false
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	return start, err == nil
}

// cmdlineNames reports whether process pid is a QEMU started for VM name
// with pidfile.
func cmdlineNames(pid int, name, pidfile string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return false // gone, or a zombie
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	var nameOK, pidOK bool
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-name":
			nameOK = args[i+1] == "guest="+name
		case "-pidfile":
			pidOK = args[i+1] == pidfile
		}
	}
	return nameOK && pidOK
}

// deadStates are QMP run states in which the guest no longer runs although
// QEMU's process may still be alive.
var deadStates = map[string]bool{"shutdown": true, "internal-error": true, "guest-panicked": true}

// Running reports whether the VM's QEMU runs: its pidfile names a live
// process whose command line is this VM's, and QMP query-status does not
// report a dead guest. A QEMU that is alive but does not answer on QMP
// within a few seconds counts as running (it holds the disks).
func (p *Provisioner) Running(name string) bool {
	st := p.state(name, "")
	if st == nil {
		return false
	}
	return p.running(st)
}

func (p *Provisioner) running(st *vmState) bool {
	if st.pid() == 0 {
		return false
	}
	if st.swtpmLost() {
		// The guest's TPM is gone: the VM counts as down, so the next
		// Boot stops its QEMU and starts both again.
		p.log.WithFields(logrus.Fields{"vm": st.name}).Warn("the VM's swtpm is gone while its QEMU runs; the VM counts as not running")
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	status, err := qmpStatus(ctx, st.path(QMPSocket))
	if err != nil {
		p.log.WithFields(logrus.Fields{"vm": st.name}).WithError(err).Warn("qemu alive but QMP does not answer")
		return true
	}
	return !deadStates[status]
}

// Address reports how the guest is reached. On a host network, while the
// VM runs, IP is an address observed from the guest (networkAddress: its
// lease, the host's neighbour table, its guest agent, or a static address
// at which its sshd answered), never one the spec merely asks for; SSH is
// IP:22. On user-mode
// networking: the SSH forward ("127.0.0.1:PORT") once a port is allocated,
// and the guest's user-mode address while the VM runs.
func (p *Provisioner) Address(name string) agent.Address {
	st := p.state(name, "")
	if st == nil {
		return agent.Address{}
	}
	var a agent.Address
	if ip, ok := p.networkAddress(st); ok {
		if ip.IsValid() {
			a.IP, a.SSH = ip.String(), netip.AddrPortFrom(ip, 22).String()
		}
		a.NICs = p.nicAddresses(st)
		return a
	}
	if port, err := readPort(st.path(PortFile)); err == nil && port > 0 {
		a.SSH = "127.0.0.1:" + strconv.Itoa(port)
	}
	if st.pid() != 0 {
		a.IP = GuestIP
	}
	return a
}

// qemuLogTail is the last KiB of QEMU's own output (QEMULog), from a line
// start where one is near: QEMU writes as much as it likes there, and
// only the tail is read.
func qemuLogTail(st *vmState) []byte {
	b, _ := readTail(st.path(QEMULog), 4<<10)
	return trimTail(b, 1024)
}

// FailureReason is the tail of QEMU's own output (qemu.log), or, when it
// wrote nothing, how the QEMU this Provisioner started exited.
func (p *Provisioner) FailureReason(name string) string {
	st := p.state(name, "")
	if st == nil {
		return ""
	}
	if st.swtpmLost() {
		return "the VM's swtpm is gone while its QEMU runs: " + swtpmLogTail(st)
	}
	if tail := qemuLogTail(st); len(tail) > 0 {
		return string(tail)
	}
	st.exitMu.Lock()
	exit := st.exit
	st.exitMu.Unlock()
	if exit != "" {
		return exit
	}
	// A pidfile left behind naming no live QEMU: it was killed, or, as
	// QEMU's user cannot remove the pidfile from the VM's directory, it
	// exited while no agent watched (after an agent restart we cannot
	// know which).
	if b, err := readRegular(st.path(PidFile), 32); err == nil && st.pid() == 0 {
		return fmt.Sprintf("qemu (pid %s) is gone without a message: killed, or its guest powered off while no agent watched?", strings.TrimSpace(string(b)))
	}
	return ""
}
