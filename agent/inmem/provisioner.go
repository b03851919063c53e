// Package inmem is an in-memory agent.Provisioner: VMs are entries in a
// table, nothing boots and no guest runs. It is the `memory` backend of
// `gitfleet agent` (for trying gitfleet out and for tests of the packages
// above the provisioner seam), in the spirit of raft's InmemStore: a real
// implementation of the seam, small enough to read at once, never a
// hypervisor.
//
// It behaves as a hypervisor would where the engine can tell: Boot refuses
// a VM without a root disk or with a volume path that is not a file,
// PrepareRootDisk never shrinks a disk, Destroy releases the VM's address,
// and every guest answers SSH the moment it boots, at a sticky address
// (10.77.1.2, 10.77.1.3, … with forwards 127.0.0.1:2202, …).
//
// A Provisioner made by Open keeps its table in a file (JSON, written by
// rename after every operation that changes it), so a later process (an
// agent run with --once, say) finds the VMs of the earlier one as a real
// hypervisor's VMs outlive the agent. One made by New keeps nothing.
//
// The world events a test plays (a crash, a host reboot, a guest that
// answers late or asks for its address late) are methods here, since they
// change the table; fault injection (failing or blocking calls, call
// records) is package agenttest's, which tests import and binaries do not.
package inmem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/google/renameio/v2"
)

var (
	_ agent.Provisioner      = (*Provisioner)(nil)
	_ agent.ProgressReporter = (*Provisioner)(nil)
	_ agent.AccelReporter    = (*Provisioner)(nil)
)

// guestIPFormat makes the n-th guest's address (n from 2); guestSSHBase+n
// is its SSH forward's port on 127.0.0.1.
const (
	guestIPFormat = "10.77.1.%d"
	guestSSHBase  = 2200
)

// StateFile is the name the agent gives the table's file in its state
// directory for the memory backend.
const StateFile = "memory-backend.json"

// stateVersion is the version of the file Open reads and writes.
const stateVersion = 1

// vm is one table entry. Its JSON form is the state file's.
type vm struct {
	DiskGB  int             `json:"diskGB"`
	Running bool            `json:"running"`
	Addr    agent.Address   `json:"addr"`
	Boot    agent.Readiness `json:"boot"`
	// Online counts root disk growths while the VM ran; Booted and
	// Staged are the Machines of the last Boot and Stage.
	Online int            `json:"online,omitempty"`
	Booted *agent.Machine `json:"-"`
	Staged *agent.Machine `json:"-"`
}

// state is the table and the state file's content.
type state struct {
	Version int            `json:"version"`
	NextIP  int            `json:"nextIP"`
	VMs     map[string]*vm `json:"vms"`
}

// Provisioner keeps VMs in a table. The zero value is not usable; call New
// or Open. Safe for concurrent use.
type Provisioner struct {
	mu     sync.Mutex
	st     state
	path   string // "" for New: nothing is written
	late   bool
	silent bool
	now    func() time.Time
}

// New returns an empty Provisioner that keeps nothing beyond the process.
func New() *Provisioner {
	return &Provisioner{st: state{Version: stateVersion, NextIP: 2, VMs: map[string]*vm{}}, now: time.Now}
}

// Open returns a Provisioner whose table lives in the file at path: read
// now when it exists (an absent file is an empty table), written after
// every operation that changes it. A file it cannot read or parse is an
// error, never an empty table: that would read as every VM gone.
func Open(path string) (*Provisioner, error) {
	p := New()
	p.path = path
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return p, nil
	}
	if err != nil {
		return nil, fmt.Errorf("memory backend: %w", err)
	}
	var st state
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("memory backend: parse %s: %w", path, err)
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("memory backend: %s: version %d, this agent reads version %d", path, st.Version, stateVersion)
	}
	if st.VMs == nil {
		st.VMs = map[string]*vm{}
	}
	if st.NextIP < 2 {
		st.NextIP = 2
	}
	p.st = st
	return p, nil
}

// saveLocked writes the table to p.path (when set) by rename, so a crash
// leaves the old file or the new one.
func (p *Provisioner) saveLocked() error {
	if p.path == "" {
		return nil
	}
	data, err := json.Marshal(&p.st)
	if err != nil {
		return fmt.Errorf("memory backend: encode: %w", err)
	}
	if err := renameio.WriteFile(p.path, data, 0o600, renameio.WithTempDir(filepath.Dir(p.path))); err != nil {
		return fmt.Errorf("memory backend: save %s: %w", p.path, err)
	}
	return nil
}

// entryLocked returns name's entry, creating an empty one.
func (p *Provisioner) entryLocked(name string) *vm {
	v := p.st.VMs[name]
	if v == nil {
		v = &vm{}
		p.st.VMs[name] = v
	}
	return v
}

// SetClock sets the clock that stamps boots and answers (default
// time.Now), to match an engine's EngineConfig.Now.
func (p *Provisioner) SetClock(now func() time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.now = now
}

// SetSilentGuests makes the guests of later boots stay booting until
// Answer; by default a guest answers over SSH the moment it boots.
func (p *Provisioner) SetSilentGuests(silent bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.silent = silent
}

// Answer plays the running guest name proving it is up, via how (one of
// agent.ReadySSH, agent.ReadyGuestAgent, agent.ReadyConsole). It does
// nothing for a VM that does not run or has answered.
func (p *Provisioner) Answer(name, via string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answerLocked(name, via)
}

func (p *Provisioner) answerLocked(name, via string) {
	v := p.st.VMs[name]
	if v == nil || !v.Running || v.Boot.Ready {
		return
	}
	if v.Boot.At.IsZero() {
		v.Boot.At, v.Boot.Via = p.now(), via
		if via == agent.ReadySSH {
			v.Boot.Addr = v.Addr.SSH
		}
	}
	v.Boot.Ready, v.Boot.Refused, v.Boot.HeldBy = true, time.Time{}, ""
}

// Refuse plays the running guest name, ready by SSH, having its sshd
// refuse: the guest counts as reached by SSH (SSHRequired) and is not
// ready until Answer. It does nothing for a VM that does not run or is not
// ready by SSH.
func (p *Provisioner) Refuse(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v := p.st.VMs[name]
	if v == nil || !v.Running || !v.Boot.Ready || v.Boot.Via != agent.ReadySSH {
		return
	}
	v.Boot.SSHRequired, v.Boot.Ready, v.Boot.Refused = true, false, p.now()
}

// Impostor plays another machine, holder (a MAC address, or "host"),
// answering at the running guest name's SSH address after the guest was
// ready by SSH: as Refuse, with Readiness.HeldBy set to holder.
func (p *Provisioner) Impostor(name, holder string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v := p.st.VMs[name]
	if v == nil || !v.Running || !v.Boot.Ready || v.Boot.Via != agent.ReadySSH {
		return
	}
	v.Boot.SSHRequired, v.Boot.Ready, v.Boot.Refused, v.Boot.HeldBy = true, false, p.now(), holder
}

// SetLateAddress switches to the shape of a host-run DHCP server: Boot
// assigns no address; one exists only after AnswerAddress.
func (p *Provisioner) SetLateAddress(late bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.late = late
}

// AnswerAddress plays the guest asking for its address after boot.
func (p *Provisioner) AnswerAddress(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.attachLocked(p.entryLocked(name))
}

func (p *Provisioner) attachLocked(v *vm) {
	if v.Addr.IP != "" {
		return
	}
	n := p.st.NextIP
	p.st.NextIP++
	v.Addr = agent.Address{IP: fmt.Sprintf(guestIPFormat, n), SSH: fmt.Sprintf("127.0.0.1:%d", guestSSHBase+n)}
}

// ForgetAddresses drops every address the backend knows, as a restarted
// backend that cannot answer for running guests.
func (p *Provisioner) ForgetAddresses() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, v := range p.st.VMs {
		v.Addr = agent.Address{}
	}
}

// Crash ends the VM's process without a stop request.
func (p *Provisioner) Crash(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if v := p.st.VMs[name]; v != nil {
		v.Running = false
	}
}

// Reboot plays a host reboot: every VM stops.
func (p *Provisioner) Reboot() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, v := range p.st.VMs {
		v.Running = false
	}
}

// BootedWith returns the Machine name was last booted with in this
// process.
func (p *Provisioner) BootedWith(name string) (agent.Machine, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if v := p.st.VMs[name]; v != nil && v.Booted != nil {
		return *v.Booted, true
	}
	return agent.Machine{}, false
}

// StagedWith returns the Machine name was last staged with in this
// process.
func (p *Provisioner) StagedWith(name string) (agent.Machine, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if v := p.st.VMs[name]; v != nil && v.Staged != nil {
		return *v.Staged, true
	}
	return agent.Machine{}, false
}

// DiskGB is the size of name's root disk in GiB, 0 when it has none.
func (p *Provisioner) DiskGB(name string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if v := p.st.VMs[name]; v != nil {
		return v.DiskGB
	}
	return 0
}

// GrownOnline reports how many times name's root disk was grown while the
// VM ran.
func (p *Provisioner) GrownOnline(name string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if v := p.st.VMs[name]; v != nil {
		return v.Online
	}
	return 0
}

// RunningCount is the number of running VMs.
func (p *Provisioner) RunningCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, v := range p.st.VMs {
		if v.Running {
			n++
		}
	}
	return n
}

// Preflight implements agent.Provisioner: it checks that the state file's
// directory takes a write, when there is a state file.
func (p *Provisioner) Preflight(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.saveLocked()
}

// PrepareRootDisk implements agent.Provisioner: it creates the root disk at
// Spec.DiskGB, or grows it (online when the VM runs, as QEMU's block_resize
// does); a smaller size leaves it as it is.
func (p *Provisioner) PrepareRootDisk(ctx context.Context, m agent.Machine) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	v := p.entryLocked(m.Name)
	if m.Spec.DiskGB > v.DiskGB {
		if v.Running {
			v.Online++
		}
		v.DiskGB = m.Spec.DiskGB
	}
	return p.saveLocked()
}

// Stage implements agent.Provisioner: it records the Machine (StagedWith)
// and leaves the VM as it is.
func (p *Provisioner) Stage(ctx context.Context, m agent.Machine) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.entryLocked(m.Name).Staged = &m
	return nil
}

// Boot implements agent.Provisioner. It fails, as a hypervisor would, when
// the VM has no root disk or a volume path is not a file; booting a running
// VM does nothing.
func (p *Provisioner) Boot(ctx context.Context, m agent.Machine) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, path := range m.Volumes {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("boot %s: volume %s: %w", m.Name, path, err)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	v := p.st.VMs[m.Name]
	if v == nil || v.DiskGB == 0 {
		return fmt.Errorf("boot %s: no root disk", m.Name)
	}
	if v.Running {
		return nil
	}
	v.Booted = &m
	v.Running = true
	if !p.late {
		p.attachLocked(v)
	}
	v.Boot = agent.Readiness{Booted: p.now()}
	if !p.silent {
		p.answerLocked(m.Name, agent.ReadySSH)
	}
	return p.saveLocked()
}

// Shutdown implements agent.Provisioner: the VM stops and keeps its disk
// and address.
func (p *Provisioner) Shutdown(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if v := p.st.VMs[name]; v != nil {
		v.Running = false
		v.Boot = agent.Readiness{}
	}
	return p.saveLocked()
}

// Destroy implements agent.Provisioner: the VM, its disk and its address
// go. Destroying an absent VM succeeds.
func (p *Provisioner) Destroy(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.st.VMs, name)
	return p.saveLocked()
}

// Readiness implements agent.Provisioner: the zero value for a VM that
// does not run.
func (p *Provisioner) Readiness(name string) agent.Readiness {
	p.mu.Lock()
	defer p.mu.Unlock()
	if v := p.st.VMs[name]; v != nil && v.Running {
		return v.Boot
	}
	return agent.Readiness{}
}

// Running implements agent.Provisioner.
func (p *Provisioner) Running(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	v := p.st.VMs[name]
	return v != nil && v.Running
}

// Address implements agent.Provisioner.
func (p *Provisioner) Address(name string) agent.Address {
	p.mu.Lock()
	defer p.mu.Unlock()
	if v := p.st.VMs[name]; v != nil {
		return v.Addr
	}
	return agent.Address{}
}

// FailureReason implements agent.Provisioner: nothing ever fails here, so
// it is always "".
func (p *Provisioner) FailureReason(string) string { return "" }

// VMProgress implements agent.ProgressReporter: there are no downloads.
func (p *Provisioner) VMProgress(string) (done, total int64, ok bool) { return 0, 0, false }

// Accel implements agent.AccelReporter: "none".
func (p *Provisioner) Accel() string { return "none" }
