package desired

import (
	"bytes"
	"encoding"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/gitfleet/gitfleet/internal/safetext"
	"go.yaml.in/yaml/v3"
)

// Format describes a kind of YAML file decoded with Decode: what errors
// about the document as a whole call it, and how large it may be.
type Format struct {
	// Noun names what the file holds, for errors about the document as a
	// whole: with Noun "snapshot" and Shape "a mapping with host, vms and
	// volumes", an empty file is "empty snapshot; a snapshot is a mapping
	// with host, vms and volumes". "" is "file".
	Noun string
	// Shape is what the document must be; "" is "a mapping".
	Shape string
	// MaxBytes bounds the file's size in bytes: a larger file is an error
	// before it is parsed, which bounds the time and memory a forged file
	// can cost. 0 is MaxFileSize (1 MiB); a negative value is no bound.
	MaxBytes int
	// AllowEmpty accepts a file with no document (empty, only comments,
	// only "---") as an empty mapping: every field left out. Without it
	// such a file is an error.
	AllowEmpty bool
}

func (f *Format) noun() string {
	if f.Noun == "" {
		return "file"
	}
	return f.Noun
}

// a is the noun with its indefinite article.
func (f *Format) a() string {
	n := f.noun()
	if strings.ContainsRune("aeiou", rune(n[0])) {
		return "an " + n
	}
	return "a " + n
}

func (f *Format) shape() string {
	if f.Shape == "" {
		return "a mapping"
	}
	return f.Shape
}

// Document is one YAML file decoded strictly into a Go value by Decode,
// kept open for the checks that follow decoding: fields that must be
// written (Required), names (Name) and the caller's own errors at a
// field's position (Errorf). Err returns everything found.
//
// Fields are named by their yaml keys joined with dots, a list item by
// its index: "host", "vms[0].specHash". After an error about the document
// as a whole (no single YAML mapping to decode), the checks do nothing.
//
// A Document is not safe for concurrent use.
type Document struct {
	d       *nodeDecoder
	decoded bool
}

// Decode decodes data, the YAML file named file, into v, a non-nil pointer
// to a struct, with the rules of object files (see "Strict decoding" in
// the package comment): one document that is a mapping, at most
// f.MaxBytes bytes; no unknown fields (with a "did you mean"), duplicate
// keys, anchors, aliases, merge keys or explicit tags; no coercion between
// strings, integers and booleans. A time.Time field takes an RFC 3339 time
// such as 2006-01-02T15:04:05Z; a field of a type that implements
// encoding.TextUnmarshaler (a duration, say) takes a string or number,
// whose text as written is given to UnmarshalText. Every error is collected, so one call
// reports all of a file's problems.
//
// file names the file in errors, which format as FILE:LINE:COL: FIELD:
// message; with file "" they format as LINE:COL: FIELD: message, for a
// caller that adds the path itself.
func Decode(file string, data []byte, v any, f Format) *Document {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() || rv.Elem().Kind() != reflect.Struct {
		panic(fmt.Sprintf("desired.Decode: want a non-nil pointer to a struct, got %T", v))
	}
	d := newNodeDecoder(file)
	d.format = &f
	doc := &Document{d: d}
	root := d.document(data)
	switch {
	case root != nil:
		d.pos[""] = fieldPos{key: nodePos(root), val: nodePos(root)}
		d.decode(root, rv.Elem(), "")
		doc.decoded = true
	case len(d.errs) == 0: // an empty file, allowed
		d.pos[""] = fieldPos{key: pos{line: 1, col: 1}, val: pos{line: 1, col: 1}}
		doc.decoded = true
	}
	return doc
}

// DecodeStrict decodes data into v like Decode with the zero Format (at
// most MaxFileSize bytes) and returns Err: nil, or an ErrorList.
func DecodeStrict(file string, data []byte, v any) error {
	return Decode(file, data, v, Format{}).Err()
}

// Required reports field as missing (at its parent's position) unless it
// was written with a value, and returns whether it was written and decoded
// without error. A field whose parent is missing or rejected is not
// reported again.
func (doc *Document) Required(field string) bool {
	return doc.decoded && doc.d.required(field)
}

// Name checks that value, written at field, is a name: an RFC 1123 label
// of at most 63 characters (MaxNameLength). It returns whether it is; a
// field with an error already is not checked again.
func (doc *Document) Name(field, value string) bool {
	if !doc.decoded || doc.d.bad[field] {
		return false
	}
	before := len(doc.d.errs)
	doc.d.name(field, value)
	return len(doc.d.errs) == before
}

// Errorf records an error of the caller's at the position of field's value
// (or of its nearest written parent).
func (doc *Document) Errorf(field, format string, args ...any) {
	if !doc.decoded {
		return
	}
	doc.d.add(doc.d.valPos(field), field, format, args...)
}

// Err returns every error found so far, sorted by line and column, as an
// ErrorList (which matches ErrInvalid), or nil when there is none.
func (doc *Document) Err() error {
	if len(doc.d.errs) == 0 {
		return nil
	}
	errs := append(ErrorList(nil), doc.d.errs...)
	errs.Sort()
	return errs
}

var timeType = reflect.TypeOf(time.Time{})

// scalarTime accepts only an RFC 3339 time, as a plain or quoted scalar.
func (d *nodeDecoder) scalarTime(n *yaml.Node, v reflect.Value, field string) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!timestamp" && n.Tag != "!!str" {
		d.add(nodePos(n), field, "must be a time such as 2006-01-02T15:04:05Z (RFC 3339), got %s", describeFor(field, n))
		return
	}
	t, err := time.Parse(time.RFC3339Nano, n.Value)
	if err != nil {
		d.add(nodePos(n), field, "must be a time such as 2006-01-02T15:04:05Z (RFC 3339), got %q", safetext.Truncate(n.Value, 40))
		return
	}
	v.Set(reflect.ValueOf(t))
}

var textUnmarshalerType = reflect.TypeOf((*encoding.TextUnmarshaler)(nil)).Elem()

// scalarText gives a scalar's text as written (a string or a number,
// never a boolean or null) to u's UnmarshalText; its error, if any, is
// the field's.
func (d *nodeDecoder) scalarText(n *yaml.Node, u encoding.TextUnmarshaler, field string) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" && n.Tag != "!!int" && n.Tag != "!!float" {
		d.add(nodePos(n), field, "must be a string, got %s", describeFor(field, n))
		return
	}
	if err := u.UnmarshalText([]byte(n.Value)); err != nil {
		d.add(nodePos(n), field, "%s", err)
	}
}

// Encode encodes v as YAML the way gitfleet writes its files: two-space
// indentation, struct fields in declaration order, map keys sorted, so
// equal values encode to equal bytes, and every string quoted where YAML
// would read it as another type. What Encode writes, Decode reads back
// unchanged.
func Encode(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
