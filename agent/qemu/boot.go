package qemu

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/desired"
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
	sshPort int         // user-mode networking's forwarded SSH port, when tap is ""
	tap     string      // the tap of a host network, or "" for user-mode networking
	model   string      // the first NIC's QEMU device; "" is desired.DefaultNICModel
	more    []launchNIC // the NICs after the first, each on a host network
	runAs   string      // -runas user; "" stays root
	sandbox bool
	machineModel
	// vars is the VM's UEFI variables file, with fw set.
	vars string
	// tpmFD is the QEMU end of the swtpm control channel as QEMU's file
	// descriptor number, with tpm set (0 otherwise).
	tpmFD int
}

// launchNIC is a NIC after a VM's first: its tap, MAC and QEMU device.
type launchNIC struct{ tap, mac, model string }

// machineModel is what a VM's machine is, resolved from its spec for
// this host (Provisioner.machineModel).
type machineModel struct {
	arch    archInfo
	machine string // QEMU machine type
	cpu     string // QEMU CPU model, "" for QEMU's default
	fw      *uefiFirmware
	tpm     bool
}

// qemuNameRE is a QEMU machine type or CPU model as desired validates
// them: no comma, so no option rides along.
var qemuNameRE = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9_.]{0,63}$`)

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
	machine := l.machine
	if machine == "" {
		machine = "q35"
	}
	machine += ",accel=" + l.accel
	if l.fw != nil && l.fw.smm {
		machine += ",smm=on"
	}
	a := []string{
		"-name", "guest=" + l.name,
		"-machine", machine,
	}
	cpu := l.cpu
	if cpu == "" && l.accel == AccelKVM {
		cpu = "host"
	}
	if cpu != "" {
		a = append(a, "-cpu", cpu)
	}
	a = append(a,
		"-smp", strconv.Itoa(l.vcpus),
		"-m", strconv.Itoa(l.memMB),
		"-nodefaults", "-no-user-config", "-display", "none",
	)
	a = append(a, l.firmwareArgs()...)
	a = append(a, l.tpmArgs()...)
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
	a = append(a, l.diskArgs()...)
	a = append(a, l.nicArgs()...)
	a = append(a,
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

// diskArgs attaches the root disk (qcow2, booted first), the NoCloud
// seed read-only when there is one, and each volume (raw), each with
// the serial the guest finds it by.
func (l launch) diskArgs() []string {
	a := []string{
		"-drive", "file=" + escapeOpt(l.root) + ",if=none,id=root,format=qcow2,cache=writeback,aio=threads,discard=unmap",
		"-device", "virtio-blk-pci,drive=root,serial=gitfleet-root,bootindex=1",
	}
	if l.seed != "" {
		a = append(a,
			"-drive", "file="+escapeOpt(l.seed)+",if=none,id=seed,format=raw,readonly=on",
			"-device", "virtio-blk-pci,drive=seed,serial="+SeedLabel,
		)
	}
	for i, v := range l.volumes {
		id := "vol" + strconv.Itoa(i)
		a = append(a,
			"-drive", "file="+escapeOpt(v)+",if=none,id="+id+",format=raw,cache=writeback,aio=threads,discard=unmap",
			"-device", "virtio-blk-pci,drive="+id+",serial="+diskSerial(v),
		)
	}
	return a
}

// nicArgs gives the first NIC user-mode networking with the SSH port
// forwarded on loopback, or its tap; every further NIC its tap.
func (l launch) nicArgs() []string {
	netdev := fmt.Sprintf("user,id=net0,hostfwd=tcp:127.0.0.1:%d-:22", l.sshPort)
	if l.tap != "" {
		netdev = "tap,id=net0,ifname=" + l.tap + ",script=no,downscript=no"
	}
	a := []string{"-netdev", netdev, "-device", nicModel(l.model) + ",netdev=net0,mac=" + l.mac}
	for i, n := range l.more {
		id := "net" + strconv.Itoa(i+1)
		a = append(a,
			"-netdev", "tap,id="+id+",ifname="+n.tap+",script=no,downscript=no",
			"-device", nicModel(n.model)+",netdev="+id+",mac="+n.mac)
	}
	return a
}

// firmwareArgs maps a UEFI firmware's code image read-only as the first
// flash unit and the VM's variables file as the second; a build that
// requires SMM gets its flash secure (only SMM code writes it).
func (l launch) firmwareArgs() []string {
	if l.fw == nil {
		return nil
	}
	var a []string
	if l.fw.smm {
		a = append(a, "-global", "driver=cfi.pflash01,property=secure,value=on")
	}
	return append(a,
		"-drive", "if=pflash,unit=0,format="+l.fw.format+",readonly=on,file="+escapeOpt(l.fw.code),
		"-drive", "if=pflash,unit=1,format="+l.fw.format+",file="+escapeOpt(l.vars),
	)
}

// tpmArgs gives the guest a TPM 2.0 backed by the VM's swtpm, reached
// over the control channel QEMU inherited as tpmFD: a TIS device on x86,
// its system-bus twin on arm64's virt.
func (l launch) tpmArgs() []string {
	if !l.tpm {
		return nil
	}
	dev := "tpm-tis"
	if l.arch.arch == "arm64" {
		dev = "tpm-tis-device"
	}
	return []string{
		"-chardev", "socket,id=chrtpm,fd=" + strconv.Itoa(l.tpmFD),
		"-tpmdev", "emulator,id=tpm0,chardev=chrtpm",
		"-device", dev + ",tpmdev=tpm0",
	}
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
// networking, writes the NoCloud seed, makes the VM's UEFI variables and
// TPM state when its spec asks for them and they are not there yet,
// starts its swtpm, and starts QEMU detached (its own session; under
// systemd with SystemdScope, its own scope) so it outlives the agent. It
// returns once QEMU answers on QMP, or with QEMU's own error output when
// QEMU exits first. Booting a VM that runs is a no-op.
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
	model, err := p.machineModel(m.Spec)
	if err != nil {
		return err
	}
	if err := p.checkDisks(st, m.Volumes); err != nil {
		return err
	}
	l, err := p.prepareLaunch(ctx, st, m, model)
	if err != nil {
		return err
	}
	if err := p.prepareMachine(ctx, st, l.machineModel); err != nil {
		return err
	}
	l.vars = st.path(UEFIVarsFile)
	return p.start(ctx, st, l, log)
}

// prepareLaunch attaches m's NIC, fetches its artifacts (checking the
// kernel's architecture), writes its seed and allocates its SSH port, and
// returns the launch they make with machine model.
func (p *Provisioner) prepareLaunch(ctx context.Context, st *vmState, m agent.Machine, model machineModel) (launch, error) {
	atts, err := p.attach(ctx, st, m)
	if err != nil {
		return launch{}, err
	}
	nics := seedNICs(m, atts)
	a, err := p.fetchArtifacts(ctx, st, m.Spec)
	if err != nil {
		return launch{}, err
	}
	seed := ""
	if !adopted(m.Spec) {
		// An adopted guest gets no seed: its cloud-init ran before, under
		// an instance-id gitfleet never knew.
		if seed, err = p.writeSeed(st, m, nics); err != nil {
			return launch{}, err
		}
	}
	port, tap := 0, ""
	if len(atts) > 0 {
		tap = atts[0].Tap
	} else {
		if port, err = p.sshPort(st); err != nil {
			return launch{}, err
		}
	}
	l := launch{
		name: m.Name, dir: st.dir, accel: p.accel,
		vcpus: max(m.Spec.VCPUs, 1), memMB: m.Spec.MemoryMB,
		root: st.path(RootDiskFile), seed: seed, volumes: m.Volumes,
		kernel: a.kernel, initrd: a.initrd, mac: nics[0].mac, sshPort: port, tap: tap, model: nics[0].model,
		sandbox: !p.cfg.NoSandbox, machineModel: model,
	}
	for i := 1; i < len(atts); i++ {
		l.more = append(l.more, launchNIC{tap: atts[i].Tap, mac: nics[i].mac, model: nics[i].model})
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
	return l, nil
}

// machineModel resolves spec's machine for this host: its architecture
// (checkArch), machine type (spec's, else the architecture's default),
// CPU model (spec's; under TCG on arm64 "max", since virt's default CPU
// is 32-bit), and UEFI firmware from the descriptors (selectFirmware).
// What the host cannot give (host CPU without KVM, no firmware that fits,
// Secure Boot without UEFI, BIOS on arm64 for an image) is permanent.
func (p *Provisioner) machineModel(spec desired.VMSpec) (machineModel, error) {
	if err := p.checkArch(spec, ""); err != nil {
		return machineModel{}, err
	}
	// A snapshot is checked for its hash, not validated again: names
	// that would carry options into -machine or -cpu are refused here.
	for _, v := range []string{spec.Machine, spec.CPUModel} {
		if v != "" && !qemuNameRE.MatchString(v) {
			return machineModel{}, agent.Permanent(fmt.Errorf("machine type or CPU model %q is not a QEMU name", v))
		}
	}
	mm := machineModel{arch: p.arch, machine: spec.Machine, cpu: spec.CPUModel, tpm: spec.TPM}
	if mm.machine == "" {
		mm.machine = p.arch.machine
	}
	if mm.cpu == "" && p.accel == AccelTCG && p.arch.arch == desired.ArchARM64 {
		mm.cpu = "max"
	}
	if mm.cpu == "host" && p.accel != AccelKVM {
		return machineModel{}, agent.Permanent(fmt.Errorf("cpuModel host needs KVM; this host runs guests under %s (name a CPU model such as max)", p.accel))
	}
	fw := spec.Firmware.Or(desired.FirmwareBIOS)
	switch {
	case fw != desired.FirmwareBIOS && fw != desired.FirmwareUEFI:
		return machineModel{}, agent.Permanent(fmt.Errorf("firmware %q: want bios or uefi", fw))
	case spec.SecureBoot && fw != desired.FirmwareUEFI:
		return machineModel{}, agent.Permanent(errors.New("secureBoot needs firmware: uefi"))
	case fw == desired.FirmwareBIOS && p.arch.arch == desired.ArchARM64 && spec.Kernel == nil:
		return machineModel{}, agent.Permanent(errors.New("arm64 has no BIOS: an image boots only with firmware: uefi"))
	case fw == desired.FirmwareUEFI:
		f, err := selectFirmware(p.cfg.FirmwareDirs, p.arch.qemuArch, mm.machine, spec.SecureBoot)
		if err != nil {
			return machineModel{}, agent.Permanent(err)
		}
		mm.fw = &f
	}
	return mm, nil
}

// prepareMachine makes what mm keeps in the VM's directory when it is not
// there yet, and checks it when it is: the UEFI variables (ensureVars)
// and the TPM's state directory (prepareTPM). Their paths are the VM
// directory's fixed names, never taken from a spec or a snapshot.
func (p *Provisioner) prepareMachine(ctx context.Context, st *vmState, mm machineModel) error {
	if mm.fw != nil {
		if err := ensureVars(st.dir, *mm.fw); err != nil {
			return err
		}
	}
	if mm.tpm {
		for _, bin := range []string{p.cfg.SWTPM, p.cfg.SWTPMSetup} {
			if _, err := exec.LookPath(bin); err != nil {
				return agent.Permanent(fmt.Errorf("tpm: %w (install swtpm and swtpm-tools)", err))
			}
		}
		return p.prepareTPM(ctx, st)
	}
	return nil
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

// start runs the VM: its swtpm first when it has a TPM, then QEMU, and
// waits until QEMU answers on QMP. A start that fails leaves no swtpm
// running.
func (p *Provisioner) start(ctx context.Context, st *vmState, l launch, log *logrus.Entry) error {
	st.stopWatch()
	logf, err := prepareStart(st)
	if err != nil {
		return err
	}
	defer logf.Close()
	var extra []*os.File
	if l.tpm {
		tpm, err := p.startSWTPM(st)
		if err != nil {
			return err
		}
		defer tpm.qemu.Close() // QEMU holds its own copy once started
		extra = append(extra, tpm.qemu)
		l.tpmFD = 3 // the first of cmd.ExtraFiles
	}
	started := time.Now()
	cmd, exited, err := p.spawn(st, l, logf, extra)
	if err == nil {
		log.WithFields(logrus.Fields{"pid": cmd.Process.Pid, "accel": l.accel, "arch": l.arch.arch, "ssh": l.sshPort, "tap": l.tap, "uefi": l.fw != nil, "tpm": l.tpm}).Info("qemu started")
		var status string
		if status, err = p.waitQMP(ctx, st, cmd, exited, log); err == nil {
			log.WithFields(logrus.Fields{"status": status, "seconds": time.Since(started).Seconds()}).Info("qemu up")
			p.watch(st, st.pid()) // probe the guest from now on
			return nil
		}
	}
	if l.tpm {
		if tail := swtpmLogTail(st); tail != "" {
			err = fmt.Errorf("%w (swtpm: %s)", err, tail)
		}
		st.stopSWTPM()
	}
	return err
}

// spawn starts QEMU for l in the VM's directory, in a session of its own,
// with extra as its file descriptors 3 and on, and reaps it when it
// exits while this agent runs (exited closes then, st.exit says how).
func (p *Provisioner) spawn(st *vmState, l launch, logf *os.File, extra []*os.File) (*exec.Cmd, chan struct{}, error) {
	argv := append([]string{p.cfg.QEMU}, l.args()...)
	if p.scope {
		argv = scopeArgs(l.name, argv)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = st.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = extra
	// A session of its own: no signal aimed at the agent's process group
	// (a terminal's ^C, a unit's stop) reaches QEMU.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	st.exitMu.Lock()
	st.exit = ""
	st.starts++
	start := st.starts
	st.exitMu.Unlock()
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	if err := recordPid(st.path(PidRecordFile), cmd.Process.Pid); err != nil {
		// Without the record the pidfile, which QEMU can rewrite, is all
		// there is: QEMU exited at once, or the directory is unwritable.
		p.log.WithField("vm", st.name).WithError(err).Warn("qemu's pid not recorded")
	}
	exited := make(chan struct{})
	go func() {
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
	return cmd, exited, nil
}

// prepareStart clears what an earlier QEMU left in the VM's directory
// (pidfile, sockets, readiness), prepares the serial log and makes a new
// qemu.log, returned open for QEMU's output. Every name is removed or
// created anew, never written through (vmfile.go).
func prepareStart(st *vmState) (*os.File, error) {
	for _, f := range []string{PidFile, PidRecordFile, QMPSocket, QMPEventsSocket, QGASocket, SerialSocket, ReadyFile} {
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
		st.stopSWTPM() // a QEMU gone on its own takes its swtpm along; make sure
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
			st.stopSWTPM() // --terminate ended it with QEMU's channel; never left behind
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

// writeSeed writes m's NoCloud seed and returns its path.
func (p *Provisioner) writeSeed(st *vmState, m agent.Machine, nics []seedNIC) (string, error) {
	files, err := p.machineSeed(st, m, nics)
	if err != nil {
		return "", agent.Permanent(fmt.Errorf("seed: %w", err))
	}
	if err := writeSeedISO(st.path(SeedFile), files); err != nil {
		return "", err
	}
	return st.path(SeedFile), nil
}
