package desired

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/testsupport/golden"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"
)

func compileSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(JSONSchema()))
	if err != nil {
		t.Fatalf("schema is not JSON: %v", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource(SchemaID, doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(SchemaID)
	if err != nil {
		t.Fatalf("schema does not compile as draft 2020-12: %v", err)
	}
	return sch
}

// yamlInstance converts one object file to the JSON value a schema checks.
func yamlInstance(t *testing.T, data []byte) any {
	t.Helper()
	var v any
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

func TestSchemaAcceptsExamplesAndTestFleet(t *testing.T) {
	sch := compileSchema(t)
	var files []string
	err := filepath.WalkDir(filepath.Join("..", "examples", "fleet"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".yaml") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 8 {
		t.Fatalf("found %d example object files, want 8", len(files))
	}
	for _, p := range files {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := sch.Validate(yamlInstance(t, data)); err != nil {
			t.Errorf("%s does not validate against the schema: %v", p, err)
		}
	}
	for p, content := range goodFleet {
		if !strings.HasPrefix(p, ".") && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			if err := sch.Validate(yamlInstance(t, []byte(content))); err != nil {
				t.Errorf("%s does not validate against the schema: %v", p, err)
			}
		}
	}
}

// TestSchemaAcceptsPartialSpecs: a Profile's spec, and the spec of a VM
// that names a profile, need no field; nested objects none either.
func TestSchemaAcceptsPartialSpecs(t *testing.T) {
	sch := compileSchema(t)
	for name, input := range map[string]string{
		"profile":               profileFile("p", baseProfile),
		"empty profile":         profileFile("p", "  {}\n"),
		"profile of a cmdline":  profileFile("p", "  kernel: {cmdline: console=ttyS0}\n"),
		"VM on a profile":       vmFile("a", "  profile: p\n  host: hv-a\n"),
		"VM's part of a kernel": vmFile("a", "  profile: p\n  kernel: {cmdline: console=ttyS1}\n  static: {gateway4: 10.0.0.1}\n"),
	} {
		t.Run(name, func(t *testing.T) {
			if _, errs := parseFile("obj.yaml", []byte(input)); errs != nil {
				t.Fatalf("the decoder rejects it: %v", ErrorList(errs))
			}
			if err := sch.Validate(yamlInstance(t, []byte(input))); err != nil {
				t.Errorf("the schema rejects it: %v", err)
			}
		})
	}
}

func TestSchemaRejectsBadObjects(t *testing.T) {
	sch := compileSchema(t)
	for name, input := range map[string]string{
		"unknown field":       vm(vmBody + "  gpus: 1\n"),
		"string for integer":  vm(strings.Replace(vmBody, "vcpus: 2", `vcpus: "2"`, 1)),
		"vcpus zero":          vm(strings.Replace(vmBody, "vcpus: 2", "vcpus: 0", 1)),
		"bad name":            strings.Replace(vm(vmBody), "name: web-01", "name: Web_01", 1),
		"bad sha256":          vm(strings.Replace(vmBody, sumA, "ABC", 1)),
		"ftp URL":             vm(strings.Replace(vmBody, "https://", "ftp://", 1)),
		"power":               vm(vmBody + "  power: off\n"),
		"no image or kernel":  vm("  host: hv-a\n  vcpus: 2\n  memoryMB: 2048\n  diskGB: 20\n"),
		"unknown kind":        strings.Replace(vm(vmBody), "kind: VM", "kind: Vm", 1),
		"unknown apiVersion":  strings.Replace(vm(vmBody), "v1alpha1", "v1", 1),
		"volume spec on VM":   "apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata: {name: a}\nspec: {host: hv-a, sizeGB: 1}\n",
		"host without bridge": "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: a}\nspec: {networks: {lan: {}}}\n",
		"profile with a host": profileFile("p", "  host: hv-a\n"),
		"nested profile":      profileFile("p", "  profile: q\n"),
		"profile vcpus zero":  profileFile("p", "  vcpus: 0\n"),
		"profile encrypted":   profileFile("p", "  cloudInit: {encryptedUserData: {recipient: age1x, ciphertext: x}}\n"),
		"profiled VM's typo":  vmFile("a", "  profile: p\n  vcpu: 2\n"),
		"profiled VM's range": vmFile("a", "  profile: p\n  memoryMB: 1\n"),
	} {
		t.Run(name, func(t *testing.T) {
			if _, errs := parseFile("obj.yaml", []byte(input)); errs == nil {
				t.Fatalf("the decoder accepts the input the schema should reject")
			}
			if err := sch.Validate(yamlInstance(t, []byte(input))); err == nil {
				t.Errorf("schema accepts a bad object")
			}
		})
	}
}

// TestSchemaFileIsCurrent keeps the copy in examples/fleet, which editors
// read through each file's yaml-language-server line, equal to JSONSchema.
func TestSchemaFileIsCurrent(t *testing.T) {
	p := filepath.Join("..", "examples", "fleet", ".gitfleet", "schema.json")
	if golden.Update() {
		if err := os.WriteFile(p, JSONSchema(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, JSONSchema()) {
		t.Errorf("%s is stale; regenerate it with go test ./desired -run TestSchemaFileIsCurrent -update", p)
	}
}

// TestSchemaErrorsNameOnlyTheObjectsKind: a bad object is checked against
// its own kind's definition alone, so the validator's errors never mention
// the other kinds (no "'Volume' was expected" noise for a VM).
func TestSchemaErrorsNameOnlyTheObjectsKind(t *testing.T) {
	sch := compileSchema(t)
	for name, tc := range map[string]struct {
		input  string
		own    string
		others []string
	}{
		"VM":     {vm(vmBody + "  gpus: 1\n"), "$defs/VM", []string{"$defs/Volume", "$defs/Host", "'Volume'", "'Host'"}},
		"Volume": {"apiVersion: gitfleet.dev/v1alpha1\nkind: Volume\nmetadata: {name: a}\nspec: {host: hv-a, sizeGB: 0}\n", "$defs/Volume", []string{"$defs/VM", "$defs/Host", "'VM'", "'Host'"}},
		"Host":   {"apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: a}\nspec: {networks: {lan: {}}}\n", "$defs/Host", []string{"$defs/VM", "$defs/Volume", "'VM'", "'Volume'"}},
	} {
		t.Run(name, func(t *testing.T) {
			err := sch.Validate(yamlInstance(t, []byte(tc.input)))
			var ve *jsonschema.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("got %v, want a validation error", err)
			}
			out, jerr := json.Marshal(ve.DetailedOutput())
			if jerr != nil {
				t.Fatal(jerr)
			}
			text := string(out) + "\n" + fmt.Sprintf("%v", err)
			if !strings.Contains(text, tc.own) {
				t.Errorf("errors do not come from %s:\n%s", tc.own, text)
			}
			for _, o := range tc.others {
				if strings.Contains(text, o) {
					t.Errorf("errors mention %s:\n%s", o, text)
				}
			}
		})
	}
}

// TestSchemaAnnotations fails while a field of a type in the schema has no
// entry in its type's schema method, or no description (its own, or its
// shape's or type's), an integer no range, a named string type no enum,
// or an entry or an anyOf/oneOf names a field the type does not have.
func TestSchemaAnnotations(t *testing.T) {
	_, problems := buildSchema()
	for _, p := range problems {
		t.Error(p)
	}
}

// badlyAnnotated has every mistake TestSchemaAnnotations reports.
type badlyAnnotated struct {
	Count int    `yaml:"count"`
	Mode  Power  `yaml:"mode"`
	Note  string `yaml:"note"`
	Extra string `yaml:"extra"`
}

func (badlyAnnotated) schema() typeSchema {
	return typeSchema{anyOf: [][]string{{"spare"}}, fields: map[string]fieldSchema{
		"count": {desc: "A count."},
		"mode":  {desc: "A mode."},
		"note":  {},
		"gone":  {desc: "A field that was removed."},
	}}
}

func TestSchemaAnnotationsCatch(t *testing.T) {
	b := newSchemaBuilder()
	b.value("bad", reflect.TypeFor[badlyAnnotated](), fieldSchema{desc: "A badly annotated type."})
	problems := strings.Join(b.sortedProblems(), "\n")
	for _, want := range []string{
		"badlyAnnotated.count: an integer needs a range",
		"badlyAnnotated.mode: a value of type desired.Power needs its enum",
		"badlyAnnotated.note: no desc",
		"badlyAnnotated.extra: no entry in badlyAnnotated's schema method",
		"badlyAnnotated.gone: annotated in badlyAnnotated's schema method, but badlyAnnotated has no such field",
		"badlyAnnotated.spare: named in an anyOf or oneOf, but badlyAnnotated has no such field",
	} {
		if !strings.Contains(problems, want) {
			t.Errorf("no problem %q; got:\n%s", want, problems)
		}
	}
}
