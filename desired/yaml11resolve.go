package desired

import "strings"

// pyyamlResolve is the tag PyYAML's resolver gives a plain scalar: its
// implicit resolvers for YAML 1.1 (resolver.py), which cloud-init's loader
// uses, tried in its order (bool, float, int, merge, null, timestamp),
// "!!str" when none matches. They differ from other YAML 1.1 libraries
// ("y" is a string, "1e3" is a string, "1:30" is the integer 90). Each is
// a scan of the scalar's bytes equivalent to resolver.py's regular
// expression (TestPyYAMLResolveMatchesResolverPatterns compares them), in
// time linear in its length with a small constant: a regular expression
// engine took a second per MB, which a hostile key made validate pay.
func pyyamlResolve(v string) string {
	switch {
	case isPyBool(v):
		return "!!bool"
	case isPyFloat(v):
		return "!!float"
	case isPyInt(v):
		return "!!int"
	case v == "<<":
		return "!!merge"
	case isPyNull(v):
		return "!!null"
	case isPyTimestamp(v):
		return "!!timestamp"
	}
	return "!!str"
}

// isPyBool: yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF.
func isPyBool(v string) bool {
	switch v {
	case "yes", "Yes", "YES", "no", "No", "NO", "true", "True", "TRUE",
		"false", "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF":
		return true
	}
	return false
}

// isPyNull: ~|null|Null|NULL|(empty).
func isPyNull(v string) bool {
	switch v {
	case "~", "null", "Null", "NULL", "":
		return true
	}
	return false
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// span is the length of the longest prefix of s whose bytes all satisfy ok.
func span(s string, ok func(byte) bool) int {
	i := 0
	for i < len(s) && ok(s[i]) {
		i++
	}
	return i
}

func digitOrUnderscore(c byte) bool { return isDigit(c) || c == '_' }

// trimSign drops one leading + or -.
func trimSign(v string) (string, bool) {
	if v != "" && (v[0] == '+' || v[0] == '-') {
		return v[1:], true
	}
	return v, false
}

// isPyInt: [-+]?0b[0-1_]+ | [-+]?0[0-7_]+ | [-+]?(?:0|[1-9][0-9_]*) |
// [-+]?0x[0-9a-fA-F_]+ | [-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+.
func isPyInt(v string) bool {
	s, _ := trimSign(v)
	switch {
	case s == "":
		return false
	case strings.HasPrefix(s, "0b"):
		return len(s) > 2 && span(s[2:], func(c byte) bool { return c == '0' || c == '1' || c == '_' }) == len(s)-2
	case strings.HasPrefix(s, "0x"):
		return len(s) > 2 && span(s[2:], func(c byte) bool {
			return isDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' || c == '_'
		}) == len(s)-2
	case s == "0":
		return true
	case s[0] == '0':
		return span(s[1:], func(c byte) bool { return c >= '0' && c <= '7' || c == '_' }) == len(s)-1
	case s[0] >= '1' && s[0] <= '9':
		i := 1 + span(s[1:], digitOrUnderscore)
		if i == len(s) {
			return true
		}
		rest, ok := base60Groups(s[i:])
		return ok && rest == ""
	}
	return false
}

// base60Groups consumes (?::[0-5]?[0-9])+ from the start of s and
// returns what follows; ok is false when no group is there.
func base60Groups(s string) (rest string, ok bool) {
	for len(s) >= 2 && s[0] == ':' && isDigit(s[1]) {
		n := 2
		// [0-5]?[0-9]: a second digit belongs to the group only after a
		// first one of 0-5; what follows a group is ':', '.' or the end,
		// never a digit, so the longer group is the only one that can
		// match.
		if len(s) > 2 && isDigit(s[2]) && s[1] <= '5' {
			n = 3
		}
		s, ok = s[n:], true
	}
	return s, ok
}

// pyExponent consumes an optional (?:[eE][-+][0-9]+) at the start of s
// and reports whether the rest is empty.
func pyExponentToEnd(s string) bool {
	if s == "" {
		return true
	}
	if len(s) < 3 || (s[0] != 'e' && s[0] != 'E') || (s[1] != '-' && s[1] != '+') {
		return false
	}
	return span(s[2:], isDigit) == len(s)-2
}

// isPyFloat: [-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)? |
// \.[0-9][0-9_]*(?:[eE][-+][0-9]+)? | [-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]* |
// [-+]?\.(?:inf|Inf|INF) | \.(?:nan|NaN|NAN).
func isPyFloat(v string) bool {
	switch v {
	case ".nan", ".NaN", ".NAN":
		return true
	}
	s, signed := trimSign(v)
	switch s {
	case ".inf", ".Inf", ".INF":
		return true
	case "":
		return false
	}
	if s[0] == '.' {
		// \.[0-9][0-9_]*(exponent)?, never signed.
		return !signed && len(s) > 1 && isDigit(s[1]) && pyExponentToEnd(s[2+span(s[2:], digitOrUnderscore):])
	}
	if !isDigit(s[0]) {
		return false
	}
	i := 1 + span(s[1:], digitOrUnderscore)
	switch {
	case i == len(s):
		return false
	case s[i] == '.':
		j := i + 1 + span(s[i+1:], digitOrUnderscore)
		return pyExponentToEnd(s[j:])
	case s[i] == ':':
		rest, ok := base60Groups(s[i:])
		return ok && rest != "" && rest[0] == '.' && span(rest[1:], digitOrUnderscore) == len(rest)-1
	}
	return false
}

// isPyTimestamp: [0-9]{4}-[0-9]{2}-[0-9]{2} |
// [0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:[Tt]|[ \t]+)[0-9]{1,2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]*)?(?:[ \t]*(?:Z|[-+][0-9]{1,2}(?::[0-9]{2})?))?.
func isPyTimestamp(v string) bool {
	if len(v) < 8 || span(v[:4], isDigit) != 4 || v[4] != '-' {
		return false
	}
	s, ok := digits12(v[5:])
	if !ok || s == "" || s[0] != '-' {
		return false
	}
	if s, ok = digits12(s[1:]); !ok {
		return false
	}
	if s == "" {
		// Only the date: the first form, two digits each.
		return len(v) == 10 && isDigit(v[6]) && isDigit(v[9])
	}
	switch {
	case s[0] == 'T' || s[0] == 't':
		s = s[1:]
	case s[0] == ' ' || s[0] == '\t':
		s = s[span(s, func(c byte) bool { return c == ' ' || c == '\t' }):]
	default:
		return false
	}
	if s, ok = digits12(s); !ok || len(s) < 6 || s[0] != ':' || !isDigit(s[1]) || !isDigit(s[2]) || s[3] != ':' || !isDigit(s[4]) || !isDigit(s[5]) {
		return false
	}
	s = s[6:]
	if s != "" && s[0] == '.' {
		s = s[1+span(s[1:], isDigit):]
	}
	if s == "" {
		return true
	}
	s = s[span(s, func(c byte) bool { return c == ' ' || c == '\t' }):]
	switch {
	case s == "Z":
		return true
	case s == "" || (s[0] != '-' && s[0] != '+'):
		return false
	}
	if s, ok = digits12(s[1:]); !ok {
		return false
	}
	return s == "" || len(s) == 3 && s[0] == ':' && isDigit(s[1]) && isDigit(s[2])
}

// digits12 consumes [0-9][0-9]? from the start of s.
func digits12(s string) (string, bool) {
	switch {
	case len(s) >= 2 && isDigit(s[0]) && isDigit(s[1]):
		return s[2:], true
	case len(s) >= 1 && isDigit(s[0]):
		return s[1:], true
	}
	return s, false
}
