package config

import (
	"reflect"
	"strconv"
	"strings"

	"github.com/gitfleet/gitfleet/desired"
)

// fieldCheck checks one value of a file, after it decoded into its Go
// type; the key is the field's dotted path ("qemu.accel"), with "[]" for
// the items of a list ("artifacts.fileRoots[]").
type fieldCheck func(value string) error

// fileFormat is a configuration file for desired.Decode: an empty file is
// every setting left out.
var fileFormat = desired.Format{Noun: "config file", Shape: "a mapping of settings", AllowEmpty: true}

// decodeStrict decodes the YAML document data (read from file) into v, a
// pointer to a struct with yaml tags, with desired.Decode, the strict
// decoder of every gitfleet file (unknown fields with a "did you mean",
// duplicate keys, anchors and aliases refused, no coercion), then gives
// each string or integer the file wrote to checks[field]. It returns nil
// or every fault at once, as a desired.ErrorList of FILE:LINE:COL: FIELD:
// message.
func decodeStrict(file string, data []byte, v any, checks map[string]fieldCheck) error {
	doc := desired.Decode(file, data, v, fileFormat)
	if doc.Err() == nil {
		check(doc, reflect.ValueOf(v).Elem(), "", "", checks)
	}
	return doc.Err()
}

// check runs checks on the value v of the field at path field (key is its
// checks key: the path with "[]" for list indexes). An empty string is an
// absent value, except as an item of a list.
func check(doc *desired.Document, v reflect.Value, field, key string, checks map[string]fieldCheck) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			check(doc, v.Elem(), field, key, checks)
		}
		return
	case reflect.Struct:
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
			if name == "" || name == "-" {
				continue
			}
			if field != "" {
				name = field + "." + name
			}
			check(doc, v.Field(i), name, name, checks)
		}
		return
	case reflect.Slice:
		for i := 0; i < v.Len(); i++ {
			check(doc, v.Index(i), field+"["+strconv.Itoa(i)+"]", key+"[]", checks)
		}
		return
	}
	c := checks[key]
	if c == nil {
		return
	}
	var s string
	switch v.Kind() {
	case reflect.String:
		s = v.String()
		if s == "" && !strings.HasSuffix(key, "[]") {
			return
		}
	case reflect.Int, reflect.Int64:
		s = strconv.FormatInt(v.Int(), 10)
	default:
		return
	}
	if err := c(s); err != nil {
		doc.Errorf(field, "%v", err)
	}
}
