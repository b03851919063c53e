package desired

// APIVersion is the only apiVersion this release accepts.
const APIVersion = "gitfleet.dev/v1alpha1"

// Kind names one of the object kinds.
type Kind string

// The object kinds of APIVersion. VMs, volumes and hosts are what the
// fleet runs; a Profile is part of a VM spec that VMs name (see Profile)
// and is never on a host itself.
const (
	KindVM      Kind = "VM"
	KindVolume  Kind = "Volume"
	KindHost    Kind = "Host"
	KindProfile Kind = "Profile"
)

// Power is a VM's desired power state.
type Power string

// The two power states a VM may ask for. The empty value decodes as
// PowerRunning.
const (
	PowerRunning Power = "running"
	PowerStopped Power = "stopped"
)

// Metadata identifies an object. Name is an RFC 1123 DNS label (at most 63
// characters) and, with the kind, the object's identity in the fleet.
type Metadata struct {
	Name   string            `yaml:"name" json:"name"`
	Labels map[string]string `yaml:"labels,omitempty" json:"labels,omitempty"`
}

func (Metadata) schema() typeSchema {
	return typeSchema{def: "metadata", desc: "The object's identity.", fields: map[string]fieldSchema{
		"name": {shape: "name", desc: "Unique per kind in the fleet: the object's identity."},
		"labels": {desc: "Free-form labels.",
			keys:   &fieldSchema{pattern: labelKeyRE.String(), maxLength: MaxNameLength},
			values: &fieldSchema{maxLength: MaxLabelValueLength}},
	}}
}

// Artifact is a file fetched by URL (schemes http, https, file) and checked
// against SHA256, 64 lowercase hex digits of the file's sha256.
type Artifact struct {
	URL    string `yaml:"url" json:"url"`
	SHA256 string `yaml:"sha256" json:"sha256"`
}

func (Artifact) schema() typeSchema {
	return typeSchema{def: "artifact", desc: "A file fetched by URL and checked against its sha256.", fields: map[string]fieldSchema{
		"url":    {shape: "url"},
		"sha256": {shape: "sha256"},
	}}
}

// Kernel is a direct kernel boot: the kernel artifact itself, an optional
// initrd, and the kernel command line.
type Kernel struct {
	URL     string    `yaml:"url" json:"url"`
	SHA256  string    `yaml:"sha256" json:"sha256"`
	Initrd  *Artifact `yaml:"initrd,omitempty" json:"initrd,omitempty"`
	Cmdline string    `yaml:"cmdline,omitempty" json:"cmdline,omitempty"`
}

func (Kernel) schema() typeSchema {
	return typeSchema{fields: map[string]fieldSchema{
		"url":     {shape: "url"},
		"sha256":  {shape: "sha256"},
		"initrd":  {},
		"cmdline": {desc: "Kernel command line."},
	}}
}

// CloudInit is what the VM's NoCloud seed carries, read by cloud-init once,
// at the VM's first boot: an edit of it is not applied to a created VM.
// UserData is the user-data document, in any format cloud-init reads
// (CheckUserData), written to the seed byte for byte. SSHAuthorizedKeys go
// to the seed's meta-data as public-keys, which cloud-init installs for the
// default user whatever UserData's format; each is one line of
// authorized_keys, non-empty and without a line break. Both are secrets: they appear in
// snapshots (the agent needs them) but never in status files or logs.
// EncryptedUserData is UserData encrypted to the VM's Host (at most one of
// the two is set): only that host's agent decrypts it, when it builds the
// seed.
type CloudInit struct {
	SSHAuthorizedKeys []string           `yaml:"sshAuthorizedKeys,omitempty" json:"sshAuthorizedKeys,omitempty"`
	UserData          string             `yaml:"userData,omitempty" json:"userData,omitempty"`
	EncryptedUserData *EncryptedUserData `yaml:"encryptedUserData,omitempty" json:"encryptedUserData,omitempty"`
}

func (CloudInit) schema() typeSchema {
	return typeSchema{fields: map[string]fieldSchema{
		"sshAuthorizedKeys": {items: &fieldSchema{minLength: 1},
			desc: "Public SSH keys for the default user (the seed's meta-data public-keys), each one line of authorized_keys."},
		"userData":          {desc: "The user-data document in any format cloud-init reads (#cloud-config, #cloud-config-archive, MIME multipart, script, ...), written to the seed byte for byte; read by cloud-init at the VM's first boot only."},
		"encryptedUserData": {desc: "userData encrypted with age to the VM's Host (gitfleet encrypt writes it); only that host's agent decrypts it, when it builds the seed. Not with userData."},
	}}
}

// EncryptedUserData is a user-data document encrypted with age to the
// VM's Host, as gitfleet encrypt writes it. Recipient is the public key it
// was encrypted to ("age1…"), which must be the Host's spec.ageRecipient:
// a Host whose key changed, or a VM moved to another host, is caught by
// validate rather than by a seed that cannot be built. Ciphertext is the
// ASCII-armored age file ("-----BEGIN AGE ENCRYPTED FILE-----"). The
// controller, plan and validate never decrypt it; the spec hash covers
// the ciphertext, so a new secret is a cloudInit change like any other.
type EncryptedUserData struct {
	Recipient  string `yaml:"recipient" json:"recipient"`
	Ciphertext string `yaml:"ciphertext" json:"ciphertext"`
}

func (EncryptedUserData) schema() typeSchema {
	return typeSchema{fields: map[string]fieldSchema{
		"recipient":  {pattern: "^age1", desc: "The public key it is encrypted to: the Host's spec.ageRecipient."},
		"ciphertext": {pattern: `^\s*-----BEGIN AGE ENCRYPTED FILE-----`, desc: "The ASCII-armored age file."},
	}}
}

// VMSpec is a VM's desired state.
type VMSpec struct {
	// Host names the Host object the VM runs on.
	Host string `yaml:"host" json:"host"`
	// VCPUs is the number of virtual CPUs, at least 1.
	VCPUs int `yaml:"vcpus" json:"vcpus"`
	// MemoryMB is guest memory in MiB, at least 64.
	MemoryMB int `yaml:"memoryMB" json:"memoryMB"`
	// DiskGB is the root disk size in GiB, at least 1. It may grow, never
	// shrink.
	DiskGB int `yaml:"diskGB" json:"diskGB"`
	// Image is the bootable disk image (qcow2 or raw), cached by sha256.
	// Optional when Kernel is given.
	Image *Artifact `yaml:"image,omitempty" json:"image,omitempty"`
	// Kernel is an optional direct kernel boot.
	Kernel *Kernel `yaml:"kernel,omitempty" json:"kernel,omitempty"`
	// Power is running (the default) or stopped.
	Power Power `yaml:"power,omitempty" json:"power,omitempty"`
	// Network optionally names a network of the VM's Host. The VM's one NIC
	// joins it instead of QEMU's user-mode network (which has an SSH port
	// forwarded on the hypervisor's 127.0.0.1): on a bridge network the
	// guest is on that LAN; on a nat network it gets a stable DHCP lease
	// from the agent's dnsmasq.
	Network string `yaml:"network,omitempty" json:"network,omitempty"`
	// Static gives the NIC fixed addresses instead of DHCP. It needs
	// Network; on a nat network every address must lie inside its CIDR.
	Static *StaticIP `yaml:"static,omitempty" json:"static,omitempty"`
	// NICs are the VM's NICs, at most MaxNICs, each on a different
	// network of its Host, in order (the guest sees them in PCI slot
	// order). Not with Network, which is the one-NIC form: Interfaces
	// gives either as a list.
	NICs []NIC `yaml:"nics,omitempty" json:"nics,omitempty"`
	// Volumes names Volume objects on the same host, attached in order.
	Volumes []string `yaml:"volumes,omitempty" json:"volumes,omitempty"`
	// CloudInit is the NoCloud seed's content.
	CloudInit *CloudInit `yaml:"cloudInit,omitempty" json:"cloudInit,omitempty"`
	// Backup opts the VM into scheduled backups of all its disks (root
	// and volumes) while it runs; nil: none.
	Backup *BackupPolicy `yaml:"backup,omitempty" json:"backup,omitempty"`
	// Restore makes the VM's disks, at its create, from a backup instead
	// of its image; nil: none. Read at create only, like cloudInit.
	Restore *RestoreSource `yaml:"restore,omitempty" json:"restore,omitempty"`
	// MAC is the fixed MAC address of the VM's one NIC, six colon-separated
	// hex octets of a unicast address ("52:54:00:12:34:56"); empty derives
	// a stable one from the VM's name. An adopted VM keeps the MAC it had
	// (gitfleet import writes it), so its guest's network configuration
	// and DHCP reservations still match.
	MAC string `yaml:"mac,omitempty" json:"mac,omitempty"`
	// RootDisk, when it says adopt, takes an existing disk as the VM's
	// root disk instead of making one from Image (see RootDisk).
	RootDisk *RootDisk `yaml:"rootDisk,omitempty" json:"rootDisk,omitempty"`
	// Firmware is what boots the VM: bios (the default, "" reads as it:
	// SeaBIOS on amd64, no firmware before a direct kernel boot on arm64)
	// or uefi (the distribution's OVMF or AAVMF, chosen from QEMU's
	// firmware descriptors, with a variables file of the VM's own that
	// survives restarts). A created VM's firmware changes only with
	// AllowFirmwareChangeFrom naming the firmware it has.
	Firmware Firmware `yaml:"firmware,omitempty" json:"firmware,omitempty"`
	// SecureBoot boots UEFI with Secure Boot on, from variables with the
	// distribution's enrolled keys. Needs Firmware uefi.
	SecureBoot bool `yaml:"secureBoot,omitempty" json:"secureBoot,omitempty"`
	// TPM gives the VM a TPM 2.0 (swtpm) whose state is the VM's own and
	// is kept in its directory across restarts.
	TPM bool `yaml:"tpm,omitempty" json:"tpm,omitempty"`
	// Arch is the guest's CPU architecture, amd64 or arm64; "" is the
	// Host's spec.arch. It must be the Host's: the agent runs guests of
	// its own architecture, and refuses before boot an image or kernel
	// whose architecture it reads as another.
	Arch Arch `yaml:"arch,omitempty" json:"arch,omitempty"`
	// Machine is QEMU's machine type ("q35", "pc-q35-7.2", "virt"); ""
	// is q35 on amd64 and virt on arm64. Secure Boot on amd64 needs a q35
	// machine (SMM).
	Machine string `yaml:"machine,omitempty" json:"machine,omitempty"`
	// CPUModel is QEMU's CPU model ("host", "max", "Skylake-Server");
	// "" is host under KVM and QEMU's default under TCG. host needs KVM.
	CPUModel string `yaml:"cpuModel,omitempty" json:"cpuModel,omitempty"`
	// AllowFirmwareChangeFrom opts in to changing a created VM's firmware
	// from the one named here to Firmware: its guest was installed for
	// the old firmware and will likely not boot. Without it the agent
	// refuses the edit. It must differ from Firmware.
	AllowFirmwareChangeFrom Firmware `yaml:"allowFirmwareChangeFrom,omitempty" json:"allowFirmwareChangeFrom,omitempty"`
}

// RootDisk says where a VM's root disk comes from. Adopt true: the disk
// is one the VM already had before gitfleet (gitfleet import), staged on
// the host in the agent's state directory at adopt/<vm>/root.qcow2 (a
// self-contained qcow2); the agent moves it into the VM's directory at
// create and never runs qemu-img create or writes a NoCloud seed for the
// VM, so cloud-init inside the guest never sees a new instance. An
// adopted spec names no image and no cloudInit (they would never be
// used); diskGB grows the disk when it is larger than the disk, as for
// any VM.
type RootDisk struct {
	Adopt bool `yaml:"adopt" json:"adopt"`
}

func (RootDisk) schema() typeSchema {
	return typeSchema{desc: "Where the root disk comes from.", fields: map[string]fieldSchema{
		"adopt": {desc: "Take the disk staged for this VM by gitfleet import --stage (<stateDir>/adopt/<vm>/root.qcow2) instead of making one from an image; no NoCloud seed is written for the VM."},
	}}
}

// Firmware is a VM's boot firmware.
type Firmware string

// The firmwares a VM may ask for. The empty value is FirmwareBIOS.
const (
	FirmwareBIOS Firmware = "bios"
	FirmwareUEFI Firmware = "uefi"
)

// Or is f, or def when f is empty.
func (f Firmware) Or(def Firmware) Firmware {
	if f == "" {
		return def
	}
	return f
}

// Arch is a CPU architecture, by Debian's name for it.
type Arch string

// The architectures hosts and guests may have. The empty value of a
// Host's spec.arch is ArchAMD64.
const (
	ArchAMD64 Arch = "amd64"
	ArchARM64 Arch = "arm64"
)

// Or is a, or def when a is empty.
func (a Arch) Or(def Arch) Arch {
	if a == "" {
		return def
	}
	return a
}

// MaxMachineLength bounds VMSpec.Machine and VMSpec.CPUModel, in bytes.
const MaxMachineLength = 64

func (VMSpec) schema() typeSchema {
	return typeSchema{
		def:   "vmSpec",
		desc:  "The VM's desired state. It needs an image, a kernel, or both, or an adopted root disk.",
		anyOf: [][]string{{"image"}, {"kernel"}, {"rootDisk"}},
		fields: map[string]fieldSchema{
			"host":     {shape: "name", desc: "The Host the VM runs on."},
			"vcpus":    {ints: between(1, MaxVCPUs), desc: "Virtual CPUs."},
			"memoryMB": {ints: between(MinMemoryMB, MaxMemoryMB), desc: "Guest memory in MiB."},
			"diskGB":   {ints: between(1, MaxDiskGB), desc: "Root disk size in GiB; may grow, never shrink."},
			"image":    {desc: "Bootable disk image (qcow2 or raw), cached by sha256."},
			"kernel":   {desc: "Direct kernel boot."},
			"power": {enum: []string{string(PowerRunning), string(PowerStopped)}, def: string(PowerRunning),
				desc: "Desired power state."},
			"network":   {shape: "name", desc: "A network of the VM's Host; the VM's NIC joins it instead of user-mode networking."},
			"static":    {desc: "Fixed addresses for the NIC instead of DHCP (netplan's field names); needs network."},
			"nics":      {maxItems: MaxNICs, desc: "The VM's NICs, each on a different network of its Host (at most 8); not with network, the one-NIC form."},
			"volumes":   {items: &fieldSchema{shape: "name"}, unique: true, desc: "Volume names on the same host, attached in order."},
			"cloudInit": {desc: "The NoCloud seed's content (secret: never logged)."},
			"mac":       {pattern: macPattern, desc: "Fixed MAC address of the VM's NIC (unicast, colon-separated hex); left out, one is derived from the VM's name."},
			"rootDisk":  {desc: "An adopted root disk instead of one made from the image."},
			"backup":    {desc: "Scheduled backups of every disk of the VM into a BackupRepository, while it runs."},
			"restore":   {desc: "At the VM's create only: its disks come from a backup instead of its image."},
			"firmware": {enum: []string{string(FirmwareBIOS), string(FirmwareUEFI)}, def: string(FirmwareBIOS),
				desc: "Boot firmware: bios, or uefi (OVMF/AAVMF with the VM's own variables file, kept across restarts). A created VM's firmware changes only with allowFirmwareChangeFrom."},
			"secureBoot": {desc: "UEFI Secure Boot with the distribution's enrolled keys; needs firmware: uefi."},
			"tpm":        {desc: "A TPM 2.0 (swtpm) of the VM's own, its state kept with the VM's disks."},
			"arch": {enum: []string{string(ArchAMD64), string(ArchARM64)},
				desc: "Guest CPU architecture; must be the Host's spec.arch (the default)."},
			"machine": {pattern: machineRE.String(), maxLength: MaxMachineLength,
				desc: "QEMU machine type; q35 on amd64 and virt on arm64 by default."},
			"cpuModel": {pattern: machineRE.String(), maxLength: MaxMachineLength,
				desc: "QEMU CPU model; host under KVM by default."},
			"allowFirmwareChangeFrom": {enum: []string{string(FirmwareBIOS), string(FirmwareUEFI)},
				desc: "Opt in to changing a created VM's firmware from this one to firmware (its guest will likely not boot); must differ from firmware."},
		},
	}
}

// VolumeSpec is a Volume's desired state.
type VolumeSpec struct {
	// Host names the Host object the volume lives on.
	Host string `yaml:"host" json:"host"`
	// SizeGB is the volume size in GiB, at least 1. A volume is created at
	// this size and never resized.
	SizeGB int `yaml:"sizeGB" json:"sizeGB"`
}

func (VolumeSpec) schema() typeSchema {
	return typeSchema{desc: "The volume's desired state.", fields: map[string]fieldSchema{
		"host":   {shape: "name", desc: "The Host the volume lives on."},
		"sizeGB": {ints: between(1, MaxVolumeGB), desc: "Size in GiB; a volume is never resized."},
	}}
}

// Capacity is what a host offers its VMs. Zero fields mean "not limited".
type Capacity struct {
	VCPUs    int `yaml:"vcpus,omitempty" json:"vcpus,omitempty"`
	MemoryMB int `yaml:"memoryMB,omitempty" json:"memoryMB,omitempty"`
}

func (Capacity) schema() typeSchema {
	return typeSchema{fields: map[string]fieldSchema{
		"vcpus":    {ints: between(0, MaxHostVCPUs), desc: "Virtual CPUs for all VMs together."},
		"memoryMB": {ints: between(0, MaxHostMemoryMB), desc: "Memory for all VMs together, in MiB."},
	}}
}

// StaticIP is a VM's fixed IP configuration, written into the NoCloud
// network-config (version 2, netplan's shape) of its seed. Field names are
// netplan's.
type StaticIP struct {
	// Addresses are the NIC's addresses with their prefix length, such as
	// "192.168.1.50/24" or "2001:db8::50/64". At least one.
	Addresses []string `yaml:"addresses" json:"addresses"`
	// Gateway4 is the IPv4 default route's next hop, such as
	// "192.168.1.1": inside the prefix of one of Addresses, and none of
	// them. On a nat network it defaults to the network's first
	// address (the agent's bridge); elsewhere no default route is set
	// without it.
	Gateway4 string `yaml:"gateway4,omitempty" json:"gateway4,omitempty"`
	// Nameservers are the guest's DNS servers and search domains. On a nat
	// network the servers default to the agent's dnsmasq.
	Nameservers *Nameservers `yaml:"nameservers,omitempty" json:"nameservers,omitempty"`
}

func (StaticIP) schema() typeSchema {
	return typeSchema{fields: map[string]fieldSchema{
		"addresses":   {minItems: 1, desc: "Addresses with prefix length, such as 192.168.1.50/24."},
		"gateway4":    {desc: "IPv4 default route's next hop; on a nat network, the network's first address by default."},
		"nameservers": {desc: "DNS servers and search domains."},
	}}
}

// Nameservers are DNS servers (IP addresses) and search domains.
type Nameservers struct {
	Addresses []string `yaml:"addresses,omitempty" json:"addresses,omitempty"`
	Search    []string `yaml:"search,omitempty" json:"search,omitempty"`
}

func (Nameservers) schema() typeSchema {
	return typeSchema{fields: map[string]fieldSchema{
		"addresses": {desc: "DNS servers' IP addresses; on a nat network, the agent's dnsmasq by default."},
		"search":    {desc: "DNS search domains."},
	}}
}

// Network is a host network VMs can join. Exactly one of Bridge and NAT is
// set.
type Network struct {
	// Bridge is an existing host bridge device, such as "br0" (the LAN).
	// The agent adds a tap per VM to it and never creates, changes or
	// deletes the bridge itself. Names starting "gf-" are the agent's own
	// and not allowed here.
	Bridge string `yaml:"bridge,omitempty" json:"bridge,omitempty"`
	// VLAN, on a bridge network, is the 802.1Q VLAN id (MinVLAN to
	// MaxVLAN) the VMs' taps join the bridge on, as access ports: the
	// tap's only VLAN, its port VLAN id, sent untagged to the guest. The
	// bridge must filter VLANs (vlan_filtering 1, which the host sets up,
	// with its trunk ports); the agent changes only its own taps. 0, the
	// default, leaves the taps in the bridge's default VLAN.
	VLAN int `yaml:"vlan,omitempty" json:"vlan,omitempty"`
	// NAT is a network the agent manages: see NAT.
	NAT *NAT `yaml:"nat,omitempty" json:"nat,omitempty"`
}

func (Network) schema() typeSchema {
	return typeSchema{
		desc:  "A host network: bridge (an existing host bridge) or nat (a network the agent manages).",
		oneOf: [][]string{{"bridge"}, {"nat"}},
		fields: map[string]fieldSchema{
			"bridge": {pattern: bridgeRE.String(), maxLength: MaxBridgeLength,
				desc: "An existing host bridge device, such as br0; the agent adds a tap per VM."},
			"vlan": {ints: between(MinVLAN, MaxVLAN),
				desc: "On a bridge network: the VLAN id (1 to 4094) the VMs' taps join the bridge on as access ports; the bridge must have VLAN filtering on."},
			"nat": {desc: "A network the agent manages: bridge gf-<name>, dnsmasq, masquerading."},
		},
	}
}

// NAT is a managed network: the agent creates bridge "gf-<network name>"
// holding the CIDR's first address, runs dnsmasq on it for DHCP and DNS,
// and masquerades the guests' traffic out of the host. Guests reach the
// host itself only for DHCP, DNS and ping.
type NAT struct {
	// CIDR is the network's IPv4 prefix, such as "10.77.0.0/24" (a network
	// address, prefix length 16 to 29, inside 10.0.0.0/8, 172.16.0.0/12,
	// 192.168.0.0/16 or 100.64.0.0/10: see NATRanges). CIDRs of one host's
	// nat networks must not overlap; the agent leaves a network whose CIDR
	// overlaps the host's own addresses or routes unmade.
	CIDR string `yaml:"cidr" json:"cidr"`
	// IPv6 is the network's optional IPv6 prefix, a unique local /64
	// (inside fd00::/8, RFC 4193), such as "fd00:77::/64": the bridge
	// takes its first address, the network's dnsmasq advertises the
	// prefix (router advertisements, SLAAC, stateless DHCPv6 for DNS),
	// and the host forwards and masquerades the guests' IPv6 as it does
	// their IPv4 (NAT66), with the same isolation. IPv6 prefixes of one
	// host's nat networks must not overlap.
	IPv6 string `yaml:"ipv6,omitempty" json:"ipv6,omitempty"`
}

func (NAT) schema() typeSchema {
	return typeSchema{fields: map[string]fieldSchema{
		"cidr": {desc: "Private IPv4 network, such as 10.77.0.0/24 (prefix length 16 to 29, inside 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 or 100.64.0.0/10)."},
		"ipv6": {desc: "Optional unique local IPv6 /64 inside fd00::/8, such as fd00:77::/64: router advertisements and SLAAC from the network's dnsmasq, forwarded and masqueraded like IPv4."},
	}}
}

// HostSpec is a Host's desired state.
type HostSpec struct {
	Capacity *Capacity          `yaml:"capacity,omitempty" json:"capacity,omitempty"`
	Networks map[string]Network `yaml:"networks,omitempty" json:"networks,omitempty"`
	// Suspend stops the host's reconciliation while true: its agent keeps
	// every guest as it is and running, keeps writing status, and acts on
	// nothing (no create, boot, stop, destroy, volume, network or image
	// cache change) until a snapshot without it arrives. Status, the
	// status README and gitfleet status say so, with SuspendReason.
	Suspend bool `yaml:"suspend,omitempty" json:"suspend,omitempty"`
	// SuspendReason says why, for people (at most MaxSuspendReason bytes
	// of printable text); it needs Suspend.
	SuspendReason string `yaml:"suspendReason,omitempty" json:"suspendReason,omitempty"`
	// AgeRecipient is the public key of the host agent's age identity
	// ("age1…", as gitfleet age-keygen or age-keygen -y prints it): VMs on
	// the host may carry user-data encrypted to it
	// (CloudInit.EncryptedUserData). Optional; public.
	AgeRecipient string `yaml:"ageRecipient,omitempty" json:"ageRecipient,omitempty"`
	// AgentKey is the public SSH key the host's agent signs its status
	// commits with: one authorized_keys line without options,
	// "ssh-ed25519 AAAA… [comment]" (the .pub line of the agent's
	// signingKey; gitfleet keygen prints it). When set, the controller
	// finalizes a delete on this host only on an ack whose status commit
	// is signed by this key (docs/DESIGN.md, "Authentic acks"); absent,
	// acks are taken unsigned. Optional; public.
	AgentKey string `yaml:"agentKey,omitempty" json:"agentKey,omitempty"`
	// Arch is the host's CPU architecture, amd64 (the default) or arm64:
	// its VMs' spec.arch must be it. The agent reports the architecture
	// it really runs on in status (agent.arch).
	Arch Arch `yaml:"arch,omitempty" json:"arch,omitempty"`
}

func (HostSpec) schema() typeSchema {
	return typeSchema{desc: "The host's desired state.", fields: map[string]fieldSchema{
		"capacity": {desc: "What the host offers its VMs; 0 or absent means not limited."},
		"networks": {keys: &fieldSchema{shape: "name"}, desc: "Networks the host's VMs can join, by name."},
		"suspend":  {desc: "Suspend the host's reconciliation: its agent keeps the guests running as they are, writes status and acts on nothing until this is removed."},
		"suspendReason": {maxLength: MaxSuspendReason,
			desc: "Why the host is suspended, shown in status; needs suspend: true."},
		"ageRecipient": {pattern: "^age1", desc: "The public key of the host agent's age identity (gitfleet age-keygen prints it): VMs on this host may carry user-data encrypted to it."},
		"agentKey":     {pattern: "^(ssh-|ecdsa-|sk-)", desc: "The public SSH key the host's agent signs its status commits with (gitfleet keygen prints it): deletes on this host are finalized only on acks signed by it."},
		"arch": {enum: []string{string(ArchAMD64), string(ArchARM64)}, def: string(ArchAMD64),
			desc: "The host's CPU architecture; its VMs' arch must be it."},
	}}
}

// MaxSuspendReason bounds HostSpec.SuspendReason, in bytes.
const MaxSuspendReason = 200

// Origin is where an object was read from: a slash-separated path relative
// to the tree root and the 1-based line and column of the object's document.
type Origin struct {
	File string `json:"file"`
	Line int    `json:"line"`
	Col  int    `json:"col"`
}

// VM is a decoded VM object. Spec is its effective spec: for a VM that
// names a profile, the profile's spec with the VM's own fields over it
// (see Profile), which is what snapshots carry and SpecHash hashes.
type VM struct {
	Metadata Metadata `yaml:"metadata" json:"metadata"`
	Spec     VMSpec   `yaml:"spec" json:"spec"`
	Origin   Origin   `yaml:"-" json:"-"`
	// Profile is the name of the Profile the VM's file names in
	// spec.profile, "" for none.
	Profile string `yaml:"-" json:"-"`
	// fieldAt is where some fields' values were written, by field path
	// ("spec.image.url"), for the messages that point at them.
	fieldAt map[string]Origin
}

// FieldOrigin is where field (a dotted path such as "spec.kernel.url")
// was written in the VM's file, when the decoder recorded it, else the
// object's own Origin.
func (vm *VM) FieldOrigin(field string) Origin {
	if o, ok := vm.fieldAt[field]; ok {
		return o
	}
	return vm.Origin
}

// Volume is a decoded Volume object.
type Volume struct {
	Metadata Metadata   `yaml:"metadata" json:"metadata"`
	Spec     VolumeSpec `yaml:"spec" json:"spec"`
	Origin   Origin     `yaml:"-" json:"-"`
}

// Host is a decoded Host object.
type Host struct {
	Metadata Metadata `yaml:"metadata" json:"metadata"`
	Spec     HostSpec `yaml:"spec" json:"spec"`
	Origin   Origin   `yaml:"-" json:"-"`
}

// Fleet is a whole, validated desired state: every object of a tree, keyed
// by metadata.name within each kind. A Fleet returned by Load without error
// has passed every cross-object check.
type Fleet struct {
	VMs     map[string]*VM
	Volumes map[string]*Volume
	Hosts   map[string]*Host
	// Profiles are the fleet's Profile objects; the VMs' specs already
	// hold what they take from them.
	Profiles map[string]*Profile
	// BackupRepositories are the fleet's BackupRepository objects.
	BackupRepositories map[string]*BackupRepository
}
