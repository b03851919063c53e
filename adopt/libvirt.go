package adopt

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/gitfleet/gitfleet/desired"
)

// Options are what an import is told beside its source: the Host the VM
// goes to, the VM's name when the source's will not do, and the host
// network its NIC joins ("" keeps what the source says, if gitfleet can
// say it).
type Options struct {
	Host    string
	Name    string
	Network string
}

// ErrInvalidSource: the source cannot be read as a VM (XML that does not
// parse, a domain without a disk). The error names FILE:LINE:COL.
var ErrInvalidSource = errors.New("invalid import source")

// FromLibvirt maps the libvirt domain XML in data (as virsh dumpxml or
// virt-manager writes it, /etc/libvirt/qemu/NAME.xml; file names it in
// errors and in the report) to a Plan. It needs no libvirtd: the XML is
// parsed with libvirt.org/go/libvirtxml, the library libvirt's own Go
// bindings ship. A domain with an id attribute is one libvirt runs: the
// Plan says so, and Inspect refuses it.
func FromLibvirt(file string, data []byte, opts Options) (*Plan, error) {
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(string(data)); err != nil {
		var se *xml.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("%w: %s:%d:1: %s", ErrInvalidSource, file, se.Line, se.Msg)
		}
		var ne *strconv.NumError
		if errors.As(err, &ne) {
			if at, what, ok := locateValue(data, ne.Num); ok {
				return nil, fmt.Errorf("%w: %s:%s is not a number", ErrInvalidSource, file, at+": "+what)
			}
		}
		return nil, fmt.Errorf("%w: %s:1:1: not a libvirt domain: %v", ErrInvalidSource, file, err)
	}
	// The report places fields by the file's base name: it goes into the
	// VM file, which names no host path.
	m := &libvirtMapper{file: filepath.Base(file), pos: elementPositions(data), plan: &Plan{}, opts: opts}
	if err := m.domain(&dom); err != nil {
		return nil, err
	}
	m.plan.sortReport()
	return m.plan, nil
}

// libvirtMapper maps one domain; pos places its elements.
type libvirtMapper struct {
	file string
	pos  map[string]string
	plan *Plan
	opts Options
}

// at is FILE:LINE:COL and the element path of an element (see
// elementPositions).
func (m *libvirtMapper) at(path string) string {
	if p, ok := m.pos[path]; ok {
		return m.file + ":" + p + " " + path
	}
	return m.file + " " + path
}

func (m *libvirtMapper) domain(d *libvirtxml.Domain) error {
	p := m.plan
	p.Spec.Host = m.opts.Host
	m.name(d)
	if d.ID != nil {
		p.Running = fmt.Sprintf("libvirt runs domain %s (id %d in %s): shut it down first (virsh shutdown %s)", d.Name, *d.ID, m.file, d.Name)
	}
	m.vcpus(d)
	if err := m.memory(d); err != nil {
		return err
	}
	m.os(d)
	m.cpu(d)
	m.features()
	m.clock(d)
	m.lifecycle(d)
	if d.Devices == nil {
		return fmt.Errorf("%w: %s: domain %s has no devices: no disk to adopt", ErrInvalidSource, m.at("domain"), d.Name)
	}
	if err := m.disks(d.Devices.Disks); err != nil {
		return err
	}
	m.interfaces(d.Devices.Interfaces)
	m.devices(d.Devices)
	return nil
}

// name takes the domain's name as the VM's, unless Options.Name is given;
// a name that is no DNS label is made one and reported.
func (m *libvirtMapper) name(d *libvirtxml.Domain) {
	p := m.plan
	if m.opts.Name != "" {
		p.Name = m.opts.Name
		p.add(Mapped, m.at("domain/name")+" "+d.Name, "metadata.name", "named %s as asked", p.Name)
		return
	}
	p.Name = dnsLabel(d.Name)
	note := ""
	if p.Name != d.Name {
		note = fmt.Sprintf("%q is no DNS label; named %s (--name to choose)", d.Name, p.Name)
	}
	p.add(Mapped, m.at("domain/name")+" "+d.Name, "metadata.name", "%s", note)
}

func (m *libvirtMapper) vcpus(d *libvirtxml.Domain) {
	p := m.plan
	if d.VCPU == nil {
		p.Spec.VCPUs = 1
		p.add(Mapped, m.at("domain"), "spec.vcpus", "no <vcpu>: libvirt's default, 1")
		return
	}
	n, note := d.VCPU.Value, ""
	if d.VCPU.Current != 0 && d.VCPU.Current < n {
		n, note = d.VCPU.Current, fmt.Sprintf("the %d vCPUs online of at most %d (gitfleet hot-plugs none)", d.VCPU.Current, d.VCPU.Value)
	}
	p.Spec.VCPUs = int(n)
	p.add(Mapped, m.at("domain/vcpu")+" "+strconv.Itoa(int(d.VCPU.Value)), "spec.vcpus", "%s", note)
	if d.VCPU.CPUSet != "" || d.CPUTune != nil {
		p.add(Dropped, m.at("domain/vcpu")+" cpuset/cputune", "", "gitfleet pins no vCPU")
	}
}

// memory maps <memory> (the guest's maximum; <currentMemory> is what a
// balloon left it) to memoryMB.
func (m *libvirtMapper) memory(d *libvirtxml.Domain) error {
	if d.Memory == nil {
		return fmt.Errorf("%w: %s: domain %s has no <memory>", ErrInvalidSource, m.at("domain"), d.Name)
	}
	b, err := bytesOf(uint64(d.Memory.Value), d.Memory.Unit)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrInvalidSource, m.at("domain/memory"), err)
	}
	mib := int(b >> 20)
	note := ""
	if b%(1<<20) != 0 {
		note = fmt.Sprintf("%d bytes, rounded down to whole MiB", b)
	}
	m.plan.Spec.MemoryMB = mib
	m.plan.add(Mapped, fmt.Sprintf("%s %d %s", m.at("domain/memory"), d.Memory.Value, unitOr(d.Memory.Unit)), "spec.memoryMB", "%s", note)
	if d.CurrentMemory != nil {
		if cb, err := bytesOf(uint64(d.CurrentMemory.Value), d.CurrentMemory.Unit); err == nil && cb < b {
			m.plan.add(Dropped, m.at("domain/currentMemory"), "", "gitfleet runs no balloon: the guest gets all %d MiB", mib)
		}
	}
	return nil
}

// bytesOf converts a libvirt memory value in unit (libvirt's scaled
// integers: b/bytes, KB/MB/GB/TB powers of 1000, k/KiB, M/MiB, G/GiB,
// T/TiB powers of 1024; "" is KiB) to bytes.
func bytesOf(v uint64, unit string) (uint64, error) {
	mult := map[string]uint64{
		"b": 1, "bytes": 1,
		"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
		"": 1 << 10, "k": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MiB": 1 << 20,
		"G": 1 << 30, "GiB": 1 << 30, "T": 1 << 40, "TiB": 1 << 40,
	}
	f, ok := mult[unit]
	if !ok {
		return 0, fmt.Errorf("unit %q is not one libvirt knows (b, KiB, MiB, GiB, TiB, KB, MB, GB, TB)", unit)
	}
	return v * f, nil
}

func unitOr(u string) string {
	if u == "" {
		return "KiB"
	}
	return u
}

// os maps the firmware, Secure Boot and machine type of <os>: UEFI (the
// firmware attribute or a pflash loader) to firmware uefi, a secure
// loader or an enabled secure-boot feature to secureBoot, the machine
// type as written when it is a QEMU name. The guest's UEFI variables
// (<nvram>) are not carried, and a kernel from a host path blocks.
func (m *libvirtMapper) os(d *libvirtxml.Domain) {
	p, o := m.plan, d.OS
	if o == nil {
		return
	}
	if o.Firmware == "efi" || (o.Loader != nil && o.Loader.Type == "pflash") {
		p.Spec.Firmware = desired.FirmwareUEFI
		p.add(Mapped, m.at("domain/os")+" firmware=efi", "spec.firmware", "uefi: the Host's OVMF (AAVMF on arm64), from its firmware descriptors")
		if secureBoot(o) {
			p.Spec.SecureBoot = true
			p.add(Mapped, m.at("domain/os")+" secure-boot", "spec.secureBoot", "Secure Boot, from variables with the distribution's enrolled keys")
		}
	} else {
		p.add(Mapped, m.at("domain/os")+" firmware=bios", "spec.firmware", "bios (SeaBIOS), libvirt's default and gitfleet's")
	}
	m.arch(o)
	if o.Type != nil && o.Type.Machine != "" {
		machine := o.Type.Machine
		if desired.ValidQEMUName(machine) {
			p.Spec.Machine = machine
			p.add(Mapped, m.at("domain/os/type")+" machine="+machine, "spec.machine", "")
		} else {
			p.add(Dropped, m.at("domain/os/type")+" machine="+machine, "", "not a QEMU machine name; gitfleet picks its own (q35 on amd64), and the guest sees new PCI addresses")
		}
	}
	if o.Kernel != "" {
		p.add(Blocks, m.at("domain/os/kernel"), "spec.kernel", "a kernel from a host path: gitfleet's kernel is an artifact with url and sha256; write spec.kernel by hand")
	}
	if o.NVRam != nil {
		p.addPath(Dropped, m.at("domain/os/nvram"), o.NVRam.NVRam, "", "not carried: the VM starts with fresh UEFI variables from the template; boot entries must be re-created")
	}
}

// secureBoot reports whether <os> asks for Secure Boot: a loader with
// secure='yes', or <firmware><feature name='secure-boot' enabled='yes'/>.
func secureBoot(o *libvirtxml.DomainOS) bool {
	if o.Loader != nil && o.Loader.Secure == "yes" {
		return true
	}
	if o.FirmwareInfo != nil {
		for _, f := range o.FirmwareInfo.Features {
			if f.Name == "secure-boot" && f.Enabled == "yes" {
				return true
			}
		}
	}
	return false
}

// arch maps <os><type arch>: x86_64 is gitfleet's default (amd64),
// aarch64 is arm64; another architecture blocks (the guest's code does
// not run on the Host).
func (m *libvirtMapper) arch(o *libvirtxml.DomainOS) {
	if o.Type == nil || o.Type.Arch == "" {
		return
	}
	at := m.at("domain/os/type") + " arch=" + o.Type.Arch
	switch o.Type.Arch {
	case "x86_64":
		m.plan.add(Mapped, at, "spec.arch", "amd64, the default")
	case "aarch64":
		m.plan.Spec.Arch = desired.ArchARM64
		m.plan.add(Mapped, at, "spec.arch", "arm64")
	default:
		m.plan.add(Blocks, at, "spec.arch", "gitfleet runs amd64 and arm64 guests")
	}
}

// cpu maps <cpu mode>: host-passthrough is cpuModel host; host-model
// and a custom model are not expressible (the VM gets gitfleet's
// default model).
func (m *libvirtMapper) cpu(d *libvirtxml.Domain) {
	if d.CPU == nil || d.CPU.Mode == "" {
		return
	}
	at := m.at("domain/cpu") + " mode=" + d.CPU.Mode
	if d.CPU.Mode == "host-passthrough" {
		m.plan.Spec.CPUModel = "host"
		m.plan.add(Mapped, at, "spec.cpuModel", "host (QEMU's -cpu host; it needs KVM)")
		return
	}
	m.plan.add(Dropped, at, "", "the VM gets gitfleet's default CPU model (host under KVM, QEMU's default under TCG)")
}

// qemuFeatures are the <features> QEMU gives a q35 (or virt) guest
// without being asked.
var qemuFeatures = map[string]bool{"acpi": true, "apic": true, "pae": true, "gic": true}

// features reports each child of <features>: ACPI, APIC, PAE and GIC as
// QEMU's default, any other (vmport, hyperv, smm, kvm) as not
// expressible.
func (m *libvirtMapper) features() {
	const parent = "domain/features/"
	for path := range m.pos {
		name, ok := strings.CutPrefix(path, parent)
		if !ok || strings.ContainsAny(name, "/[") {
			continue
		}
		if qemuFeatures[name] {
			m.plan.add(Ignored, m.at(path), "", "QEMU's default: the guest has it")
			continue
		}
		m.plan.add(Dropped, m.at(path), "", "the guest runs with QEMU's default for it")
	}
}

// clock reports <clock>: offset utc is QEMU's default; another offset
// (localtime, a timezone, variable) and each timer policy are not
// expressible.
func (m *libvirtMapper) clock(d *libvirtxml.Domain) {
	c := d.Clock
	if c == nil {
		return
	}
	offset := c.Offset
	if offset == "" {
		offset = "utc"
	}
	if offset == "utc" {
		m.plan.add(Ignored, m.at("domain/clock")+" offset=utc", "", "QEMU's default: the guest's RTC runs in UTC")
	} else {
		m.plan.add(Dropped, m.at("domain/clock")+" offset="+offset, "", "the guest's RTC runs in UTC (a guest that keeps local time, such as Windows, shows UTC)")
	}
	for i, tm := range c.Timer {
		m.plan.add(Dropped, fmt.Sprintf("%s name=%s", m.at(fmt.Sprintf("domain/clock/timer[%d]", i)), tm.Name), "", "the guest gets QEMU's default for this timer")
	}
}

// lifecycle reports <on_poweroff>, <on_reboot>, <on_crash> and <pm>: a
// reboot that restarts the guest is QEMU's default; what follows a
// poweroff or crash is gitfleet's (the VM's desired state), and power
// management is QEMU's default.
func (m *libvirtMapper) lifecycle(d *libvirtxml.Domain) {
	p := m.plan
	if d.OnPoweroff != "" {
		p.add(Dropped, m.at("domain/on_poweroff")+" "+d.OnPoweroff, "", "what follows a guest's poweroff is gitfleet's, by the VM's desired state")
	}
	if d.OnReboot == "restart" {
		p.add(Ignored, m.at("domain/on_reboot")+" restart", "", "QEMU's default: a reboot restarts the guest")
	} else if d.OnReboot != "" {
		p.add(Dropped, m.at("domain/on_reboot")+" "+d.OnReboot, "", "a reboot restarts the guest")
	}
	if d.OnCrash != "" {
		p.add(Dropped, m.at("domain/on_crash")+" "+d.OnCrash, "", "what follows a guest's crash is gitfleet's, by the VM's desired state")
	}
	if d.PM != nil {
		p.add(Dropped, m.at("domain/pm"), "", "the guest gets QEMU's default suspend states")
	}
}

// disks adopts the first disk as the root disk and each later raw file
// disk as a Volume named <vm>-<target> (gitfleet's volumes are raw files);
// a later disk that is not a raw file would not come along, which blocks.
func (m *libvirtMapper) disks(disks []libvirtxml.DomainDisk) error {
	p := m.plan
	n := 0
	for i, dk := range disks {
		at := m.at(fmt.Sprintf("domain/devices/disk[%d]", i))
		dev := dk.Device
		if dev == "" {
			dev = "disk"
		}
		if dev != "disk" {
			p.addPath(Dropped, at+" device="+dev, diskFile(dk), "", "gitfleet attaches no %s", dev)
			continue
		}
		n++
		if n > 1 {
			m.volume(at, dk)
			continue
		}
		if dk.Source == nil || dk.Source.File == nil || dk.Source.File.File == "" {
			p.add(Blocks, at, "spec.rootDisk", "the root disk is not a file (a block device, a network disk): gitfleet adopts a qcow2 file")
			continue
		}
		format := ""
		if dk.Driver != nil {
			format = dk.Driver.Type
		}
		if format != "" && format != "qcow2" {
			p.add(Blocks, at+" type="+format, "spec.rootDisk", "gitfleet runs qcow2 root disks: convert it first (qemu-img convert -O qcow2, a copy you make)")
			continue
		}
		path := dk.Source.File.File
		if !filepath.IsAbs(path) {
			return fmt.Errorf("%w: %s: disk source %q is not an absolute path", ErrInvalidSource, at, path)
		}
		p.Disk = filepath.Clean(path)
		p.Spec.RootDisk = &desired.RootDisk{Adopt: true}
		p.addPath(Mapped, at, path, "spec.rootDisk.adopt", "staged by gitfleet import --stage into the agent's state directory; no host path is written")
	}
	if p.Disk == "" && len(p.Blocking()) == 0 {
		return fmt.Errorf("%w: %s: the domain has no disk to adopt", ErrInvalidSource, m.at("domain/devices"))
	}
	return nil
}

// volume adopts a disk after the root disk as a Volume when it is a raw
// file, and reports it as blocking otherwise.
func (m *libvirtMapper) volume(at string, dk libvirtxml.DomainDisk) {
	p := m.plan
	path := diskFile(dk)
	format := ""
	if dk.Driver != nil {
		format = dk.Driver.Type
	}
	switch {
	case path == "":
		p.add(Blocks, at, "spec.volumes", "not a file (a block device, a network disk): its data would not come along")
		return
	case format != "raw":
		p.addPath(Blocks, at+" type="+format, path, "spec.volumes", "gitfleet's volumes are raw files: convert it first (qemu-img convert -O raw, a copy you make), or its data does not come along")
		return
	case !filepath.IsAbs(path):
		p.addPath(Blocks, at, path, "spec.volumes", "the source is not an absolute path")
		return
	}
	dev := fmt.Sprintf("disk%d", len(p.Volumes)+1)
	if dk.Target != nil && dk.Target.Dev != "" {
		dev = dk.Target.Dev
	}
	name := dnsLabel(p.Name + "-" + dev)
	p.Volumes = append(p.Volumes, VolumePlan{Name: name, Disk: filepath.Clean(path)})
	p.Spec.Volumes = append(p.Spec.Volumes, name)
	p.addPath(Mapped, at, path, "spec.volumes", "Volume %s, staged by gitfleet import --stage into the agent's volumes directory (attached in this order, after the root disk)", name)
}

func diskFile(dk libvirtxml.DomainDisk) string {
	if dk.Source != nil && dk.Source.File != nil {
		return dk.Source.File.File
	}
	return ""
}

// interfaces maps the first NIC's MAC and network; more NICs are not
// expressible.
func (m *libvirtMapper) interfaces(ifs []libvirtxml.DomainInterface) {
	p := m.plan
	if len(ifs) == 0 {
		p.add(Dropped, m.at("domain/devices"), "", "the domain has no NIC; the VM gets one on user-mode networking")
	}
	for i, nic := range ifs {
		at := m.at(fmt.Sprintf("domain/devices/interface[%d]", i))
		if i > 0 {
			p.add(Dropped, at, "", "gitfleet gives a VM one NIC")
			continue
		}
		if nic.MAC != nil && nic.MAC.Address != "" {
			p.Spec.MAC = strings.ToLower(nic.MAC.Address)
			p.add(Mapped, at+" mac="+nic.MAC.Address, "spec.mac", "")
		}
		m.network(at, nic)
		if nic.Model != nil && nic.Model.Type != "virtio" {
			p.add(Dropped, at+" model="+nic.Model.Type, "", "gitfleet's NIC is virtio-net: the guest needs its driver (every Linux distribution has it)")
		}
	}
}

// network maps a NIC's source to spec.network: Options.Network when
// given, else a libvirt network's name (the Host must define a network of
// that name).
func (m *libvirtMapper) network(at string, nic libvirtxml.DomainInterface) {
	p := m.plan
	src := "user-mode"
	if s := nic.Source; s != nil {
		switch {
		case s.Network != nil:
			src = "network " + s.Network.Network
		case s.Bridge != nil:
			src = "bridge " + s.Bridge.Bridge
		case s.Direct != nil:
			src = "direct " + s.Direct.Dev
		}
	}
	switch {
	case m.opts.Network != "":
		p.Spec.Network = m.opts.Network
		p.add(Mapped, at+" "+src, "spec.network", "network %s as asked", m.opts.Network)
	case nic.Source != nil && nic.Source.Network != nil:
		p.Spec.Network = nic.Source.Network.Network
		p.add(Mapped, at+" "+src, "spec.network", "the Host must define a network %q (--network to choose another)", p.Spec.Network)
	case nic.Source != nil && nic.Source.Bridge != nil:
		p.add(Dropped, at+" "+src, "spec.network", "name the Host's bridge network on %s with --network; without it the NIC is on user-mode networking", nic.Source.Bridge.Bridge)
	case src != "user-mode":
		p.add(Dropped, at+" "+src, "spec.network", "not expressible; the NIC is on user-mode networking (--network to choose a Host network)")
	default:
		p.add(Mapped, at+" user-mode", "spec.network", "user-mode networking, as before")
	}
}

// devices reports every other device class: what gitfleet gives (a
// serial console, a guest agent channel) and what it cannot express.
func (m *libvirtMapper) devices(d *libvirtxml.DomainDeviceList) {
	p := m.plan
	each := func(kind string, n int, v Verdict, note string) {
		for i := 0; i < n; i++ {
			p.add(v, m.at(fmt.Sprintf("domain/devices/%s[%d]", kind, i)), "", "%s", note)
		}
	}
	for i, c := range d.Controllers {
		if c.Type == "pci" || c.Type == "virtio-serial" {
			continue // what QEMU's machine gives, and gitfleet's own channels use
		}
		p.add(Dropped, fmt.Sprintf("%s type=%s", m.at(fmt.Sprintf("domain/devices/controller[%d]", i)), c.Type), "", "gitfleet adds no %s controller", c.Type)
	}
	for i, g := range d.Graphics {
		kind := "display"
		switch {
		case g.Spice != nil:
			kind = "spice"
		case g.VNC != nil:
			kind = "vnc"
		}
		p.add(Dropped, m.at(fmt.Sprintf("domain/devices/graphics[%d]", i))+" type="+kind, "", "no display: gitfleet console attaches to the serial console")
	}
	for i, in := range d.Inputs {
		if in.Bus == "ps2" {
			p.add(Ignored, fmt.Sprintf("%s type=%s bus=ps2", m.at(fmt.Sprintf("domain/devices/input[%d]", i)), in.Type), "", "QEMU's default: the machine's PS/2 controller")
			continue
		}
		p.add(Dropped, fmt.Sprintf("%s type=%s bus=%s", m.at(fmt.Sprintf("domain/devices/input[%d]", i)), in.Type, in.Bus), "", "no input device beside the serial console")
	}
	for i, ch := range d.Channels {
		at := m.at(fmt.Sprintf("domain/devices/channel[%d]", i))
		if ch.Target != nil && ch.Target.VirtIO != nil && ch.Target.VirtIO.Name == "org.qemu.guest_agent.0" {
			p.add(Mapped, at+" org.qemu.guest_agent.0", "", "gitfleet gives every VM a guest agent channel of this name")
			continue
		}
		p.add(Dropped, at, "", "no such channel")
	}
	each("serial", len(d.Serials), Mapped, "gitfleet gives every VM a serial console (gitfleet console)")
	each("console", len(d.Consoles), Mapped, "the serial console")
	each("video", len(d.Videos), Dropped, "no display")
	each("sound", len(d.Sounds), Dropped, "no sound device")
	each("audio", len(d.Audios), Dropped, "no audio backend")
	each("redirdev", len(d.RedirDevs), Dropped, "no USB redirection")
	each("hub", len(d.Hubs), Dropped, "no USB hub")
	each("smartcard", len(d.Smartcards), Dropped, "no smartcard")
	each("rng", len(d.RNGs), Mapped, "gitfleet gives every VM a virtio-rng device")
	each("watchdog", len(d.Watchdogs), Dropped, "no watchdog device")
	each("panic", len(d.Panics), Dropped, "no panic device")
	each("parallel", len(d.Parallels), Dropped, "no parallel port")
	each("hostdev", len(d.Hostdevs), Blocks, "host device passthrough: the guest loses the device (a GPU, a NIC, a disk controller) and what it holds")
	for i := range d.TPMs {
		p.Spec.TPM = true
		p.add(MappedLoss, m.at(fmt.Sprintf("domain/devices/tpm[%d]", i)), "spec.tpm", "a new TPM: the old TPM's state is not carried (secrets the guest sealed to it, such as disk encryption keys, are lost)")
	}
	each("filesystem", len(d.Filesystems), Blocks, "a shared host directory: the guest loses what it mounts from there")
	each("shmem", len(d.Shmems), Dropped, "no shared memory device")
	if d.MemBalloon != nil && d.MemBalloon.Model != "none" {
		p.add(Dropped, m.at("domain/devices/memballoon")+" model="+d.MemBalloon.Model, "", "no balloon")
	}
}

// dnsLabel makes s a DNS label as gitfleet names are: lowercase letters,
// digits and '-', starting and ending with a letter or digit, at most 63.
func dnsLabel(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	out := strings.Trim(b.String(), "-")
	if len(out) > 63 {
		out = strings.Trim(out[:63], "-")
	}
	return out
}

// elementPositions maps the path of every element of doc to its
// LINE:COL: "domain/devices/disk[1]" is the second <disk> under
// <devices>; the first of a name is also given without its index
// ("domain/memory"), and its children are under that path. A document
// that does not parse gives what was read before the error.
func elementPositions(doc []byte) map[string]string {
	out := map[string]string{}
	dec := xml.NewDecoder(bytes.NewReader(doc))
	type frame struct {
		path  string
		count map[string]int
	}
	stack := []frame{{count: map[string]int{}}}
	for {
		off := dec.InputOffset()
		tok, err := dec.Token()
		if err == io.EOF || err != nil {
			return out
		}
		switch t := tok.(type) {
		case xml.StartElement:
			top := &stack[len(stack)-1]
			name := t.Name.Local
			i := top.count[name]
			top.count[name]++
			base := name
			if top.path != "" {
				base = top.path + "/" + name
			}
			pos := lineCol(doc, off)
			indexed := fmt.Sprintf("%s[%d]", base, i)
			out[indexed] = pos
			if i == 0 {
				out[base] = pos
			}
			path := indexed
			if i == 0 {
				path = base
			}
			stack = append(stack, frame{path: path, count: map[string]int{}})
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		}
	}
}

// locateValue finds the first element of doc whose text or attribute is
// val (the value a number did not parse from): its LINE:COL and what it
// is, as <vcpu> "two" or <vcpu> current="one".
func locateValue(doc []byte, val string) (at, what string, ok bool) {
	dec := xml.NewDecoder(bytes.NewReader(doc))
	type open struct{ name, pos string }
	var stack []open
	for {
		off := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return "", "", false
		}
		switch t := tok.(type) {
		case xml.StartElement:
			e := open{t.Name.Local, lineCol(doc, off)}
			for _, a := range t.Attr {
				if a.Value == val {
					return e.pos, fmt.Sprintf("<%s> %s=%q", e.name, a.Name.Local, val), true
				}
			}
			stack = append(stack, e)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) > 0 && strings.TrimSpace(string(t)) == val {
				e := stack[len(stack)-1]
				return e.pos, fmt.Sprintf("<%s> %q", e.name, val), true
			}
		}
	}
}

// lineCol is the 1-based LINE:COL of byte offset off in doc, at the
// element's '<' (the decoder's offset may sit on the whitespace before
// it).
func lineCol(doc []byte, off int64) string {
	for off < int64(len(doc)) && doc[off] != '<' {
		off++
	}
	line := 1 + bytes.Count(doc[:off], []byte("\n"))
	col := int(off) - bytes.LastIndexByte(doc[:off], '\n')
	return fmt.Sprintf("%d:%d", line, col)
}
