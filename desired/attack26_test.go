package desired

import (
	"fmt"
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
