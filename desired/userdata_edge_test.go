package desired

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"strings"
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

func gzipped(t *testing.T, parts ...string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw, err := gzip.NewWriterLevel(&b, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if _, err := zw.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// A gzip bomb of repeated keys, 24 KiB on disk, decompressed to 16 MiB and
// reported 3.3 million problems (minutes of CPU, gigabytes of memory).
// What is decompressed is bounded for the whole document, and so is the
// number of problems.
func TestCheckUserDataBoundsGzipBombs(t *testing.T) {
	bomb := gzipped(t, "#cloud-config\n", strings.Repeat("a: 1\n", (16<<20)/5))
	probs := CheckUserData(bomb)
	if len(probs) != 1 || !strings.Contains(probs[0].Msg, "decompresses to more than") {
		t.Errorf("16 MiB gzip bomb: %d problems, first %+v; want one saying it decompresses too far", len(probs), probs[:min(len(probs), 1)])
	}

	// Many parts, each within the bound, together beyond it.
	part := base64.StdEncoding.EncodeToString(gzipped(t, "#cloud-config\n", strings.Repeat("# x\n", (maxUserData/2)/4)))
	var msg strings.Builder
	msg.WriteString("MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=B\n\n")
	for range 8 {
		msg.WriteString("--B\nContent-Type: application/gzip\nContent-Transfer-Encoding: base64\n\n" + part + "\n")
	}
	msg.WriteString("--B--\n")
	probs = CheckUserData([]byte(msg.String()))
	if len(probs) == 0 || !strings.Contains(probs[0].Msg, "decompresses to more than") {
		t.Errorf("8 gzip parts of %d bytes each: %+v; want the part past the bound reported", maxUserData/2, probs)
	}

	// Repeated keys without compression: the list is cut, and says so.
	probs = CheckUserData([]byte("#cloud-config\n" + strings.Repeat("a: 1\n", 1000)))
	if len(probs) != maxUserDataProblems+1 || !strings.Contains(probs[len(probs)-1].Msg, "more problems follow") {
		t.Errorf("999 repeated keys: %d problems, last %+v; want %d and a note", len(probs), probs[len(probs)-1], maxUserDataProblems+1)
	}

	// What is within the bound is still checked.
	if probs := CheckUserData(gzipped(t, "#cloud-config\na: 1\na: 2\n")); len(probs) != 1 || !strings.Contains(probs[0].Msg, "written again") {
		t.Errorf("small gzip cloud-config with a repeated key: %+v", probs)
	}
}

// Archive entries as cloud-init's _explode_archive reads them: a non-string
// scalar is skipped (not checked as cloud-config), and a type that is not
// "main/sub" makes cloud-init fail on the whole user-data.
func TestCheckUserDataArchiveEntriesAsCloudInitReadsThem(t *testing.T) {
	for _, tc := range []struct {
		doc, want string
	}{
		{"#cloud-config-archive\n- 42\n", "is a scalar (int), not a string or a mapping: cloud-init skips it"},
		{"#cloud-config-archive\n- ~\n- '#cloud-config\n\n  a: 1\n\n  '\n", ""},
		{"#cloud-config-archive\n- {type: foo, content: 'x'}\n", `type "foo" is not a MIME type`},
		{"#cloud-config-archive\n- {type: 1, content: 'x'}\n", "type is a scalar (int), not a MIME type"},
		{"#cloud-config-archive\n- {type: [a], content: 'x'}\n", "type is a list, not a MIME type"},
		{"#cloud-config-archive\n- {type: '', content: 'a: 1'}\n- {type: ~, content: 'b: 1'}\n", ""},
		{"#cloud-config-archive\n- {type: text/x-shellscript, content: '#!/bin/sh'}\n", ""},
		{"#cloud-config-archive\n- {type: text/cloud-config, content: 'a: 1\n\n  a: 2'}\n", "written again"},
	} {
		probs := CheckUserData([]byte(tc.doc))
		if tc.want == "" {
			if len(probs) != 0 {
				t.Errorf("%q: %+v, want none", tc.doc, probs)
			}
			continue
		}
		if len(probs) != 1 || !strings.Contains(probs[0].Msg, tc.want) {
			t.Errorf("%q: %+v, want one problem saying %q", tc.doc, probs, tc.want)
		}
	}
}

// "mime-version:" anywhere in the first 4096 bytes makes cloud-init parse a
// MIME message; Python's email parser takes the first line that is not a
// header for the start of the body, so a #cloud-config that mentions
// mime-version is still a cloud-config, and is checked as one.
func TestCheckUserDataMIMEWithoutHeaders(t *testing.T) {
	docs := []string{
		"#cloud-config\n# mime-version: 1.0\na: 1\na: 2\n",
		"MIME-Version: 1.0\n#cloud-config\na: [1\n",
	}
	out := cloudinittest.Run(t, `import json, sys
from cloudinit import user_data
res = []
for d in json.load(sys.stdin):
    m = user_data.UserDataProcessor(None).process(d.encode())
    res.append([p.get_content_type() for p in m.walk()][1:])
print(json.dumps(res))`, docs)
	var types [][]string
	if err := json.Unmarshal(out, &types); err != nil {
		t.Fatal(err)
	}
	for i, d := range docs {
		if len(types[i]) != 1 || types[i][0] != "text/cloud-config" {
			t.Fatalf("%q: cloud-init reads parts %v; the test expects one cloud-config", d, types[i])
		}
		if probs := CheckUserData([]byte(d)); len(probs) != 1 {
			t.Errorf("%q: %+v; want the one problem of its cloud-config", d, probs)
		}
	}
}
