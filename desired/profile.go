package desired

import (
	"fmt"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/gitfleet/gitfleet/internal/parallel"
)

// Profile is a decoded Profile object: part of a VM spec, which VMs name
// in spec.profile to take as the base of their own. A VM's effective spec
// is its profile's spec with the VM's own spec written over it, by three
// rules (as JSON Merge Patch, RFC 7386, has them):
//
//   - a mapping written in both merges by key, recursively;
//   - any other value the VM writes (a list, a string, a number, a
//     mapping over a non-mapping) replaces the profile's whole;
//   - an empty value in the VM (null, or a key with no value) replaces
//     the profile's too, so the field is left out of the effective spec.
//
// Fields of the profile the VM does not write are taken as they are. The
// merge is of YAML nodes, before decoding, so it knows no field by name
// and every field works the same way. The effective spec is then decoded
// and checked as a VM file is, each error at the FILE:LINE:COL of the
// value that won. A profile names no other profile (they do not nest), and
// sets neither host (a change of it would destroy every VM naming the
// profile and create it empty elsewhere), mac and rootDisk (one VM's own)
// nor cloudInit.encryptedUserData (sealed to one VM and its host). A Profile is no object on a host: it is
// never in a snapshot and never tombstoned; a VM's snapshot carries its
// effective spec alone.
type Profile struct {
	Metadata Metadata `yaml:"metadata" json:"metadata"`
	// Spec holds the fields the profile writes; the others are zero.
	Spec   VMSpec `yaml:"spec" json:"spec"`
	Origin Origin `yaml:"-" json:"-"`
}

// profileDoc is the on-disk shape of a Profile.
type profileDoc struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Metadata   Metadata `yaml:"metadata"`
	Spec       VMSpec   `yaml:"spec"`
}

// profileRefused are the fields a Profile may not write, with why.
var profileRefused = map[string]string{
	"spec.profile": "a Profile does not name another profile (profiles do not nest); write the fields here",
	"spec.host": "a Profile does not set host: a VM's host is where its disk lives, and a change of it destroys the VM there and creates it empty on the other host; " +
		"write host in each VM's file",
	"spec.cloudInit.encryptedUserData": "a Profile does not hold encryptedUserData: encrypted user-data is sealed to one VM and its host (gitfleet encrypt VMFILE); " +
		"write it in the VM's file, or plain userData here",
	"spec.mac":      "a Profile does not set mac: a MAC belongs to one NIC, and every VM naming the profile would share it; write mac in the VM's file",
	"spec.rootDisk": "a Profile does not set rootDisk: an adopted disk is one VM's own (gitfleet import); write rootDisk in the VM's file",
	"spec.restore":  "a Profile does not set restore: a restore names the backup of one VM; write it in the VM's file",
}

// profileEnvelope is the typeSchema of profileDoc: its spec is a VM
// spec with every field optional, less the fields a Profile may not write.
func profileEnvelope() typeSchema {
	ts := envelope(KindProfile)
	var omit []string
	for f := range profileRefused {
		if rest, ok := strings.CutPrefix(f, "spec."); ok {
			omit = append(omit, rest)
		}
	}
	sort.Strings(omit)
	ts.desc = fmt.Sprintf("A Profile object of %s: part of a VM spec that VMs name in spec.profile.", APIVersion)
	ts.fields["spec"] = fieldSchema{partial: true, omit: omit,
		desc: "Any part of a VM spec but host, mac, rootDisk, restore and cloudInit.encryptedUserData; a VM that names the profile writes its own fields over these."}
	return ts
}

// profileName checks a VM's spec.profile.
func (d *nodeDecoder) profileName(vm *VM) {
	if d.written("spec.profile") {
		d.name("spec.profile", vm.Profile)
	}
}

// mergeSpec returns the effective spec node of a VM: over (the VM's spec
// mapping, its profile key left out) written over base (the profile's),
// by Profile's rules. Nodes of base that reach the result are passed to
// fromBase, each once; new mapping nodes take over's position. Neither
// input is changed.
func mergeSpec(base, over *yaml.Node, fromBase func(*yaml.Node)) *yaml.Node {
	if base.Kind != yaml.MappingNode || over.Kind != yaml.MappingNode {
		return over
	}
	out := *over
	out.Content = make([]*yaml.Node, 0, len(base.Content)+len(over.Content))
	inOver := make(map[string]int, len(over.Content)/2)
	for i := 0; i+1 < len(over.Content); i += 2 {
		inOver[over.Content[i].Value] = i
	}
	inBase := make(map[string]bool, len(base.Content)/2)
	for i := 0; i+1 < len(base.Content); i += 2 {
		k, v := base.Content[i], base.Content[i+1]
		inBase[k.Value] = true
		if j, ok := inOver[k.Value]; ok {
			out.Content = append(out.Content, over.Content[j], mergeSpec(v, over.Content[j+1], fromBase))
			continue
		}
		markTree(k, fromBase)
		markTree(v, fromBase)
		out.Content = append(out.Content, k, v)
	}
	for i := 0; i+1 < len(over.Content); i += 2 {
		if !inBase[over.Content[i].Value] {
			out.Content = append(out.Content, over.Content[i], over.Content[i+1])
		}
	}
	return &out
}

// markTree calls fn on n and every node under it.
func markTree(n *yaml.Node, fn func(*yaml.Node)) {
	fn(n)
	for _, c := range n.Content {
		markTree(c, fn)
	}
}

// withValue is a copy of mapping n with key's value replaced by v, or,
// for a nil v, with key left out.
func withValue(n *yaml.Node, key string, v *yaml.Node) *yaml.Node {
	out := *n
	out.Content = make([]*yaml.Node, 0, len(n.Content))
	for i := 0; i+1 < len(n.Content); i += 2 {
		switch {
		case n.Content[i].Value != key:
			out.Content = append(out.Content, n.Content[i], n.Content[i+1])
		case v != nil:
			out.Content = append(out.Content, n.Content[i], v)
		}
	}
	return &out
}

// decodeEffective decodes the effective VM of vm, an object of a VM file
// that names a profile, and p, that profile's object: vm's document (root,
// or when nil parsed again from its src) with its spec written over p's
// (mergeSpec), decoded and checked in full as one VM file whose fields
// from p lie in p's file. It returns the decoder, whose pos holds where
// each field's value was written, and the object (nil when the effective
// spec has errors, in d.errs).
func decodeEffective(vm, p *object, root *yaml.Node) (*nodeDecoder, *object) {
	d := newNodeDecoder(vm.origin().File)
	if root == nil {
		// As parseFile found it: a mapping with a spec mapping.
		if root = d.document(vm.src); root == nil {
			return d, nil
		}
	}
	d.profile = p.name
	d.nodeFile = map[*yaml.Node]string{}
	pfile := p.origin().File
	mark := func(n *yaml.Node) { d.nodeFile[n] = pfile }
	spec := mappingValue(root, "spec")
	merged := mergeSpec(mappingValue(p.root, "spec"), withValue(spec, "profile", nil), mark)
	obj := d.object(withValue(root, "spec", merged))
	if len(d.errs) > 0 {
		obj = nil
	}
	for _, e := range d.errs {
		if e.File != vm.origin().File {
			e.Msg += vm.viaProfile()
		}
	}
	if obj != nil {
		obj.vm.Profile = vm.vm.Profile
		obj.at.profile = vm.at.profile
	}
	return d, obj
}

// viaProfile is the note on an error of o's effective spec found in its
// profile's file: which VM it is for, and where that VM names the profile.
func (o *object) viaProfile() string {
	return fmt.Sprintf(" (for VM %q, which takes it from profile %q at %s:%d:%d)",
		o.name, o.vm.Profile, o.origin().File, o.at.profile.line, o.at.profile.col)
}

// effectiveKey names an effective VM in the Loader's cache: the cache
// keys of the VM's file and of its profile's.
type effectiveKey struct{ vm, profile string }

// withProfiles replaces, in objs, each VM that names a profile by its
// effective VM (decodeEffective), reusing the effective VMs of the last
// Load when neither file changed (keys[i] is the cache key of objs[i],
// roots[i] its document when this Load parsed it). It
// returns the errors of the VMs it could not resolve: a profile that does
// not exist (unless complete is false: then a rejected file may define
// it, and the VM is left out in silence), and the effective specs' own.
// A VM whose effective spec has errors is left out. VMs keep their place,
// so objs stays sorted by file.
func (l *Loader) withProfiles(objs []*object, keys []string, roots []*yaml.Node, unchanged map[*object]bool, complete bool) ([]*object, ErrorList) {
	profiles := map[string]int{} // name → index in objs
	for i, o := range objs {
		if _, dup := profiles[o.name]; o.kind == KindProfile && !dup {
			profiles[o.name] = i
		}
	}
	out := append([]*object(nil), objs...)
	res := make([]*parsed, len(objs))
	next := make(map[effectiveKey]*parsed, len(l.effective))
	var todo []int // indexes of the VMs to decode
	var errs ErrorList
	for i, o := range objs {
		if o.kind != KindVM || o.vm.Profile == "" {
			continue
		}
		p, ok := profiles[o.vm.Profile]
		switch {
		case !ok && complete:
			errs = append(errs, missingProfile(o, profileUsers(objs, o.vm.Profile)))
			out[i] = nil
		case !ok:
			out[i] = nil
		default:
			k := effectiveKey{keys[i], keys[p]}
			if res[i] = l.effective[k]; res[i] == nil {
				todo = append(todo, i)
			}
			next[k] = res[i]
		}
	}
	parallel.For(len(todo), func(j int) {
		vm := objs[todo[j]]
		d, obj := decodeEffective(vm, objs[profiles[vm.vm.Profile]], roots[todo[j]])
		r := &parsed{obj: obj}
		if obj == nil {
			r.errs = d.errs
		}
		res[todo[j]] = r
	})
	for _, i := range todo {
		next[effectiveKey{keys[i], keys[profiles[objs[i].vm.Profile]]}] = res[i]
	}
	for i, r := range res {
		if r == nil {
			continue
		}
		errs = append(errs, r.errs...)
		if out[i] = r.obj; r.obj != nil && unchanged[objs[i]] {
			unchanged[r.obj] = true
		}
	}
	l.effective = next
	return compact(out), errs
}

// compact drops the nil objects of objs, keeping the order.
func compact(objs []*object) []*object {
	out := objs[:0]
	for _, o := range objs {
		if o != nil {
			out = append(out, o)
		}
	}
	return out
}

// profileUsers lists the VMs of objs that name profile, by file.
func profileUsers(objs []*object, profile string) []*object {
	var users []*object
	for _, o := range objs {
		if o.kind == KindVM && o.vm.Profile == profile {
			users = append(users, o)
		}
	}
	return users
}

// maxUsersNamed bounds the VMs one missing-profile message names.
const maxUsersNamed = 10

// missingProfile is the error of VM o naming a profile no file defines
// (deleted or renamed while users names it), at its spec.profile, naming
// every VM that names it.
func missingProfile(o *object, users []*object) *Error {
	var names []string
	for i, u := range users {
		if i == maxUsersNamed {
			names = append(names, fmt.Sprintf("and %d more", len(users)-maxUsersNamed))
			break
		}
		names = append(names, fmt.Sprintf("%s (%s:%d:%d)", u.name, u.origin().File, u.at.profile.line, u.at.profile.col))
	}
	return &Error{File: o.origin().File, Line: o.at.profile.line, Col: o.at.profile.col, Field: "spec.profile",
		Msg: fmt.Sprintf("Profile %q does not exist; a profile is deleted or renamed only once no VM names it, and it is named by %s: %s",
			o.vm.Profile, countOf(len(users), "VM", "VMs"), strings.Join(names, ", "))}
}

// countOf is "1 VM" or "n VMs".
func countOf(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
