package desired

import (
	"encoding/json"
	"testing"

	"github.com/gitfleet/gitfleet/internal/cloudinittest"
)

// Hostile prefixes: white space Python's str.lstrip removes and Go's
// unicode.IsSpace does not, and letters whose lower case differs between
// Python's str.lower and Go's strings.ToLower.
func TestUserDataTypeMatchesCloudInitOnOddWhiteSpaceAndCase(t *testing.T) {
	docs := []string{
		"\x1c#cloud-config\na: 1\n", "\x1d#!/bin/sh\n", "\x1e#cloud-config\n", "\x1f#cloud-config\n",
		"\u2028#cloud-config\n", "\u200b#cloud-config\n", "\u0085#cloud-config\n", "\u00a0#cloud-config\n",
		"#\u0130nclude\nhttp://x\n", "#cloud-boothoo\u212a\n", "\ufeff#cloud-config\n",
	}
	want := cloudinittest.Run(t, `import json, sys
from cloudinit import handlers
print(json.dumps([handlers.type_from_starts_with(d.encode()) or "" for d in json.load(sys.stdin)]))`, docs)
	var types []string
	if err := json.Unmarshal(want, &types); err != nil {
		t.Fatal(err)
	}
	for i, d := range docs {
		if got := UserDataType([]byte(d)); got != types[i] {
			t.Errorf("UserDataType(%q) = %q; cloud-init says %q", d, got, types[i])
		}
	}
}
