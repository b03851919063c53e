package snapshots

import (
	"fmt"

	"github.com/gitfleet/gitfleet/agent/backup"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/safetext"
)

// MarshalSnapshot encodes s as the YAML of hosts/<host>.yaml: two-space
// indentation, fields in declaration order, map keys sorted, so equal
// snapshots encode to equal bytes. Nil VM and volume lists are written as
// empty lists ("vms: []"), never left out.
func MarshalSnapshot(s *Snapshot) ([]byte, error) {
	c := *s
	if c.VMs == nil {
		c.VMs = []SnapshotVM{}
	}
	if c.Volumes == nil {
		c.Volumes = []SnapshotVolume{}
	}
	b, err := desired.Encode(&c)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot of host %s: %w", s.Host, err)
	}
	return b, nil
}

// snapshotFormat is a snapshot file for desired.Decode. A snapshot holds
// every VM spec of its host, each from an object file of up to 1 MiB, so
// it is bounded by MaxSnapshotBytes, as its readers are.
var snapshotFormat = desired.Format{Noun: "snapshot", Shape: "a mapping with host, vms and volumes", MaxBytes: MaxSnapshotBytes}

// ParseSnapshot decodes a snapshot file strictly, with the rules of object
// files (one document, no unknown fields or duplicate keys, no coercion, no
// anchors or aliases) and at most MaxSnapshotBytes, and checks it: host, vms
// and volumes are present, names are RFC 1123 labels and unique within
// their list, each VM's specHash is desired.SpecHash of its spec, and a
// tombstone's confirm is a nonce (ValidConfirm). The error is
// a desired.ErrorList whose entries have an empty File and format as
// LINE:COL: message; callers add the path.
func ParseSnapshot(data []byte) (*Snapshot, error) {
	s := &Snapshot{}
	doc := desired.Decode("", data, s, snapshotFormat)
	if doc.Required("host") {
		doc.Name("host", s.Host)
	}
	doc.Required("vms")
	doc.Required("volumes")
	if s.VMs == nil {
		s.VMs = []SnapshotVM{}
	}
	if s.Volumes == nil {
		s.Volumes = []SnapshotVolume{}
	}
	checkNames(doc, "vms", "VM", s.VMs, func(vm *SnapshotVM) string { return vm.Name })
	for i, vm := range s.VMs {
		f := fmt.Sprintf("vms[%d]", i)
		if doc.Required(f+".specHash") && doc.Required(f+".spec") {
			if want := desired.SpecHash(vm.Spec); vm.SpecHash != want {
				doc.Errorf(f+".specHash", "%q does not match the spec, whose hash is %s", safetext.Truncate(string(vm.SpecHash), 70), want)
			}
		}
		// The NICs the agent would attach: a hand-made or forged
		// snapshot past validation must not reach a host with more
		// NICs than a VM may have, or one MAC twice.
		for _, p := range desired.CheckNICs(&s.VMs[i].Spec) {
			doc.Errorf(f+".spec."+p.Field, "%s", p.Msg)
		}
	}
	checkNames(doc, "volumes", "volume", s.Volumes, func(v *SnapshotVolume) string { return v.Name })
	checkNames(doc, "backupRepositories", "backup repository", s.BackupRepositories, func(r *SnapshotBackupRepository) string { return r.Name })
	for i, r := range s.BackupRepositories {
		if f := fmt.Sprintf("backupRepositories[%d].url", i); doc.Required(f) {
			if err := backup.CheckURL(r.URL); err != nil {
				doc.Errorf(f, "%v", err)
			}
		}
	}
	for i, vm := range s.VMs {
		checkConfirm(doc, fmt.Sprintf("vms[%d].tombstone.confirm", i), vm.Tombstone)
	}
	for i, v := range s.Volumes {
		checkConfirm(doc, fmt.Sprintf("volumes[%d].tombstone.confirm", i), v.Tombstone)
	}
	if err := doc.Err(); err != nil {
		return nil, err
	}
	return s, nil
}

// checkConfirm checks a tombstone's confirmation nonce, when it has one:
// ValidConfirm's shape.
func checkConfirm(doc *desired.Document, field string, t *Tombstone) {
	if t != nil && t.Confirm != "" && !ValidConfirm(t.Confirm) {
		doc.Errorf(field, "%q is not a confirmation nonce (%d lowercase hex digits)", safetext.Truncate(t.Confirm, 70), ConfirmLen)
	}
}

// checkNames checks the name of every entry of list, the list at field
// whose entries are a what ("VM"): written, a name, and listed once.
func checkNames[T any](doc *desired.Document, field, what string, list []T, nameOf func(*T) string) {
	seen := make(map[string]bool, len(list))
	for i := range list {
		f := fmt.Sprintf("%s[%d].name", field, i)
		if !doc.Required(f) {
			continue
		}
		name := nameOf(&list[i])
		doc.Name(f, name)
		if seen[name] {
			doc.Errorf(f, "%s %q is listed twice", what, name)
		}
		seen[name] = true
	}
}
