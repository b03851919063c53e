package desired

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/testsupport/cloudinittest"
)

// TestUserDataTypeMatchesCloudInit types documents with UserDataType and
// with cloud-init's own type_from_starts_with, and wants the same answer.
func TestUserDataTypeMatchesCloudInit(t *testing.T) {
	docs := []string{
		"#cloud-config\na: 1\n", "  \n\t#Cloud-Config\n", "#cloud-config-archive\n- x\n", "#cloud-config-jsonp\n[]",
		"#!/bin/sh\n", "#include\nhttp://x\n", "#include-once\nhttp://x\n", "#cloud-boothook\n", "#part-handler\n",
		"## template: jinja\n#cloud-config\n", "#cloud-confg\n", "cloud-config\n", "", "text/x-shellscript-per-boot\n",
		"#INCLUDE-ONCE", "# cloud-config\n",
	}
	want := cloudinittest.Run(t, `import json, sys
from cloudinit import handlers
print(json.dumps([handlers.type_from_starts_with(d) or "" for d in json.load(sys.stdin)]))`, docs)
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

// TestCheckUserDataAgreesWithCloudInitsLoader reads cloud-config
// documents as cloud-init does (cloudinit.safeyaml, PyYAML's safe loader;
// load_yaml keeps only a mapping or nothing) and wants CheckUserData to
// refuse exactly those cloud-init cannot load, and to report as many
// repeated keys as PyYAML's loader silently drops.
func TestCheckUserDataAgreesWithCloudInitsLoader(t *testing.T) {
	docs := []string{
		"#cloud-config\nusers:\n  - name: alice\n    lock_passwd: no\nssh_pwauth: no\n",
		"#cloud-config\n# only a comment\n",
		"#cloud-config\nruncmd:\n  - [touch, /x\n",
		"#cloud-config\n- a list\n",
		"#cloud-config\n42\n",
		"#cloud-config\na: 1\n---\nb: 2\n",
		"#cloud-config\na: [1, 2\n",
		"#cloud-config\na: 'unterminated\n",
		"#cloud-config\nwhen: 2024-01-31\nat: 1:30\n",
		"#cloud-config\na: 1\na: 2\n",
		"#cloud-config\nw:\n  yes: 1\n  true: 2\n  1: 3\n  0x1: 4\n",
		"#cloud-config\nw:\n  'yes': 1\n  true: 2\n",
		"#cloud-config\nx: &a {k: 1}\ny:\n  <<: *a\n  k: 2\n",
		"#cloud-config\nusers:\n  - name: a\n    sudo: x\n    sudo: y\n  - name: b\n",
		// Keys whose YAML 1.1 identity differs between PyYAML's resolver
		// and other YAML libraries.
		"#cloud-config\nw:\n  y: 1\n  true: 2\n  n: 3\n  false: 4\n",
		"#cloud-config\nw:\n  1e3: 1\n  1000: 2\n  1.0e3: 3\n  1.0e+3: 4\n",
		"#cloud-config\nw:\n  09: 1\n  9: 2\n  010: 3\n  8: 4\n",
		"#cloud-config\nw:\n  9007199254740993: 1\n  9007199254740992: 2\n",
		"#cloud-config\nw:\n  99999999999999999999: 1\n  100000000000000000000: 2\n",
		"#cloud-config\nw:\n  190:20:30: 1\n  685230: 2\n  1:30: 3\n  90: 4\n",
		"#cloud-config\nw:\n  1_000: 1\n  1000: 2\n  0b11: 3\n  3: 4\n  3.0: 5\n  +3: 6\n",
		"#cloud-config\nw:\n  .nan: 1\n  .NaN: 2\n  .inf: 3\n  .Inf: 4\n  -.inf: 5\n",
		"#cloud-config\nw:\n  ~: 1\n  null: 2\n  '<<': 3\n  '<<': 4\n",
		"#cloud-config\nw:\n  2001-12-14: 1\n  2001-12-14: 2\n",
		"#cloud-config\nw: {a: 1, b: {c: 1, c: 2}, a: 3}\n",
		"#cloud-config\nw:\n  ? |\n    multi\n    line\n  : 1\n  \"multi\\nline\\n\": 2\n",
		"#cloud-config\nw:\n  !!str 1: 1\n  '1': 2\n  1: 3\n",
		"#cloud-config\nw:\n  [a, b]: 1\n",
	}
	out := cloudinittest.Run(t, `import json, sys, yaml
from cloudinit import safeyaml
def repeats(node, loader):
    n = 0
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for k, v in node.value:
            if k.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(k, deep=True)
            if key in seen:
                n += 1
            seen.add(key)
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        for item in node.value:
            for x in (item if isinstance(item, tuple) else (item,)):
                n += repeats(x, loader)
    return n
res = []
for d in json.load(sys.stdin):
    try:
        v = safeyaml.load(d)
        ok = v is None or isinstance(v, dict)
    except yaml.YAMLError:
        ok = False
    r = 0
    if ok:
        loader = yaml.SafeLoader(d)
        r = repeats(loader.get_single_node(), loader)
    res.append({"loaded": ok, "repeats": r})
print(json.dumps(res))`, docs)
	var res []struct {
		Loaded  bool `json:"loaded"`
		Repeats int  `json:"repeats"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	for i, d := range docs {
		probs := CheckUserData([]byte(d))
		repeats, other := 0, 0
		for _, p := range probs {
			if strings.Contains(p.Msg, "is written again here") {
				repeats++
			} else {
				other++
			}
		}
		if res[i].Loaded == (other > 0) {
			t.Errorf("%q: cloud-init loads it: %v; CheckUserData: %+v", d, res[i].Loaded, probs)
		}
		if repeats != res[i].Repeats {
			t.Errorf("%q: PyYAML drops %d repeated keys; CheckUserData reports %d: %+v", d, res[i].Repeats, repeats, probs)
		}
	}
}

// TestCheckUserDataFormats pins what CheckUserData says about each format
// cloud-init reads, wrapped the ways cloud-init unwraps them.
func TestCheckUserDataFormats(t *testing.T) {
	dup := "#cloud-config\na: 1\na: 2\n"
	gz := func(s string) string {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		w.Write([]byte(s))
		w.Close()
		return b.String()
	}
	mimeDoc := func(parts ...string) string {
		var b strings.Builder
		b.WriteString("Content-Type: multipart/mixed; boundary=\"XX\"\nMIME-Version: 1.0\n\n")
		for _, p := range parts {
			b.WriteString("--XX\n" + p + "\n")
		}
		b.WriteString("--XX--\n")
		return b.String()
	}
	for _, tc := range []struct {
		name, doc string
		want      []string // one substring per problem, in order
		line      int      // line of the first problem
	}{
		{"empty", "", nil, 0},
		{"script", "#!/bin/sh\nanything: [at all\n", nil, 0},
		{"include", "#include\nhttps://example.org/x\n", nil, 0},
		{"boothook", "#cloud-boothook\n#!/bin/sh\n", nil, 0},
		{"jinja is not looked into", "## template: jinja\n#cloud-config\na: {{ v }\n", nil, 0},
		// The lines PyYAML's error names (its problem mark, or the start of
		// the construct when that is what the parser can name).
		{"syntax error in a flow mapping", "#cloud-config\nchpasswd:\n  users:\n    - {name: root, password: a: b}\n", []string{"YAML: did not find expected ',' or '}' (in the flow mapping {"}, 4},
		{"syntax error after a quoted scalar", "#cloud-config\npassword: 'x'y\n", []string{"YAML: did not find expected key (in the block mapping"}, 2},
		{"syntax error in a block sequence", "#cloud-config\nwrite_files:\n  - path: /etc/x\n    content: y\n   owner: root\n", []string{"YAML: did not find expected '-' indicator (in the block sequence"}, 3},
		{"unclosed flow sequence at the end", "#cloud-config\nruncmd:\n  - [touch, /x\npackages: [a]\n", []string{"YAML: did not find expected ',' or ']'"}, 3},
		{"cloud-config repeated key", dup, []string{`key "a" is written again here (first 1 line above`}, 3},
		{"unknown format", "packages: [a]\n", []string{"recognises no format"}, 1},
		{"gzip", gz(dup), []string{"gzip-compressed user-data: line 3: key \"a\""}, 0},
		{"gzip script", gz("#!/bin/sh\n"), nil, 0},
		{"archive", "#cloud-config-archive\n- |\n  #cloud-config\n  a: 1\n  a: 2\n- {type: text/x-shellscript, content: 'x: [y'}\n- 'b: [c'\n",
			[]string{`archive entry 1: key "a"`, "archive entry 3: line 1: YAML"}, 5},
		{"archive not a list", "#cloud-config-archive\na: 1\n", []string{"not a list of parts"}, 2},
		{"mime", mimeDoc("Content-Type: text/cloud-config\n\n"+dup, "Content-Type: text/x-shellscript\n\n#!/bin/sh\n"),
			[]string{`MIME part 1 (text/cloud-config): line 3: key "a"`}, 0},
		{"mime text/plain typed by its start", mimeDoc("Content-Type: text/plain\n\n" + dup), []string{`MIME part 1 (text/plain): line 3: key "a"`}, 0},
		{"mime base64", mimeDoc("Content-Type: text/cloud-config\nContent-Transfer-Encoding: base64\n\n" + base64.StdEncoding.EncodeToString([]byte(dup))),
			[]string{`MIME part 1 (text/cloud-config): line 3`}, 0},
		{"mime gzip part", mimeDoc("Content-Type: application/x-gzip\nContent-Transfer-Encoding: base64\n\n" + base64.StdEncoding.EncodeToString([]byte(gz(dup)))),
			[]string{`MIME part 1 (application/x-gzip): line 3`}, 0},
		{"mime unknown text part", mimeDoc("Content-Type: text/plain\n\nhello"), []string{"cloud-init ignores this part"}, 0},
		{"mime nested archive", mimeDoc("Content-Type: text/cloud-config-archive\n\n- 'a: [b'"), []string{"MIME part 1 (text/cloud-config-archive): archive entry 1: line 1: YAML"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			probs := CheckUserData([]byte(tc.doc))
			if len(probs) != len(tc.want) {
				t.Fatalf("%d problems, want %d: %+v", len(probs), len(tc.want), probs)
			}
			for i, w := range tc.want {
				if !strings.Contains(probs[i].Msg, w) {
					t.Errorf("problem %d = %q, want it to say %q", i, probs[i].Msg, w)
				}
			}
			if len(probs) > 0 && probs[0].Line != tc.line {
				t.Errorf("first problem on line %d, want %d", probs[0].Line, tc.line)
			}
		})
	}
}

// FuzzCheckUserData feeds CheckUserData arbitrary documents: it must never
// panic, and every problem it reports has a message and a line within the
// document (or none).
func FuzzCheckUserData(f *testing.F) {
	for _, seed := range []string{
		"", "#cloud-config\na: 1\na: 2\n", "#cloud-config-archive\n- 'a: [b'\n- [x]\n",
		"Content-Type: multipart/mixed; boundary=\"b\"\nMIME-Version: 1.0\n\n--b\nContent-Type: text/plain\n\n#cloud-config\nx: 1\nx: 2\n--b--\n",
		"#!/bin/sh\n", "\x1f\x8b\x08\x00", "#cloud-config\n{a: 1, a: 2}\n", "## template: jinja\n#cloud-config\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		lines := bytes.Count(doc, []byte("\n")) + 1
		for _, p := range CheckUserData(doc) {
			if p.Msg == "" || p.Line < 0 || p.Line > lines {
				t.Fatalf("problem %+v for a document of %d lines", p, lines)
			}
		}
	})
}

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
