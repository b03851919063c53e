// Package errchain checks the text of an error chain for repeated
// prefixes: "boot: boot: …", "destroy: destroy web-01: …", the same
// segment twice. Each layer of a chain should add what only it knows; a
// layer that repeats its callee's words makes the message longer and no
// clearer. Tests use Repeat on the errors they provoke.
package errchain

import (
	"strings"
	"unicode"
)

// Repeat returns the first repetition in msg, a chain of segments joined
// by ": ", or "" when there is none. A repetition is a segment that
// appears twice on one line, or two adjacent segments that start with the
// same word (letters and digits, compared without case). Each line is
// checked on its own: lines after the first are a program's output quoted
// at the end of the chain (QEMU's), which says what it says.
func Repeat(msg string) string {
	for _, line := range strings.Split(msg, "\n") {
		if r := repeatInLine(line); r != "" {
			return r
		}
	}
	return ""
}

func repeatInLine(line string) string {
	segs := strings.Split(line, ": ")
	seen := make(map[string]bool, len(segs))
	prev := ""
	for _, s := range segs {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if seen[s] {
			return s
		}
		seen[s] = true
		w := firstWord(s)
		if w != "" && w == prev {
			return w
		}
		prev = w
	}
	return ""
}

// firstWord is s's first run of letters and digits, lower-cased.
func firstWord(s string) string {
	end := strings.IndexFunc(s, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
	if end < 0 {
		end = len(s)
	}
	return strings.ToLower(s[:end])
}
