// Package agenttest is test support for package agent: Provisioner, an
// in-memory implementation of agent.Provisioner that keeps VMs as entries in
// a map, hands out sticky addresses, and lets a test inject errors, crashes,
// host reboots, late addresses, silent guests and the hypervisor's failure
// reason.
//
// It is a real implementation of the seam, not a script: Boot refuses a
// volume path that is not a file (as a hypervisor would), Destroy releases
// the address, PrepareRootDisk never shrinks a disk.
package agenttest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"time"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
)

var (
	_ agent.Provisioner      = (*Provisioner)(nil)
	_ agent.ProgressReporter = (*Provisioner)(nil)
	_ agent.AccelReporter    = (*Provisioner)(nil)
)

// Op names a Provisioner method, for recorded calls and injected errors.
type Op string

// The operations a Provisioner records.
const (
	OpPreflight Op = "preflight"
	OpRootDisk  Op = "rootdisk"
	OpStage     Op = "stage"
	OpBoot      Op = "boot"
	OpShutdown  Op = "shutdown"
	OpDestroy   Op = "destroy"
)

// Call is one recorded invocation, failed ones included.
type Call struct {
	Op   Op
	Name string // empty for Preflight
}

// Hook runs at the start of every operation, before injected errors; a
// non-nil error fails the operation. It may block (until ctx ends, to play a
// wedged hypervisor).
type Hook func(ctx context.Context, op Op, name string) error

// Provisioner keeps VMs in memory. The zero value is not usable; call New.
// Safe for concurrent use.
type Provisioner struct {
	mu       sync.Mutex
	running  map[string]bool
	disks    map[string]int // root disk size in GiB
	addrs    map[string]agent.Address
	booted   map[string]agent.Machine
	staged   map[string]agent.Machine
	online   map[string]int // root disk growths while running
	reasons  map[string]string
	progress map[string][2]int64
	sticky   map[Op]error
	once     map[Op]error
	calls    []Call
	nextIP   int
	late     bool
	hook     Hook
	// boots holds each running VM's Readiness; silent makes new boots wait
	// for Answer instead of answering at once.
	boots  map[string]agent.Readiness
	silent bool
	now    func() time.Time
}

// guestIPFormat makes the n-th guest's address (n from 2).
const guestIPFormat = "10.77.1.%d"

// New returns an empty in-memory Provisioner whose guests get addresses
// 10.77.1.2, 10.77.1.3, … and SSH forwards 127.0.0.1:2202, …
func New() *Provisioner {
	return &Provisioner{
		running:  map[string]bool{},
		disks:    map[string]int{},
		addrs:    map[string]agent.Address{},
		booted:   map[string]agent.Machine{},
		staged:   map[string]agent.Machine{},
		online:   map[string]int{},
		reasons:  map[string]string{},
		progress: map[string][2]int64{},
		sticky:   map[Op]error{},
		once:     map[Op]error{},
		boots:    map[string]agent.Readiness{},
		nextIP:   2,
		now:      time.Now,
	}
}

// SetSilentGuests makes the guests of later boots stay silent (booting)
// until Answer; by default a guest answers over SSH the moment it boots.
func (p *Provisioner) SetSilentGuests(silent bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.silent = silent
}

// SetClock sets the clock that stamps boots and answers (default time.Now),
// to match an engine's EngineConfig.Now.
func (p *Provisioner) SetClock(now func() time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.now = now
}

// Answer plays the running guest name proving it is up, via how (one of
// agent.ReadySSH, agent.ReadyGuestAgent, agent.ReadyConsole). It does
// nothing for a VM that does not run.
func (p *Provisioner) Answer(name, via string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answerLocked(name, via)
}

func (p *Provisioner) answerLocked(name, via string) {
	r, ok := p.boots[name]
	if !ok || !p.running[name] || r.Ready {
		return
	}
	if r.At.IsZero() {
		r.At, r.Via = p.now(), via
		if via == agent.ReadySSH {
			r.Addr = p.addrs[name].SSH
		}
	}
	r.Ready, r.Refused = true, time.Time{}
	p.boots[name] = r
}

// Refuse plays the running guest name, ready by SSH, having its sshd
// refuse: the guest counts as reached by SSH (SSHRequired) and is no
// longer ready until Answer. It does nothing for a VM that does not run
// or is not ready by SSH.
func (p *Provisioner) Refuse(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.boots[name]
	if !ok || !p.running[name] || !r.Ready || r.Via != agent.ReadySSH {
		return
	}
	r.SSHRequired, r.Ready, r.Refused = true, false, p.now()
	p.boots[name] = r
}

// FailAlways makes every call of op fail with err until cleared with nil.
func (p *Provisioner) FailAlways(op Op, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		delete(p.sticky, op)
		return
	}
	p.sticky[op] = err
}

// FailOnce makes the next call of op fail with err.
func (p *Provisioner) FailOnce(op Op, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.once[op] = err
}

// SetHook installs h (nil removes it).
func (p *Provisioner) SetHook(h Hook) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hook = h
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
	p.attachLocked(name)
}

// ForgetAddresses drops every address the backend knows, as a restarted
// backend that cannot answer for running guests.
func (p *Provisioner) ForgetAddresses() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.addrs = map[string]agent.Address{}
}

// Crash ends the VM's process without a stop request.
func (p *Provisioner) Crash(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running[name] = false
}

// Reboot plays a host reboot: every VM stops.
func (p *Provisioner) Reboot() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running = map[string]bool{}
}

// SetFailureReason sets what the "hypervisor" left behind for name.
func (p *Provisioner) SetFailureReason(name, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reasons[name] = reason
}

// SetProgress sets what VMProgress answers for name: bytes done of total
// (-1 unknown). A negative done clears it.
func (p *Provisioner) SetProgress(name string, done, total int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if done < 0 {
		delete(p.progress, name)
		return
	}
	p.progress[name] = [2]int64{done, total}
}

// Calls returns the names of every recorded call of op, in order.
func (p *Provisioner) Calls(op Op) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, c := range p.calls {
		if c.Op == op {
			out = append(out, c.Name)
		}
	}
	return out
}

// AllCalls returns every recorded call, in order.
func (p *Provisioner) AllCalls() []Call {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Call(nil), p.calls...)
}

// ResetCalls forgets the recorded calls.
func (p *Provisioner) ResetCalls() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = nil
}

// BootedWith returns the Machine name was last booted with.
func (p *Provisioner) BootedWith(name string) (agent.Machine, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m, ok := p.booted[name]
	return m, ok
}

// DiskGB is the size of name's root disk in GiB, 0 when it has none.
func (p *Provisioner) DiskGB(name string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.disks[name]
}

// RunningCount is the number of running VMs.
func (p *Provisioner) RunningCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, r := range p.running {
		if r {
			n++
		}
	}
	return n
}

// begin records the call and returns the error it should fail with.
func (p *Provisioner) begin(ctx context.Context, op Op, name string) error {
	p.mu.Lock()
	p.calls = append(p.calls, Call{Op: op, Name: name})
	hook := p.hook
	p.mu.Unlock()
	if hook != nil {
		if err := hook(ctx, op, name); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err, ok := p.once[op]; ok {
		delete(p.once, op)
		return err
	}
	return p.sticky[op]
}

// Preflight implements agent.Provisioner.
func (p *Provisioner) Preflight(ctx context.Context) error { return p.begin(ctx, OpPreflight, "") }

// PrepareRootDisk implements agent.Provisioner: it creates the root disk at
// Spec.DiskGB, or grows it (online when the VM runs, as QEMU's block_resize
// does); a smaller size leaves it as it is. Grown records each growth of a
// running VM's disk.
func (p *Provisioner) PrepareRootDisk(ctx context.Context, m agent.Machine) error {
	if err := p.begin(ctx, OpRootDisk, m.Name); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if m.Spec.DiskGB > p.disks[m.Name] {
		if p.running[m.Name] {
			p.online[m.Name]++
		}
		p.disks[m.Name] = m.Spec.DiskGB
	}
	return nil
}

// GrownOnline reports how many times name's root disk was grown while the
// VM ran.
func (p *Provisioner) GrownOnline(name string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.online[name]
}

// Stage implements agent.Provisioner: it records the call and fails only
// as injected (FailOnce, FailAlways), leaving the VM as it is.
func (p *Provisioner) Stage(ctx context.Context, m agent.Machine) error {
	if err := p.begin(ctx, OpStage, m.Name); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.staged[m.Name] = m
	return nil
}

// StagedWith returns the Machine name was last staged with.
func (p *Provisioner) StagedWith(name string) (agent.Machine, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m, ok := p.staged[name]
	return m, ok
}

// Boot implements agent.Provisioner. It fails, as a hypervisor would, when
// the VM has no root disk or a volume path is not a file.
func (p *Provisioner) Boot(ctx context.Context, m agent.Machine) error {
	if err := p.begin(ctx, OpBoot, m.Name); err != nil {
		return err
	}
	for _, v := range m.Volumes {
		if _, err := os.Stat(v); errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("boot %s: volume %s: %w", m.Name, v, err)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.disks[m.Name] == 0 {
		return fmt.Errorf("boot %s: no root disk", m.Name)
	}
	if p.running[m.Name] {
		return nil
	}
	p.booted[m.Name] = m
	p.running[m.Name] = true
	if !p.late {
		p.attachLocked(m.Name)
	}
	p.boots[m.Name] = agent.Readiness{Booted: p.now()}
	if !p.silent {
		p.answerLocked(m.Name, agent.ReadySSH)
	}
	return nil
}

func (p *Provisioner) attachLocked(name string) {
	if _, ok := p.addrs[name]; ok {
		return
	}
	n := p.nextIP
	p.nextIP++
	p.addrs[name] = agent.Address{IP: fmt.Sprintf(guestIPFormat, n), SSH: fmt.Sprintf("127.0.0.1:%d", 2200+n)}
}

// Shutdown implements agent.Provisioner.
func (p *Provisioner) Shutdown(ctx context.Context, name string) error {
	if err := p.begin(ctx, OpShutdown, name); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running[name] = false
	delete(p.boots, name)
	return nil
}

// Destroy implements agent.Provisioner: the VM, its disk and its address
// go.
func (p *Provisioner) Destroy(ctx context.Context, name string) error {
	if err := p.begin(ctx, OpDestroy, name); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.running, name)
	delete(p.disks, name)
	delete(p.addrs, name)
	delete(p.booted, name)
	delete(p.boots, name)
	return nil
}

// Readiness implements agent.Provisioner: the zero value for a VM that
// does not run.
func (p *Provisioner) Readiness(name string) agent.Readiness {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running[name] {
		return agent.Readiness{}
	}
	return p.boots[name]
}

// Running implements agent.Provisioner.
func (p *Provisioner) Running(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running[name]
}

// Address implements agent.Provisioner.
func (p *Provisioner) Address(name string) agent.Address {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addrs[name]
}

// FailureReason implements agent.Provisioner.
func (p *Provisioner) FailureReason(name string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reasons[name]
}

// VMProgress implements agent.ProgressReporter.
func (p *Provisioner) VMProgress(name string) (done, total int64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.progress[name]
	return v[0], v[1], ok
}

// Accel implements agent.AccelReporter; the in-memory backend reports
// "none".
func (p *Provisioner) Accel() string { return "none" }

// Spec is a convenience for tests: a minimal valid VM spec on host.
func Spec(host string) desired.VMSpec {
	return desired.VMSpec{
		Host: host, VCPUs: 1, MemoryMB: 512, DiskGB: 5,
		Image: &desired.Artifact{URL: "https://images.example/base.qcow2", SHA256: "aa" + fmt.Sprintf("%062d", 0)},
		Power: desired.PowerRunning,
	}
}
