package desired

import (
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
)

// pos is a 1-based line and column in a file.
type pos struct{ line, col int }

func nodePos(n *yaml.Node) pos { return pos{n.Line, n.Column} }

// fieldPos is where a field was written: its key and its value. For list
// items and the document root both are the item's position.
type fieldPos struct{ key, val pos }

// nodeDecoder decodes a yaml.Node tree into Go values strictly. It is driven
// by the yaml struct tags of the target types and never coerces: a string
// field takes only a YAML string, an integer field only a plain decimal
// integer, a boolean only true or false. Unknown fields, duplicate keys,
// anchors, aliases, merge keys and explicit tags are errors. Every error is
// collected; decoding goes on with the next field, so one pass reports all
// of a file's problems. It records where each field was written (pos) for
// the validation that follows.
type nodeDecoder struct {
	file string
	errs []*Error
	pos  map[string]fieldPos
	bad  map[string]bool // fields with an error already
	// empty holds the key positions of fields written with an empty
	// (null) value, which decode as if left out.
	empty map[string]pos
	// snapshot words document-level errors for a snapshot file rather
	// than an object file.
	snapshot bool
}

func newNodeDecoder(file string) *nodeDecoder {
	return &nodeDecoder{file: file, pos: make(map[string]fieldPos, 16)}
}

// maxErrorsPerFile bounds the errors reported for one file, so a large
// garbage file yields a readable report.
const maxErrorsPerFile = 50

func (d *nodeDecoder) add(p pos, field, format string, args ...any) {
	if len(d.errs) == maxErrorsPerFile {
		d.errs = append(d.errs, &Error{File: d.file, Line: p.line, Col: p.col,
			Msg: fmt.Sprintf("too many errors in this file; stopped after %d", maxErrorsPerFile)})
	}
	if len(d.errs) > maxErrorsPerFile {
		return
	}
	if p.line < 1 {
		p.line = 1
	}
	if p.col < 1 {
		p.col = 1
	}
	if d.bad == nil {
		d.bad = make(map[string]bool)
	}
	d.bad[field] = true
	d.errs = append(d.errs, &Error{File: d.file, Line: p.line, Col: p.col, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// keyPos returns where field was written, falling back to its nearest
// recorded parent, then to the start of the file.
func (d *nodeDecoder) keyPos(field string) pos {
	for {
		if fp, ok := d.pos[field]; ok {
			return fp.key
		}
		if field == "" {
			return pos{1, 1}
		}
		field = parentPath(field)
	}
}

// valPos is like keyPos for the field's value.
func (d *nodeDecoder) valPos(field string) pos {
	for {
		if fp, ok := d.pos[field]; ok {
			return fp.val
		}
		if field == "" {
			return pos{1, 1}
		}
		field = parentPath(field)
	}
}

func parentPath(p string) string {
	i := strings.LastIndexAny(p, ".[")
	if i < 0 {
		return ""
	}
	return p[:i]
}

func joinPath(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

// describe names what a node holds, for "must be X, got Y" messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.DocumentNode:
		return "a document"
	}
	v := n.Value
	if len(v) > 40 {
		v = v[:40] + "..."
	}
	switch n.Tag {
	case "!!str":
		return fmt.Sprintf("the string %q", v)
	case "!!int":
		return "the integer " + v
	case "!!float":
		return "the number " + v
	case "!!bool":
		return "the boolean " + v
	case "!!null":
		return "null (an empty value)"
	case "!!timestamp":
		return "the timestamp " + v
	}
	return fmt.Sprintf("%s %q", n.Tag, v)
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// plain reports whether n may be decoded at all: anchors, aliases and
// explicit tags are rejected here, wherever they appear.
func (d *nodeDecoder) plain(n *yaml.Node, field string) bool {
	switch {
	case n.Kind == yaml.AliasNode:
		d.add(nodePos(n), field, "aliases (*%s) are not supported; write the value out in full", n.Value)
		return false
	case n.Anchor != "":
		d.add(nodePos(n), field, "anchors (&%s) are not supported; write the value out in full", n.Anchor)
		return false
	case n.Style&yaml.TaggedStyle != 0:
		d.add(nodePos(n), field, "explicit tags (%s) are not supported; write strings in quotes instead", n.Tag)
		return false
	}
	return true
}

// structField is one yaml-tagged field of a struct type.
type structField struct {
	name  string
	index int
}

type structInfo struct {
	fields []structField
	byName map[string]int
}

var structCache sync.Map // reflect.Type -> *structInfo

func infoOf(t reflect.Type) *structInfo {
	if v, ok := structCache.Load(t); ok {
		return v.(*structInfo)
	}
	info := &structInfo{byName: map[string]int{}}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		info.byName[name] = len(info.fields)
		info.fields = append(info.fields, structField{name: name, index: i})
	}
	structCache.Store(t, info)
	return info
}

// decode decodes n into v, reporting errors under field.
func (d *nodeDecoder) decode(n *yaml.Node, v reflect.Value, field string) {
	if !d.plain(n, field) {
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		if isNull(n) {
			return
		}
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.decode(n, v.Elem(), field)
	case reflect.Struct:
		d.decodeStruct(n, v, field)
	case reflect.Map:
		d.decodeMap(n, v, field)
	case reflect.Slice:
		d.decodeSlice(n, v, field)
	case reflect.String:
		if s, ok := d.scalarString(n, field); ok {
			v.SetString(s)
		}
	case reflect.Int, reflect.Int64:
		if i, ok := d.scalarInt(n, field, false); ok {
			v.SetInt(i)
		}
	case reflect.Uint64:
		if i, ok := d.scalarInt(n, field, true); ok {
			v.SetUint(uint64(i))
		}
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			d.add(nodePos(n), field, "must be true or false, got %s", describe(n))
			return
		}
		switch n.Value {
		case "true":
			v.SetBool(true)
		case "false":
			v.SetBool(false)
		default:
			d.add(nodePos(n), field, "must be true or false (lowercase), got %q", n.Value)
		}
	default:
		panic(fmt.Sprintf("desired: no decoder for %s", v.Type()))
	}
}

// mappingPairs checks that n is a mapping with plain, unique string keys and
// calls fn for each key/value pair, after recording the field's position.
func (d *nodeDecoder) mappingPairs(n *yaml.Node, field string, fn func(key string, k, val *yaml.Node, sub string)) {
	if n.Kind != yaml.MappingNode {
		d.add(nodePos(n), field, "must be a mapping, got %s", describe(n))
		return
	}
	var seen map[string]*yaml.Node
	if len(n.Content) > 16 {
		seen = make(map[string]*yaml.Node, len(n.Content)/2)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			d.add(nodePos(k), field, "merge keys (<<) are not supported; write the fields out in full")
			continue
		}
		if !d.plain(k, field) {
			continue
		}
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
			d.add(nodePos(k), field, "keys must be strings, got %s", describe(k))
			continue
		}
		// Duplicate keys: a linear scan for the small mappings objects
		// have, a map for large ones.
		var first *yaml.Node
		if seen != nil {
			first = seen[k.Value]
			if first == nil {
				seen[k.Value] = k
			}
		} else {
			for j := 0; j < i; j += 2 {
				if p := n.Content[j]; p.Kind == yaml.ScalarNode && p.Value == k.Value && p.Tag == "!!str" {
					first = p
					break
				}
			}
		}
		sub := joinPath(field, k.Value)
		if first != nil {
			d.add(nodePos(k), sub, "duplicate key %q (first written at line %d); a key may appear only once", k.Value, first.Line)
			continue
		}
		fn(k.Value, k, val, sub)
	}
}

func (d *nodeDecoder) decodeStruct(n *yaml.Node, v reflect.Value, field string) {
	info := infoOf(v.Type())
	d.mappingPairs(n, field, func(key string, k, val *yaml.Node, sub string) {
		i, ok := info.byName[key]
		if !ok {
			msg := fmt.Sprintf("unknown field %q", key)
			if s := suggest(key, info); s != "" {
				msg += fmt.Sprintf("; did you mean %q?", s)
			} else {
				names := make([]string, len(info.fields))
				for j, f := range info.fields {
					names[j] = f.name
				}
				msg += "; known fields: " + strings.Join(names, ", ")
			}
			d.add(nodePos(k), sub, "%s", msg)
			return
		}
		if isNull(val) && val.Style&yaml.TaggedStyle == 0 && val.Anchor == "" {
			// An empty value is the same as leaving the field out; only
			// a "missing" error points at it.
			if d.empty == nil {
				d.empty = make(map[string]pos)
			}
			d.empty[sub] = nodePos(k)
			return
		}
		d.pos[sub] = fieldPos{key: nodePos(k), val: nodePos(val)}
		d.decode(val, v.Field(info.fields[i].index), sub)
	})
}

func (d *nodeDecoder) decodeMap(n *yaml.Node, v reflect.Value, field string) {
	if v.Type().Key().Kind() != reflect.String {
		panic(fmt.Sprintf("desired: map key type %s", v.Type().Key()))
	}
	if n.Kind == yaml.MappingNode && v.IsNil() {
		v.Set(reflect.MakeMapWithSize(v.Type(), len(n.Content)/2))
	}
	et := v.Type().Elem()
	d.mappingPairs(n, field, func(key string, k, val *yaml.Node, sub string) {
		d.pos[sub] = fieldPos{key: nodePos(k), val: nodePos(val)}
		e := reflect.New(et).Elem()
		before := len(d.errs)
		d.decode(val, e, sub)
		if len(d.errs) == before {
			v.SetMapIndex(reflect.ValueOf(key).Convert(v.Type().Key()), e)
		}
	})
}

func (d *nodeDecoder) decodeSlice(n *yaml.Node, v reflect.Value, field string) {
	if n.Kind != yaml.SequenceNode {
		d.add(nodePos(n), field, "must be a list, got %s", describe(n))
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, item := range n.Content {
		sub := field + "[" + strconv.Itoa(i) + "]"
		d.pos[sub] = fieldPos{key: nodePos(item), val: nodePos(item)}
		d.decode(item, s.Index(i), sub)
	}
	v.Set(s)
}

// scalarString accepts only a YAML string. A plain scalar that YAML reads
// as something else (no coercion either way: 007, 1e3, 1.10, true, null)
// is rejected with advice to quote it, so the value is never silently
// changed into a number and back into different text.
func (d *nodeDecoder) scalarString(n *yaml.Node, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		d.add(nodePos(n), field, "must be a string, got %s", describe(n))
		return "", false
	}
	if n.Tag != "!!str" {
		d.add(nodePos(n), field, "must be a string, got %s; if you mean the text, quote it: %q", describe(n), n.Value)
		return "", false
	}
	return n.Value, true
}

var decimal = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

// scalarInt accepts only a plain decimal integer: no quotes, no floats, no
// 0x/0o/0b prefixes, no leading zeros, no underscores, no sign prefix "+".
func (d *nodeDecoder) scalarInt(n *yaml.Node, field string, unsigned bool) (int64, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" && n.Tag != "!!float" {
		d.add(nodePos(n), field, "must be an integer, got %s", describe(n))
		return 0, false
	}
	if !decimal.MatchString(n.Value) {
		d.add(nodePos(n), field, "must be a plain decimal integer such as 42, got %s", n.Value)
		return 0, false
	}
	if unsigned {
		u, err := strconv.ParseUint(n.Value, 10, 63)
		if err != nil {
			d.add(nodePos(n), field, "must be a non-negative integer below 2^63, got %s", n.Value)
			return 0, false
		}
		return int64(u), true
	}
	i, err := strconv.ParseInt(n.Value, 10, 32)
	if err != nil {
		d.add(nodePos(n), field, "integer %s is out of range", n.Value)
		return 0, false
	}
	return i, true
}

// suggest returns the known field name closest to key (case-insensitive
// match or edit distance at most 2), or "".
func suggest(key string, info *structInfo) string {
	best, bestD := "", 3
	for _, f := range info.fields {
		if strings.EqualFold(f.name, key) {
			return f.name
		}
		if dd := editDistance(key, f.name); dd < bestD {
			best, bestD = f.name, dd
		}
	}
	return best
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 99
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			c = min(c, prev[j]+1, cur[j-1]+1)
			cur[j] = c
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
