package desired

import (
	"math/rand/v2"
	"regexp"
	"testing"
)

// resolverPatterns are PyYAML's implicit resolvers (resolver.py, YAML
// 1.1), in its order: the reference pyyamlResolve's scans must agree with.
var resolverPatterns = []struct {
	tag string
	re  *regexp.Regexp
}{
	{"!!bool", regexp.MustCompile(`^(?:yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$`)},
	{"!!float", regexp.MustCompile(`^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$`)},
	{"!!int", regexp.MustCompile(`^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+)$`)},
	{"!!merge", regexp.MustCompile(`^(?:<<)$`)},
	{"!!null", regexp.MustCompile(`^(?:~|null|Null|NULL|)$`)},
	{"!!timestamp", regexp.MustCompile(`^(?:[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]|[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?(?:[Tt]|[ \t]+)[0-9][0-9]?:[0-9][0-9]:[0-9][0-9](?:\.[0-9]*)?(?:[ \t]*(?:Z|[-+][0-9][0-9]?(?::[0-9][0-9])?))?)$`)},
}

func resolveByPattern(v string) string {
	for _, p := range resolverPatterns {
		if p.re.MatchString(v) {
			return p.tag
		}
	}
	return "!!str"
}

// pyyamlResolve's scans give the tag resolver.py's patterns give: on the
// edge cases of each form and on 300,000 random strings over the
// characters the patterns name.
func TestPyYAMLResolveMatchesResolverPatterns(t *testing.T) {
	cases := []string{
		"", "~", "null", "NULL", "nULL", "yes", "Yes", "yES", "on", "OFF", "y", "n", "<<", "<", "<<<",
		"0", "00", "0_", "-0", "+0", "07", "08", "0b", "0b1", "0b2", "0b_", "-0b1", "0x", "0xG", "0xfF_", "+0x1",
		"1", "1_000", "_1", "1:30", "1:3", "1:60", "1:05", "1:5:", "1::5", "190:20:30", "-1:30", "01:30", "1:555", "1:6",
		"1.", "1.5", "1_.5_", ".5", "-.5", "+.5", ".", "._", "1e3", "1.0e3", "1.0e+3", "1.0E-3", "1.e+3", "1.0e+", ".5e+1",
		"1:30.5", "1:30.", "1:30.5e+1", "0:30.5", "-1:30.5", ".inf", "-.inf", "+.Inf", ".INF", ".nan", "-.nan", ".NaN", ".nAn",
		"2001-12-14", "2001-1-14", "2001-12-1", "2001-12-14t21:59:43.10-05:00", "2001-12-14 21:59:43.10 -5",
		"2001-12-14\t21:59:43", "2001-12-14  21:59:43.Z", "2001-12-14 21:59:43 ", "2001-12-14 21:59:43 Z", "2001-12-14 21:59:43+05:3",
		"2001-12-14T1:59:43", "2001-12-14T21:5:43", "2001-12-14T21:59:43.", "2001-12-14T21:59:43+05:30", "2001-12-14T21:59:43-5",
		"2001-1-1", "2001-12-14X21:59:43", "20011-12-14",
	}
	for _, c := range cases {
		if got, want := pyyamlResolve(c), resolveByPattern(c); got != want {
			t.Errorf("pyyamlResolve(%q) = %s; resolver.py's patterns say %s", c, got, want)
		}
	}
	const alphabet = "0123456789_:.-+eEbxaAfFinINtTZ \t~<"
	rng := rand.New(rand.NewPCG(1, 2))
	prefixes := []string{"", "1", "0", "2001-12-14", "2001-12-14T21:59:43", "1:30", "0x", "0b", ".", "-"}
	for range 300000 {
		b := []byte(prefixes[rng.IntN(len(prefixes))])
		for range rng.IntN(10) {
			b = append(b, alphabet[rng.IntN(len(alphabet))])
		}
		v := string(b)
		if got, want := pyyamlResolve(v), resolveByPattern(v); got != want {
			t.Fatalf("pyyamlResolve(%q) = %s; resolver.py's patterns say %s", v, got, want)
		}
	}
}
