package desired

import (
	"fmt"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/gitfleet/gitfleet/internal/redact"
	"github.com/gitfleet/gitfleet/internal/safetext"
	"github.com/gitfleet/gitfleet/internal/sealed"
)

// Limits of the object fields. The lower bounds are what a VM needs to boot
// at all; the upper bounds catch a typo (an extra zero) before it reaches a
// host.
const (
	// MaxNameLength is the longest metadata.name, an RFC 1123 label.
	MaxNameLength = 63
	// MaxVCPUs is the most virtual CPUs one VM may have.
	MaxVCPUs = 256
	// MinMemoryMB and MaxMemoryMB bound a VM's memory, in MiB (64 MiB to
	// 4 TiB).
	MinMemoryMB = 64
	MaxMemoryMB = 4 << 20
	// MaxDiskGB bounds a VM's root disk, in GiB (64 TiB).
	MaxDiskGB = 64 << 10
	// MaxVolumeGB bounds a volume, in GiB (64 TiB).
	MaxVolumeGB = 64 << 10
	// MaxHostVCPUs and MaxHostMemoryMB bound a host's declared capacity
	// (4096 CPUs, 64 TiB in MiB).
	MaxHostVCPUs    = 4096
	MaxHostMemoryMB = 64 << 20
	// MaxBridgeLength is the longest Linux interface name.
	MaxBridgeLength = 15
	// MaxLabelValueLength is the longest value of a metadata label.
	MaxLabelValueLength = 253
)

var (
	labelRE    = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	sha256RE   = regexp.MustCompile(`^[0-9a-f]{64}$`)
	labelKeyRE = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?$`)
	bridgeRE   = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9_.]*$`)
	// machineRE is a QEMU machine type or CPU model name: no comma, so
	// it cannot carry options into QEMU's -machine or -cpu.
	machineRE = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9_.]*$`)
	// domainLabelRE is one label of a domain name; see isDomain.
	domainLabelRE = regexp.MustCompile(`^[A-Za-z0-9_]([-A-Za-z0-9_]*[A-Za-z0-9_])?$`)
)

// isDomain reports whether s is a DNS domain name as resolv.conf and the
// network-config renderers take one: labels of 1 to 63 letters, digits,
// '-' or '_' (not starting or ending with '-'), joined by '.', with an
// optional final '.', 253 characters at most. Anything else (a newline, a
// quote, '#') would be a line or a comment in the guest's configuration.
func isDomain(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if len(l) > 63 || !domainLabelRE.MatchString(l) {
			return false
		}
	}
	return true
}

// checkName reports why s is not an RFC 1123 label, or "".
func checkName(s string) string {
	switch {
	case s == "":
		return "must not be empty"
	case len(s) > MaxNameLength:
		// Quoted only as far as a name may go: the rest may be a
		// megabyte, which the error would repeat.
		return fmt.Sprintf("%q… is %d characters; a name is at most %d", s[:MaxNameLength], len(s), MaxNameLength)
	case !labelRE.MatchString(s):
		return fmt.Sprintf("%q is not a DNS label (RFC 1123): lowercase letters, digits and '-', starting and ending with a letter or digit", s)
	}
	return ""
}

// written reports whether field appears in the file.
func (d *nodeDecoder) written(field string) bool {
	_, ok := d.pos[field]
	return ok
}

// required reports a missing field and returns false, or returns whether
// the field decoded without error.
//
// A field whose parent is missing or rejected is not reported again, nor
// a field under spec of a partial document (a Profile, a VM that names
// one: the other file may write it).
func (d *nodeDecoder) required(field string) bool {
	if !d.written(field) {
		if d.partial && strings.HasPrefix(field, "spec.") {
			return false
		}
		parent := parentPath(field)
		if parent != "" && (!d.written(parent) || d.bad[parent]) {
			return false
		}
		if p, ok := d.empty[field]; ok {
			d.add(p, field, "missing (the value is empty)")
			return false
		}
		if d.profile != "" && strings.HasPrefix(field, "spec.") {
			d.add(d.keyPos(parent), field, "missing: neither the VM nor its profile %q sets it", d.profile)
			return false
		}
		d.add(d.keyPos(parent), field, "missing")
		return false
	}
	return !d.bad[field]
}

func (d *nodeDecoder) name(field, value string) {
	if d.bad[field] {
		return
	}
	if msg := checkName(value); msg != "" {
		d.add(d.valPos(field), field, "%s", msg)
	}
}

func (d *nodeDecoder) intRange(field string, v, lo, hi int, unit string) {
	if !d.written(field) || d.bad[field] {
		return
	}
	if v < lo || v > hi {
		d.add(d.valPos(field), field, "%d is out of range; must be %d to %d%s", v, lo, hi, unit)
	}
}

func (d *nodeDecoder) artifact(field, u, sum string) {
	if d.required(field + ".url") {
		if msg := checkURL(u); msg != "" {
			d.add(d.valPos(field+".url"), field+".url", "%s", msg)
		}
	}
	if d.required(field+".sha256") && !sha256RE.MatchString(sum) {
		d.add(d.valPos(field+".sha256"), field+".sha256", "must be 64 lowercase hex digits (the file's sha256), got %d characters %q", len(sum), safetext.Truncate(sum, 70))
	}
}

// checkURL reports why u is not a fetchable artifact URL, or "".
func checkURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "not a URL: " + redact.Text(err.Error())
	}
	switch p.Scheme {
	case "http", "https":
		if p.Host == "" {
			return fmt.Sprintf("%q has no host", redact.URL(u))
		}
	case "file":
		if !strings.HasPrefix(p.Path, "/") || p.Host != "" && p.Host != "localhost" {
			return fmt.Sprintf("%q must be file:///absolute/path", redact.URL(u))
		}
	case "":
		return fmt.Sprintf("%q has no scheme; use http, https or file", redact.URL(u))
	default:
		return fmt.Sprintf("scheme %q is not supported; use http, https or file", p.Scheme)
	}
	return ""
}

// check runs the checks that need only the object itself, then records the
// positions the cross-object checks report at.
func (d *nodeDecoder) check(o *object) {
	if d.required("metadata.name") {
		d.name("metadata.name", o.name)
	}
	var labels map[string]string
	switch o.kind {
	case KindVM:
		labels = o.vm.Metadata.Labels
		d.checkVM(&o.vm.Spec)
		d.profileName(o.vm)
	case KindProfile:
		labels = o.profile.Metadata.Labels
		d.checkVM(&o.profile.Spec)
	case KindVolume:
		labels = o.volume.Metadata.Labels
		if d.required("spec.host") {
			d.name("spec.host", o.volume.Spec.Host)
		}
		if d.required("spec.sizeGB") {
			d.intRange("spec.sizeGB", o.volume.Spec.SizeGB, 1, MaxVolumeGB, " GiB")
		}
	case KindHost:
		labels = o.host.Metadata.Labels
		d.checkHost(&o.host.Spec)
	case KindBackupRepository:
		labels = o.backupRepo.Metadata.Labels
		d.checkBackupRepository(&o.backupRepo.Spec)
	}
	for k, v := range labels {
		f := "metadata.labels." + k
		if len(k) > MaxNameLength || !labelKeyRE.MatchString(k) {
			d.add(d.keyPos(f), f, "label key %q must be 1 to %d letters, digits, '-', '_', '.' or '/', starting and ending with a letter or digit", safetext.Truncate(k, 70), MaxNameLength)
		}
		if len(v) > MaxLabelValueLength {
			d.add(d.valPos(f), f, "label value is %d characters; at most %d", len(v), MaxLabelValueLength)
		}
	}
	o.at = positions{
		name:           d.valPos("metadata.name"),
		host:           d.valPos("spec.host"),
		capacityVCPUs:  d.valPos("spec.capacity.vcpus"),
		capacityMemory: d.valPos("spec.capacity.memoryMB"),
		profile:        d.valPos("spec.profile"),
		arch:           d.valPos("spec.arch"),
		ageRecipient:   d.valPos(map[Kind]string{KindVM: "spec.cloudInit.encryptedUserData.recipient", KindHost: "spec.ageRecipient"}[o.kind]),
		// backupRepository is a VM's.
		backupRepository:  d.valPos("spec.backup.repository"),
		restoreRepository: d.valPos("spec.restore.repository"),
	}
	if o.kind == KindBackupRepository {
		o.at.repoHosts = make([]pos, len(o.backupRepo.Spec.Hosts))
		for i := range o.backupRepo.Spec.Hosts {
			o.at.repoHosts[i] = d.valPos(indexPath("spec.hosts", i))
		}
	}
	if o.kind == KindVM {
		o.at.nics = d.nicPositions(&o.vm.Spec)
		o.at.volumes = make([]pos, len(o.vm.Spec.Volumes))
		for i := range o.vm.Spec.Volumes {
			o.at.volumes[i] = d.valPos(indexPath("spec.volumes", i))
		}
	}
}

// nicPositions are where the NICs of s were written, in Interfaces'
// order.
func (d *nodeDecoder) nicPositions(s *VMSpec) []nicAt {
	nics := s.Interfaces()
	out := make([]nicAt, len(nics))
	for i, n := range nics {
		at := nicAt{netField: "spec.network", staticField: "spec.static"}
		if len(s.NICs) > 0 {
			f := indexPath("spec.nics", i)
			at = nicAt{netField: f + ".network", staticField: f + ".static", mac: d.valPos(f + ".mac")}
		}
		at.network = d.valPos(at.netField)
		if n.MAC == "" {
			at.mac = at.network
		}
		at.gateway4 = d.valPos(at.staticField + ".gateway4")
		if n.Static != nil {
			at.static = make([]pos, len(n.Static.Addresses))
			for j := range n.Static.Addresses {
				at.static[j] = d.valPos(indexPath(at.staticField+".addresses", j))
			}
		}
		out[i] = at
	}
	return out
}

func (d *nodeDecoder) checkVM(s *VMSpec) {
	if d.required("spec.host") {
		d.name("spec.host", s.Host)
	}
	if d.required("spec.vcpus") {
		d.intRange("spec.vcpus", s.VCPUs, 1, MaxVCPUs, "")
	}
	if d.required("spec.memoryMB") {
		d.intRange("spec.memoryMB", s.MemoryMB, MinMemoryMB, MaxMemoryMB, " MiB")
	}
	if d.required("spec.diskGB") {
		d.intRange("spec.diskGB", s.DiskGB, 1, MaxDiskGB, " GiB")
	}
	if s.RootDisk != nil {
		d.required("spec.rootDisk.adopt")
	}
	adopted := s.RootDisk != nil && s.RootDisk.Adopt
	if s.Image == nil && s.Kernel == nil && !adopted && !d.partial && d.written("spec") && !d.bad["spec"] && !d.bad["spec.image"] && !d.bad["spec.kernel"] && !d.bad["spec.rootDisk"] {
		d.add(d.keyPos("spec"), "spec", "needs an image, a kernel, or both, or an adopted root disk (rootDisk: {adopt: true})")
	}
	if adopted {
		d.adopted(s)
	}
	if d.written("spec.mac") && !d.bad["spec.mac"] {
		if msg := CheckMAC(s.MAC); msg != "" {
			d.add(d.valPos("spec.mac"), "spec.mac", "%s", msg)
		}
		if len(s.NICs) > 0 {
			d.add(d.keyPos("spec.mac"), "spec.mac", "is the one-NIC form's MAC; with spec.nics write each NIC's mac there")
		}
	}
	if s.Image != nil {
		d.artifact("spec.image", s.Image.URL, s.Image.SHA256)
	}
	if s.Kernel != nil {
		d.artifact("spec.kernel", s.Kernel.URL, s.Kernel.SHA256)
		if s.Kernel.Initrd != nil {
			d.artifact("spec.kernel.initrd", s.Kernel.Initrd.URL, s.Kernel.Initrd.SHA256)
		}
	}
	if d.written("spec.power") && !d.bad["spec.power"] && s.Power != PowerRunning && s.Power != PowerStopped {
		d.add(d.valPos("spec.power"), "spec.power", "must be running or stopped, got %q", s.Power)
	}
	if d.written("spec.network") {
		d.name("spec.network", s.Network)
	}
	if s.Static != nil {
		if !d.written("spec.network") && len(s.NICs) == 0 && !d.partial {
			d.add(d.keyPos("spec.static"), "spec.static", "needs spec.network: a static address is for a NIC on a host network")
		}
		d.checkStatic("spec.static", s.Static)
	}
	d.checkMachine(s)
	d.checkNICs(s)
	seen := make(map[string]int, len(s.Volumes))
	for i, v := range s.Volumes {
		f := indexPath("spec.volumes", i)
		d.name(f, v)
		if j, ok := seen[v]; ok {
			d.add(d.valPos(f), f, "volume %q is listed twice (first at spec.volumes[%d])", v, j)
			continue
		}
		seen[v] = i
	}
	if s.CloudInit != nil {
		d.checkCloudInit(s.CloudInit)
	}
	if s.Backup != nil {
		d.checkBackup(s.Backup)
	}
	if s.Restore != nil {
		d.checkRestore(s.Restore)
	}
}

// adopted refuses, beside rootDisk.adopt, the fields an adopted VM would
// never use: an image (its disk already exists), cloudInit and static
// (no NoCloud seed is written over a guest that already ran cloud-init).
func (d *nodeDecoder) adopted(s *VMSpec) {
	why := map[string]string{
		"spec.image":     "an adopted root disk is not made from an image; remove image (or rootDisk to create the VM afresh)",
		"spec.cloudInit": "an adopted VM gets no NoCloud seed (its guest ran cloud-init before); remove cloudInit and change the guest from inside",
		"spec.static":    "static addresses reach a guest in the NoCloud seed, which an adopted VM does not get; configure them inside the guest",
	}
	for _, f := range []string{"spec.image", "spec.cloudInit", "spec.static"} {
		if d.written(f) {
			d.add(d.keyPos(f), f, "%s", why[f])
		}
	}
}

// enumField checks that field, when written, is one of values.
func (d *nodeDecoder) enumField(field, got string, values ...string) bool {
	if !d.written(field) || d.bad[field] {
		return false
	}
	if !slices.Contains(values, got) {
		d.add(d.valPos(field), field, "must be %s, got %q", strings.Join(values, " or "), safetext.Truncate(got, 70))
		return false
	}
	return true
}

// checkCloudInit checks a VM's cloudInit on its own: each SSH key one
// non-empty line, the user-data, the sealed user-data.
func (d *nodeDecoder) checkCloudInit(ci *CloudInit) {
	for i, k := range ci.SSHAuthorizedKeys {
		f := indexPath("spec.cloudInit.sshAuthorizedKeys", i)
		switch {
		case d.bad[f]:
		case strings.TrimSpace(k) == "":
			d.add(d.valPos(f), f, "must not be empty")
		case strings.ContainsAny(k, "\r\n"):
			// cloud-init writes each entry as one line of
			// authorized_keys: a line break would install a key
			// the list does not show as one.
			d.add(d.valPos(f), f, "holds a line break: each entry is one line of authorized_keys; list each key as its own entry")
		}
	}
	d.userData(ci.UserData)
	if ci.EncryptedUserData != nil {
		d.encryptedUserData(ci)
	}
}

// checkMachine checks the machine model of a VM on its own: firmware,
// Secure Boot, architecture, machine type, CPU model and the firmware
// change opt-in. Whether the architecture is the Host's is a
// cross-object check.
func (d *nodeDecoder) checkMachine(s *VMSpec) {
	d.enumField("spec.firmware", string(s.Firmware), string(FirmwareBIOS), string(FirmwareUEFI))
	d.enumField("spec.arch", string(s.Arch), string(ArchAMD64), string(ArchARM64))
	for _, f := range []struct{ field, v string }{{"spec.machine", s.Machine}, {"spec.cpuModel", s.CPUModel}} {
		if !d.written(f.field) || d.bad[f.field] {
			continue
		}
		if !ValidQEMUName(f.v) {
			d.add(d.valPos(f.field), f.field, "%q must be 1 to %d letters, digits, '-', '_' or '.' (a QEMU name, without options)", safetext.Truncate(f.v, 70), MaxMachineLength)
		}
	}
	allow := d.enumField("spec.allowFirmwareChangeFrom", string(s.AllowFirmwareChangeFrom), string(FirmwareBIOS), string(FirmwareUEFI))
	if d.partial {
		return // the other file may set what these need
	}
	fw := s.Firmware.Or(FirmwareBIOS)
	if s.SecureBoot && fw != FirmwareUEFI && !d.bad["spec.firmware"] {
		d.add(d.valPos("spec.secureBoot"), "spec.secureBoot", "needs firmware: uefi (Secure Boot is a UEFI feature; the VM's firmware is %s)", fw)
	}
	if s.Arch == ArchARM64 && fw == FirmwareBIOS && s.Kernel == nil && !d.bad["spec.firmware"] {
		// Reported as the firmware's fault, where the arch is written
		// when the firmware is not.
		at := d.valPos("spec.arch")
		if d.written("spec.firmware") {
			at = d.valPos("spec.firmware")
		}
		d.add(at, "spec.firmware", "is bios, but arch arm64 has no BIOS: an image boots only with firmware: uefi (or give a kernel for a direct kernel boot)")
	}
	if s.SecureBoot && s.Arch.Or(ArchAMD64) == ArchAMD64 && s.Machine != "" && !d.bad["spec.machine"] && !isQ35(s.Machine) {
		d.add(d.valPos("spec.machine"), "spec.machine", "%q: Secure Boot on amd64 needs a q35 machine (its firmware runs in SMM)", s.Machine)
	}
	if s.Arch == ArchARM64 && s.Machine != "" && !d.bad["spec.machine"] && s.Machine != "virt" && !strings.HasPrefix(s.Machine, "virt-") {
		d.add(d.valPos("spec.machine"), "spec.machine", "%q: arm64 guests run on the virt machine", s.Machine)
	}
	if allow && s.AllowFirmwareChangeFrom == fw {
		// The firmware asked for is what makes the opt-in meaningless;
		// shown where the opt-in is written.
		d.add(d.valPos("spec.allowFirmwareChangeFrom"), "spec.firmware", "is %s, and allowFirmwareChangeFrom names it too: allowFirmwareChangeFrom names the firmware a created VM is changed from, another than firmware", fw)
	}
}

// ValidQEMUName reports whether s is a QEMU machine type or CPU model
// name spec.machine and spec.cpuModel accept: 1 to MaxMachineLength
// letters, digits, '-', '_' or '.', starting with a letter or digit (no
// comma, so no options).
func ValidQEMUName(s string) bool {
	return len(s) <= MaxMachineLength && machineRE.MatchString(s)
}

// isQ35 reports whether machine is QEMU's q35 or a versioned one of it.
func isQ35(machine string) bool {
	return machine == "q35" || strings.HasPrefix(machine, "pc-q35-")
}

// checkNICs checks spec.nics on its own (CheckNICs, each NIC's network
// a name and its static configuration); whether the networks exist and
// the MACs are the fleet's only ones are cross-object checks.
func (d *nodeDecoder) checkNICs(s *VMSpec) {
	for i, n := range s.NICs {
		f := indexPath("spec.nics", i)
		if d.required(f + ".network") {
			d.name(f+".network", n.Network)
		}
		if n.Static != nil {
			d.checkStatic(f+".static", n.Static)
		}
	}
	for _, p := range CheckNICs(s) {
		f := "spec." + p.Field
		if d.bad[f] {
			continue
		}
		at := d.valPos(f)
		if p.Field == "nics" || p.Field == "static" {
			at = d.keyPos(f)
		}
		d.add(at, f, "%s", p.Msg)
	}
}

// encryptedUserData checks spec.cloudInit.encryptedUserData without any
// key: a recipient that parses, a ciphertext that is an armored age file,
// and no plaintext userData beside it. Whether the recipient is its Host's
// is a cross-object check.
func (d *nodeDecoder) encryptedUserData(ci *CloudInit) {
	const f = "spec.cloudInit.encryptedUserData"
	if d.bad[f] {
		return
	}
	if d.written("spec.cloudInit.userData") {
		hint := ""
		if d.pos["spec.cloudInit.userData"].val.file != "" {
			hint = fmt.Sprintf("; to leave out the userData of profile %q, write userData: null beside encryptedUserData", d.profile)
		}
		d.add(d.keyPos(f), f, "spec.cloudInit has both userData and encryptedUserData; a VM's user-data is one or the other (gitfleet encrypt replaces userData with encryptedUserData)%s", hint)
	}
	e := ci.EncryptedUserData
	if d.required(f + ".recipient") {
		if _, err := sealed.ParseRecipient(e.Recipient); err != nil {
			d.add(d.valPos(f+".recipient"), f+".recipient", "%v", err)
		}
	}
	if d.required(f + ".ciphertext") {
		if err := sealed.CheckCiphertext(e.Ciphertext); err != nil {
			d.add(d.valPos(f+".ciphertext"), f+".ciphertext", "%v", err)
		}
	}
}

// userData reports what cloud-init would refuse in spec.cloudInit.userData
// (CheckUserData). A problem on line k of a literal block ("|") is placed
// on its line of the file; otherwise on the field, naming the line.
func (d *nodeDecoder) userData(ud string) {
	const f = "spec.cloudInit.userData"
	if !d.written(f) || d.bad[f] {
		return
	}
	fp := d.pos[f]
	for _, p := range CheckUserData([]byte(ud)) {
		at, msg := fp.val, p.Msg
		switch {
		case p.Line > 0 && fp.literal:
			at = pos{line: fp.val.line + p.Line, col: 1, file: fp.val.file}
			msg = fmt.Sprintf("user-data line %d: %s", p.Line, p.Msg)
		case p.Line > 0:
			msg = fmt.Sprintf("user-data line %d: %s", p.Line, p.Msg)
		}
		d.add(at, f, "%s", msg)
	}
}

// checkHost checks a Host's spec on its own: the suspend reason, the
// public keys, the capacity and each network.
func (d *nodeDecoder) checkHost(s *HostSpec) {
	d.suspendReason(s)
	if d.written("spec.ageRecipient") && !d.bad["spec.ageRecipient"] {
		if _, err := sealed.ParseRecipient(s.AgeRecipient); err != nil {
			d.add(d.valPos("spec.ageRecipient"), "spec.ageRecipient", "%v", err)
		}
	}
	if d.written("spec.agentKey") && !d.bad["spec.agentKey"] {
		if _, err := ParseAgentKey(s.AgentKey); err != nil {
			d.add(d.valPos("spec.agentKey"), "spec.agentKey", "%v", err)
		}
	}
	if c := s.Capacity; c != nil {
		d.intRange("spec.capacity.vcpus", c.VCPUs, 0, MaxHostVCPUs, " (0 means not limited)")
		d.intRange("spec.capacity.memoryMB", c.MemoryMB, 0, MaxHostMemoryMB, " MiB (0 means not limited)")
	}
	d.enumField("spec.arch", string(s.Arch), string(ArchAMD64), string(ArchARM64))
	d.hostNetworks(s.Networks)
}

// suspendReason checks spec.suspendReason: it needs suspend: true and is
// one short line of text.
func (d *nodeDecoder) suspendReason(s *HostSpec) {
	const rf = "spec.suspendReason"
	if !d.written(rf) || d.bad[rf] {
		return
	}
	switch {
	case !s.Suspend:
		d.add(d.keyPos(rf), rf, "needs suspend: true (a reason for a host that is not suspended would say nothing true)")
	case len(s.SuspendReason) > MaxSuspendReason:
		d.add(d.valPos(rf), rf, "is %d bytes; at most %d", len(s.SuspendReason), MaxSuspendReason)
	case strings.IndexFunc(s.SuspendReason, func(r rune) bool { return unicode.IsControl(r) || r == utf8.RuneError }) >= 0:
		d.add(d.valPos(rf), rf, "holds a control character or invalid UTF-8; one line of text")
	}
}

// natNet is a nat network of the Host being checked, for the overlap
// check.
type natNet struct {
	name            string
	prefix, prefix6 netip.Prefix
}

// hostNetworks checks each network of a Host, in name order, so that of
// two overlapping nat networks the later name is reported.
func (d *nodeDecoder) hostNetworks(networks map[string]Network) {
	names := make([]string, 0, len(networks))
	for name := range networks {
		names = append(names, name)
	}
	sort.Strings(names)
	var nats []natNet
	for _, name := range names {
		n := networks[name]
		f := "spec.networks." + name
		if msg := checkName(name); msg != "" {
			d.add(d.keyPos(f), f, "network name %s", msg)
		}
		if d.bad[f] {
			continue
		}
		bf, nf := f+".bridge", f+".nat"
		d.intRange(f+".vlan", n.VLAN, MinVLAN, MaxVLAN, "")
		switch {
		case d.written(bf) && d.written(nf):
			d.add(d.keyPos(nf), f, "has both bridge and nat; a network is one or the other")
		case !d.written(bf) && !d.written(nf):
			d.add(d.keyPos(f), f, "needs bridge (an existing host bridge) or nat (a network the agent manages)")
		case d.written(bf):
			d.bridge(bf, n.Bridge)
		case d.written(f+".vlan") && !d.bad[f+".vlan"] && n.VLAN >= MinVLAN && n.VLAN <= MaxVLAN:
			d.add(d.keyPos(f+".vlan"), f+".vlan", "is for a bridge network: a nat network's bridge is the agent's own, with one VLAN")
		case n.NAT != nil && d.required(nf+".cidr"):
			if p, ok := d.natNetwork(name, n.NAT, nats); ok {
				nats = append(nats, natNet{name, p, d.natIPv6(name, n.NAT, nats)})
			}
		}
	}
}

// bridge checks the bridge device named at field bf: a Linux interface
// name, and not one of the agent's own.
func (d *nodeDecoder) bridge(bf, bridge string) {
	if d.bad[bf] {
		return
	}
	if len(bridge) > MaxBridgeLength || !bridgeRE.MatchString(bridge) {
		d.add(d.valPos(bf), bf, "%q is not a Linux interface name (1 to %d letters, digits, '-', '_' or '.')", safetext.Truncate(bridge, 70), MaxBridgeLength)
	} else if strings.HasPrefix(bridge, ManagedBridgePrefix) {
		d.add(d.valPos(bf), bf, "%q starts with %q, the prefix of the bridges the agent makes for nat networks; name your own bridge otherwise", bridge, ManagedBridgePrefix)
	}
}

// natNetwork checks the nat network name of a Host, whose cidr was
// written, against the name's length limit and against the nat networks
// checked before it (nats). It returns the network's prefix and whether
// the cidr parses.
func (d *nodeDecoder) natNetwork(name string, nat *NAT, nats []natNet) (netip.Prefix, bool) {
	f := "spec.networks." + name
	if len(name) > MaxNATNameLength {
		d.add(d.keyPos(f), f, "a nat network's name is at most %d characters (its bridge is %s<name>, and Linux interface names are at most %d)", MaxNATNameLength, ManagedBridgePrefix, MaxBridgeLength)
	}
	cf := f + ".nat.cidr"
	p, err := nat.Prefix()
	if err != nil {
		d.add(d.valPos(cf), cf, "%v", err)
		return netip.Prefix{}, false
	}
	for _, o := range nats {
		if o.prefix.Overlaps(p) {
			d.add(d.valPos(cf), cf, "%s overlaps %s of network %q on this host; the nat networks of a host must not overlap", p, o.prefix, o.name)
		}
	}
	return p, true
}

// natIPv6 checks the IPv6 prefix of nat network name (Prefix6) and
// that no nat network checked before it (nats) has it; it returns the
// prefix, invalid when there is none or it is wrong.
func (d *nodeDecoder) natIPv6(name string, nat *NAT, nats []natNet) netip.Prefix {
	f := "spec.networks." + name + ".nat.ipv6"
	p, err := nat.Prefix6()
	if err != nil {
		d.add(d.valPos(f), f, "%v", err)
		return netip.Prefix{}
	}
	for _, o := range nats {
		if p.IsValid() && o.prefix6.IsValid() && o.prefix6.Overlaps(p) {
			d.add(d.valPos(f), f, "%s is also the IPv6 prefix of network %q on this host; the nat networks of a host must not overlap", p, o.name)
		}
	}
	return p
}

// checkStatic checks a NIC's static IP configuration st, written at
// field sf ("spec.static", "spec.nics[1].static"), on its own; whether
// the addresses fit the network is a cross-object check.
func (d *nodeDecoder) checkStatic(sf string, st *StaticIP) {
	if d.required(sf+".addresses") && len(st.Addresses) == 0 {
		d.add(d.valPos(sf+".addresses"), sf+".addresses", "must list at least one address")
	}
	for i, a := range st.Addresses {
		f := indexPath(sf+".addresses", i)
		if d.bad[f] {
			continue
		}
		p, err := netip.ParsePrefix(a)
		switch {
		case err != nil:
			d.add(d.valPos(f), f, "%q is not an address with a prefix length, such as 192.168.1.50/24", a)
		case p.Masked().Addr() == p.Addr() && p.Bits() < p.Addr().BitLen()-1:
			d.add(d.valPos(f), f, "%q is a network address, not a host's", a)
		}
	}
	if st.Gateway4 != "" && !d.bad[sf+".gateway4"] {
		if a, err := netip.ParseAddr(st.Gateway4); err != nil || !a.Is4() {
			d.add(d.valPos(sf+".gateway4"), sf+".gateway4", "%q is not an IPv4 address", st.Gateway4)
		} else if msg := offLink(a, st.Addresses); msg != "" {
			d.add(d.valPos(sf+".gateway4"), sf+".gateway4", "%s", msg)
		}
	}
	if ns := st.Nameservers; ns != nil {
		for i, a := range ns.Addresses {
			f := indexPath(sf+".nameservers.addresses", i)
			if _, err := netip.ParseAddr(a); err != nil && !d.bad[f] {
				d.add(d.valPos(f), f, "%q is not an IP address", a)
			}
		}
		for i, dom := range ns.Search {
			f := indexPath(sf+".nameservers.search", i)
			if !d.bad[f] && !isDomain(dom) {
				d.add(d.valPos(f), f, "%q is not a domain name (labels of 1 to 63 letters, digits, '-' or '_', joined by '.')", safetext.Truncate(dom, 70))
			}
		}
	}
}

// offLink reports why gateway gw cannot be the default route of a NIC
// with the static addresses addrs (those that parse): it is one of them,
// or inside none of their IPv4 prefixes, so the guest has no route to it
// (netplan's renderers refuse or ignore such a gateway). "" when it can.
func offLink(gw netip.Addr, addrs []string) string {
	onLink, any4 := false, false
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a)
		if err != nil || !p.Addr().Is4() {
			continue
		}
		any4 = true
		if p.Addr() == gw {
			return fmt.Sprintf("%s is the VM's own address %q, not a gateway", gw, a)
		}
		onLink = onLink || p.Masked().Contains(gw)
	}
	if any4 && !onLink {
		return fmt.Sprintf("%s is inside none of the VM's IPv4 static addresses' prefixes (%s): the guest would have no route to it", gw, strings.Join(addrs, ", "))
	}
	return ""
}

// crossCheck runs the checks between objects over objs, which are sorted
// by file. Where two objects conflict, the one in the earlier file is taken
// as the reference and the error is reported on the later one. complete is
// false when some files were rejected: then the checks that an object
// exists, and the capacity sums, are skipped.
//
// The checks run as steps in order: index the names (reporting
// duplicates), check each object's references, then each host's capacity
// against what its VMs ask.
func crossCheck(objs []*object, complete bool, unchanged map[*object]bool) []*Error {
	c := newCrossChecker(objs, complete, unchanged)
	c.indexNames()
	for _, o := range objs {
		if c.duplicate[o] {
			continue
		}
		switch o.kind {
		case KindVolume:
			c.volumeHost(o)
		case KindVM:
			c.vmHost(o)
			c.vmVolumes(o)
			c.vmBackup(o)
			c.vmMACs(o)
		case KindBackupRepository:
			c.backupRepositoryHosts(o)
		}
	}
	c.capacity()
	return c.errs
}

// crossChecker is the state of one crossCheck: the objects by kind and
// name, what each host's VMs ask, which VM each volume is attached to, and
// the errors so far.
type crossChecker struct {
	objs      []*object
	complete  bool
	unchanged map[*object]bool
	errs      []*Error

	hosts, volumes, vms, profiles, backupRepos map[string]*object
	// duplicate holds the objects whose name an earlier one took; they
	// are checked no further.
	duplicate map[*object]bool
	use       map[string]*hostUsage
	attached  map[string]*object
	statics   map[staticKey]*object
	macs      map[string]macOwner
}

// hostUsage is what the VMs on one host ask for in all.
type hostUsage struct {
	vcpus, memoryMB, count int
	vms                    []*object
}

// newCrossChecker sizes the indexes up front: a fleet of ten thousand VMs
// would grow each map a dozen times per pass.
func newCrossChecker(objs []*object, complete bool, unchanged map[*object]bool) *crossChecker {
	var nHosts, nVolumes int
	for _, o := range objs {
		switch o.kind {
		case KindHost:
			nHosts++
		case KindVolume:
			nVolumes++
		}
	}
	return &crossChecker{
		objs: objs, complete: complete, unchanged: unchanged,
		hosts:       make(map[string]*object, nHosts),
		volumes:     make(map[string]*object, nVolumes),
		vms:         make(map[string]*object, len(objs)-nHosts-nVolumes),
		duplicate:   make(map[*object]bool),
		use:         make(map[string]*hostUsage, nHosts),
		attached:    make(map[string]*object, nVolumes),
		statics:     make(map[staticKey]*object),
		macs:        make(map[string]macOwner),
		profiles:    make(map[string]*object),
		backupRepos: make(map[string]*object),
	}
}

// add records an error of o at p. An error at a field a VM takes from its
// profile lies in the profile's file and names the VM (viaProfile).
func (c *crossChecker) add(o *object, p pos, field, format string, args ...any) {
	file, msg := o.origin().File, fmt.Sprintf(format, args...)
	if p.file != "" && p.file != file {
		file, msg = p.file, msg+o.viaProfile()
	}
	c.errs = append(c.errs, &Error{File: file, Line: p.line, Col: p.col, Field: field, Msg: msg})
}

// indexNames files every object under its kind and name. Of two objects
// with one name, the one the change added (see Loader.SetBaseline), else
// the later one, is reported and marked duplicate.
func (c *crossChecker) indexNames() {
	for _, o := range c.objs {
		var m map[string]*object
		switch o.kind {
		case KindHost:
			m = c.hosts
		case KindVolume:
			m = c.volumes
		case KindVM:
			m = c.vms
		case KindProfile:
			m = c.profiles
		case KindBackupRepository:
			m = c.backupRepos
		}
		first, ok := m[o.name]
		if !ok {
			m[o.name] = o
			continue
		}
		added, existing := o, first
		if c.unchanged[o] && !c.unchanged[first] {
			// The earlier path is the one the change added.
			added, existing = first, o
			m[o.name] = o
		}
		since := ""
		if c.unchanged[existing] && !c.unchanged[added] {
			since = ", defined before this change"
		}
		c.add(added, added.at.name, "metadata.name", "%s %q is also defined in %s:%d:%d%s; names are unique per kind",
			added.kind, added.name, existing.origin().File, existing.at.name.line, existing.at.name.col, since)
		c.duplicate[added] = true
	}
}

// volumeHost checks that a Volume's host exists.
func (c *crossChecker) volumeHost(o *object) {
	if _, ok := c.hosts[o.volume.Spec.Host]; !ok && c.complete {
		c.add(o, o.at.host, "spec.host", "Host %q does not exist", o.volume.Spec.Host)
	}
}

// vmHost checks a VM against its host: that the host exists, that the
// VM's encrypted user-data is sealed to it, and that the VM's network and
// static addresses exist on it; it adds the VM to the host's usage.
func (c *crossChecker) vmHost(o *object) {
	s := &o.vm.Spec
	h, ok := c.hosts[s.Host]
	if !ok {
		if c.complete {
			c.add(o, o.at.host, "spec.host", "Host %q does not exist", s.Host)
		}
		return
	}
	u := c.use[s.Host]
	if u == nil {
		u = &hostUsage{}
		c.use[s.Host] = u
	}
	u.vcpus += s.VCPUs
	u.memoryMB += s.MemoryMB
	u.count++
	if ci := s.CloudInit; ci != nil && ci.EncryptedUserData != nil {
		if msg := checkSealedTo(ci.EncryptedUserData, h); msg != "" {
			c.add(o, o.at.ageRecipient, "spec.cloudInit.encryptedUserData.recipient", "%s", msg)
		}
	}
	u.vms = append(u.vms, o)
	if want := h.host.Spec.Arch.Or(ArchAMD64); s.Arch != "" && s.Arch != want {
		c.add(o, o.at.arch, "spec.arch", "is %s, but Host %q is %s (its spec.arch): a host runs guests of its own architecture", s.Arch, s.Host, want)
	}
	if s.Arch == "" && h.host.Spec.Arch == ArchARM64 && s.Firmware.Or(FirmwareBIOS) == FirmwareBIOS && s.Kernel == nil {
		c.add(o, o.at.host, "spec.host", "Host %q is arm64, which has no BIOS: an image boots there only with firmware: uefi (or give a kernel for a direct kernel boot)", s.Host)
	}
	for i, nic := range s.Interfaces() {
		if i >= len(o.at.nics) {
			break
		}
		at := o.at.nics[i]
		n, ok := h.host.Spec.Networks[nic.Network]
		if !ok && c.complete {
			c.add(o, at.network, at.netField, "Host %q has no network %q", s.Host, nic.Network)
		}
		if ok && nic.Static != nil {
			for _, e := range checkStaticOnNetwork(s.Host, nic, n, at, c.statics, o) {
				c.add(o, e.at, e.field, "%s", e.msg)
			}
		}
	}
}

// macOwner is the NIC that holds a MAC address: NIC index of VM o.
type macOwner struct {
	o     *object
	index int
}

// vmMACs checks that no NIC of VM o has the MAC of another VM's NIC
// (fixed, or derived: NICMAC), anywhere in the fleet: the bridge networks
// of several hosts may be one LAN, and a VM moves between hosts. The
// later file's NIC is reported, naming the earlier one's file.
func (c *crossChecker) vmMACs(o *object) {
	s := &o.vm.Spec
	for i, nic := range s.Interfaces() {
		if i >= len(o.at.nics) || (nic.MAC != "" && CheckMAC(nic.MAC) != "") {
			continue
		}
		mac := NICMAC(o.name, i, nic)
		other, ok := c.macs[mac]
		if !ok {
			c.macs[mac] = macOwner{o, i}
			continue
		}
		if other.o == o {
			continue // reported on its own (CheckNICs)
		}
		at := o.at.nics[i]
		field := at.netField
		if nic.MAC != "" {
			field = strings.TrimSuffix(at.netField, ".network") + ".mac"
		}
		c.add(o, at.mac, field, "MAC %s is also the MAC of VM %q's NIC %d (%s:%d:%d); a MAC belongs to one NIC in the fleet",
			mac, other.o.name, other.index, other.o.origin().File, other.o.at.nics[other.index].mac.line, other.o.at.nics[other.index].mac.col)
	}
}

// vmVolumes checks that each volume a VM lists exists, is on the VM's
// host and is attached to no other VM.
func (c *crossChecker) vmVolumes(o *object) {
	s := &o.vm.Spec
	for i, name := range s.Volumes {
		f := indexPath("spec.volumes", i)
		v, ok := c.volumes[name]
		switch {
		case !ok:
			if c.complete {
				c.add(o, o.at.volumes[i], f, "Volume %q does not exist", name)
			}
			continue
		case v.volume.Spec.Host != s.Host:
			c.add(o, o.at.volumes[i], f, "Volume %q is on host %q, not on this VM's host %q", name, v.volume.Spec.Host, s.Host)
		}
		if other, ok := c.attached[name]; ok && other != o {
			c.add(o, o.at.volumes[i], f, "Volume %q is already attached to VM %q (%s:%d:%d); a volume belongs to at most one VM",
				name, other.name, other.origin().File, other.at.name.line, other.at.name.col)
			continue
		}
		c.attached[name] = o
	}
}

// capacity checks, on each host that declares a capacity, that its VMs
// (stopped ones included) fit it. It is skipped while some files are
// rejected: they may define VMs, or the host itself.
func (c *crossChecker) capacity() {
	if !c.complete {
		return
	}
	for _, o := range c.objs {
		if o.kind != KindHost || c.duplicate[o] || o.host.Spec.Capacity == nil {
			continue
		}
		u := c.use[o.name]
		if u == nil {
			continue
		}
		hc := o.host.Spec.Capacity
		if hc.VCPUs > 0 && u.vcpus > hc.VCPUs {
			c.add(o, o.at.capacityVCPUs, "spec.capacity.vcpus", "the %d VMs on this host ask for %d vCPUs in all, more than its capacity of %d: %s",
				u.count, u.vcpus, hc.VCPUs, askers(u.vms, func(s *VMSpec) int { return s.VCPUs }, ""))
		}
		if hc.MemoryMB > 0 && u.memoryMB > hc.MemoryMB {
			c.add(o, o.at.capacityMemory, "spec.capacity.memoryMB", "the %d VMs on this host ask for %d MiB of memory in all, more than its capacity of %d MiB: %s",
				u.count, u.memoryMB, hc.MemoryMB, askers(u.vms, func(s *VMSpec) int { return s.MemoryMB }, " MiB"))
		}
	}
}

// checkSealedTo reports why user-data encrypted to e.Recipient cannot be
// opened by the agent of host h, or "": h must name that recipient. A
// Host whose key changed (its spec.ageRecipient replaced) and a VM moved
// to another host both land here, before any agent fails to build a seed.
func checkSealedTo(e *EncryptedUserData, h *object) string {
	want := h.host.Spec.AgeRecipient
	if _, err := sealed.ParseRecipient(e.Recipient); err != nil {
		return "" // reported on its own
	}
	switch {
	case want == "":
		return fmt.Sprintf("the user-data is encrypted to %s, but Host %q names no spec.ageRecipient (%s:%d:%d): give the Host its agent's public key (gitfleet age-keygen prints it), or write plain userData", e.Recipient, h.name, h.origin().File, h.at.name.line, h.at.name.col)
	case want != e.Recipient:
		return fmt.Sprintf("the user-data is encrypted to %s, but Host %q's spec.ageRecipient is %s (%s:%d:%d): the host's key changed or the VM moved, and that host's agent cannot decrypt it; encrypt its plaintext again for this host (gitfleet encrypt --host %s --user-data PLAINTEXT VMFILE), or, for a VM already created, remove encryptedUserData (cloudInit is read at first boot only)", e.Recipient, h.name, want, h.origin().File, h.at.ageRecipient.line, h.at.ageRecipient.col, h.name)
	}
	return ""
}

// maxAskers bounds the VMs a capacity message names.
const maxAskers = 10

// askers names the VMs that together overflow a host's capacity, largest
// ask first (then by name), each with what it asks (amount, unit) and
// where it is defined: "web-01 (vms/web-01.yaml:3:18) asks 4, …", at most
// maxAskers of them and a count of the rest.
func askers(vms []*object, amount func(*VMSpec) int, unit string) string {
	sorted := append([]*object(nil), vms...)
	sort.Slice(sorted, func(i, j int) bool {
		ai, aj := amount(&sorted[i].vm.Spec), amount(&sorted[j].vm.Spec)
		if ai != aj {
			return ai > aj
		}
		return sorted[i].name < sorted[j].name
	})
	var parts []string
	for i, o := range sorted {
		if i == maxAskers {
			parts = append(parts, fmt.Sprintf("and %d more", len(sorted)-maxAskers))
			break
		}
		parts = append(parts, fmt.Sprintf("%s (%s:%d:%d) asks %d%s", o.name, o.origin().File, o.at.name.line, o.at.name.col, amount(&o.vm.Spec), unit))
	}
	return strings.Join(parts, ", ")
}

// staticKey is one static address on one host network.
type staticKey struct {
	host, network string
	addr          netip.Addr
}

type staticError struct {
	at    pos
	field string
	msg   string
}

// checkStaticOnNetwork checks the static addresses of nic, a NIC of VM o
// on host, written at at, against network n of the host, and against the
// addresses of the VMs checked before it (statics, which it extends).
func checkStaticOnNetwork(host string, nic NIC, n Network, at nicAt, statics map[staticKey]*object, o *object) []staticError {
	var errs []staticError
	var cidr netip.Prefix
	if n.NAT != nil {
		var err error
		if cidr, err = n.NAT.Prefix(); err != nil {
			return nil // reported on the Host
		}
	}
	for i, a := range nic.Static.Addresses {
		p, err := netip.ParsePrefix(a)
		if err != nil || i >= len(at.static) {
			continue // reported on its own
		}
		f := indexPath(at.staticField+".addresses", i)
		at := at.static[i]
		if cidr.IsValid() && p.Addr().Is4() {
			switch {
			case !cidr.Contains(p.Addr()):
				errs = append(errs, staticError{at, f, fmt.Sprintf("%s is outside %s, the CIDR of network %q", p.Addr(), cidr, nic.Network)})
				continue
			case p.Bits() != cidr.Bits():
				errs = append(errs, staticError{at, f, fmt.Sprintf("%q: the prefix length must be %d, the one of network %q (%s)", a, cidr.Bits(), nic.Network, cidr)})
			case p.Addr() == n.NAT.Gateway():
				errs = append(errs, staticError{at, f, fmt.Sprintf("%s is the address of the agent's bridge on network %q", p.Addr(), nic.Network)})
			case p.Addr() == Broadcast(cidr):
				errs = append(errs, staticError{at, f, fmt.Sprintf("%s is the broadcast address of %s", p.Addr(), cidr)})
			}
		}
		k := staticKey{host, nic.Network, p.Addr()}
		if other, ok := statics[k]; ok && other != o {
			errs = append(errs, staticError{at, f, fmt.Sprintf("%s is already the static address of VM %q (%s:%d:%d)", p.Addr(), other.name, other.origin().File, other.at.name.line, other.at.name.col)})
			continue
		}
		statics[k] = o
	}
	if cidr.IsValid() && nic.Static.Gateway4 != "" {
		if g, err := netip.ParseAddr(nic.Static.Gateway4); err == nil && !cidr.Contains(g) {
			errs = append(errs, staticError{at.gateway4, at.staticField + ".gateway4", fmt.Sprintf("%s is outside %s, the CIDR of network %q", g, cidr, nic.Network)})
		}
	}
	return errs
}

func (o *object) origin() Origin {
	switch o.kind {
	case KindVM:
		return o.vm.Origin
	case KindVolume:
		return o.volume.Origin
	case KindProfile:
		return o.profile.Origin
	case KindBackupRepository:
		return o.backupRepo.Origin
	}
	return o.host.Origin
}
