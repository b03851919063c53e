package desired

import (
	"bytes"
	"encoding"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"

	"github.com/gitfleet/gitfleet/internal/safetext"
)

// pos is a 1-based line and column in a file. file names the file when
// it is not the one being decoded: a field a VM takes from its profile
// (see mergeSpec) lies in the profile's file. "" is the decoder's own file.
type pos struct {
	line, col int
	file      string
}

func nodePos(n *yaml.Node) pos { return pos{line: n.Line, col: n.Column} }

// at is where node n was written: its line and column, and its file when
// n came from another file than the decoder's (nodeFile).
func (d *nodeDecoder) at(n *yaml.Node) pos {
	p := nodePos(n)
	p.file = d.nodeFile[n]
	return p
}

// fileOf is the file position p lies in.
func (d *nodeDecoder) fileOf(p pos) string {
	if p.file != "" {
		return p.file
	}
	return d.file
}

// fieldPos is where a field was written: its key and its value. For list
// items and the document root both are the item's position.
// literal is set when the value is a literal block scalar ("|"), whose
// line k of content is line val.line+k of the file.
type fieldPos struct {
	key, val pos
	literal  bool
}

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
	// format words document-level errors and bounds the size of a file
	// decoded through Decode; nil for an object file.
	format *Format
	// nodeFile names the file of each node that came from another file
	// than file: the fields a VM takes from its profile (mergeSpec). Nil
	// when every node is file's.
	nodeFile map[*yaml.Node]string
	// partial is set while decoding a Profile, or a VM that names one:
	// no field under spec is required and no check needs another field
	// to be written, since the other file may write it. Load checks the
	// effective spec in full (effectiveVM).
	partial bool
	// refuse maps the paths of fields this document may not hold to the
	// reason, reported in place of decoding them (a Profile's host); they
	// are no known fields there. Nil for none.
	refuse map[string]string
	// profile names the profile of the VM being decoded as its effective
	// spec, "" otherwise, for the messages of fields neither sets.
	profile string
}

func newNodeDecoder(file string) *nodeDecoder {
	return &nodeDecoder{file: file, pos: make(map[string]fieldPos, 16)}
}

// maxErrorsPerFile bounds the errors reported for one file, so a large
// garbage file yields a readable report.
const maxErrorsPerFile = 50

// maxQuoted bounds each string a decoder message quotes, so a hostile
// value of a megabyte costs validate's output and the controller's log a
// line, not a megabyte; legitimate arguments (a field list, a list of
// VMs) stay well below it.
const maxQuoted = 1024

func (d *nodeDecoder) add(p pos, field, format string, args ...any) {
	for i, a := range args {
		// Any string kind: the spec's named types (Power, Firmware) too.
		if v := reflect.ValueOf(a); v.Kind() == reflect.String && v.Len() > maxQuoted {
			args[i] = safetext.Truncate(v.String(), maxQuoted)
		}
	}
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
	d.errs = append(d.errs, &Error{File: d.fileOf(p), Line: p.line, Col: p.col, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// keyPos returns where field was written, falling back to its nearest
// recorded parent, then to the start of the file.
func (d *nodeDecoder) keyPos(field string) pos {
	for {
		if fp, ok := d.pos[field]; ok {
			return fp.key
		}
		if field == "" {
			return pos{line: 1, col: 1}
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
			return pos{line: 1, col: 1}
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

// indexPath is the field path of item i of the list at field, such as
// "spec.volumes[0]": the key under which the decoder records the item's
// position and the checks look it up.
func indexPath(field string, i int) string {
	return field + "[" + strconv.Itoa(i) + "]"
}

// describeFor is describe for a node of field, naming only the kind of a
// secret field's value (user-data, keys): a message quotes no part of it.
func describeFor(field string, n *yaml.Node) string {
	if !isSecretField(field) {
		return describe(n)
	}
	switch n.Tag {
	case "!!str":
		return "a string"
	case "!!int", "!!float":
		return "a number"
	case "!!bool":
		return "a boolean"
	}
	if n.Kind != yaml.ScalarNode {
		return describe(n)
	}
	return "a scalar"
}

// valueFor is a node's text for a message, or "(secret)" for a secret
// field's.
func valueFor(field string, v string) string {
	if isSecretField(field) {
		return "(secret)"
	}
	return v
}

// isSecretField reports whether field holds a secret (see secretFields):
// its value is never shown, by validate, plan or the agent.
func isSecretField(field string) bool {
	for _, pub := range publicFields {
		if field == pub {
			return false
		}
	}
	for _, sec := range secretFields {
		if strings.HasPrefix(field, sec) {
			return true
		}
	}
	return false
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
		d.add(d.at(n), field, "aliases (*%s) are not supported; write the value out in full", n.Value)
		return false
	case n.Anchor != "":
		d.add(d.at(n), field, "anchors (&%s) are not supported; write the value out in full", n.Anchor)
		return false
	case n.Style&yaml.TaggedStyle != 0:
		d.add(d.at(n), field, "explicit tags (%s) are not supported; write strings in quotes instead", n.Tag)
		return false
	}
	return true
}

// structField is one yaml-tagged field of a struct type; index is its
// index sequence (reflect.Value.FieldByIndex), longer than one for a field
// of an embedded struct tagged ",inline".
type structField struct {
	name  string
	index []int
}

type structInfo struct {
	fields []structField
	byName map[string]int
}

var structCache sync.Map // reflect.Type -> *structInfo

// infoOf lists the fields of struct type t by their yaml names. The fields
// of an embedded struct tagged `yaml:",inline"` are read as t's own, as
// the yaml package reads them.
func infoOf(t reflect.Type) *structInfo {
	if v, ok := structCache.Load(t); ok {
		return v.(*structInfo)
	}
	info := &structInfo{byName: map[string]int{}}
	info.addFields(t, nil)
	structCache.Store(t, info)
	return info
}

func (info *structInfo) addFields(t reflect.Type, index []int) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		at := append(append(make([]int, 0, len(index)+1), index...), i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct && slices.Contains(strings.Split(opts, ","), "inline") {
			info.addFields(f.Type, at)
			continue
		}
		if name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		info.byName[name] = len(info.fields)
		info.fields = append(info.fields, structField{name: name, index: at})
	}
}

// decode decodes n into v, reporting errors under field.
func (d *nodeDecoder) decode(n *yaml.Node, v reflect.Value, field string) {
	if !d.plain(n, field) {
		return
	}
	if v.Type() == timeType {
		d.scalarTime(n, v, field)
		return
	}
	if v.CanAddr() && v.Addr().Type().Implements(textUnmarshalerType) {
		d.scalarText(n, v.Addr().Interface().(encoding.TextUnmarshaler), field)
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
		if i, ok := d.scalarInt(n, field); ok {
			v.SetInt(i)
		}
	case reflect.Uint64:
		if u, ok := d.scalarUint(n, field); ok {
			v.SetUint(u)
		}
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			d.add(d.at(n), field, "must be true or false, got %s", describeFor(field, n))
			return
		}
		switch n.Value {
		case "true":
			v.SetBool(true)
		case "false":
			v.SetBool(false)
		default:
			d.add(d.at(n), field, "must be true or false (lowercase), got %q", n.Value)
		}
	default:
		panic(fmt.Sprintf("desired: no decoder for %s", v.Type()))
	}
}

// mappingPairs checks that n is a mapping with plain, unique string keys and
// calls fn for each key/value pair, after recording the field's position.
func (d *nodeDecoder) mappingPairs(n *yaml.Node, field string, fn func(key string, k, val *yaml.Node, sub string)) {
	if n.Kind != yaml.MappingNode {
		d.add(d.at(n), field, "must be a mapping, got %s", describeFor(field, n))
		return
	}
	var seen map[string]*yaml.Node
	if len(n.Content) > 16 {
		seen = make(map[string]*yaml.Node, len(n.Content)/2)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			d.add(d.at(k), field, "merge keys (<<) are not supported; write the fields out in full")
			continue
		}
		if !d.plain(k, field) {
			continue
		}
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
			d.add(d.at(k), field, "keys must be strings, got %s", describeFor(field, k))
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
			d.add(d.at(k), sub, "duplicate key %q (first written at line %d); a key may appear only once", k.Value, first.Line)
			continue
		}
		fn(k.Value, k, val, sub)
	}
}

func (d *nodeDecoder) decodeStruct(n *yaml.Node, v reflect.Value, field string) {
	info := infoOf(v.Type())
	d.mappingPairs(n, field, func(key string, k, val *yaml.Node, sub string) {
		if why, refused := d.refuse[sub]; refused {
			d.add(d.at(k), sub, "%s", why)
			return
		}
		i, ok := info.byName[key]
		if !ok {
			msg := fmt.Sprintf("unknown field %q", key)
			if s := d.suggest(key, info, field); s != "" {
				msg += fmt.Sprintf("; did you mean %q?", s)
			} else {
				msg += "; known fields: " + strings.Join(d.knownFields(info, field), ", ")
			}
			d.add(d.at(k), sub, "%s", msg)
			return
		}
		if isNull(val) && val.Style&yaml.TaggedStyle == 0 && val.Anchor == "" {
			// An empty value is the same as leaving the field out; only
			// a "missing" error points at it.
			if d.empty == nil {
				d.empty = make(map[string]pos)
			}
			d.empty[sub] = d.at(k)
			return
		}
		d.pos[sub] = fieldPos{key: d.at(k), val: d.at(val), literal: val.Kind == yaml.ScalarNode && val.Style&yaml.LiteralStyle != 0}
		d.decode(val, v.FieldByIndex(info.fields[i].index), sub)
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
		d.pos[sub] = fieldPos{key: d.at(k), val: d.at(val)}
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
		d.add(d.at(n), field, "must be a list, got %s", describeFor(field, n))
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, item := range n.Content {
		sub := indexPath(field, i)
		d.pos[sub] = fieldPos{key: d.at(item), val: d.at(item)}
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
		d.add(d.at(n), field, "must be a string, got %s", describeFor(field, n))
		return "", false
	}
	if n.Tag != "!!str" {
		if isSecretField(field) {
			d.add(d.at(n), field, "must be a string, got %s; if you mean the text, quote it", describeFor(field, n))
		} else {
			d.add(d.at(n), field, "must be a string, got %s; if you mean the text, quote it: %q", describe(n), n.Value)
		}
		return "", false
	}
	return n.Value, true
}

var decimal = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

// scalarInt accepts only a plain decimal integer (see decimal) that fits
// in 32 bits, for an int or int64 field.
func (d *nodeDecoder) scalarInt(n *yaml.Node, field string) (int64, bool) {
	if !d.decimal(n, field) {
		return 0, false
	}
	i, err := strconv.ParseInt(n.Value, 10, 32)
	if err != nil {
		d.add(d.at(n), field, "integer %s is out of range", n.Value)
		return 0, false
	}
	return i, true
}

// scalarUint is scalarInt for an unsigned field (a uint64: an epoch, a
// heartbeat): 0 to 2^64-1.
func (d *nodeDecoder) scalarUint(n *yaml.Node, field string) (uint64, bool) {
	if !d.decimal(n, field) {
		return 0, false
	}
	u, err := strconv.ParseUint(n.Value, 10, 64)
	if err != nil {
		d.add(d.at(n), field, "must be a non-negative integer below 2^64, got %s", valueFor(field, n.Value))
		return 0, false
	}
	return u, true
}

// decimal reports whether n is a plain decimal integer, recording why not:
// no quotes, no floats, no 0x/0o/0b prefixes, no leading zeros, no
// underscores, no sign prefix "+".
func (d *nodeDecoder) decimal(n *yaml.Node, field string) bool {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" && n.Tag != "!!float" {
		d.add(d.at(n), field, "must be an integer, got %s", describeFor(field, n))
		return false
	}
	if !decimal.MatchString(n.Value) {
		d.add(d.at(n), field, "must be a plain decimal integer such as 42, got %s", valueFor(field, n.Value))
		return false
	}
	return true
}

// knownFields are the names of info's fields that a mapping at field may
// hold: all but those refused there (d.refuse).
func (d *nodeDecoder) knownFields(info *structInfo, field string) []string {
	names := make([]string, 0, len(info.fields))
	for _, f := range info.fields {
		if _, refused := d.refuse[joinPath(field, f.name)]; !refused {
			names = append(names, f.name)
		}
	}
	return names
}

// suggest returns the known field name (knownFields) closest to key
// (case-insensitive match or edit distance at most 2), or "".
func (d *nodeDecoder) suggest(key string, info *structInfo, field string) string {
	best, bestD := "", 3
	for _, name := range d.knownFields(info, field) {
		if strings.EqualFold(name, key) {
			return name
		}
		if dd := editDistance(key, name); dd < bestD {
			best, bestD = name, dd
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

// yamlDocuments parses data as a YAML stream and returns the root nodes of
// its documents that are not empty, stopping at the second such document.
// An empty document is "---" alone or only comments: its root is an untagged
// null without an anchor.
func yamlDocuments(data []byte) ([]*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var roots []*yaml.Node
	for len(roots) < 2 {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if len(doc.Content) == 0 || isNull(doc.Content[0]) && doc.Content[0].Style&yaml.TaggedStyle == 0 && doc.Content[0].Anchor == "" {
			continue
		}
		roots = append(roots, doc.Content[0])
	}
	return roots, nil
}

// reparseTabLines parses data again after the parser rejected it with
// err. The parser rejects lines YAML reads as blank or as a comment when
// their leading whitespace holds a tab, wherever a block structure is open,
// although YAML 1.2 allows them: a tab is separation there, not
// indentation. So those lines are cleared of their tabs (blankTabLines)
// and the data parsed again.
//
// Clearing a line keeps the meaning of the file everywhere except where a
// block scalar (| or >) may hold it as content (see tabLinesInBlocks):
// those lines are kept as written, the rest cleared, and the data parsed
// once more; what the parser still rejects there is an error. It returns
// the documents (as yamlDocuments does) and the data they were parsed
// from, or the error to report and the data it refers to; both have the
// lines and columns of data.
func reparseTabLines(data []byte, err error) ([]*yaml.Node, []byte, error) {
	cleared, changed := blankTabLines(data, nil)
	if len(changed) == 0 {
		return nil, data, err
	}
	roots, err := yamlDocuments(cleared)
	if err != nil {
		return nil, cleared, err
	}
	in := tabLinesInBlocks(cleared, roots, changed)
	if len(in) == 0 {
		return roots, cleared, nil
	}
	keep := make(map[int]bool, len(in))
	for _, p := range in {
		keep[p.line] = true
	}
	cleared, changed = blankTabLines(data, keep)
	if len(changed) == 0 {
		return nil, data, &blockTabError{at: in[0]}
	}
	if roots, err = yamlDocuments(cleared); err != nil {
		return nil, cleared, err
	}
	if in := tabLinesInBlocks(cleared, roots, changed); len(in) > 0 {
		// Keeping some lines moved a block scalar: never guess.
		return nil, cleared, &blockTabError{at: in[0]}
	}
	return roots, cleared, nil
}

// blockTabError is a tab where a block scalar's indentation is expected.
type blockTabError struct{ at pos }

func (e *blockTabError) Error() string {
	return fmt.Sprintf("line %d: tab character in the indentation of a block scalar", e.at.line)
}

// blankTabLines returns a copy of data in which each line of only spaces
// and tabs that holds a tab becomes empty, and each comment line whose
// leading whitespace holds a tab ("\t# note") has spaces for its tabs,
// except the lines (1-based) in keep. Every line and every column stays
// where it was. It returns the position of the first tab of each line it
// changed, in line order; with none, it returns data itself.
func blankTabLines(data []byte, keep map[int]bool) ([]byte, []pos) {
	var out []byte
	var changed []pos
	for start, line := 0, 1; start < len(data); line++ {
		end := len(data)
		if i := bytes.IndexByte(data[start:], '\n'); i >= 0 {
			end = start + i
		}
		l := bytes.TrimSuffix(data[start:end], []byte{'\r'})
		ws := len(l) - len(bytes.TrimLeft(l, " \t"))
		if tab := bytes.IndexByte(l[:ws], '\t'); tab >= 0 && (ws == len(l) || l[ws] == '#') && !keep[line] {
			if out == nil {
				out = append(make([]byte, 0, len(data)), data[:start]...)
			}
			if ws < len(l) {
				out = append(out, bytes.Repeat([]byte{' '}, ws)...)
			}
			out = append(out, data[start+ws:end]...) // the comment, or a '\r'
			changed = append(changed, pos{line: line, col: tab + 1})
		} else if out != nil {
			out = append(out, data[start:end]...)
		}
		if end < len(data) && out != nil {
			out = append(out, '\n')
		}
		start = end + 1
	}
	if out == nil {
		return data, nil
	}
	return out, changed
}

// splitLines splits data into lines without their line ends.
func splitLines(data []byte) [][]byte {
	lines := bytes.Split(data, []byte{'\n'})
	for i, l := range lines {
		lines[i] = bytes.TrimSuffix(l, []byte{'\r'})
	}
	return lines
}

// indentOf returns the number of spaces a line starts with and whether it
// holds anything but spaces and tabs.
func indentOf(l []byte) (int, bool) {
	sp := len(l) - len(bytes.TrimLeft(l, " "))
	return sp, len(bytes.TrimLeft(l, " \t")) > 0
}

// tabLinesInBlocks returns those of changed (the lines blankTabLines
// cleared in cleared, in line order) that a block scalar of roots may hold:
// lines after its header and before the next node, unless the line is
// blank or a comment left of the scalar's indentation with no more content
// after it, where it ends the scalar and clearing it changes nothing. With
// keep chomping (|+, >+) a cleared line would add a line end, and with an
// indentation indicator (|2) the indentation is not known here, so every
// such line counts.
func tabLinesInBlocks(cleared []byte, roots []*yaml.Node, changed []pos) []pos {
	var starts, blocks []pos
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		starts = append(starts, nodePos(n))
		if n.Kind == yaml.AliasNode {
			return // its target is walked where it was defined
		}
		if n.Kind == yaml.ScalarNode && n.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
			blocks = append(blocks, nodePos(n))
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	for _, r := range roots {
		walk(r)
	}
	if len(blocks) == 0 {
		return nil
	}
	lines := splitLines(cleared)
	isChanged := make(map[int]bool, len(changed))
	for _, c := range changed {
		isChanged[c.line] = true
	}
	before := func(a, b pos) bool { return a.line < b.line || a.line == b.line && a.col < b.col }
	sort.Slice(starts, func(i, j int) bool { return before(starts[i], starts[j]) })
	var in []pos
	for _, b := range blocks {
		end := len(lines) + 1 // the line of the next node, or past the end
		if i := sort.Search(len(starts), func(i int) bool { return before(b, starts[i]) }); i < len(starts) {
			end = starts[i].line
		}
		first := sort.Search(len(changed), func(i int) bool { return changed[i].line > b.line })
		if first == len(changed) || changed[first].line >= end {
			continue
		}
		// The header's indicators, and the scalar's indentation: that of
		// its first line with content (-1: none, or not known). Cleared
		// lines are left out: what they are is the question.
		header := lines[b.line-1]
		header = header[min(b.col, len(header)):]
		indicators := header[:len(header)-len(bytes.TrimLeft(header, "0123456789+-"))]
		n, last := -1, 0 // last: the last line the scalar holds content on
		if bytes.ContainsAny(indicators, "+0123456789") {
			last = end
		} else {
			for l := b.line + 1; l < end; l++ {
				if isChanged[l] {
					continue
				}
				sp, content := indentOf(lines[l-1])
				if content && n < 0 {
					n = sp
				}
				if content && sp >= n {
					last = l
				}
			}
			if n < 0 {
				last = end
			}
		}
		for i := first; i < len(changed) && changed[i].line < end; i++ {
			if c := changed[i]; c.line < last || c.col-1 >= n {
				in = append(in, c)
			}
		}
	}
	sort.Slice(in, func(i, j int) bool { return in[i].line < in[j].line })
	return in
}

// blockTabLine finds the line of a tab where a block scalar's indentation
// is expected, for a parser error at line: that line if its indentation
// holds a tab, else the first line after it whose indentation has a tab
// left of the indentation of the first line with content after it.
func blockTabLine(data []byte, line int) (pos, bool) {
	lines := splitLines(data)
	if line < 1 || line > len(lines) {
		return pos{}, false
	}
	if sp, _ := indentOf(lines[line-1]); sp < len(lines[line-1]) && lines[line-1][sp] == '\t' {
		return pos{line: line, col: sp + 1}, true
	}
	n := -1
	for l := line + 1; l <= len(lines); l++ {
		sp, content := indentOf(lines[l-1])
		if sp < len(lines[l-1]) && lines[l-1][sp] == '\t' && (n < 0 || sp < n) {
			return pos{line: l, col: sp + 1}, true
		}
		if content && n < 0 {
			n = sp
		}
	}
	return pos{}, false
}

// blockTabMsg and tabIndentMsg are the messages of a tab used as
// indentation, which the parser's own messages say nothing useful about.
const (
	blockTabMsg  = "tab character in the indentation of a block scalar (| or >); YAML indents with spaces only, and a blank line inside the block may hold only spaces"
	tabIndentMsg = "tab character in indentation; YAML indents with spaces only"
)

// yamlError turns a parser error into an Error. A tab used as indentation
// before a key, a value or a list item, or where a block scalar's lines
// are indented, gets a message of its own, on the line of the tab: the
// parser names that line, the one before it, or the block scalar's header.
func (d *nodeDecoder) yamlError(data []byte, err error) {
	var bt *blockTabError
	if errors.As(err, &bt) {
		d.add(bt.at, "", blockTabMsg)
		return
	}
	line, msg := yamlErrorAt(data, err.Error())
	p := pos{line: max(line, 1), col: 1}
	switch {
	case strings.Contains(msg, "where an indentation space is expected"):
		if t, ok := blockTabLine(data, p.line); ok {
			d.add(t, "", blockTabMsg)
			return
		}
	case strings.Contains(msg, "tab character"), strings.Contains(msg, "cannot start any token"):
		if t, ok := tabIndent(data, p.line, p.line+1); ok {
			d.add(t, "", tabIndentMsg)
			return
		}
	}
	d.add(p, "", "invalid YAML: %s", msg)
}

// tabIndent finds the first line from line first to line last (1-based)
// whose leading whitespace holds a tab before content, and returns the
// position of that tab.
func tabIndent(data []byte, first, last int) (pos, bool) {
	lines := splitLines(data)
	for l := max(first, 1); l <= min(last, len(lines)); l++ {
		ws := len(lines[l-1]) - len(bytes.TrimLeft(lines[l-1], " \t"))
		if tab := bytes.IndexByte(lines[l-1][:ws], '\t'); tab >= 0 && ws < len(lines[l-1]) {
			return pos{line: l, col: tab + 1}, true
		}
	}
	return pos{}, false
}
