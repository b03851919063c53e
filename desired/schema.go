package desired

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// SchemaID is the $id of the JSON Schema JSONSchema returns.
const SchemaID = "https://gitfleet.dev/schemas/v1alpha1/object.json"

// JSONSchema returns a JSON Schema (draft 2020-12) of one object file: kind
// must be VM, Volume, Host, Profile or BackupRepository, and an if/then on kind checks the object
// against that kind's definition alone (so a validator reports errors of the
// object's own kind, never of the others), each with its fields, types,
// required fields (none in a Profile's spec, nor in the spec of a VM that
// names a profile: the effective spec is checked by Load) and the
// per-object limits of this package (name pattern
// and length, integer ranges, sha256 and URL shapes, power values). Editors
// use it to complete and check object files as they are written. The
// cross-object checks (references, uniqueness, capacity) and the YAML rules
// a schema cannot express (no anchors, one document, quoting) are left to
// Load and gitfleet validate. The output is deterministic, indented JSON
// ending in a newline.
//
// The schema is generated from the types the decoder fills, read as the
// decoder reads them (by their yaml tags), and the descriptions and limits
// beside each type (typeSchema); TestSchemaFieldsMatchDecoder holds schema
// and decoder to the same fields, required fields, types and limits.
func JSONSchema() []byte {
	schema, _ := buildSchema()
	b, err := json.MarshalIndent(schema, "", "  ")
	if err != nil {
		panic(fmt.Sprintf("desired: encode schema: %v", err))
	}
	return append(b, '\n')
}

// schemaKinds are the document types of the object kinds, in the order
// the schema lists the kinds. Each one's typeSchema is envelope(kind).
var schemaKinds = []schemaAnnotated{vmDoc{}, volumeDoc{}, hostDoc{}, profileDoc{}, backupRepositoryDoc{}}

// schemaShapes are the string shapes several fields share, each a $defs
// entry of the schema that fieldSchema.shape names.
var schemaShapes = map[string]fieldSchema{
	"name": {
		minLength: 1, maxLength: MaxNameLength, pattern: labelRE.String(),
		desc: "An RFC 1123 DNS label: lowercase letters, digits and '-', at most 63 characters.",
	},
	"sha256": {pattern: sha256RE.String(), desc: "The file's sha256: 64 lowercase hex digits."},
	"url": {
		pattern: `^(https?://[^/?#]+|file:///)`,
		desc:    "Where to fetch the file: an http, https or file:///absolute/path URL.",
	},
}

// schemaAnnotated is a struct type of an object file: every type the
// decoder fills from one carries its typeSchema.
type schemaAnnotated interface{ schema() typeSchema }

// typeSchema is what JSONSchema says of one struct type beyond what its Go
// definition says. The fields, their names and JSON types come from the
// type, as the decoder reads it (infoOf: the yaml tag names a field); a
// field without omitempty in its yaml tag is required. The rest is here.
type typeSchema struct {
	// def, when set, names the type's entry in the schema's $defs, for a
	// type that several fields share; a field of the type then refers to
	// it. Otherwise the type is written out wherever a field has it.
	def string
	// desc describes the type: its $defs entry, or a field of the type
	// that has no desc of its own.
	desc string
	// anyOf and oneOf are sets of fields of which at least one (anyOf) or
	// exactly one (oneOf) set must be written in full.
	anyOf, oneOf [][]string
	// partialWhen names a field of a type that embeds another inline (a
	// VM file's spec and its profile): written, it makes every other
	// field optional at any depth (the profile may write them); left
	// out, the embedded type's schema applies in full.
	partialWhen string
	// fields annotates every field, by yaml name. A field without an
	// entry is left out of the schema (and fails TestSchemaAnnotations).
	fields map[string]fieldSchema
}

// fieldSchema is what JSONSchema says of one field beyond its name and
// JSON type, or of the items of a list field, or of the keys or values of
// a map field.
type fieldSchema struct {
	// desc describes the field. Every field needs one, unless its value
	// is a constant, or a shape or a $defs type that has one.
	desc string
	// shape names an entry of schemaShapes the (string) value takes.
	shape string
	// constant is the one value the (string) field may take.
	constant string
	// enum lists the values of a string field; a field of a named string
	// type (such as Power) needs one. def is the value when it is left out.
	enum []string
	def  string
	// pattern, minLength and maxLength bound a string (or a map's keys).
	pattern              string
	minLength, maxLength int
	// ints bounds an integer field; every integer field needs it.
	ints *intRange
	// minItems, maxItems (0: no limit) and unique constrain a list.
	minItems, maxItems int
	unique             bool
	// items, keys and values annotate a list's items and a map's keys and
	// values.
	items, keys, values *fieldSchema
	// partial makes every field of the (struct) value optional, at any
	// depth, with no anyOf or oneOf: part of a VM spec, as a Profile
	// writes it. omit lists the fields, by dotted path within the value,
	// left out of it.
	partial bool
	omit    []string
}

// intRange is an inclusive range of integers.
type intRange struct{ lo, hi int }

func between(lo, hi int) *intRange { return &intRange{lo, hi} }

// buildSchema returns the schema as a tree of maps for encoding/json (which
// sorts their keys), and what the annotations lack or get wrong, one line
// each, sorted: TestSchemaAnnotations fails on any.
func buildSchema() (obj, []string) {
	b := newSchemaBuilder()
	for name, s := range schemaShapes {
		b.defs[name] = b.value("$defs."+name, reflect.TypeFor[string](), s)
	}
	var kinds []string
	var onKinds []obj
	for _, doc := range schemaKinds {
		def := doc.schema().def
		b.value(def, reflect.TypeOf(doc), fieldSchema{})
		kinds = append(kinds, def)
		onKinds = append(onKinds, onKind(def))
	}
	schema := obj{
		"$schema":     "https://json-schema.org/draft/2020-12/schema",
		"$id":         SchemaID,
		"title":       "gitfleet object",
		"description": fmt.Sprintf("One object file of a gitfleet fleet (%s): a VM, a Volume, a Host, a Profile or a BackupRepository.", APIVersion),
		"type":        "object",
		"required":    []string{"kind"},
		"properties": obj{
			"kind": obj{"enum": kinds, "description": "The object's kind; it chooses the rest of the schema."},
		},
		"allOf": onKinds,
		"$defs": b.defs,
	}
	return schema, b.sortedProblems()
}

// envelope is the typeSchema of the document type of kind k: apiVersion,
// kind, metadata and spec, as the $defs entry named after the kind.
func envelope(k Kind) typeSchema {
	return typeSchema{
		def:  string(k),
		desc: fmt.Sprintf("A %s object of %s.", k, APIVersion),
		fields: map[string]fieldSchema{
			"apiVersion": {constant: APIVersion},
			"kind":       {constant: string(k)},
			"metadata":   {},
			"spec":       {},
		},
	}
}

// onKind applies the definition def to objects whose kind is def.
func onKind(def string) obj {
	return obj{
		"if":   obj{"required": []string{"kind"}, "properties": obj{"kind": obj{"const": def}}},
		"then": obj{"$ref": "#/$defs/" + def},
	}
}

// obj is a JSON object under construction; encoding/json sorts its keys.
type obj = map[string]any

// schemaBuilder collects the $defs of the schema being built and the
// problems of the annotations it reads. While it writes a partial value
// (fieldSchema.partial) it writes every struct out in place, with no
// required fields, and leaves out the fields in omit; rel is the dotted
// path of the value being written within the partial one.
type schemaBuilder struct {
	defs     obj
	problems map[string]bool
	partial  bool
	omit     map[string]bool
	rel      string
}

func newSchemaBuilder() *schemaBuilder {
	return &schemaBuilder{defs: obj{}, problems: map[string]bool{}}
}

// sortedProblems returns the problems found so far, one line each.
func (b *schemaBuilder) sortedProblems() []string {
	problems := make([]string, 0, len(b.problems))
	for p := range b.problems {
		problems = append(problems, p)
	}
	sort.Strings(problems)
	return problems
}

func (b *schemaBuilder) problem(at, format string, args ...any) {
	b.problems[at+": "+fmt.Sprintf(format, args...)] = true
}

// value returns the schema of a value of Go type t annotated by f; at
// names it in problems.
func (b *schemaBuilder) value(at string, t reflect.Type, f fieldSchema) obj {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if f.partial {
		defer b.enterPartial(f.omit)()
	}
	o := obj{}
	switch {
	case f.constant != "":
		o["const"] = f.constant
	case f.shape != "":
		if _, ok := schemaShapes[f.shape]; !ok {
			b.problem(at, "no shape %q in schemaShapes", f.shape)
		}
		o["$ref"] = "#/$defs/" + f.shape
	case t == timeType || reflect.PointerTo(t).Implements(textUnmarshalerType):
		// The decoder reads these from a scalar, as text.
		o["type"] = "string"
		b.stringBounds(f, o)
	case t.Kind() == reflect.Struct:
		o = b.structValue(at, t, f.desc)
	case t.Kind() == reflect.String:
		b.stringValue(at, t, f, o)
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		o["type"] = "integer"
		if f.ints == nil {
			b.problem(at, "an integer needs a range (ints: between(lo, hi))")
		} else {
			o["minimum"], o["maximum"] = f.ints.lo, f.ints.hi
		}
	case t.Kind() == reflect.Bool:
		o["type"] = "boolean"
	case t.Kind() == reflect.Slice:
		o["type"] = "array"
		o["items"] = b.value(at+"[]", t.Elem(), deref(f.items))
		if f.minItems > 0 {
			o["minItems"] = f.minItems
		}
		if f.maxItems > 0 {
			o["maxItems"] = f.maxItems
		}
		if f.unique {
			o["uniqueItems"] = true
		}
	case t.Kind() == reflect.Map:
		o["type"] = "object"
		if f.keys != nil {
			o["propertyNames"] = b.mapKeys(at, *f.keys)
		}
		o["additionalProperties"] = b.value(at+".*", t.Elem(), deref(f.values))
	default:
		b.problem(at, "JSONSchema has no rule for Go type %s", t)
	}
	if f.desc != "" {
		o["description"] = f.desc
	}
	return o
}

// stringValue fills o, the schema of a string of Go type t: an enum, or a
// string with f's bounds. A named string type is a closed set of values
// and needs its enum.
func (b *schemaBuilder) stringValue(at string, t reflect.Type, f fieldSchema, o obj) {
	if len(f.enum) > 0 {
		o["enum"] = f.enum
		if f.def != "" {
			o["default"] = f.def
		}
		return
	}
	if t != reflect.TypeFor[string]() {
		b.problem(at, "a value of type %s needs its enum", t)
	}
	o["type"] = "string"
	b.stringBounds(f, o)
}

func (b *schemaBuilder) stringBounds(f fieldSchema, o obj) {
	if f.pattern != "" {
		o["pattern"] = f.pattern
	}
	if f.minLength > 0 {
		o["minLength"] = f.minLength
	}
	if f.maxLength > 0 {
		o["maxLength"] = f.maxLength
	}
}

// mapKeys is the propertyNames schema of a map's keys, which JSON makes
// strings: a shape, or bounds.
func (b *schemaBuilder) mapKeys(at string, f fieldSchema) obj {
	if f.shape != "" {
		return b.value(at+" keys", reflect.TypeFor[string](), fieldSchema{shape: f.shape})
	}
	o := obj{}
	b.stringBounds(f, o)
	return o
}

// structValue is the schema of a struct type: a reference to its $defs
// entry (made on first use) when the type has a def, else the object
// written out, described by desc or else by the type's own desc.
func (b *schemaBuilder) structValue(at string, t reflect.Type, desc string) obj {
	ann, ok := reflect.Zero(t).Interface().(schemaAnnotated)
	if !ok {
		b.problem(t.Name(), "type %s has no schema method (see typeSchema)", t)
		return obj{"type": "object"}
	}
	ts := ann.schema()
	if ts.def == "" || b.partial {
		if desc == "" {
			desc = ts.desc
		}
		return b.object(t, ts, desc)
	}
	if _, done := b.defs[ts.def]; !done {
		b.defs[ts.def] = obj{} // claimed, for a type that holds itself
		b.defs[ts.def] = b.object(t, ts, ts.desc)
	}
	return obj{"$ref": "#/$defs/" + ts.def}
}

// enterPartial starts writing a partial value that leaves out the fields
// omit names, and returns the function that ends it.
func (b *schemaBuilder) enterPartial(omit []string) func() {
	partial, was, rel := b.partial, b.omit, b.rel
	b.partial, b.omit, b.rel = true, map[string]bool{}, ""
	for _, f := range omit {
		b.omit[f] = true
	}
	return func() { b.partial, b.omit, b.rel = partial, was, rel }
}

// object writes out struct type t as a closed object: the fields the
// decoder knows (infoOf), as ts annotates them (and the types t embeds
// inline annotate theirs).
func (b *schemaBuilder) object(t reflect.Type, ts typeSchema, desc string) obj {
	info := infoOf(t)
	props := obj{}
	var required []string
	for _, sf := range info.fields {
		at := t.Name() + "." + sf.name
		fs, ok := annotation(t, ts, sf)
		if !ok {
			b.problem(at, "no entry in %s's schema method; give the field its desc and limits there", t.Name())
			continue
		}
		if b.partial && b.omit[joinPath(b.rel, sf.name)] {
			continue
		}
		field := t.FieldByIndex(sf.index)
		p := b.field(at, field.Type, fs, sf.name, ts.partialWhen)
		if fs.constant == "" && !b.described(p) {
			b.problem(at, "no desc, and its shape or type has none")
		}
		props[sf.name] = p
		if !strings.Contains(field.Tag.Get("yaml"), ",omitempty") {
			required = append(required, sf.name)
		}
	}
	for name := range ts.fields {
		if _, ok := info.byName[name]; !ok {
			b.problem(t.Name()+"."+name, "annotated in %s's schema method, but %s has no such field", t.Name(), t.Name())
		}
	}
	o := obj{"type": "object", "additionalProperties": false, "properties": props}
	if desc != "" {
		o["description"] = desc
	}
	if ts.partialWhen != "" {
		b.partialUnless(t.Name(), t, ts.partialWhen, o)
		return o
	}
	if b.partial {
		return o
	}
	if len(required) > 0 {
		o["required"] = required
	}
	if alt := b.alternatives(t, info, ts.anyOf); alt != nil {
		o["anyOf"] = alt
	}
	if alt := b.alternatives(t, info, ts.oneOf); alt != nil {
		o["oneOf"] = alt
	}
	return o
}

// field is the schema of field name of a struct, of Go type t, annotated
// by fs: under a partialWhen other than name, a partial value.
func (b *schemaBuilder) field(at string, t reflect.Type, fs fieldSchema, name, partialWhen string) obj {
	rel := b.rel
	b.rel = joinPath(rel, name)
	defer func() { b.rel = rel }()
	if partialWhen != "" && name != partialWhen && !b.partial {
		defer b.enterPartial(nil)()
		b.rel = name
	}
	return b.value(at, t, fs)
}

// partialUnless makes o, the schema of struct type t with a partialWhen
// field, apply the schema of the type t embeds inline in full (an "else"
// branch) unless the field is written.
func (b *schemaBuilder) partialUnless(at string, t reflect.Type, when string, o obj) {
	for i := 0; i < t.NumField(); i++ {
		if f := t.Field(i); f.Anonymous {
			o["if"] = obj{"required": []string{when}}
			o["else"] = b.value(at+"."+f.Name, f.Type, fieldSchema{})
			return
		}
	}
	b.problem(at, "partialWhen %q, but %s embeds no type to apply in full", when, t.Name())
}

// annotation is the fieldSchema of sf, a field of struct type t that ts
// annotates: ts's entry, or for a field of a type t embeds inline, that
// type's.
func annotation(t reflect.Type, ts typeSchema, sf structField) (fieldSchema, bool) {
	if fs, ok := ts.fields[sf.name]; ok || len(sf.index) == 1 {
		return fs, ok
	}
	outer := t.FieldByIndex(sf.index[:len(sf.index)-1]).Type
	ann, ok := reflect.Zero(outer).Interface().(schemaAnnotated)
	if !ok {
		return fieldSchema{}, false
	}
	fs, ok := ann.schema().fields[sf.name]
	return fs, ok
}

// alternatives is an anyOf or oneOf list of required sets.
func (b *schemaBuilder) alternatives(t reflect.Type, info *structInfo, sets [][]string) []obj {
	var alt []obj
	for _, set := range sets {
		for _, name := range set {
			if _, ok := info.byName[name]; !ok {
				b.problem(t.Name()+"."+name, "named in an anyOf or oneOf, but %s has no such field", t.Name())
			}
		}
		alt = append(alt, obj{"required": set})
	}
	return alt
}

// described reports whether schema p has a description, its own or that
// of the $defs entry it refers to.
func (b *schemaBuilder) described(p obj) bool {
	if _, ok := p["description"]; ok {
		return true
	}
	ref, ok := p["$ref"].(string)
	if !ok {
		return false
	}
	def, _ := b.defs[strings.TrimPrefix(ref, "#/$defs/")].(obj)
	_, ok = def["description"]
	return ok
}

func deref(f *fieldSchema) fieldSchema {
	if f == nil {
		return fieldSchema{}
	}
	return *f
}
