package desired

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"

	"go.yaml.in/yaml/v3"
)

// SpecHash returns the lowercase hex sha256 of spec's canonical JSON: the
// encoding/json encoding of VMSpec (fields in declaration order, empty
// optional fields left out, map keys sorted). Equal specs hash equally; a
// change to any field changes the hash.
func SpecHash(spec VMSpec) string {
	b, err := json.Marshal(spec)
	if err != nil {
		// VMSpec holds only strings, ints, slices and maps with string
		// keys: encoding cannot fail.
		panic(fmt.Sprintf("desired: encode VMSpec: %v", err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

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
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&c); err != nil {
		return nil, fmt.Errorf("encode snapshot of host %s: %w", s.Host, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode snapshot of host %s: %w", s.Host, err)
	}
	return b.Bytes(), nil
}

// ParseSnapshot decodes a snapshot file strictly, with the rules of object
// files (one document, no unknown fields or duplicate keys, no coercion, no
// anchors or aliases, at most MaxFileSize bytes) and checks it: host, vms
// and volumes are present, names are RFC 1123 labels and unique within
// their list, and each VM's specHash is SpecHash of its spec. The error is
// an ErrorList whose entries have an empty File and format as
// LINE:COL: message; callers add the path.
func ParseSnapshot(data []byte) (*Snapshot, error) {
	d := newNodeDecoder("")
	d.snapshot = true
	root := d.document(data)
	if root == nil {
		return nil, ErrorList(d.errs)
	}
	d.pos[""] = fieldPos{key: nodePos(root), val: nodePos(root)}
	s := &Snapshot{}
	d.decode(root, reflect.ValueOf(s).Elem(), "")
	if d.required("host") {
		d.name("host", s.Host)
	}
	d.required("vms")
	d.required("volumes")
	if s.VMs == nil {
		s.VMs = []SnapshotVM{}
	}
	if s.Volumes == nil {
		s.Volumes = []SnapshotVolume{}
	}
	seen := make(map[string]bool, len(s.VMs))
	for i, vm := range s.VMs {
		f := indexPath("vms", i)
		if d.required(f+".name") && !d.bad[f+".name"] {
			d.name(f+".name", vm.Name)
			if seen[vm.Name] {
				d.add(d.valPos(f+".name"), f+".name", "VM %q is listed twice", vm.Name)
			}
			seen[vm.Name] = true
		}
		if d.required(f+".specHash") && d.required(f+".spec") && !d.bad[f+".specHash"] {
			if want := SpecHash(vm.Spec); vm.SpecHash != want {
				d.add(d.valPos(f+".specHash"), f+".specHash", "%q does not match the spec, whose hash is %s", truncate(vm.SpecHash, 70), want)
			}
		}
	}
	seen = make(map[string]bool, len(s.Volumes))
	for i, v := range s.Volumes {
		f := indexPath("volumes", i)
		if d.required(f+".name") && !d.bad[f+".name"] {
			d.name(f+".name", v.Name)
			if seen[v.Name] {
				d.add(d.valPos(f+".name"), f+".name", "volume %q is listed twice", v.Name)
			}
			seen[v.Name] = true
		}
	}
	if len(d.errs) > 0 {
		errs := ErrorList(d.errs)
		errs.Sort()
		return nil, errs
	}
	return s, nil
}
