package desired

import (
	"bytes"
	"fmt"
	"reflect"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// MaxFileSize is the largest object file accepted, in bytes (1 MiB). It also
// bounds the time and memory any one file can cost the parser.
const MaxFileSize = 1 << 20

// object is one decoded file: exactly one of vm, volume, host, profile,
// backupRepo is
// set. at keeps where the fields the cross-object checks point at were
// written.
type object struct {
	kind    Kind
	name    string
	vm      *VM
	volume  *Volume
	host    *Host
	profile *Profile
	// backupRepo is a BackupRepository.
	backupRepo *BackupRepository
	at         positions
	// root is a Profile's document, and src the content of the file of a
	// VM that names a profile: Load decodes the VM's effective spec from
	// both (decodeEffective). A VM keeps its bytes, not its nodes, which
	// take ten times the memory; a profile's nodes serve all its VMs.
	root *yaml.Node
	src  []byte
}

// positions are the locations cross-object errors are reported at.
type positions struct {
	name, host, capacityVCPUs, capacityMemory pos
	ageRecipient, arch                        pos
	// profile is where a VM's spec.profile was written.
	profile pos
	volumes []pos
	// backupRepository is where a VM's spec.backup.repository was
	// written, repoHosts a BackupRepository's spec.hosts entries.
	backupRepository, restoreRepository pos
	repoHosts                           []pos
	// nics are where a VM's NICs were written, in VMSpec.Interfaces'
	// order.
	nics []nicAt
}

// nicAt is where one NIC of a VM was written: the field paths of its
// network and static configuration ("spec.network" and "spec.static" for
// the one-NIC form), and the positions the cross-object checks report at.
type nicAt struct {
	netField, staticField  string
	network, mac, gateway4 pos
	static                 []pos
}

// vmDoc, volumeDoc, hostDoc and profileDoc are the on-disk shapes of the
// kinds.
type vmDoc struct {
	APIVersion string     `yaml:"apiVersion"`
	Kind       string     `yaml:"kind"`
	Metadata   Metadata   `yaml:"metadata"`
	Spec       vmFileSpec `yaml:"spec"`
}

// vmFileSpec is the spec of a VM file: the VM's own fields and the
// profile it takes the others from. A VM that names a profile may leave
// out any field (its profile may set it); Load checks the effective spec
// in full.
type vmFileSpec struct {
	Profile string `yaml:"profile,omitempty"`
	VMSpec  `yaml:",inline"`
}

func (vmFileSpec) schema() typeSchema {
	return typeSchema{
		desc:        "The VM's desired state: its own fields, written over those of the profile it names, if any. Without a profile it needs host, vcpus, memoryMB, diskGB and an image, a kernel, or both.",
		partialWhen: "profile",
		fields: map[string]fieldSchema{
			"profile": {shape: "name", desc: "A Profile whose spec this VM's fields are written over (maps merge by key, lists and values replace, an empty value removes the profile's); with it every field is optional here, and the effective spec must be complete."},
		},
	}
}

type volumeDoc struct {
	APIVersion string     `yaml:"apiVersion"`
	Kind       string     `yaml:"kind"`
	Metadata   Metadata   `yaml:"metadata"`
	Spec       VolumeSpec `yaml:"spec"`
}

type hostDoc struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Metadata   Metadata `yaml:"metadata"`
	Spec       HostSpec `yaml:"spec"`
}

func (vmDoc) schema() typeSchema      { return envelope(KindVM) }
func (profileDoc) schema() typeSchema { return profileEnvelope() }
func (volumeDoc) schema() typeSchema  { return envelope(KindVolume) }
func (hostDoc) schema() typeSchema    { return envelope(KindHost) }

// parseFile decodes and checks one object file. It returns the object when
// the file has no errors of its own; cross-object checks come later.
func parseFile(file string, data []byte) (*object, []*Error) {
	obj, _, errs := parseFileRoot(file, data)
	return obj, errs
}

// parseFileRoot is parseFile that also returns the file's document, for
// Load to merge a VM that names a profile without parsing it again.
func parseFileRoot(file string, data []byte) (*object, *yaml.Node, []*Error) {
	d := newNodeDecoder(file)
	root := d.document(data)
	if root == nil {
		return nil, nil, d.errs
	}
	obj := d.object(root)
	if len(d.errs) > 0 {
		return nil, nil, d.errs
	}
	if obj.kind == KindVM && obj.vm.Profile != "" {
		obj.src = data
	}
	return obj, root, nil
}

// document checks the encoding and returns the root node of the file's one
// YAML document, or nil after recording why there is none (or, for a
// Format that allows it, nil and no error for a file with no document).
func (d *nodeDecoder) document(data []byte) *yaml.Node {
	if limit := d.maxBytes(); limit >= 0 && len(data) > limit {
		if d.format == nil {
			d.add(pos{line: 1, col: 1}, "", "file is %d bytes; an object file may be at most %d bytes (1 MiB)", len(data), MaxFileSize)
		} else {
			d.add(pos{line: 1, col: 1}, "", "file is %d bytes; %s may be at most %d bytes", len(data), d.format.a(), limit)
		}
		return nil
	}
	switch {
	case bytes.HasPrefix(data, []byte{0xFE, 0xFF}), bytes.HasPrefix(data, []byte{0xFF, 0xFE}):
		d.add(pos{line: 1, col: 1}, "", "file is UTF-16 encoded; save it as UTF-8")
		return nil
	case bytes.HasPrefix(data, []byte{0xEF, 0xBB, 0xBF}):
		data = data[3:] // a UTF-8 byte-order mark carries no content
	}
	if !utf8.Valid(data) {
		p := offsetPos(data, firstInvalidUTF8(data))
		d.add(p, "", "file is not valid UTF-8; save it as UTF-8")
		return nil
	}
	if i := bytes.IndexByte(data, 0); i >= 0 {
		d.add(offsetPos(data, i), "", "file contains a NUL byte; is it UTF-16 or binary? save it as UTF-8 text")
		return nil
	}
	if isLFSPointer(data) {
		d.add(pos{line: 1, col: 1}, "", "a Git LFS pointer, not the file's content: Git LFS keeps the content outside the repository, and gitfleet reads only what is committed; "+
			"stop tracking YAML files with Git LFS (`git lfs untrack '*.yaml' '*.yml'`, then `git add --renormalize .` and commit)")
		return nil
	}
	roots, err := yamlDocuments(data)
	if err != nil {
		if roots, data, err = reparseTabLines(data, err); err != nil {
			d.yamlError(data, err)
			return nil
		}
	}
	var root *yaml.Node
	if len(roots) > 0 {
		root = roots[0]
	}
	f := d.format
	if len(roots) > 1 {
		if f != nil {
			d.add(nodePos(roots[1]), "", "a second YAML document; %s is one document", f.a())
			return nil
		}
		d.add(nodePos(roots[1]), "", "a second YAML document; each file holds exactly one object (split it into two files)")
		return nil
	}
	switch {
	case root == nil && f != nil && f.AllowEmpty:
		return nil
	case root == nil && f != nil:
		d.add(pos{line: 1, col: 1}, "", "empty %s; %s is %s", f.noun(), f.a(), f.shape())
		return nil
	case root == nil:
		d.add(pos{line: 1, col: 1}, "", "no object in file; each *.yaml / *.yml file holds exactly one object (remove the file or give it one)")
		return nil
	case root.Kind != yaml.MappingNode && f != nil:
		d.add(nodePos(root), "", "%s must be %s; got %s", f.a(), f.shape(), describe(root))
		return nil
	case root.Kind != yaml.MappingNode:
		if d.plain(root, "") {
			d.add(nodePos(root), "", "an object must be a mapping with apiVersion, kind, metadata and spec; got %s", describe(root))
		}
		return nil
	}
	if !d.plain(root, "") {
		return nil
	}
	return root
}

// maxBytes is the size bound of the file being decoded; negative is none.
func (d *nodeDecoder) maxBytes() int {
	if d.format == nil || d.format.MaxBytes == 0 {
		return MaxFileSize
	}
	return d.format.MaxBytes
}

func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size <= 1 {
			return i
		}
		i += size
	}
	return len(b)
}

// offsetPos converts a byte offset into a line and a column counted in
// characters.
func offsetPos(b []byte, off int) pos {
	line := 1 + bytes.Count(b[:off], []byte{'\n'})
	start := bytes.LastIndexByte(b[:off], '\n') + 1
	return pos{line: line, col: utf8.RuneCount(b[start:off]) + 1}
}

// object decodes the root mapping according to its kind.
func (d *nodeDecoder) object(root *yaml.Node) *object {
	d.pos[""] = fieldPos{key: nodePos(root), val: nodePos(root)}
	// Find apiVersion and kind first: the kind decides the spec's shape.
	var apiVersionKey, apiVersion, kind *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		k := root.Content[i]
		switch {
		case k.Kind != yaml.ScalarNode || k.Tag != "!!str":
		case k.Value == "apiVersion" && apiVersion == nil:
			apiVersionKey, apiVersion = k, root.Content[i+1]
		case k.Value == "kind" && kind == nil:
			kind = root.Content[i+1]
		}
	}
	switch {
	case apiVersion == nil:
		d.add(nodePos(root), "apiVersion", "missing; write apiVersion: %s", APIVersion)
	case isNull(apiVersion) && apiVersion.Style&yaml.TaggedStyle == 0 && apiVersion.Anchor == "":
		// The decoder reads an empty value as one left out, which
		// would leave the object without an apiVersion.
		d.add(nodePos(apiVersionKey), "apiVersion", "missing (the value is empty); write apiVersion: %s", APIVersion)
	case apiVersion.Kind == yaml.ScalarNode && apiVersion.Tag == "!!str" && apiVersion.Value != APIVersion:
		d.add(nodePos(apiVersion), "apiVersion", "unknown apiVersion %q; this release reads %s", apiVersion.Value, APIVersion)
	}
	var target any
	switch {
	case kind == nil:
		d.add(nodePos(root), "kind", "missing; write kind: VM, Volume, Host, Profile or BackupRepository")
	case kind.Kind != yaml.ScalarNode || kind.Tag != "!!str":
		// decodeEnvelope reports it.
	case kind.Value == string(KindVM):
		target = &vmDoc{}
	case kind.Value == string(KindVolume):
		target = &volumeDoc{}
	case kind.Value == string(KindHost):
		target = &hostDoc{}
	case kind.Value == string(KindProfile):
		target = &profileDoc{}
		d.partial, d.refuse = true, profileRefused
	case kind.Value == string(KindBackupRepository):
		target = &backupRepositoryDoc{}
	default:
		d.add(nodePos(kind), "kind", "unknown kind %q; must be VM, Volume, Host, Profile or BackupRepository", kind.Value)
	}
	if target == nil {
		d.decodeEnvelope(root)
		return nil
	}
	d.decode(root, reflect.ValueOf(target).Elem(), "")
	d.required("metadata")
	d.required("spec")
	obj := d.newObject(target, Origin{File: d.file, Line: root.Line, Col: root.Column})
	if obj.profile != nil {
		obj.root = root
	}
	d.check(obj)
	if obj.vm != nil {
		obj.vm.fieldAt = make(map[string]Origin, len(artifactURLFields))
		for _, f := range artifactURLFields {
			if fp, ok := d.pos[f]; ok {
				obj.vm.fieldAt[f] = Origin{File: d.fileOf(fp.val), Line: fp.val.line, Col: fp.val.col}
			}
		}
	}
	return obj
}

// newObject makes the object of a decoded document. A VM that names a
// profile is checked as partial (d.partial): its spec need not be
// complete, and power takes no default, until Load merges it with its
// profile.
func (d *nodeDecoder) newObject(target any, origin Origin) *object {
	switch doc := target.(type) {
	case *vmDoc:
		d.partial = d.written("spec.profile")
		if doc.Spec.Power == "" && !d.partial {
			doc.Spec.Power = PowerRunning
		}
		vm := &VM{Metadata: doc.Metadata, Spec: doc.Spec.VMSpec, Origin: origin, Profile: doc.Spec.Profile}
		return &object{kind: KindVM, name: doc.Metadata.Name, vm: vm}
	case *volumeDoc:
		return &object{kind: KindVolume, name: doc.Metadata.Name, volume: &Volume{Metadata: doc.Metadata, Spec: doc.Spec, Origin: origin}}
	case *hostDoc:
		return &object{kind: KindHost, name: doc.Metadata.Name, host: &Host{Metadata: doc.Metadata, Spec: doc.Spec, Origin: origin}}
	case *backupRepositoryDoc:
		r := &BackupRepository{Metadata: doc.Metadata, Spec: doc.Spec, Origin: origin}
		return &object{kind: KindBackupRepository, name: doc.Metadata.Name, backupRepo: r}
	case *profileDoc:
		return &object{kind: KindProfile, name: doc.Metadata.Name, profile: &Profile{Metadata: doc.Metadata, Spec: doc.Spec, Origin: origin}}
	}
	panic(fmt.Sprintf("desired: no object for %T", target))
}

// artifactURLFields are the VM fields whose positions warnings point at:
// the URLs the agent fetches (FileURLWarnings) and the user-data
// (CloudInitUserWarnings).
var artifactURLFields = []string{"spec.image.url", "spec.kernel.url", "spec.kernel.initrd.url", "spec.cloudInit.userData"}

// decodeEnvelope reports unknown and duplicate top-level fields and the
// metadata's errors of an object whose kind is missing or unknown.
func (d *nodeDecoder) decodeEnvelope(root *yaml.Node) {
	d.mappingPairs(root, "", func(key string, k, val *yaml.Node, sub string) {
		switch key {
		case "apiVersion", "kind":
			if d.plain(val, sub) {
				d.scalarString(val, sub) // reports a value that is not a string
			}
		case "metadata":
			var m Metadata
			d.decode(val, reflect.ValueOf(&m).Elem(), sub)
		case "spec":
		default:
			d.add(nodePos(k), sub, "unknown field %q; known fields: apiVersion, kind, metadata, spec", key)
		}
	})
}

// String names an object for messages: "VM web-01".
func (o *object) String() string { return fmt.Sprintf("%s %s", o.kind, o.name) }

// isLFSPointer reports whether data is a Git LFS pointer file: under 1024
// bytes and starting with a "version" line naming the LFS specification
// (https://github.com/git-lfs/git-lfs/blob/main/docs/spec.md; the
// pre-release "hawser" URL too).
func isLFSPointer(data []byte) bool {
	if len(data) >= 1024 {
		return false
	}
	line, _, _ := bytes.Cut(data, []byte("\n"))
	line = bytes.TrimSuffix(line, []byte("\r"))
	return bytes.Equal(line, []byte("version https://git-lfs.github.com/spec/v1")) ||
		bytes.Equal(line, []byte("version https://hawser.github.com/spec/v1"))
}
