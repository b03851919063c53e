package desired

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/gitfleet/gitfleet/testsupport/cloudinittest"
)

// explicitKey is a cloud-config whose mapping w has the one key k, written
// as an explicit key (a plain implicit key is at most 1024 characters).
func explicitKey(k string) string { return "#cloud-config\nw:\n  ? " + k + "\n  : 1\n" }

// mergeBomb is a cloud-config of levels mappings, each merging the one
// below fan times: PyYAML's loader copies every merged entry, repeats
// included, so the last one makes it copy 2·fan^levels.
func mergeBomb(levels, fan int) string {
	var b strings.Builder
	b.WriteString("#cloud-config\na0: &a0 {k0: 1, k1: 2}\n")
	for i := 1; i <= levels; i++ {
		refs := strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*a%d, ", i-1), fan), ", ")
		fmt.Fprintf(&b, "a%d: &a%d {<<: [%s]}\n", i, i, refs)
	}
	return b.String()
}

// nested is a cloud-config holding depth nested flow sequences.
func nested(depth int) string {
	return "#cloud-config\nw: " + strings.Repeat("[", depth) + strings.Repeat("]", depth) + "\n"
}

// The numbers and merges on which PyYAML (cloud-init's loader) differs
// from a YAML library that only parses: Python refuses to convert a
// decimal of more than 4300 digits (int_max_str_digits), a base-60 float
// of 175 parts overflows, a merge of anything but mappings is an error,
// and its composer stops at some 490 levels of nesting. CheckUserData
// refuses what cloud-init's loader refuses, and reports the repeated keys
// it drops, for numbers of any size.
func TestCheckUserDataAgreesWithCloudInitOnHostileNumbers(t *testing.T) {
	d4300, d4301 := "1"+strings.Repeat("7", 4299), "1"+strings.Repeat("7", 4300)
	hex := "0x" + strings.Repeat("f", 3000)
	docs := []string{
		explicitKey(d4300),
		explicitKey(d4301),
		explicitKey("1" + strings.Repeat("_7", 4299)), // 4300 digits once the underscores go
		"#cloud-config\nw: " + d4301 + "\n",           // a value too
		"#cloud-config\nw: [1, " + d4301 + "]\n",
		explicitKey(d4301 + ":30"),                           // a base-60 part
		explicitKey("1" + strings.Repeat(":59", 173) + ".5"), // 174 parts
		explicitKey("1" + strings.Repeat(":59", 174) + ".5"), // 175 parts
		"#cloud-config\nw: 1" + strings.Repeat(":59", 174) + ".5\n",
		"#cloud-config\na: {<<: 1}\n",
		"#cloud-config\na: {<<: [1]}\n",
		"#cloud-config\na: {<<: ~}\n",
		"#cloud-config\nx: &x [1]\na: {<<: *x}\n",
		"#cloud-config\nx: &x [{k: 1}]\na: {<<: *x}\n",
		"#cloud-config\nx: &x {k: 1}\na: {<<: [*x, *x], j: 2}\n",
		"#cloud-config\na: &a {<<: *a}\n",
		"#cloud-config\na: &a [*a]\n",
		mergeBomb(6, 4),
		nested(300),
		nested(600),
		// Large keys PyYAML reads at once (bases 2, 8, 16), each equal
		// to the next.
		"#cloud-config\nw:\n  ? " + hex + "\n  : 1\n  ? 0x" + strings.Repeat("f_", 3000) + "\n  : 2\n  ? 0b" + strings.Repeat("1", 12000) + "\n  : 3\n  ? 0" + strings.Repeat("7", 4000) + "\n  : 4\n",
		"#cloud-config\nw:\n  ? 0x1" + strings.Repeat("0", 1200) + "\n  : 1\n  ? 1" + strings.Repeat(":00", 4) + "\n  : 2\n  ? 12960000\n  : 3\n  ? 0xc5c100\n  : 4\n",
		"#cloud-config\nw:\n  ? 1" + strings.Repeat(":30", 900) + "\n  : 1\n  ? 1" + strings.Repeat(":30", 900) + "\n  : 2\n",
		"#cloud-config\nw: {1.0e+3: 1, 0x3e8: 2, 1000.0: 3, 16:40: 4, 0b1111101000: 5, 01750: 6}\n",
	}
	out := cloudinittest.Run(t, `import json, sys, yaml
from cloudinit import safeyaml
def repeats(node, loader, seen_nodes=None):
    seen_nodes = set() if seen_nodes is None else seen_nodes
    if id(node) in seen_nodes:
        return 0
    seen_nodes.add(id(node))
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
        for k, v in node.value:
            n += repeats(v, loader, seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for v in node.value:
            n += repeats(v, loader, seen_nodes)
    return n
res = []
sys.setrecursionlimit(1000)
for d in json.load(sys.stdin):
    try:
        v = safeyaml.load(d)
        ok = v is None or isinstance(v, dict)
    except Exception:
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
		short := d
		if len(short) > 80 {
			short = short[:80] + "…"
		}
		if res[i].Loaded == (other > 0) {
			t.Errorf("doc %d %q: cloud-init loads it: %v; CheckUserData: %s", i, short, res[i].Loaded, userDataProblemsText(probs))
		}
		if repeats != res[i].Repeats {
			t.Errorf("doc %d %q: PyYAML drops %d repeated keys; CheckUserData reports %d: %s", i, short, res[i].Repeats, repeats, userDataProblemsText(probs))
		}
	}
}

// Keys and values a YAML parser reads in no time but that cost PyYAML (or,
// once, CheckUserData itself) seconds: a base-60 number of 350,000 parts
// (PyYAML's time grows with the square of its length: half a minute),
// merges that multiply what PyYAML copies (2·4^12 entries from 600
// bytes), and a decimal of a million digits (Python refuses it). Each is
// a problem naming why; what PyYAML reads at once (a million hex, octal
// or binary digits) is none. BenchmarkCheckUserDataHostile measures the
// cost of each.
func TestCheckUserDataBoundsHostileKeys(t *testing.T) {
	for _, tc := range hostileUserData() {
		t.Run(tc.name, func(t *testing.T) {
			probs := CheckUserData([]byte(tc.doc))
			if tc.want == "" {
				if len(probs) != 0 {
					t.Fatalf("problems %s, want none", userDataProblemsText(probs))
				}
				return
			}
			if len(probs) == 0 || !strings.Contains(probs[0].Msg, tc.want) {
				t.Fatalf("problems %s, want one saying %q", userDataProblemsText(probs), tc.want)
			}
			if probs[0].Line == 0 {
				t.Errorf("problem %q names no line", probs[0].Msg)
			}
		})
	}
}

// hostileUserData are the documents of TestCheckUserDataBoundsHostileKeys
// and BenchmarkCheckUserDataHostile, with what the first problem says
// ("" for none).
func hostileUserData() []struct{ name, doc, want string } {
	const mb = 1 << 20
	return []struct{ name, doc, want string }{
		{"base-60 key of 350k parts", explicitKey("1" + strings.Repeat(":59", mb/3)), "base-60"},
		{"base-60 value of 350k parts", "#cloud-config\nw: 1" + strings.Repeat(":59", mb/3) + "\n", "base-60"},
		{"base-60 float of 350k parts", explicitKey("1" + strings.Repeat(":59", mb/3) + ".5"), "base-60"},
		{"decimal key of 1M digits", explicitKey("1" + strings.Repeat("7", mb)), "more than 4300"},
		{"merge bomb", mergeBomb(12, 4), "merge"},
		{"nesting 9000 deep", nested(9000), "nested"},
		{"hex key of 1M digits", explicitKey("0x1" + strings.Repeat("f", mb)), ""},
		{"octal key of 1M digits", explicitKey("01" + strings.Repeat("7", mb)), ""},
		{"binary key of 1M digits", explicitKey("0b1" + strings.Repeat("1", mb)), ""},
		{"float key of 1M digits", explicitKey("1" + strings.Repeat("7", mb) + ".5"), ""},
		{"100k base-60 keys", "#cloud-config\nw:\n" + func() string {
			var b strings.Builder
			for i := range 100000 {
				fmt.Fprintf(&b, "  %d:%02d:%02d: 1\n", i/3600+1, i/60%60, i%60)
			}
			return b.String()
		}(), ""},
	}
}

// BenchmarkCheckUserDataHostile reports CheckUserData's cost on each
// document of hostileUserData (about 1 MB each).
func BenchmarkCheckUserDataHostile(b *testing.B) {
	for _, tc := range hostileUserData() {
		b.Run(strings.ReplaceAll(tc.name, " ", "_"), func(b *testing.B) {
			doc := []byte(tc.doc)
			b.SetBytes(int64(len(doc)))
			for b.Loop() {
				CheckUserData(doc)
			}
		})
	}
}

// userDataProblemsText shows problems for a failure message, each message
// cut to 200 bytes.
func userDataProblemsText(probs []UserDataProblem) string {
	var b strings.Builder
	for _, p := range probs {
		msg := p.Msg
		if len(msg) > 200 {
			msg = msg[:200] + "…"
		}
		fmt.Fprintf(&b, "\n  line %d: %s", p.Line, msg)
	}
	return b.String()
}
