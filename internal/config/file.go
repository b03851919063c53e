package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"
)

// fieldCheck checks one scalar of a file, after it decoded into its Go
// type; the key is the field's dotted path ("qemu.accel"), with "[]" for
// the items of a list ("artifacts.fileRoots[]").
type fieldCheck func(value string) error

// decodeStrict decodes the YAML document data (read from file) into v, a
// pointer to a struct with yaml tags. Every fault is one error of the form
// "FILE:LINE:COL: message": an unknown field (naming its section and the
// known ones), a mapping or list where the other or a scalar was wanted, a
// scalar that does not decode into its field's type, and a scalar that
// checks[field] refuses. The first fault in document order is returned.
func decodeStrict(file string, data []byte, v any, checks map[string]fieldCheck) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if len(doc.Content) == 0 {
		return nil
	}
	w := walker{file: file, checks: checks}
	if err := w.walk(doc.Content[0], reflect.TypeOf(v).Elem(), ""); err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: %w", file, err)
	}
	return nil
}

type walker struct {
	file   string
	checks map[string]fieldCheck
}

func (w walker) errorf(n *yaml.Node, format string, args ...any) error {
	return fmt.Errorf("%s:%d:%d: %s", w.file, n.Line, n.Column, fmt.Sprintf(format, args...))
}

// walk checks node n against the Go type t of the field at dotted path
// field ("" is the document).
func (w walker) walk(n *yaml.Node, t reflect.Type, field string) error {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil // absent: the default
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	_, custom := reflect.New(t).Interface().(yaml.Unmarshaler)
	switch {
	case custom:
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			if field == "" {
				return w.errorf(n, "want a mapping of settings at the top level")
			}
			return w.errorf(n, "%s: want a mapping of its fields", field)
		}
		return w.mapping(n, t, field)
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return w.errorf(n, "%s: want a list", field)
		}
		for _, item := range n.Content {
			if err := w.walk(item, t.Elem(), field+"[]"); err != nil {
				return err
			}
		}
		return nil
	}
	if n.Kind != yaml.ScalarNode {
		return w.errorf(n, "%s: want a single value, not a mapping or list", field)
	}
	if err := n.Decode(reflect.New(t).Interface()); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			return w.errorf(n, "%s: %q is not %s", field, n.Value, kindName(t))
		}
		return w.errorf(n, "%s: %v", field, err)
	}
	// An empty value is an absent one, except as an item of a list.
	if check := w.checks[field]; check != nil && (n.Value != "" || strings.HasSuffix(field, "[]")) {
		if err := check(n.Value); err != nil {
			return w.errorf(n, "%s: %v", field, err)
		}
	}
	return nil
}

// mapping checks the keys of mapping n against the yaml tags of struct t.
func (w walker) mapping(n *yaml.Node, t reflect.Type, section string) error {
	fields := map[string]reflect.Type{}
	var known []string
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		fields[name] = t.Field(i).Type
		known = append(known, name)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		ft, ok := fields[key.Value]
		if !ok {
			where := "the top level"
			if section != "" {
				where = section
			}
			return w.errorf(key, "unknown field %q in %s (known: %s)", key.Value, where, strings.Join(known, ", "))
		}
		sub := key.Value
		if section != "" {
			sub = section + "." + key.Value
		}
		if err := w.walk(val, ft, sub); err != nil {
			return err
		}
	}
	return nil
}

// kindName says what a value of Go type t is, for "x is not ...".
func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number of 0 or more"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	}
	return "a " + t.String()
}
