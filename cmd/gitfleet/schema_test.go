package main

import (
	"bytes"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/gitfleet/gitfleet/desired"
)

func TestSchemaCommand(t *testing.T) {
	code, out := runCLI(t, "schema")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(out)))
	if err != nil {
		t.Fatalf("output is not JSON: %v", err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(desired.SchemaID, doc); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Compile(desired.SchemaID); err != nil {
		t.Fatalf("output does not compile as a JSON Schema: %v", err)
	}
	if code, _ := runCLI(t, "schema", "extra"); code != 2 {
		t.Errorf("schema with an argument: exit %d, want 2", code)
	}
}
