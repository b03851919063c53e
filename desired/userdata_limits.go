package desired

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Where PyYAML, cloud-init's loader, stops or slows down on a document a
// YAML parser reads in no time, and where CheckUserData stops computing.
// Each was measured with the PyYAML cloud-init runs (Debian 12's, Python
// 3.11); TestCheckUserDataAgreesWithCloudInitOnHostileNumbers compares
// with it.
const (
	// pyIntMaxDigits: Python refuses to convert a decimal string of more
	// digits to an integer (int_max_str_digits, Python 3.11 and the
	// security releases of 3.7 to 3.10), so PyYAML fails on a decimal
	// integer (or a part of a base-60 one) that long, and cloud-init
	// ignores the cloud-config. Bases 2, 8 and 16 have no such limit.
	pyIntMaxDigits = 4300
	// pyFloatMaxParts: PyYAML adds a base-60 float's parts as
	// part × 60^k with 60^k a Python integer turned into a float, which
	// overflows from 60^174: a base-60 float of more parts fails.
	pyFloatMaxParts = 174
	// maxBase60Parts bounds the parts of a base-60 integer (1:30:00)
	// CheckUserData computes. PyYAML multiplies them out one by one, in
	// time that grows with the square of the number's length (a second
	// for 60,000 parts, half a minute for 350,000); so did CheckUserData.
	maxBase60Parts = 1000
	// pyMaxNesting bounds how deep collections may nest: PyYAML's
	// composer recurses once per level and Python stops it at about 490
	// levels from the top of a program, fewer inside cloud-init.
	pyMaxNesting = 400
	// maxMergedEntries bounds the entries PyYAML copies to build one
	// mapping with merge keys (<<): it copies every merged entry, repeats
	// included, so merges of merges multiply them (a million take it
	// about a second and hundreds of MB; 600 bytes can ask for 33
	// million).
	maxMergedEntries = 1_000_000
)

// pyyamlLimits walks the tree under root (each node once, aliases
// followed) and reports where PyYAML's SafeLoader would fail, or take
// seconds to minutes, and a YAML parser would not: numbers past the
// limits above, collections nested deeper than pyMaxNesting, a merge key
// whose value is not a mapping or a list of mappings (PyYAML's
// ConstructorError), and merges that make PyYAML copy more than
// maxMergedEntries entries. It costs time linear in the document.
func pyyamlLimits(root *yaml.Node) []yamlProblem {
	l := &limitWalk{seen: map[*yaml.Node]bool{}, merged: map[*yaml.Node]int{}}
	l.walk(root, 1)
	return l.probs
}

// limitWalk is the state of one pyyamlLimits walk: the nodes visited,
// the merged size of each mapping (mergedSize), and whether the nesting
// and merge limits were reported already (once per document).
type limitWalk struct {
	seen                 map[*yaml.Node]bool
	merged               map[*yaml.Node]int
	deepSaid, mergedSaid bool
	probs                []yamlProblem
}

func (l *limitWalk) walk(n *yaml.Node, depth int) {
	if n == nil || l.seen[n] || len(l.probs) > maxUserDataProblems {
		return
	}
	l.seen[n] = true
	switch n.Kind {
	case yaml.AliasNode:
		// Composed once, wherever it is used: its depth is the anchor's.
		l.walk(n.Alias, depth)
		return
	case yaml.ScalarNode:
		if msg := numberLimit(n); msg != "" {
			l.probs = append(l.probs, yamlProblem{line: n.Line, msg: msg})
		}
		return
	case yaml.MappingNode, yaml.SequenceNode:
		if depth > pyMaxNesting && !l.deepSaid {
			l.deepSaid = true
			l.probs = append(l.probs, yamlProblem{line: n.Line, msg: fmt.Sprintf("collections are nested more than %d deep here: PyYAML's loader recurses once per level and Python stops it at about 490, so cloud-init cannot load this and ignores it", pyMaxNesting)})
		}
	}
	if n.Kind == yaml.MappingNode {
		l.checkMerges(n)
	}
	for _, c := range n.Content {
		l.walk(c, depth+1)
	}
}

// checkMerges reports a merge key of m whose value is not a mapping or a
// list of mappings, and merges that make m more than maxMergedEntries.
func (l *limitWalk) checkMerges(m *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		k := m.Content[i]
		if k.Kind != yaml.ScalarNode || pyyamlTag(k) != "!!merge" {
			continue
		}
		if _, ok := mergeSources(m.Content[i+1]); !ok {
			l.probs = append(l.probs, yamlProblem{line: k.Line, msg: fmt.Sprintf("the merge key (<<) here merges %s: PyYAML merges only a mapping or a list of mappings, so cloud-init cannot load this and ignores it", yamlKind(resolveAlias(m.Content[i+1])))})
		}
	}
	if l.mergedSize(m, map[*yaml.Node]bool{}) > maxMergedEntries && !l.mergedSaid {
		l.mergedSaid = true
		l.probs = append(l.probs, yamlProblem{line: m.Line, msg: fmt.Sprintf("the merge keys (<<) of this mapping and those it merges make PyYAML copy more than %d entries (it copies every merged entry, repeats included): cloud-init's loader would spend seconds to minutes and hundreds of MB on it", maxMergedEntries)})
	}
}

// mergedSize is the number of entries PyYAML's flatten_mapping leaves in
// m: its own entries but its merge keys, and those of every mapping it
// merges, flattened first, repeats kept; at most maxMergedEntries+1. A
// mapping merged while it is being flattened (it merges itself) counts
// its own entries, as PyYAML, which drops the merge key before it
// follows it, finds them.
func (l *limitWalk) mergedSize(m *yaml.Node, open map[*yaml.Node]bool) int {
	if n, ok := l.merged[m]; ok {
		return n
	}
	own, total := 0, 0
	var sources []*yaml.Node
	for i := 0; i+1 < len(m.Content); i += 2 {
		if k := m.Content[i]; k.Kind == yaml.ScalarNode && pyyamlTag(k) == "!!merge" {
			src, _ := mergeSources(m.Content[i+1])
			sources = append(sources, src...)
			continue
		}
		own++
	}
	if open[m] {
		return own
	}
	open[m] = true
	total = own
	for _, src := range sources {
		total = min(total+l.mergedSize(src, open), maxMergedEntries+1)
	}
	delete(open, m)
	l.merged[m] = total
	return total
}

// mergeSources are the mappings a merge key's value v merges (aliases
// resolved): v itself, or the entries of a list; ok is false when v or
// an entry is not a mapping.
func mergeSources(v *yaml.Node) (out []*yaml.Node, ok bool) {
	v = resolveAlias(v)
	switch v.Kind {
	case yaml.MappingNode:
		return []*yaml.Node{v}, true
	case yaml.SequenceNode:
		for _, e := range v.Content {
			if e = resolveAlias(e); e.Kind != yaml.MappingNode {
				return out, false
			}
			out = append(out, e)
		}
		return out, true
	}
	return nil, false
}

func resolveAlias(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}

// numberLimit says why PyYAML fails, or is slow, on the number a scalar
// holds ("" when it is no number or within the limits).
func numberLimit(n *yaml.Node) string {
	tag := pyyamlTag(n)
	if tag != "!!int" && tag != "!!float" {
		return ""
	}
	v := strings.TrimLeft(strings.ReplaceAll(n.Value, "_", ""), "+-")
	parts := strings.Count(v, ":") + 1
	switch {
	case tag == "!!float" && parts > pyFloatMaxParts:
		return fmt.Sprintf("a base-60 float of %d parts: PyYAML computes it with 60^%d, which overflows a float from 60^%d, so cloud-init cannot load this and ignores it", parts, parts-1, pyFloatMaxParts)
	case tag == "!!int" && parts > maxBase60Parts:
		return fmt.Sprintf("a base-60 integer of %d parts: PyYAML multiplies it out part by part in time that grows with the square of its length (half a minute for 350000 parts), and gitfleet checks none of more than %d; write it as a decimal integer", parts, maxBase60Parts)
	case tag == "!!int" && !strings.HasPrefix(v, "0"):
		first, _, _ := strings.Cut(v, ":")
		if len(first) > pyIntMaxDigits {
			return fmt.Sprintf("an integer of %d decimal digits: Python converts none of more than %d (int_max_str_digits), so PyYAML fails and cloud-init cannot load this and ignores it", len(first), pyIntMaxDigits)
		}
	}
	return ""
}

// pyyamlInt is PyYAML's construct_yaml_int as an identity: the value in
// lower-case hex with its sign ("-1f", "0"), for underscores dropped, 0b
// binary, 0x hex, a leading 0 octal, a:b:c base 60, else decimal. Bases
// 2, 8 and 16 are converted digit by digit, in time linear in their
// length; ok is false where numberLimit reports a problem (PyYAML fails,
// or the number is not computed) and for a value that is no integer.
func pyyamlInt(v string) (string, bool) {
	v = strings.ReplaceAll(v, "_", "")
	neg := strings.HasPrefix(v, "-")
	v = strings.TrimLeft(v, "+-")
	var hex string
	ok := true
	switch {
	case v == "0":
		return "0", true
	case strings.HasPrefix(v, "0b"):
		hex, ok = pow2Hex(v[2:], 1)
	case strings.HasPrefix(v, "0x"):
		hex, ok = pow2Hex(strings.ToLower(v[2:]), 4)
	case strings.HasPrefix(v, "0"):
		hex, ok = pow2Hex(v[1:], 3)
	default:
		hex, ok = base60Hex(v)
	}
	if !ok {
		return "", false
	}
	if neg && hex != "0" {
		hex = "-" + hex
	}
	return hex, true
}

const hexDigits = "0123456789abcdef"

// pow2Hex converts digits of base 2^bits (bits 1, 3 or 4), most
// significant first, to hex without leading zeros.
func pow2Hex(digits string, bits uint) (string, bool) {
	if digits == "" {
		return "", false
	}
	out := make([]byte, 0, len(digits)*int(bits)/4+2)
	var acc uint64
	var n uint
	for i := len(digits) - 1; i >= 0; i-- {
		d := strings.IndexByte(hexDigits, digits[i])
		if d < 0 || d >= 1<<bits {
			return "", false
		}
		acc |= uint64(d) << n
		for n += bits; n >= 4; n -= 4 {
			out = append(out, hexDigits[acc&15])
			acc >>= 4
		}
	}
	if n > 0 {
		out = append(out, hexDigits[acc&15])
	}
	for len(out) > 1 && out[len(out)-1] == '0' {
		out = out[:len(out)-1]
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return string(out), true
}

// base60Hex converts a decimal integer or a base-60 one (a:b:c, without
// sign or underscores) to hex, within numberLimit's limits.
func base60Hex(v string) (string, bool) {
	parts := strings.Split(v, ":")
	if len(parts) > maxBase60Parts || len(parts[0]) > pyIntMaxDigits {
		return "", false
	}
	n := new(big.Int)
	for _, part := range parts {
		d, ok := new(big.Int).SetString(part, 10)
		if !ok {
			return "", false
		}
		n.Mul(n, big.NewInt(60)).Add(n, d)
	}
	return n.Text(16), true
}

// pyyamlFloat is PyYAML's construct_yaml_float: underscores dropped, .inf
// and .nan, a:b:c.d base 60 (each part × 60^k, 60^k an exact integer
// rounded to a float as Python does; ok is false past pyFloatMaxParts
// parts, where Python overflows), else Python's float().
func pyyamlFloat(v string) (float64, bool) {
	v = strings.ToLower(strings.ReplaceAll(v, "_", ""))
	sign := 1.0
	if strings.HasPrefix(v, "-") {
		sign = -1
	}
	v = strings.TrimLeft(v, "+-")
	switch {
	case v == ".inf":
		return sign * math.Inf(1), true
	case v == ".nan":
		return math.NaN(), true
	case strings.Contains(v, ":"):
		parts := strings.Split(v, ":")
		if len(parts) > pyFloatMaxParts {
			return 0, false
		}
		val, base := 0.0, big.NewInt(1)
		for i := len(parts) - 1; i >= 0; i-- {
			d, err := strconv.ParseFloat(parts[i], 64)
			if err != nil {
				return 0, false
			}
			b, _ := new(big.Float).SetInt(base).Float64()
			val += d * b
			base.Mul(base, big.NewInt(60))
		}
		return sign * val, true
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, false
	}
	return sign * f, true
}

// pyNumberKey is the identity of a float as a Python dict key: an integral
// float is the integer it equals (in pyyamlInt's hex); any other, "f:"
// and the float; PyYAML builds every .nan from one object, so all NaN
// keys are one key.
func pyNumberKey(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 0):
		return "f:" + strconv.FormatFloat(f, 'g', -1, 64)
	case f == math.Trunc(f):
		n, _ := new(big.Float).SetFloat64(f).Int(nil)
		return "n:" + n.Text(16)
	}
	return "f:" + strconv.FormatFloat(f, 'g', -1, 64)
}
