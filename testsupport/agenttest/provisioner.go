// Package agenttest is test support for package agent: Provisioner wraps
// the in-memory provisioner of package inmem with fault injection. A test
// can fail a call once or always, block it in a Hook (to play a wedged
// hypervisor), read back every call made, and set what the hypervisor
// reports as a VM's failure reason or download progress. Everything else
// (the VM table, crashes, reboots, guests that answer late) is inmem's.
//
// Binaries never import this package; the `memory` backend of `gitfleet
// agent` is inmem.Provisioner itself.
package agenttest

import (
	"context"
	"fmt"
	"sync"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/inmem"
	"github.com/gitfleet/gitfleet/desired"
)

var (
	_ agent.Provisioner      = (*Provisioner)(nil)
	_ agent.ProgressReporter = (*Provisioner)(nil)
	_ agent.AccelReporter    = (*Provisioner)(nil)
	_ agent.LeaseReporter    = (*Provisioner)(nil)
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

// Provisioner is an inmem.Provisioner with fault injection. The zero value
// is not usable; call New. Safe for concurrent use.
type Provisioner struct {
	*inmem.Provisioner

	mu       sync.Mutex
	reasons  map[string]string
	progress map[string][2]int64
	unleased map[string]error
	sticky   map[Op]error
	once     map[Op]error
	calls    []Call
	hook     Hook
}

// New returns a Provisioner over an empty inmem.New table: guests get
// addresses 10.77.1.2, 10.77.1.3, … and SSH forwards 127.0.0.1:2202, …
func New() *Provisioner {
	return &Provisioner{
		Provisioner: inmem.New(),
		reasons:     map[string]string{},
		progress:    map[string][2]int64{},
		unleased:    map[string]error{},
		sticky:      map[Op]error{},
		once:        map[Op]error{},
	}
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

// begin records the call and returns the error it should fail with: the
// hook's, the context's, then an injected one.
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
func (p *Provisioner) Preflight(ctx context.Context) error {
	if err := p.begin(ctx, OpPreflight, ""); err != nil {
		return err
	}
	return p.Provisioner.Preflight(ctx)
}

// PrepareRootDisk implements agent.Provisioner.
func (p *Provisioner) PrepareRootDisk(ctx context.Context, m agent.Machine) error {
	if err := p.begin(ctx, OpRootDisk, m.Name); err != nil {
		return err
	}
	return p.Provisioner.PrepareRootDisk(ctx, m)
}

// Stage implements agent.Provisioner.
func (p *Provisioner) Stage(ctx context.Context, m agent.Machine) error {
	if err := p.begin(ctx, OpStage, m.Name); err != nil {
		return err
	}
	return p.Provisioner.Stage(ctx, m)
}

// Boot implements agent.Provisioner.
func (p *Provisioner) Boot(ctx context.Context, m agent.Machine) error {
	if err := p.begin(ctx, OpBoot, m.Name); err != nil {
		return err
	}
	return p.Provisioner.Boot(ctx, m)
}

// Shutdown implements agent.Provisioner.
func (p *Provisioner) Shutdown(ctx context.Context, name string) error {
	if err := p.begin(ctx, OpShutdown, name); err != nil {
		return err
	}
	return p.Provisioner.Shutdown(ctx, name)
}

// Destroy implements agent.Provisioner.
func (p *Provisioner) Destroy(ctx context.Context, name string) error {
	if err := p.begin(ctx, OpDestroy, name); err != nil {
		return err
	}
	return p.Provisioner.Destroy(ctx, name)
}

// FailureReason implements agent.Provisioner: what SetFailureReason set.
func (p *Provisioner) FailureReason(name string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reasons[name]
}

// VMProgress implements agent.ProgressReporter: what SetProgress set.
func (p *Provisioner) VMProgress(name string) (done, total int64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.progress[name]
	return v[0], v[1], ok
}

// SetUnleased sets what Unleased answers for name: why its guest holds no
// lease of its address (nil: it holds it, the default).
func (p *Provisioner) SetUnleased(name string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unleased[name] = err
}

// Unleased implements agent.LeaseReporter: what SetUnleased set, for a VM
// that runs.
func (p *Provisioner) Unleased(name string) error {
	if !p.Running(name) {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.unleased[name]
}

// Spec is a convenience for tests: a minimal valid VM spec on host.
func Spec(host string) desired.VMSpec {
	return desired.VMSpec{
		Host: host, VCPUs: 1, MemoryMB: 512, DiskGB: 5,
		Image: &desired.Artifact{URL: "https://images.example/base.qcow2", SHA256: "aa" + fmt.Sprintf("%062d", 0)},
		Power: desired.PowerRunning,
	}
}
