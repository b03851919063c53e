package desired

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestSchemaFieldsMatchDecoder walks JSONSchema's output and asks the
// strict decoder (parseFile) about every object, field, list item and map
// value it names, so that neither can name a field, a type, a required
// field or a limit the other does not:
//
//   - at every object, an unknown key makes the decoder list the fields it
//     knows there, which must be the schema's properties;
//   - an empty object makes the decoder report as missing exactly the
//     fields the schema requires;
//   - a value of the schema's type is taken without a type error; an
//     integer at its minimum and maximum, each enum value and a constant
//     are taken without any error, and one past either end, or another
//     word, is rejected.
//
// Each probe is a valid object of the kind (probeBases) with one value
// replaced.
func TestSchemaFieldsMatchDecoder(t *testing.T) {
	var schema map[string]any
	if err := json.Unmarshal(JSONSchema(), &schema); err != nil {
		t.Fatal(err)
	}
	defs := schema["$defs"].(map[string]any)
	kinds := schema["properties"].(map[string]any)["kind"].(map[string]any)["enum"].([]any)
	if len(kinds) != len(probeBases) {
		t.Fatalf("the schema has kinds %v; the test has a base object for %d kinds", kinds, len(probeBases))
	}
	for _, k := range kinds {
		kind := k.(string)
		base, ok := probeBases[kind]
		if !ok {
			t.Fatalf("no base object for kind %s in probeBases", kind)
		}
		variants := map[string]map[string]any{kind: base}
		for name, v := range probeVariants[kind] {
			variants[name] = v
		}
		for name, base := range variants {
			t.Run(name, func(t *testing.T) {
				if _, errs := parseFile("base.yaml", yamlBytes(t, base)); errs != nil {
					t.Fatalf("the base %s object is rejected: %v", name, ErrorList(errs))
				}
				p := &schemaProbe{t: t, defs: defs, base: base}
				p.walk(nil, defs[kind].(map[string]any), 0)
				for _, f := range deepestFields[name] {
					if !slices.Contains(p.leaves, f) {
						t.Errorf("the walk did not reach %s; it probed %v", f, p.leaves)
					}
				}
			})
		}
	}
}

// probeVariants are more bases of a kind, for the parts of its schema that
// apply only when a field is written (if/else): a VM that names a profile
// may leave out any field of its spec.
var probeVariants = map[string]map[string]map[string]any{
	"VM": {"VM with a profile": {"apiVersion": APIVersion, "kind": "VM", "metadata": map[string]any{"name": "a"},
		"spec": map[string]any{"profile": "p"}}},
}

// probeBases are valid objects of each kind, into which the probes write.
// The VM has a network so that spec.static may be written.
var probeBases = map[string]map[string]any{
	"VM": {"apiVersion": APIVersion, "kind": "VM", "metadata": map[string]any{"name": "a"},
		"spec": map[string]any{"host": "h", "vcpus": 1, "memoryMB": MinMemoryMB, "diskGB": 1, "network": "n",
			"image": map[string]any{"url": "https://example.com/a.img", "sha256": strings.Repeat("a", 64)}}},
	"Volume": {"apiVersion": APIVersion, "kind": "Volume", "metadata": map[string]any{"name": "a"},
		"spec": map[string]any{"host": "h", "sizeGB": 1}},
	"Host": {"apiVersion": APIVersion, "kind": "Host", "metadata": map[string]any{"name": "a"},
		"spec": map[string]any{}},
	"Profile": {"apiVersion": APIVersion, "kind": "Profile", "metadata": map[string]any{"name": "a"},
		"spec": map[string]any{}},
	"BackupRepository": {"apiVersion": APIVersion, "kind": "BackupRepository", "metadata": map[string]any{"name": "a"},
		"spec": map[string]any{"url": "/srv/restic", "hosts": []any{"h"}, "maintenance": "h"}},
}

// deepestFields are some of the values a walk of each kind must reach.
var deepestFields = map[string][]string{
	"VM": {"apiVersion", "kind", "metadata.name", "metadata.labels.x", "spec.kernel.initrd.sha256", "spec.volumes[0]",
		"spec.static.nameservers.search[0]", "spec.cloudInit.sshAuthorizedKeys[0]", "spec.cloudInit.encryptedUserData.ciphertext",
		"spec.backup.repository", "spec.backup.keep.monthly", "spec.restore.backup", "spec.restore.host"},
	"Volume":           {"spec.host", "spec.sizeGB"},
	"BackupRepository": {"spec.url", "spec.hosts[0]", "spec.maintenance"},
	"Host":             {"spec.networks.x.nat.cidr", "spec.networks.x.bridge", "spec.capacity.memoryMB", "spec.suspend"},
	"Profile": {"spec.vcpus", "spec.kernel.initrd.sha256", "spec.static.addresses[0]", "spec.static.nameservers.search[0]",
		"spec.cloudInit.sshAuthorizedKeys[0]", "spec.cloudInit.userData", "spec.power"},
	"VM with a profile": {"spec.profile", "spec.host", "spec.image.sha256", "spec.kernel.initrd.url", "spec.static.addresses[0]",
		"spec.cloudInit.encryptedUserData.ciphertext"},
}

// probeKey is a key no field of any object is named like, nor close to
// (so the decoder lists its known fields instead of suggesting one).
const probeKey = "zzzzzzzzzzzz"

// probeSeg is one step of a path into an object: a key of a mapping, or
// the first item of a list.
type probeSeg struct {
	key   string
	index bool
}

type schemaProbe struct {
	t    probeT
	defs map[string]any
	base map[string]any
	// leaves are the fields of the values probed, for the test to see
	// that the walk went everywhere.
	leaves []string
}

// probeField is the decoder's name of path: "spec.volumes[0]".
func probeField(path []probeSeg) string {
	f := ""
	for _, s := range path {
		if s.index {
			f = indexPath(f, 0)
		} else {
			f = joinPath(f, s.key)
		}
	}
	return f
}

// probeWith returns node with v at path, copying every mapping along the path.
func probeWith(node any, path []probeSeg, v any) any {
	if len(path) == 0 {
		return v
	}
	if path[0].index {
		return []any{probeWith(nil, path[1:], v)}
	}
	m, _ := node.(map[string]any)
	c := make(map[string]any, len(m)+1)
	for k, x := range m {
		c[k] = x
	}
	c[path[0].key] = probeWith(m[path[0].key], path[1:], v)
	return c
}

// errorsAt decodes the base object with v at path (v is the whole
// document when path is empty) and returns the errors whose field is f.
func (p *schemaProbe) errorsAt(path []probeSeg, v any, f string) []*Error {
	p.t.Helper()
	doc := probeWith(p.base, path, v)
	_, errs := parseFile("probe.yaml", yamlBytes(p.t, doc))
	var at []*Error
	for _, e := range errs {
		if e.Field == f {
			at = append(at, e)
		}
	}
	return at
}

// typeErrors are the starts of the decoder's messages for a value of the
// wrong type, or a key it does not know.
var typeErrors = []string{"must be a string", "must be an integer", "must be a plain decimal", "must be true or false",
	"must be a mapping", "must be a list", "unknown field", "keys must be strings"}

func isTypeError(e *Error) bool {
	for _, te := range typeErrors {
		if strings.HasPrefix(e.Msg, te) {
			return true
		}
	}
	return false
}

func (p *schemaProbe) resolve(s map[string]any) map[string]any {
	for {
		ref, ok := s["$ref"].(string)
		if !ok {
			return s
		}
		s = p.defs[strings.TrimPrefix(ref, "#/$defs/")].(map[string]any)
	}
}

// walk probes the schema s of the value at path, and everything in it.
func (p *schemaProbe) walk(path []probeSeg, s map[string]any, depth int) {
	if depth > 12 {
		p.t.Fatalf("%s: the schema nests deeper than 12 levels", probeField(path))
	}
	s = p.resolve(s)
	switch {
	case s["type"] == "object" && s["properties"] != nil:
		p.object(path, p.branch(path, s), depth)
	case s["type"] == "object":
		p.walk(append(slices.Clip(path), probeSeg{key: "x"}), s["additionalProperties"].(map[string]any), depth+1)
	case s["type"] == "array":
		p.walk(append(slices.Clip(path), probeSeg{index: true}), s["items"].(map[string]any), depth+1)
	default:
		p.leaf(path, s)
	}
}

// branchedObject is an object schema as the base at one path meets it:
// outer names the fields the object may hold; inner is what applies to
// the base (outer itself, or its "else" when the base does not write what
// its "if" requires), and kept are the fields of the base that choose it,
// which every probe at the path keeps.
type branchedObject struct {
	outer, inner map[string]any
	kept         map[string]any
}

// branch resolves the if/else of object schema s for the base at path.
func (p *schemaProbe) branch(path []probeSeg, s map[string]any) branchedObject {
	b := branchedObject{outer: s, inner: s, kept: map[string]any{}}
	cond, ok := s["if"].(map[string]any)
	if !ok {
		return b
	}
	at, _ := p.baseAt(path).(map[string]any)
	for _, r := range asList(cond["required"]) {
		v, written := at[r.(string)]
		if !written {
			b.inner, b.kept = p.resolve(s["else"].(map[string]any)), map[string]any{}
			return b
		}
		b.kept[r.(string)] = v
	}
	return b
}

// baseAt is the base's value at path (nil when it has none).
func (p *schemaProbe) baseAt(path []probeSeg) any {
	var v any = p.base
	for _, s := range path {
		m, _ := v.(map[string]any)
		if s.index || m == nil {
			return nil
		}
		v = m[s.key]
	}
	return v
}

// object checks the fields and required fields the decoder knows at path
// against s, then walks each property of the schema that applies.
func (p *schemaProbe) object(path []probeSeg, s branchedObject, depth int) {
	f := probeField(path)
	names := sortedKeys(s.outer["properties"].(map[string]any))
	known := p.knownFields(path, s.kept)
	sort.Strings(known)
	if !slices.Equal(known, names) {
		p.t.Errorf("at %q the decoder knows the fields %v, the schema %v", f, known, names)
	}

	required := []string{}
	for _, r := range asList(s.inner["required"]) {
		required = append(required, r.(string))
	}
	props := s.inner["properties"].(map[string]any)
	missing := p.missing(path, sortedKeys(props), s.kept)
	sort.Strings(required)
	if !slices.Equal(missing, required) {
		p.t.Errorf("in an empty %q the decoder reports as missing %v; the schema requires %v", f, missing, required)
	}
	for _, name := range sortedKeys(props) {
		p.walk(append(slices.Clip(path), probeSeg{key: name}), props[name].(map[string]any), depth+1)
	}
}

func sortedKeys(m map[string]any) []string {
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// withKept is v, a mapping probed at a path, with the base's fields that
// choose the schema there.
func withKept(v map[string]any, kept map[string]any) map[string]any {
	for k, x := range kept {
		v[k] = x
	}
	return v
}

// knownFields returns the fields the decoder lists at path when it meets
// an unknown one there.
func (p *schemaProbe) knownFields(path []probeSeg, kept map[string]any) []string {
	f := probeField(path)
	var v any = withKept(map[string]any{probeKey: 1}, kept)
	if len(path) == 0 {
		v = map[string]any{"apiVersion": APIVersion, "kind": p.base["kind"], probeKey: 1}
	}
	for _, e := range p.errorsAt(path, v, f) {
		if isTypeError(e) {
			p.t.Errorf("%s: a mapping is rejected: %s", f, e.Msg)
		}
	}
	errs := p.errorsAt(path, v, joinPath(f, probeKey))
	if len(errs) != 1 {
		p.t.Errorf("at %q the decoder reports %v for an unknown field, not one error listing its known fields", f, ErrorList(errs))
		return nil
	}
	_, list, ok := strings.Cut(errs[0].Msg, "; known fields: ")
	if !ok {
		p.t.Errorf("at %q the decoder does not list its known fields: %s", f, errs[0].Msg)
		return nil
	}
	return strings.Split(list, ", ")
}

// missing returns those of names the decoder reports as missing in an
// empty object at path; at the root, in an object holding only its kind.
func (p *schemaProbe) missing(path []probeSeg, names []string, kept map[string]any) []string {
	var v any = withKept(map[string]any{}, kept)
	if len(path) == 0 {
		v = map[string]any{"kind": p.base["kind"]}
	}
	missing := []string{}
	if len(path) == 0 {
		missing = append(missing, "kind") // written
	}
	for _, name := range names {
		for _, e := range p.errorsAt(path, v, joinPath(probeField(path), name)) {
			if strings.HasPrefix(e.Msg, "missing") {
				missing = append(missing, name)
				break
			}
		}
	}
	sort.Strings(missing)
	return missing
}

// leaf checks that the decoder takes a value of the schema's type at path
// and, for integer ranges, enums and constants, the same values.
func (p *schemaProbe) leaf(path []probeSeg, s map[string]any) {
	f := probeField(path)
	p.leaves = append(p.leaves, f)
	accept := func(v any) {
		for _, e := range p.errorsAt(path, v, f) {
			p.t.Errorf("%s: %v is valid in the schema; the decoder says %s", f, v, e.Msg)
		}
	}
	reject := func(v any) {
		if len(p.errorsAt(path, v, f)) == 0 {
			p.t.Errorf("%s: %v is invalid in the schema; the decoder takes it", f, v)
		}
	}
	switch {
	case s["const"] != nil:
		accept(s["const"])
		reject(probeKey)
	case s["enum"] != nil:
		for _, v := range s["enum"].([]any) {
			accept(v)
		}
		reject(probeKey)
	case s["type"] == "integer":
		min, okMin := s["minimum"].(float64)
		max, okMax := s["maximum"].(float64)
		if !okMin || !okMax {
			p.t.Errorf("%s: an integer without a minimum and a maximum", f)
			return
		}
		lo, hi := int(min), int(max)
		accept(lo)
		accept(hi)
		reject(lo - 1)
		reject(hi + 1)
	case s["type"] == "string" || s["type"] == "boolean":
		v := any("x")
		if s["type"] == "boolean" {
			v = true
		}
		for _, e := range p.errorsAt(path, v, f) {
			if isTypeError(e) {
				p.t.Errorf("%s: a %s is rejected: %s", f, s["type"], e.Msg)
			}
		}
	default:
		p.t.Errorf("%s: the test has no probe for the schema %v", f, s)
	}
}

// probeT is the part of *testing.T a schemaProbe reports to.
type probeT interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// asList is a JSON list, or nil for none.
func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func yamlBytes(t probeT, v any) []byte {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return b
}

// TestSchemaFieldsProbeCatches shows that the probe's checks can fail: a
// Volume spec schema changed in each way below is reported.
func TestSchemaFieldsProbeCatches(t *testing.T) {
	var schema map[string]any
	if err := json.Unmarshal(JSONSchema(), &schema); err != nil {
		t.Fatal(err)
	}
	defs := schema["$defs"].(map[string]any)
	spec := defs["Volume"].(map[string]any)["properties"].(map[string]any)["spec"].(map[string]any)
	props := func(s map[string]any) map[string]any { return s["properties"].(map[string]any) }
	for name, change := range map[string]func(spec map[string]any){
		"field the decoder does not know": func(s map[string]any) {
			props(s)["zone"] = map[string]any{"type": "string"}
		},
		"field the schema does not name": func(s map[string]any) { delete(props(s), "host") },
		"required field the decoder does not require": func(s map[string]any) {
			props(s)["zone"] = map[string]any{"type": "string"}
			s["required"] = []any{"host", "sizeGB", "zone"}
		},
		"optional field the decoder requires": func(s map[string]any) { s["required"] = []any{"host"} },
		"wider range":                         func(s map[string]any) { props(s)["sizeGB"].(map[string]any)["minimum"] = 0.0 },
		"integer the decoder reads as text": func(s map[string]any) {
			props(s)["host"] = map[string]any{"type": "integer", "minimum": 0.0, "maximum": 9.0}
		},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := json.Marshal(spec)
			if err != nil {
				t.Fatal(err)
			}
			var changed map[string]any
			if err := json.Unmarshal(b, &changed); err != nil {
				t.Fatal(err)
			}
			change(changed)
			rec := &recorder{T: t}
			p := &schemaProbe{t: rec, defs: defs, base: probeBases["Volume"]}
			p.walk([]probeSeg{{key: "spec"}}, changed, 1)
			if len(rec.errors) == 0 {
				t.Errorf("the probe finds nothing wrong with the changed schema")
			}
			for _, e := range rec.errors {
				t.Log("reported: " + e)
			}
		})
	}
}

// TestSchemaFieldsProbeCatchesPartial shows that the probe holds the
// schema of a VM that names a profile to the decoder too: a spec that
// requires a field there, or that leaves a field out, is reported.
func TestSchemaFieldsProbeCatchesPartial(t *testing.T) {
	var schema map[string]any
	if err := json.Unmarshal(JSONSchema(), &schema); err != nil {
		t.Fatal(err)
	}
	defs := schema["$defs"].(map[string]any)
	spec := defs["VM"].(map[string]any)["properties"].(map[string]any)["spec"].(map[string]any)
	for name, change := range map[string]func(spec map[string]any){
		"a field required with a profile": func(s map[string]any) { s["required"] = []any{"vcpus"} },
		"a field missing with a profile":  func(s map[string]any) { delete(s["properties"].(map[string]any), "vcpus") },
		"a nested field required with one": func(s map[string]any) {
			s["properties"].(map[string]any)["image"].(map[string]any)["required"] = []any{"url"}
		},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := json.Marshal(spec)
			if err != nil {
				t.Fatal(err)
			}
			var changed map[string]any
			if err := json.Unmarshal(b, &changed); err != nil {
				t.Fatal(err)
			}
			change(changed)
			rec := &recorder{T: t}
			p := &schemaProbe{t: rec, defs: defs, base: probeVariants["VM"]["VM with a profile"]}
			p.walk([]probeSeg{{key: "spec"}}, changed, 1)
			if len(rec.errors) == 0 {
				t.Errorf("the probe finds nothing wrong with the changed schema")
			}
			for _, e := range rec.errors {
				t.Log("reported: " + e)
			}
		})
	}
}

// recorder keeps a probe's errors instead of failing the test.
type recorder struct {
	*testing.T
	errors []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
