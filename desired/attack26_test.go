package desired

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A second round of hostile user-data of the kinds
// TestCheckUserDataBoundsHostileKeys pins, each within the 1 MiB a
// branch writer may put in a pull request: aliases of big collections
// and complex keys (PyYAML cannot hash a list or an alias of one, so
// cloud-init ignores the document), tens of thousands of timestamp keys,
// a !!binary megabyte, a 100,000-digit exponent, deep block nesting and an
// archive of 8,000 parts. Each gets cloud-init's verdict; their cost is
// BenchmarkCheckUserDataSecondRound's.
func TestAttackUserDataSecondRound(t *testing.T) {
	for _, tc := range hostileUserDataSecondRound() {
		t.Run(tc.name, func(t *testing.T) {
			probs := CheckUserData([]byte(tc.doc))
			if tc.want == "" {
				if len(probs) != 0 {
					t.Fatalf("problems %s, want none", userDataProblemsText(probs))
				}
				return
			}
			if len(probs) == 0 || !strings.Contains(probs[0].Msg, tc.want) || probs[0].Line == 0 {
				t.Fatalf("problems %s, want the first at a line saying %q", userDataProblemsText(probs), tc.want)
			}
		})
	}
}

func BenchmarkCheckUserDataSecondRound(b *testing.B) {
	for _, tc := range hostileUserDataSecondRound() {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				CheckUserData([]byte(tc.doc))
			}
		})
	}
}

func hostileUserDataSecondRound() []struct{ name, doc, want string } {
	const mb = 1 << 20
	var aliasKeys strings.Builder
	aliasKeys.WriteString("#cloud-config\nbig: &b {")
	for i := range 5000 {
		fmt.Fprintf(&aliasKeys, "k%d: %d, ", i, i)
	}
	aliasKeys.WriteString("z: 0}\nw:\n")
	for i := range 5000 {
		fmt.Fprintf(&aliasKeys, "  ? [*b, %d]\n  : 1\n", i)
	}
	var complexKeys strings.Builder
	complexKeys.WriteString("#cloud-config\nw:\n")
	for i := range 10000 {
		fmt.Fprintf(&complexKeys, "  ? [[[a, b], {c: d}], %d]\n  : 1\n", i%3)
	}
	var ts strings.Builder
	ts.WriteString("#cloud-config\nw:\n")
	for i := range 25000 {
		fmt.Fprintf(&ts, "  2001-12-14t21:59:43.%d-05:00: 1\n", i)
	}
	var dupMapKeys strings.Builder
	dupMapKeys.WriteString("#cloud-config\nbig: &b [")
	dupMapKeys.WriteString(strings.Repeat("x, ", 100000))
	dupMapKeys.WriteString("x]\nw:\n")
	for i := range 2000 {
		fmt.Fprintf(&dupMapKeys, "  ? *b\n  : %d\n", i)
	}
	return []struct{ name, doc, want string }{
		{"alias of a big map inside 5000 keys", aliasKeys.String(), "a key here is a list"},
		{"10000 equal complex keys", complexKeys.String(), "a key here is a list"},
		{"25000 timestamp keys", ts.String(), ""},
		{"2000 keys aliasing a 100k list", dupMapKeys.String(), "a key here is an alias"},
		{"binary 1M", "#cloud-config\nw: !!binary " + strings.Repeat("QUFB", mb/4-16) + "\n", ""},
		{"float exponent", explicitKey("1e" + strings.Repeat("9", 100000)), ""},
		{"long sexagesimal float with an exponent", explicitKey("1" + strings.Repeat(":5", mb/3) + ".5e3"), ""},
		{"deep block nesting", "#cloud-config\n" + func() string {
			var b strings.Builder
			for i := range 1400 {
				b.WriteString(strings.Repeat(" ", i) + "a:\n")
			}
			return b.String()
		}(), "nested more than 400 deep"},
		{"archive of 8000 parts", "#cloud-config-archive\n" + strings.Repeat("- {type: text/cloud-config, content: \"#cloud-config\\na: 1\\n\"}\n", 8000), ""},
	}
}

// Object files a branch writer may put in a pull request, within the
// 1 MiB a file may hold, shaped to cost the loader: deep flow and block
// nesting, an alias bomb, a million-byte name and 50,000 labels. Each is
// refused, naming FILE:LINE:COL, and the loader returns; the error is
// not itself the size of the file.
func TestAttackHostileObjectFiles(t *testing.T) {
	head := "apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata:\n  name: web-1\n"
	labels := func() string {
		var b strings.Builder
		b.WriteString("apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata:\n  name: web-1\n  labels:\n")
		for i := range 50000 {
			fmt.Fprintf(&b, "    k%d: v\n", i)
		}
		return b.String() + "spec: {host: hv-a}\n"
	}()
	for _, tc := range []struct{ name, doc, want string }{
		{"flow nesting 200,000 deep", head + "spec:\n  host: " + strings.Repeat("[", 200000) + strings.Repeat("]", 200000) + "\n", "web-1.yaml:"},
		{"block nesting 1,400 deep", head + "spec:\n" + func() string {
			var b strings.Builder
			for i := range 1400 {
				b.WriteString(strings.Repeat(" ", i+2) + "a:\n")
			}
			return b.String()
		}(), "web-1.yaml:"},
		{"alias bomb", head + "spec:\n  a: &a [x, x, x, x, x, x, x, x, x, x]\n  b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n  c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n  d: [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n", "unknown field"},
		{"alias bomb in known fields", head + "  labels: &a {a: x, b: x, c: x, d: x, e: x, f: x, g: x, h: x}\nspec:\n  host: hv-a\n  volumes: [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n", "alias"},
		{"a name of a million bytes", "apiVersion: gitfleet.dev/v1alpha1\nkind: VM\nmetadata:\n  name: " + strings.Repeat("a", 1000000) + "\nspec: {host: hv-a}\n", "web-1.yaml:"},
		{"50,000 labels", labels, "web-1.yaml:"},
		{"a power of 300,000 bytes", head + "spec:\n  host: hv-a\n  power: " + strings.Repeat("b", 300000) + "\n", "web-1.yaml:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.doc) > MaxFileSize {
				t.Fatalf("the document is %d bytes, over MaxFileSize: it tests the size check only", len(tc.doc))
			}
			dir := t.TempDir()
			os.MkdirAll(filepath.Join(dir, "vms"), 0o755)
			if err := os.WriteFile(filepath.Join(dir, "vms", "web-1.yaml"), []byte(tc.doc), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := LoadDir(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("LoadDir: %v; want an error naming %s", err, tc.want)
			}
			msg := err.Error()
			if i := strings.Index(msg, "web-1.yaml:"); i < 0 || !regexp.MustCompile(`web-1\.yaml:\d+:\d+: `).MatchString(msg[i:]) {
				t.Errorf("the error names no FILE:LINE:COL: %.300s", msg)
			}
			t.Logf("%.200s", msg)
			if len(msg) > 16<<10 {
				t.Errorf("the error quotes the hostile value whole: %d bytes of output for one file (validate's, the controller's log)", len(msg))
			}
		})
	}
}
