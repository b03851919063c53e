package qemu

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/agent"
)

// launch is everything the QEMU command line is built from.
type launch struct {
	name    string
	dir     string // the VM's directory; QEMU runs with it as working directory
	accel   string
	vcpus   int
	memMB   int
	root    string
	seed    string
	volumes []string
	kernel  string
	initrd  string
	cmdline string
	mac     string
	sshPort int    // user-mode networking's forwarded SSH port, when tap is ""
	tap     string // the tap of a host network, or "" for user-mode networking
	runAs   string // -runas user; "" stays root
	sandbox bool
}

// escapeOpt doubles commas, QEMU's escape inside an option value.
func escapeOpt(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// diskSerial is the virtio serial a guest sees for a volume (at most 20
// bytes, the virtio-blk limit): the volume file's name without extension.
func diskSerial(path string) string {
	s := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	if len(s) > 20 {
		s = s[:20]
	}
	return escapeOpt(s)
}

// args renders the qemu-system-x86_64 arguments. The QMP socket is given
// relative to the VM's directory (QEMU's working directory) so a deep
// state directory never overflows sun_path; the pidfile is absolute and,
// with -name, identifies the process as this VM's in /proc/PID/cmdline.
func (l launch) args() []string {
	machine := "q35,accel=" + l.accel
	a := []string{
		"-name", "guest=" + l.name,
		"-machine", machine,
	}
	if l.accel == AccelKVM {
		a = append(a, "-cpu", "host")
	}
	a = append(a,
		"-smp", strconv.Itoa(l.vcpus),
		"-m", strconv.Itoa(l.memMB),
		"-nodefaults", "-no-user-config", "-display", "none",
	)
	if l.sandbox {
		a = append(a, sandboxArgs(l.runAs != "")...)
	}
	if l.runAs != "" {
		a = append(a, "-runas", l.runAs)
	}
	a = append(a,
		"-pidfile", filepath.Join(l.dir, PidFile),
		"-qmp", "unix:"+QMPSocket+",server=on,wait=off",
		"-qmp", "unix:"+QMPEventsSocket+",server=on,wait=off",
	)
	a = append(a, consoleArgs(l.dir)...)
	a = append(a,
		"-drive", "file="+escapeOpt(l.root)+",if=none,id=root,format=qcow2,cache=writeback,aio=threads,discard=unmap",
		"-device", "virtio-blk-pci,drive=root,serial=gitfleet-root,bootindex=1",
		"-drive", "file="+escapeOpt(l.seed)+",if=none,id=seed,format=raw,readonly=on",
		"-device", "virtio-blk-pci,drive=seed,serial="+SeedLabel,
	)
	for i, v := range l.volumes {
		id := "vol" + strconv.Itoa(i)
		a = append(a,
			"-drive", "file="+escapeOpt(v)+",if=none,id="+id+",format=raw,cache=writeback,aio=threads,discard=unmap",
			"-device", "virtio-blk-pci,drive="+id+",serial="+diskSerial(v),
		)
	}
	netdev := fmt.Sprintf("user,id=net0,hostfwd=tcp:127.0.0.1:%d-:22", l.sshPort)
	if l.tap != "" {
		netdev = "tap,id=net0,ifname=" + l.tap + ",script=no,downscript=no"
	}
	a = append(a,
		"-netdev", netdev,
		"-device", "virtio-net-pci,netdev=net0,mac="+l.mac,
		"-device", "virtio-rng-pci",
		// The guest agent's channel, always present: a guest that runs
		// qemu-guest-agent answers on it (readiness, addresses).
		"-chardev", "socket,id=qga0,path="+QGASocket+",server=on,wait=off",
		"-device", "virtio-serial-pci,id=serial0",
		"-device", "virtserialport,bus=serial0.0,chardev=qga0,name="+QGAChannel,
	)
	if l.kernel != "" {
		a = append(a, "-kernel", l.kernel)
		if l.initrd != "" {
			a = append(a, "-initrd", l.initrd)
		}
		if l.cmdline != "" {
			a = append(a, "-append", l.cmdline)
		}
	}
	return a
}

// scopeDevices are the only device nodes a VM's scope may open, besides
// the pseudo devices DevicePolicy=closed always allows (/dev/null,
// /dev/zero, /dev/full, /dev/random, /dev/urandom, /dev/tty, /dev/ptmx):
// KVM, and the tun device a host network's tap is attached through. No
// disk, no /dev/mem: QEMU before it drops root opens nothing else, and
// whatever it is made to open cannot reach a block device. (vhost-net is
// not used: taps run without vhost=on.) The agent's unit
// (examples/systemd/gitfleet-agent.service) allows the same.
var scopeDevices = []string{"/dev/kvm rw", "/dev/net/tun rw"}

// scopeArgs wraps a command so systemd runs it in its own transient scope
// unit, outside the agent's unit, under scopeDevices' device policy (the
// scope leaves the agent unit's cgroup, and with it the unit's policy):
// systemd-run --scope execs the command in place, so the pid stays
// QEMU's.
func scopeArgs(name string, cmd []string) []string {
	a := []string{"systemd-run", "--scope", "--quiet", "--collect", "--unit", "gitfleet-vm-" + name, "--property=DevicePolicy=closed"}
	for _, d := range scopeDevices {
		a = append(a, "--property=DeviceAllow="+d)
	}
	return append(append(a, "--"), cmd...)
}

// Boot puts the VM's NIC on its host network (a tap, with the network
// ensured first) or makes sure it has its SSH port on user-mode
// networking, writes the NoCloud seed, and starts QEMU detached (its own session; under systemd with SystemdScope,
// its own scope) so it outlives the agent. It returns once QEMU answers on
// QMP, or with QEMU's own error output when QEMU exits first. Booting a VM
// that runs is a no-op.
func (p *Provisioner) Boot(ctx context.Context, m agent.Machine) error {
	st, err := p.machineState(m)
	if err != nil {
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	log := p.log.WithField("vm", m.Name)
	if err := p.claim(st); err != nil {
		return err
	}
	if p.running(st) {
		return nil
	}
	if pid := st.pid(); pid != 0 {
		// Alive but its guest is dead (shut down, crashed): stop it first.
		if err := p.stop(ctx, st, false, log); err != nil {
			return err
		}
	}
	if err := p.checkDisks(st, m.Volumes); err != nil {
		return err
	}
	mac := macFor(m.Name)
	att, err := p.attach(ctx, st, m, mac)
	if err != nil {
		return err
	}
	a, err := p.fetchArtifacts(ctx, st, m.Spec)
	if err != nil {
		return err
	}
	files, err := p.machineSeed(st, m, mac, staticFor(m.Spec.Static, att))
	if err != nil {
		return agent.Permanent(fmt.Errorf("seed: %w", err))
	}
	if err := writeSeedISO(st.path(SeedFile), files); err != nil {
		return err
	}
	port := 0
	if att.Tap == "" {
		if port, err = p.sshPort(st); err != nil {
			return err
		}
	}
	l := launch{
		name: m.Name, dir: st.dir, accel: p.accel,
		vcpus: max(m.Spec.VCPUs, 1), memMB: m.Spec.MemoryMB,
		root: st.path(RootDiskFile), seed: st.path(SeedFile), volumes: m.Volumes,
		kernel: a.kernel, initrd: a.initrd, mac: mac, sshPort: port, tap: att.Tap,
		sandbox: !p.cfg.NoSandbox,
	}
	if p.user != nil {
		l.runAs = p.user.name
	}
	if l.memMB <= 0 {
		l.memMB = 512
	}
	if m.Spec.Kernel != nil {
		l.cmdline = m.Spec.Kernel.Cmdline
	}
	return p.start(ctx, st, l, log)
}

// checkDisks checks, before QEMU opens them as root, the root disk's
// header (checkRootDisk: a disk QEMU made name a host file is a permanent
// error) and that every volume exists.
func (p *Provisioner) checkDisks(st *vmState, volumes []string) error {
	_, err := checkRootDisk(st.path(RootDiskFile), p.cfg.CacheDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w (PrepareRootDisk first)", err)
	case errors.Is(err, ErrImageNotSelfContained), errors.Is(err, ErrUnsafeFile):
		return agent.Permanent(err)
	case err != nil:
		return err
	}
	for _, v := range volumes {
		if _, err := os.Stat(v); err != nil {
			return fmt.Errorf("volume: %w", err)
		}
	}
	return nil
}

// sshPort returns the VM's forwarded SSH port, allocating and persisting
// one when it has none or when its old one is taken by someone else.
func (p *Provisioner) sshPort(st *vmState) (int, error) {
	file := st.path(PortFile)
	port, err := readPort(file)
	if err != nil {
		p.log.WithField("vm", st.name).WithError(err).Warn("ssh port file unreadable; allocating a new port")
	}
	if port > 0 && p.reservePort(port, st.name) && portFree(port) {
		return port, nil
	}
	// Two VMs booting at once could be handed one port between probe and
	// QEMU's bind: ports given to other VMs of this Provisioner are skipped.
	for {
		if port, err = freePort(); err != nil {
			return 0, err
		}
		if p.reservePort(port, st.name) {
			break
		}
	}
	if err := writeAtomic(file, []byte(strconv.Itoa(port)+"\n"), 0o644); err != nil {
		return 0, fmt.Errorf("save ssh port: %w", err)
	}
	return port, nil
}

// reservePort records port as name's; false when another VM of this
// Provisioner has it.
func (p *Provisioner) reservePort(port int, name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if owner, ok := p.ports[port]; ok && owner != name {
		return false
	}
	for other, owner := range p.ports {
		if owner == name && other != port {
			delete(p.ports, other)
		}
	}
	p.ports[port] = name
	return true
}

// start runs QEMU and waits until it answers on QMP.
func (p *Provisioner) start(ctx context.Context, st *vmState, l launch, log *logrus.Entry) error {
	st.stopWatch()
	logf, err := prepareStart(st)
	if err != nil {
		return err
	}
	defer logf.Close()
	argv := append([]string{p.cfg.QEMU}, l.args()...)
	if p.scope {
		argv = scopeArgs(l.name, argv)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = st.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// A session of its own: no signal aimed at the agent's process group
	// (a terminal's ^C, a unit's stop) reaches QEMU.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	st.exitMu.Lock()
	st.exit = ""
	st.starts++
	start := st.starts
	st.exitMu.Unlock()
	started := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", argv[0], err)
	}
	exited := make(chan struct{})
	go func() {
		// Reap QEMU when it exits while this agent runs, and keep how.
		err := cmd.Wait()
		st.exitMu.Lock()
		// A QEMU reaped after a newer one started (a stop that saw
		// it gone before this goroutine ran) says nothing of the new one.
		switch {
		case st.starts != start:
		case err != nil:
			st.exit = "qemu exited: " + err.Error()
		default:
			st.exit = "qemu exited"
		}
		st.exitMu.Unlock()
		close(exited)
	}()
	log.WithFields(logrus.Fields{"pid": cmd.Process.Pid, "accel": l.accel, "ssh": l.sshPort, "tap": l.tap}).Info("qemu started")
	status, err := p.waitQMP(ctx, st, cmd, exited, log)
	if err != nil {
		return err
	}
	log.WithFields(logrus.Fields{"status": status, "seconds": time.Since(started).Seconds()}).Info("qemu up")
	p.watch(st, st.pid()) // probe the guest from now on
	return nil
}

// prepareStart clears what an earlier QEMU left in the VM's directory
// (pidfile, sockets, readiness), prepares the serial log and makes a new
// qemu.log, returned open for QEMU's output. Every name is removed or
// created anew, never written through (vmfile.go).
func prepareStart(st *vmState) (*os.File, error) {
	for _, f := range []string{PidFile, QMPSocket, QMPEventsSocket, QGASocket, SerialSocket, ReadyFile} {
		if err := os.Remove(st.path(f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("clear stale %s: %w", f, err)
		}
	}
	if err := prepareSerialLog(st.dir, time.Now()); err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	logf, err := createRegular(st.path(QEMULog), 0o600)
	if err != nil {
		return nil, fmt.Errorf("qemu log: %w", err)
	}
	return logf, nil
}

// waitQMP waits until the QEMU cmd started answers on QMP and returns
// its run state; it fails with QEMU's own output when QEMU exits first
// (exited closes), and kills it after BootTimeout.
func (p *Provisioner) waitQMP(ctx context.Context, st *vmState, cmd *exec.Cmd, exited chan struct{}, log *logrus.Entry) (string, error) {
	wait, cancel := context.WithTimeout(ctx, p.cfg.BootTimeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-exited:
			st.exitMu.Lock()
			exit := st.exit // "qemu exited[: exit status N]"
			st.exitMu.Unlock()
			if exit == "" {
				exit = "qemu exited"
			}
			reason := p.failureText(st)
			log.WithField("reason", reason).Error("qemu exited during boot")
			return "", fmt.Errorf("%s: %s", exit, reason)
		case <-wait.Done():
			cmd.Process.Kill()
			<-exited
			return "", fmt.Errorf("qemu did not answer on QMP within %s: %s", p.cfg.BootTimeout, p.failureText(st))
		case <-tick.C:
		}
		if st.pid() == 0 {
			continue
		}
		qctx, qcancel := context.WithTimeout(wait, time.Second)
		status, err := qmpStatus(qctx, st.path(QMPSocket))
		qcancel()
		if err == nil {
			return status, nil
		}
	}
}

// failureText is QEMU's own output of the run start just began (its log
// is made anew at every start), or "(no output)".
func (p *Provisioner) failureText(st *vmState) string {
	if tail := qemuLogTail(st); len(tail) > 0 {
		return string(tail)
	}
	return "(no output)"
}

// Shutdown stops the VM: ACPI powerdown over QMP, then, each after its
// timeout, QMP quit, SIGTERM and SIGKILL. Stopping a stopped VM is a no-op;
// disks are kept.
func (p *Provisioner) Shutdown(ctx context.Context, name string) error {
	st := p.state(name, "")
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return p.stop(ctx, st, true, p.log.WithField("vm", name))
}

// stop runs the stop ladder; graceful=false skips the ACPI powerdown.
func (p *Provisioner) stop(ctx context.Context, st *vmState, graceful bool, log *logrus.Entry) error {
	pid := st.pid()
	if pid == 0 {
		return nil
	}
	sock := st.path(QMPSocket)
	type step struct {
		name    string
		do      func() error
		timeout time.Duration
	}
	steps := []step{
		{"powerdown", func() error { _, err := qmpCommand(ctx, sock, "system_powerdown", nil); return err }, p.cfg.PowerdownTimeout},
		{"quit", func() error { _, err := qmpCommand(ctx, sock, "quit", nil); return err }, p.cfg.KillTimeout},
		{"sigterm", func() error { return syscall.Kill(pid, syscall.SIGTERM) }, p.cfg.KillTimeout},
		{"sigkill", func() error { return syscall.Kill(pid, syscall.SIGKILL) }, p.cfg.KillTimeout},
	}
	if !graceful {
		steps = steps[1:]
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			log.WithField("step", s.name).WithError(err).Warn("stop step failed")
		}
		if p.waitGone(ctx, st, s.timeout) {
			log.WithField("step", s.name).Info("qemu stopped")
			st.stopWatch()
			os.Remove(sock)
			os.Remove(st.path(SerialSocket))
			os.Remove(st.path(PidFile))
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("stop %s: %w", st.name, ctx.Err())
		}
	}
	return fmt.Errorf("stop %s: qemu pid %d survived SIGKILL", st.name, pid)
}

// waitGone waits up to timeout for the VM's QEMU to be gone.
func (p *Provisioner) waitGone(ctx context.Context, st *vmState, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if st.pid() == 0 {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Destroy stops the VM and removes every file the backend made in its
// directory (see the package comment). Volumes, and anything else in the
// directory, are left alone. Destroying an absent VM is a no-op.
func (p *Provisioner) Destroy(ctx context.Context, name string) error {
	st := p.state(name, "")
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	log := p.log.WithField("vm", name)
	if err := p.stop(ctx, st, true, log); err != nil {
		return err
	}
	if p.cfg.Networks != nil {
		if err := p.cfg.Networks.Detach(name); err != nil {
			return err
		}
	}
	if err := p.dropSnapshot(st); err != nil {
		return err
	}
	for _, f := range ownedFiles {
		if err := os.RemoveAll(st.path(f)); err != nil {
			return fmt.Errorf("remove %s: %w", f, err)
		}
	}
	p.mu.Lock()
	delete(p.machines, name)
	for port, owner := range p.ports {
		if owner == name {
			delete(p.ports, port)
		}
	}
	p.mu.Unlock()
	log.Info("destroyed")
	return nil
}
