package desired

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/gitfleet/gitfleet/internal/redact"
)

// Action is what a plan does to one object on one host.
type Action string

// Plan actions. A host move is a Delete on the old host (MovedTo set) and a
// Create on the new one (MovedFrom set): the object is destroyed and created
// again, never migrated.
const (
	ActionCreate   Action = "create"
	ActionUpdate   Action = "update"
	ActionDelete   Action = "delete"
	ActionUndelete Action = "undelete"
)

// Plan is what merging head over base would do to the fleet, host by host
// (the `gitfleet plan` output and the pull-request comment). Errors are the
// validation errors of head, as FILE:LINE:COL: message; a Plan with errors
// would be rejected by the controller and its Hosts are empty. Warnings
// say what a reader must know before trusting the plan (a base that does
// not validate, so the plan was computed against another base; a mass
// delete that a Gitfleet-Allow-Deletes trailer lets through); they are
// shown at the top. Guards are the controller's checks beyond validation
// that the change trips as it stands (a commit signature refused, the
// mass-delete guard and the trailer it needs): the controller would reject
// the head for each. Profiles are the profiles the change edits, each with
// the VMs it reaches grouped by effect.
type Plan struct {
	Base     string        `json:"base"`
	Head     string        `json:"head"`
	Hosts    []HostPlan    `json:"hosts"`
	Profiles []ProfilePlan `json:"profiles,omitempty"`
	Errors   []string      `json:"errors,omitempty"`
	Warnings []string      `json:"warnings,omitempty"`
	Guards   []string      `json:"guards,omitempty"`
}

// HostPlan is the changes on one host, ordered deletes first, then
// un-deletes, creates and updates; by kind and name within each action.
type HostPlan struct {
	Host    string       `json:"host"`
	Changes []PlanChange `json:"changes"`
}

// PlanChange is one object's change. Fields lists changed fields of an
// update, by their YAML path ("spec.vcpus"); secret fields
// (spec.cloudInit.*) show only that they changed. Warnings say what a person
// must know before merging: data loss, a destroy-and-create host move, a
// change the agent will not apply to an existing disk.
type PlanChange struct {
	Action    Action        `json:"action"`
	Kind      Kind          `json:"kind"`
	Name      string        `json:"name"`
	MovedFrom string        `json:"movedFrom,omitempty"`
	MovedTo   string        `json:"movedTo,omitempty"`
	Fields    []FieldChange `json:"fields,omitempty"`
	Warnings  []string      `json:"warnings,omitempty"`
}

// FieldChange is one changed field: its YAML path, the old and new values
// rendered compactly ("" when absent), and, for a VM, what the change does
// to the existing guest (Effect).
type FieldChange struct {
	Field  string `json:"field"`
	Old    string `json:"old"`
	New    string `json:"new"`
	Effect Effect `json:"effect,omitempty"`
}

// Effect is what an update of one field of a VM does to the existing VM,
// as the agent applies it (see docs/DESIGN.md, "Spec edits").
type Effect string

// The effects of a VM field update. Every edit is staged first: each new
// artifact is fetched and verified while the VM keeps running, and an edit
// that fails leaves the VM running on its previous spec.
const (
	// EffectRestart: vCPUs, memory, network, volumes, kernel of a VM that
	// runs: a graceful shutdown, then a boot with the new spec.
	EffectRestart Effect = "restarts the VM"
	// EffectBoots: power from stopped to running.
	EffectBoots Effect = "boots the VM"
	// EffectShutsDown: power from running to stopped (a graceful
	// shutdown; the disk is kept).
	EffectShutsDown Effect = "shuts the VM down"
	// EffectGrowsDisk: a larger diskGB, grown in place without a restart
	// (the guest's growpart extends its partition at its next boot).
	EffectGrowsDisk Effect = "grows the disk, no restart"
	// EffectNone: metadata (labels), which the agent records and the
	// guest never sees.
	EffectNone Effect = "changes nothing on the guest"
	// EffectNextBoot: a restart-class change of a VM whose spec says
	// stopped, before or after the change: it applies when the VM is
	// next booted (by this change, when it sets power to running).
	EffectNextBoot Effect = "applies at next boot"
	// EffectNotApplied: image, cloudInit, static addresses (cloud-init's
	// network-config, applied at first boot), rootDisk (an adopted disk is
	// taken at create) and a smaller diskGB are kept
	// in the spec but never applied to the existing VM; all but diskGB
	// apply when the VM is created again.
	EffectNotApplied Effect = "not applied to the existing VM"
)

// vmFieldEffect is the Effect of changing field of a VM from old to new,
// the VM's power in base being basePower and in head power ("" is
// running).
func vmFieldEffect(field, old, new, basePower, power string) Effect {
	switch {
	case strings.HasPrefix(field, "spec.cloudInit."), strings.HasPrefix(field, "spec.image."), staticField(field),
		strings.HasPrefix(field, "spec.rootDisk."),
		strings.HasPrefix(field, "spec.restore."):
		return EffectNotApplied
	case field == "spec.diskGB":
		if atoi(new) < atoi(old) {
			return EffectNotApplied
		}
		return EffectGrowsDisk
	case field == "spec.power":
		if new == string(PowerStopped) {
			return EffectShutsDown
		}
		return EffectBoots
	case strings.HasPrefix(field, "metadata."), field == "spec.profile", strings.HasPrefix(field, "spec.backup."):
		// A backup policy is the agent's schedule: the guest never sees it.
		// The profile a VM names is no part of its effective spec: the
		// fields it changes are listed with their own effects.
		return EffectNone
	case field == "spec.allowFirmwareChangeFrom":
		return EffectNone
	}
	// vcpus, memoryMB, network, volumes, kernel.*, firmware, secureBoot,
	// tpm, arch, machine, cpuModel, and any field not
	// named above: what QEMU is started with. A VM stopped before or
	// after the change is not restarted for it.
	if power == string(PowerStopped) || basePower == string(PowerStopped) {
		return EffectNextBoot
	}
	return EffectRestart
}

// NICsEditWarning is the plan's warning for a VM whose NICs change
// (network, MAC, model, a NIC added or removed).
const NICsEditWarning = "the VM restarts with its NICs as listed; a NIC added to a created VM is not in the network-config cloud-init applied at its first boot, so the guest configures it itself"

// staticField reports whether field is part of a NIC's static addresses
// (spec.static.…, spec.nics[i].static.…): first-boot-only, like cloudInit.
func staticField(field string) bool {
	if strings.HasPrefix(field, "spec.static.") {
		return true
	}
	rest, ok := strings.CutPrefix(field, "spec.nics[")
	if !ok {
		return false
	}
	_, after, ok := strings.Cut(rest, "]")
	return ok && strings.HasPrefix(after, ".static.")
}

// ObjectRef names one object on one host.
type ObjectRef struct {
	Kind Kind   `json:"kind"`
	Name string `json:"name"`
	Host string `json:"host"`
}

// PlanOptions adds what the two fleets cannot tell. Pending are the
// tombstones not yet finalized (from the published snapshots): an object of
// head that base lacks and that is pending on the same host is an un-delete,
// not a create.
type PlanOptions struct {
	Pending []ObjectRef
	// Retained are the objects kept after a history rewrite (the ledger's):
	// an object of head that base lacks and that is retained on the same
	// host is desired again, not created.
	Retained []ObjectRef
}

// Empty reports whether the plan changes nothing and has no errors.
func (p *Plan) Empty() bool { return len(p.Hosts) == 0 && len(p.Profiles) == 0 && len(p.Errors) == 0 }

// ComputePlan diffs two valid fleets. Either may be nil, read as empty.
// base and head of the returned Plan are left for the caller to fill in.
func ComputePlan(base, head *Fleet, opts PlanOptions) *Plan {
	if base == nil {
		base = &Fleet{}
	}
	if head == nil {
		head = &Fleet{}
	}
	pending, retained := map[ObjectRef]bool{}, map[ObjectRef]bool{}
	for _, r := range opts.Pending {
		pending[r] = true
	}
	for _, r := range opts.Retained {
		retained[r] = true
	}
	byHost := map[string][]PlanChange{}
	add := func(host string, c PlanChange) { byHost[host] = append(byHost[host], c) }

	diff := func(kind Kind, oldObjs, newObjs map[string]planObject) {
		for name, o := range oldObjs {
			n, ok := newObjs[name]
			switch {
			case !ok:
				add(o.host, PlanChange{Action: ActionDelete, Kind: kind, Name: name, Warnings: deleteWarnings(kind, "")})
			case n.host != o.host:
				add(o.host, PlanChange{Action: ActionDelete, Kind: kind, Name: name, MovedTo: n.host, Warnings: deleteWarnings(kind, n.host)})
				add(n.host, PlanChange{Action: ActionCreate, Kind: kind, Name: name, MovedFrom: o.host,
					Warnings: []string{fmt.Sprintf("host move from %s: created empty here, nothing is copied", o.host)}})
			default:
				if c, ok := updateChange(kind, name, o, n); ok {
					add(o.host, c)
				}
			}
		}
		for name, n := range newObjs {
			if _, ok := oldObjs[name]; ok {
				continue
			}
			if pending[ObjectRef{Kind: kind, Name: name, Host: n.host}] {
				add(n.host, PlanChange{Action: ActionUndelete, Kind: kind, Name: name,
					Warnings: []string{"the pending delete is cancelled; the existing disk is kept"}})
				continue
			}
			if retained[ObjectRef{Kind: kind, Name: name, Host: n.host}] {
				add(n.host, PlanChange{Action: ActionUndelete, Kind: kind, Name: name,
					Warnings: []string{RetainedRestoreWarning}})
				continue
			}
			add(n.host, PlanChange{Action: ActionCreate, Kind: kind, Name: name})
		}
	}
	diff(KindHost, hostObjects(base), hostObjects(head))
	diff(KindVolume, volumeObjects(base), volumeObjects(head))
	diff(KindVM, vmObjects(base), vmObjects(head))
	restoreNotes(byHost, head)

	suspendedWait(byHost, head)
	p := &Plan{Hosts: sortedHostPlans(byHost)}
	p.Profiles = profilePlans(base, head, p.Hosts)
	return p
}

// updateChange is the update of object name of kind from o to n, with
// each field's effect on a VM and the warnings it needs; false when no
// field changed.
func updateChange(kind Kind, name string, o, n planObject) (PlanChange, bool) {
	fields := diffFields(o.fields, n.fields)
	if len(fields) == 0 {
		return PlanChange{}, false
	}
	if kind == KindVM {
		for i, f := range fields {
			fields[i].Effect = vmFieldEffect(f.Field, o.fields[f.Field], n.fields[f.Field], o.fields["spec.power"], n.fields["spec.power"])
		}
	}
	w := updateWarnings(kind, fields)
	if kind == KindVM {
		w = append(w, firmwareWarnings(o.fields, n.fields)...)
	}
	return PlanChange{Action: ActionUpdate, Kind: kind, Name: name, Fields: fields, Warnings: w}, true
}

// sortedHostPlans is byHost as host plans sorted by host, each host's
// changes by action (actionRank), kind (kindRank) and name.
func sortedHostPlans(byHost map[string][]PlanChange) []HostPlan {
	hosts := []HostPlan{}
	for host, changes := range byHost {
		sort.Slice(changes, func(i, j int) bool {
			a, b := changes[i], changes[j]
			if actionRank[a.Action] != actionRank[b.Action] {
				return actionRank[a.Action] < actionRank[b.Action]
			}
			if kindRank[a.Kind] != kindRank[b.Kind] {
				return kindRank[a.Kind] < kindRank[b.Kind]
			}
			return a.Name < b.Name
		})
		hosts = append(hosts, HostPlan{Host: host, Changes: changes})
	}
	sort.Slice(hosts, func(i, j int) bool { return hosts[i].Host < hosts[j].Host })
	return hosts
}

// restoreNotes says, on each VM create whose spec restores from a backup,
// where its disks come from.
func restoreNotes(byHost map[string][]PlanChange, head *Fleet) {
	for _, changes := range byHost {
		for i, c := range changes {
			vm := head.VMs[c.Name]
			if c.Kind != KindVM || c.Action != ActionCreate || vm == nil || vm.Spec.Restore == nil {
				continue
			}
			r := vm.Spec.Restore
			from, by := r.VM, ""
			if from == "" {
				from = c.Name
			}
			if r.Host != "" {
				by = " made by " + r.Host
			}
			changes[i].Warnings = append(changes[i].Warnings,
				fmt.Sprintf("disks restored from backup %s of VM %s%s in repository %s, not made from the image", r.Backup, from, by, r.Repository))
		}
	}
}

var actionRank = map[Action]int{ActionDelete: 0, ActionUndelete: 1, ActionCreate: 2, ActionUpdate: 3}
var kindRank = map[Kind]int{KindHost: 0, KindVolume: 1, KindVM: 2}

func deleteWarnings(kind Kind, movedTo string) []string {
	var w []string
	if movedTo != "" {
		w = append(w, fmt.Sprintf("host move to %s: destroyed here and created again there", movedTo))
	}
	switch kind {
	case KindVM:
		w = append(w, "the root disk is destroyed after the tombstone grace")
	case KindVolume:
		w = append(w, "data loss: the volume is destroyed after the tombstone grace")
	}
	return w
}

func updateWarnings(kind Kind, fields []FieldChange) []string {
	var w []string
	for _, f := range fields {
		switch {
		case kind == KindVM && f.Field == "spec.diskGB" && atoi(f.New) < atoi(f.Old):
			w = append(w, fmt.Sprintf("root disks never shrink: an existing disk stays at %s GB", f.Old))
		case kind == KindVM && strings.HasPrefix(f.Field, "spec.image."):
			w = append(w, "a changed image does not touch an existing root disk")
		case kind == KindVM && strings.HasPrefix(f.Field, "spec.cloudInit."):
			w = append(w, CloudInitEditWarning)
		case kind == KindVolume && f.Field == "spec.sizeGB":
			w = append(w, "volumes are never resized: an existing volume keeps its size")
		case kind == KindVM && f.Field == "spec.network":
			w = append(w, "the VM restarts with its NIC on the new network, at a new address")
		case kind == KindVM && strings.HasPrefix(f.Field, "spec.nics") && !staticField(f.Field):
			w = append(w, NICsEditWarning)
		case kind == KindHost && f.Field == "spec.suspend" && f.New == "true":
			w = append(w, SuspendWarning)
		case kind == KindHost && f.Field == "spec.suspend" && f.Old == "true":
			w = append(w, "reconciliation resumes: the host's agent applies every change that waited while it was suspended")
		case kind == KindHost && f.Field == "spec.ageRecipient":
			w = append(w, AgeRecipientWarning)
		case kind == KindHost && f.Field == "spec.agentKey" && f.New != "":
			w = append(w, AgentKeyWarning)
		case kind == KindHost && f.Field == "spec.agentKey":
			w = append(w, "the host's acks are taken unsigned again: anyone who can push to its status branch can ack its deletes")
		case kind == KindVM && staticField(f.Field):
			w = append(w, "static addresses reach the guest in cloud-init's network-config, which cloud-init applies at an instance's first boot only: the created VM keeps the addresses it was created with; they apply when the VM is created again")
		case kind == KindVM && strings.HasPrefix(f.Field, "spec.rootDisk."):
			w = append(w, "a disk is adopted when the VM is created: the created VM keeps the root disk it has (and its seed, or none)")
		}
	}
	if kind == KindHost {
		w = append(w, networkWarnings(fields)...)
	}
	return dedupe(w)
}

// firmwareWarnings says what a change of a VM's firmware from base's
// fields to head's does: the guest was installed for the old firmware,
// and the agent refuses the change unless head's
// spec.allowFirmwareChangeFrom names the old one.
func firmwareWarnings(base, head map[string]string) []string {
	from := Firmware(base["spec.firmware"]).Or(FirmwareBIOS)
	to := Firmware(head["spec.firmware"]).Or(FirmwareBIOS)
	if from == to {
		return nil
	}
	if Firmware(head["spec.allowFirmwareChangeFrom"]) == from {
		return []string{fmt.Sprintf("firmware changes from %s to %s (allowed by allowFirmwareChangeFrom: %s): the guest's boot loader was installed for %s and will likely not boot", from, to, from, from)}
	}
	return []string{fmt.Sprintf(FirmwareChangeRefused, from, to, from)}
}

// FirmwareChangeRefused is the plan's warning, and the agent's error, on a
// firmware change of a created VM without the opt-in; its verbs are the
// old firmware, the new one and the old one again.
const FirmwareChangeRefused = "firmware change from %s to %s refused: the guest was installed for its firmware and will likely not boot on another; the VM keeps its firmware unless the spec also sets allowFirmwareChangeFrom: %s"

// RetainedRestoreWarning is the plan's note on an object kept after a
// history rewrite whose file comes back: it is desired again, nothing is
// created.
const RetainedRestoreWarning = "kept after a history rewrite and desired again: nothing is created, the existing VM or volume and its data are kept (a spec that differs from the one it runs is applied as an edit)"

// SuspendedWaitWarning is the plan's warning on a change of a VM or
// volume whose host head suspends: the change waits until it resumes.
const SuspendedWaitWarning = "waits: the host is suspended, and this change is applied once suspend is removed"

// suspendedWait warns on every VM and volume change on a host that head
// suspends.
func suspendedWait(byHost map[string][]PlanChange, head *Fleet) {
	for host, changes := range byHost {
		h := head.Hosts[host]
		if h == nil || !h.Spec.Suspend {
			continue
		}
		for i := range changes {
			if changes[i].Kind != KindHost {
				changes[i].Warnings = append(changes[i].Warnings, SuspendedWaitWarning)
			}
		}
	}
}

// SuspendWarning is the plan's warning on a Host being suspended.
const SuspendWarning = "the host is suspended: its agent keeps its guests running as they are and acts on nothing (no create, boot, stop, destroy, volume or network change) until suspend is removed; changes to its VMs and volumes wait"

// CloudInitEditWarning is the plan's warning on a cloudInit change of an
// existing VM.
const CloudInitEditWarning = "cloudInit is not applied to the existing VM: cloud-init seeds a VM once, at its first boot, and never removes a key it installed; " +
	"to rotate an SSH key, add the new key to and remove the old one from ~/.ssh/authorized_keys inside the guest; this cloudInit seeds the VM only if it is created again"

// AgeRecipientWarning is the plan's warning on a change of a Host's
// spec.ageRecipient: the host's agent must hold the new key before the
// change merges, and every VM's encryptedUserData on the host must be
// encrypted to it (validate refuses one that is not).
const AgeRecipientWarning = "the host's age recipient changes: add the new identity to the agent's ageIdentity file on this host before this merges (keep the old one until every VM created from its user-data is running); " +
	"every VM's encryptedUserData here must be encrypted to the new recipient (gitfleet encrypt --host), and validate refuses one that is not; a created VM keeps running on the seed it was created with"

// AgentKeyWarning is the plan's warning on a Host's new or changed
// spec.agentKey: only acks signed by it finalize deletes on the host.
const AgentKeyWarning = "the host's agent key changes: from this merge on, deletes on this host are finalized only on acks signed by this key; set the agent's signingKey to its private half first (gitfleet keygen --host), or the host's deletes wait, pending"

// networkWarnings says what a Host's changed networks do to their guests:
// a renumbered nat network, a network removed, a network on another
// bridge or of the other kind (the running guests stay where they are
// until they restart: a host network's definition is not the VM's spec).
func networkWarnings(fields []FieldChange) []string {
	var w []string
	removed := map[string]bool{}
	var names []string
	type kinds struct{ wasNAT, isNAT, wasBridge, isBridge bool }
	kind := map[string]*kinds{}
	for _, f := range fields {
		rest, ok := strings.CutPrefix(f.Field, "spec.networks.")
		if !ok {
			continue
		}
		name, leaf, _ := strings.Cut(rest, ".")
		if _, seen := removed[name]; !seen {
			names = append(names, name)
			removed[name] = true
			kind[name] = &kinds{}
		}
		removed[name] = removed[name] && f.New == ""
		k := kind[name]
		switch leaf {
		case "nat.cidr":
			k.wasNAT, k.isNAT = f.Old != "", f.New != ""
			if f.Old != "" && f.New != "" {
				w = append(w, fmt.Sprintf("network %s is renumbered: its guests get new addresses at their next DHCP renewal (within 30 minutes) or restart", name))
			}
		case "bridge":
			k.wasBridge, k.isBridge = f.Old != "", f.New != ""
			if f.Old != "" && f.New != "" {
				w = append(w, fmt.Sprintf("network %s moves from bridge %s to bridge %s: its running guests stay on %s until they restart", name, f.Old, f.New, f.Old))
			}
		}
	}
	for _, name := range names {
		k := kind[name]
		switch {
		case removed[name]:
			w = append(w, fmt.Sprintf("network %s is removed from the host once no VM there uses it", name))
		case k.wasNAT && k.isBridge:
			w = append(w, fmt.Sprintf("network %s changes from nat to bridge: its running guests stay on the nat network until they restart", name))
		case k.wasBridge && k.isNAT:
			w = append(w, fmt.Sprintf("network %s changes from bridge to nat: its running guests stay on the bridge until they restart", name))
		}
	}
	return w
}

func atoi(s string) int {
	var n int
	fmt.Sscanf(s, "%d", &n)
	return n
}

func dedupe(s []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// planObject is one object reduced to its host and flattened fields.
type planObject struct {
	host   string
	fields map[string]string
}

// planObjects reduces each object of one kind to its host and the flattened
// fields of its metadata and spec; view picks those three out of an object.
func planObjects[T any](objs map[string]*T, view func(name string, o *T) (host string, meta Metadata, spec any)) map[string]planObject {
	out := make(map[string]planObject, len(objs))
	for name, o := range objs {
		host, meta, spec := view(name, o)
		out[name] = planObject{host: host, fields: flatten(struct {
			Metadata Metadata `json:"metadata"`
			Spec     any      `json:"spec"`
		}{meta, spec})}
	}
	return out
}

// vmObjects flattens each VM's effective spec and, as spec.profile, the
// profile its file names.
func vmObjects(f *Fleet) map[string]planObject {
	type withProfile struct {
		VMSpec
		Profile string `json:"profile,omitempty"`
	}
	return planObjects(f.VMs, func(_ string, vm *VM) (string, Metadata, any) {
		return vm.Spec.Host, vm.Metadata, withProfile{vm.Spec, vm.Profile}
	})
}

func volumeObjects(f *Fleet) map[string]planObject {
	return planObjects(f.Volumes, func(_ string, v *Volume) (string, Metadata, any) { return v.Spec.Host, v.Metadata, v.Spec })
}

// hostObjects places each host on itself.
func hostObjects(f *Fleet) map[string]planObject {
	return planObjects(f.Hosts, func(name string, h *Host) (string, Metadata, any) { return name, h.Metadata, h.Spec })
}

// secretFields are shown as changed, never with their values.
var secretFields = []string{"spec.cloudInit."}

// publicFields are fields under a secretFields prefix that hold no secret
// and are shown: the age recipient user-data is encrypted to is a public
// key, and a plan that hides its change hides a re-encryption.
var publicFields = []string{"spec.cloudInit.encryptedUserData.recipient"}

// flatten renders v's JSON form as field path → compact value. Objects are
// walked, and so are lists of objects (spec.nics[1].mac); other lists and
// scalars are leaves. metadata.name is left out: it is the
// identity, not a field. Secret values are kept here and redacted by
// diffFields.
func flatten(v any) map[string]string {
	data, err := json.Marshal(v)
	if err != nil {
		// The object types are plain data; encoding cannot fail.
		panic(fmt.Sprintf("encode object: %v", err))
	}
	var tree map[string]any
	if err := json.Unmarshal(data, &tree); err != nil {
		panic(fmt.Sprintf("decode object: %v", err))
	}
	out := map[string]string{}
	var walk func(prefix string, x any)
	walk = func(prefix string, x any) {
		if m, ok := x.(map[string]any); ok {
			for k, y := range m {
				p := k
				if prefix != "" {
					p = prefix + "." + k
				}
				walk(p, y)
			}
			return
		}
		if l, ok := x.([]any); ok && len(l) > 0 && allObjects(l) {
			for i, y := range l {
				walk(indexPath(prefix, i), y)
			}
			return
		}
		b, _ := json.Marshal(x)
		s := string(b)
		if str, ok := x.(string); ok {
			s = str
		}
		out[prefix] = s
	}
	walk("", tree)
	delete(out, "metadata.name")
	return out
}

// allObjects reports whether every item of l is a JSON object.
func allObjects(l []any) bool {
	for _, y := range l {
		if _, ok := y.(map[string]any); !ok {
			return false
		}
	}
	return true
}

func diffFields(old, new map[string]string) []FieldChange {
	var out []FieldChange
	keys := map[string]bool{}
	for k := range old {
		keys[k] = true
	}
	for k := range new {
		keys[k] = true
	}
	for k := range keys {
		o, n := old[k], new[k]
		if o == n {
			continue
		}
		if isSecretField(k) {
			o, n = maskSecret(o), maskSecret(n)
			if o == n {
				n = "(secret, changed)"
			}
		} else {
			// An artifact URL may carry a token in its user or query.
			o, n = redact.Text(o), redact.Text(n)
		}
		out = append(out, FieldChange{Field: k, Old: o, New: n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Field < out[j].Field })
	return out
}

func maskSecret(s string) string {
	if s == "" {
		return ""
	}
	return "(secret)"
}

// Text renders the plan for a terminal.
func (p *Plan) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Plan %s -> %s\n", Hash(p.Base).Short(), Hash(p.Head).Short())
	for _, w := range p.Warnings {
		fmt.Fprintf(&b, "\n! %s\n", w)
	}
	if len(p.Errors) > 0 {
		b.WriteString("\nValidation errors (the controller would reject this commit):\n")
		for _, e := range p.Errors {
			fmt.Fprintf(&b, "  %s\n", e)
		}
	}
	if len(p.Guards) > 0 {
		b.WriteString("\nController guards (the controller would reject this head as it stands):\n")
		for _, g := range p.Guards {
			fmt.Fprintf(&b, "  ! %s\n", g)
		}
	}
	p.profilesText(&b)
	if p.Empty() {
		b.WriteString("\nNo changes.\n")
	}
	for _, h := range p.Hosts {
		fmt.Fprintf(&b, "\nhost %s\n", h.Host)
		for _, c := range h.Changes {
			fmt.Fprintf(&b, "  %s %s %s %s%s\n", actionSign[c.Action], c.Action, c.Kind, c.Name, moveNote(c))
			for _, f := range c.Fields {
				fmt.Fprintf(&b, "      %s: %s -> %s%s\n", f.Field, orNone(f.Old), orNone(f.New), effectNote(f.Effect, "  [%s]"))
			}
			for _, w := range c.Warnings {
				fmt.Fprintf(&b, "      ! %s\n", w)
			}
		}
	}
	return b.String()
}

// Markdown renders the plan as a pull-request comment.
func (p *Plan) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "### gitfleet plan `%s` → `%s`\n\n", Hash(p.Base).Short(), Hash(p.Head).Short())
	for _, w := range p.Warnings {
		fmt.Fprintf(&b, "> ⚠️ %s\n\n", w)
	}
	if len(p.Errors) > 0 {
		b.WriteString("**Validation errors** — the controller would reject this commit and keep the last good state:\n\n```\n")
		for _, e := range p.Errors {
			b.WriteString(e + "\n")
		}
		b.WriteString("```\n\n")
	}
	if len(p.Guards) > 0 {
		b.WriteString("**Controller guards** — the controller would reject this head as it stands:\n\n")
		for _, g := range p.Guards {
			fmt.Fprintf(&b, "- ⛔ %s\n", g)
		}
		b.WriteString("\n")
	}
	if p.Empty() {
		b.WriteString("No changes.\n")
	}
	counts := map[Action]int{}
	for _, h := range p.Hosts {
		for _, c := range h.Changes {
			counts[c.Action]++
		}
	}
	if len(p.Hosts) > 0 {
		fmt.Fprintf(&b, "%d to create, %d to update, %d to delete, %d to un-delete.\n\n",
			counts[ActionCreate], counts[ActionUpdate], counts[ActionDelete], counts[ActionUndelete])
	}
	p.profilesMarkdown(&b)
	for _, h := range p.Hosts {
		fmt.Fprintf(&b, "#### host `%s`\n\n", h.Host)
		for _, c := range h.Changes {
			mark := ""
			if len(c.Warnings) > 0 && (c.Action == ActionDelete || c.MovedFrom != "") {
				mark = "⚠️ "
			}
			fmt.Fprintf(&b, "- %s**%s** %s `%s`%s\n", mark, c.Action, c.Kind, c.Name, moveNote(c))
			for _, f := range c.Fields {
				fmt.Fprintf(&b, "  - `%s`: `%s` → `%s`%s\n", f.Field, mdCode(orNone(f.Old)), mdCode(orNone(f.New)), effectNote(f.Effect, " — **%s**"))
			}
			for _, w := range c.Warnings {
				fmt.Fprintf(&b, "  - _%s_\n", w)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// JSON renders the plan as indented JSON.
func (p *Plan) JSON() ([]byte, error) {
	data, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode plan: %w", err)
	}
	return append(data, '\n'), nil
}

var actionSign = map[Action]string{ActionCreate: "+", ActionUpdate: "~", ActionDelete: "-", ActionUndelete: "^"}

func moveNote(c PlanChange) string {
	switch {
	case c.MovedTo != "":
		return " (moved to " + c.MovedTo + ")"
	case c.MovedFrom != "":
		return " (moved from " + c.MovedFrom + ")"
	}
	return ""
}

// effectNote renders e with format, or "" when the change has no Effect.
func effectNote(e Effect, format string) string {
	if e == "" {
		return ""
	}
	return fmt.Sprintf(format, e)
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func mdCode(s string) string { return strings.ReplaceAll(s, "`", "'") }
