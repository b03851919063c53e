package desired

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"

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

// ComputeSnapshots returns the desired half of each host's snapshot, keyed
// by host name: one Snapshot per Host object, also for a host with no VMs
// and no volumes (a real, empty desired state). VMs and volumes are sorted
// by name, none tombstoned; HostSpec is the Host's spec. Epoch and Source
// are left zero for the controller to set, as are tombstones. The snapshots
// share nothing with f.
func ComputeSnapshots(f *Fleet) map[string]*Snapshot {
	out := make(map[string]*Snapshot, len(f.Hosts))
	for name, h := range f.Hosts {
		out[name] = &Snapshot{
			Host:     name,
			HostSpec: cloneHostSpec(h.Spec),
			VMs:      []SnapshotVM{},
			Volumes:  []SnapshotVolume{},
		}
	}
	for name, vm := range f.VMs {
		s := out[vm.Spec.Host]
		if s == nil {
			continue // impossible in a validated Fleet
		}
		spec := cloneVMSpec(vm.Spec)
		s.VMs = append(s.VMs, SnapshotVM{Name: name, SpecHash: SpecHash(spec), Spec: spec})
	}
	for name, v := range f.Volumes {
		s := out[v.Spec.Host]
		if s == nil {
			continue
		}
		s.Volumes = append(s.Volumes, SnapshotVolume{Name: name, SizeGB: v.Spec.SizeGB})
	}
	for _, s := range out {
		sort.Slice(s.VMs, func(i, j int) bool { return s.VMs[i].Name < s.VMs[j].Name })
		sort.Slice(s.Volumes, func(i, j int) bool { return s.Volumes[i].Name < s.Volumes[j].Name })
	}
	return out
}

func cloneHostSpec(h HostSpec) HostSpec {
	if h.Capacity != nil {
		c := *h.Capacity
		h.Capacity = &c
	}
	h.Networks = maps.Clone(h.Networks)
	for name, n := range h.Networks {
		if n.NAT != nil {
			c := *n.NAT
			n.NAT = &c
			h.Networks[name] = n
		}
	}
	return h
}

func cloneVMSpec(s VMSpec) VMSpec {
	if s.Image != nil {
		a := *s.Image
		s.Image = &a
	}
	if s.Kernel != nil {
		k := *s.Kernel
		if k.Initrd != nil {
			a := *k.Initrd
			k.Initrd = &a
		}
		s.Kernel = &k
	}
	s.Volumes = slices.Clone(s.Volumes)
	if s.Static != nil {
		st := *s.Static
		st.Addresses = slices.Clone(st.Addresses)
		if st.Nameservers != nil {
			ns := *st.Nameservers
			ns.Addresses, ns.Search = slices.Clone(ns.Addresses), slices.Clone(ns.Search)
			st.Nameservers = &ns
		}
		s.Static = &st
	}
	if s.CloudInit != nil {
		c := *s.CloudInit
		c.SSHAuthorizedKeys = slices.Clone(c.SSHAuthorizedKeys)
		s.CloudInit = &c
	}
	return s
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
