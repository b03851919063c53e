package desired

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/gitfleet/gitfleet/internal/redact"
)

// ErrNoSuchVM is what ExplainVM's error matches when the fleet holds no
// VM of that name.
var ErrNoSuchVM = errors.New("no such VM")

// Explanation is a VM's effective spec, field by field, each with where
// the value that won was written: the VM's file or its profile's.
type Explanation struct {
	VM string `json:"vm"`
	// File is the VM's file; Profile and ProfileFile the profile it
	// names and where that is defined ("" for none).
	File        string `json:"file"`
	Profile     string `json:"profile,omitempty"`
	ProfileFile string `json:"profileFile,omitempty"`
	// Fields are in path order.
	Fields []ExplainedField `json:"fields"`
}

// ExplainedField is one field of an effective spec: its dotted path and
// value as a plan shows them (a list is one field; a secret field's value
// is "(secret)", a URL's credentials are redacted), and the FILE:LINE:COL
// of its value. Origin is nil for a value no file wrote (power's default).
type ExplainedField struct {
	Field  string  `json:"field"`
	Value  string  `json:"value"`
	Origin *Origin `json:"origin,omitempty"`
}

// ExplainVM loads the fleet of t under dir, as NewLoader(dir).Load does,
// and explains the effective spec of its VM name. An invalid fleet is its
// ErrorList (nothing is explained in a fleet the controller would
// reject); a fleet without the VM is an error matching ErrNoSuchVM; a
// failure to read the tree is any other error.
func ExplainVM(t Tree, dir, name string) (*Explanation, error) {
	fl, err := NewLoader(dir).Load(t)
	if err != nil {
		return nil, err
	}
	vm := fl.VMs[name]
	if vm == nil {
		return nil, fmt.Errorf("%w: the fleet has no VM %q", ErrNoSuchVM, name)
	}
	ex := &Explanation{VM: name, File: vm.Origin.File, Profile: vm.Profile}
	files := []string{vm.Origin.File}
	if p := fl.Profiles[vm.Profile]; p != nil {
		ex.ProfileFile = p.Origin.File
		files = append(files, p.Origin.File)
	}
	data, err := readFiles(t, files)
	if err != nil {
		return nil, err
	}
	d, err := decodeVMAgain(ex, data)
	if err != nil {
		return nil, err
	}
	ex.Fields = explainFields(d, vm.Spec)
	return ex, nil
}

// readFiles reads the files at paths from t.
func readFiles(t Tree, paths []string) (map[string][]byte, error) {
	out := make(map[string][]byte, len(paths))
	err := t.Walk(func(f File) error {
		for _, p := range paths {
			if f.Path == p {
				data, err := f.Read()
				if err != nil {
					return fmt.Errorf("read %s: %w", p, err)
				}
				out[p] = data
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, p := range paths {
		if _, ok := out[p]; !ok {
			return nil, fmt.Errorf("read %s: gone from the tree while it was read", p)
		}
	}
	return out, nil
}

// decodeVMAgain decodes ex's VM from its files' data as Load did, and
// returns the decoder, which holds where each field was written.
func decodeVMAgain(ex *Explanation, data map[string][]byte) (*nodeDecoder, error) {
	if ex.Profile == "" {
		d := newNodeDecoder(ex.File)
		if root := d.document(data[ex.File]); root != nil {
			d.object(root)
		}
		if len(d.errs) > 0 {
			return nil, ErrorList(d.errs)
		}
		return d, nil
	}
	vmObj, errs := parseFile(ex.File, data[ex.File])
	if errs != nil {
		return nil, ErrorList(errs)
	}
	pObj, errs := parseFile(ex.ProfileFile, data[ex.ProfileFile])
	if errs != nil {
		return nil, ErrorList(errs)
	}
	d, obj := decodeEffective(vmObj, pObj, nil)
	if obj == nil {
		return nil, ErrorList(d.errs)
	}
	return d, nil
}

// explainFields lists the fields of spec with their origins from d.
func explainFields(d *nodeDecoder, spec VMSpec) []ExplainedField {
	flat := flatten(struct {
		Spec VMSpec `json:"spec"`
	}{spec})
	out := make([]ExplainedField, 0, len(flat))
	for field, v := range flat {
		ef := ExplainedField{Field: field, Value: redact.Text(v)}
		if isSecretField(field) {
			ef.Value = maskSecret(v)
		}
		if fp, ok := d.pos[field]; ok {
			ef.Origin = &Origin{File: d.fileOf(fp.val), Line: fp.val.line, Col: fp.val.col}
		}
		out = append(out, ef)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Field < out[j].Field })
	return out
}

// Text renders the explanation for a terminal: a heading naming the VM's
// file and its profile's, then one line per field with its origin and
// value.
func (ex *Explanation) Text() string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "VM %s (%s)", ex.VM, ex.File)
	if ex.Profile != "" {
		fmt.Fprintf(&b, ", profile %s (%s)", ex.Profile, ex.ProfileFile)
	}
	b.WriteString("\n\n")
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	for _, f := range ex.Fields {
		at := "(default)"
		if f.Origin != nil {
			at = fmt.Sprintf("%s:%d:%d", f.Origin.File, f.Origin.Line, f.Origin.Col)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", f.Field, at, oneLine(f.Value))
	}
	w.Flush()
	return b.String()
}

// JSON renders the explanation as indented JSON.
func (ex *Explanation) JSON() ([]byte, error) {
	data, err := json.MarshalIndent(ex, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode explanation: %w", err)
	}
	return append(data, '\n'), nil
}

// oneLine keeps a value on its line of a table: line breaks and tabs are
// shown escaped.
func oneLine(s string) string {
	return strings.NewReplacer("\n", `\n`, "\r", `\r`, "\t", `\t`).Replace(s)
}
