// Package safetext makes error texts fit to be written where people read
// them: a branch file (ledger.yaml, a status, README.md) or a log line.
// Texts from git, servers and YAML can carry anything — a NUL byte in a
// ref advertisement, invalid UTF-8, ten thousand errors of one commit —
// and a branch file or a log line must stay valid UTF-8, free of control
// characters, and bounded.
package safetext

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxLines is how many lines of a multi-line error Lines keeps.
const MaxLines = 50

// MaxLineBytes bounds one line kept by Lines, in bytes.
const MaxLineBytes = 1024

// Line makes s one printable line: invalid UTF-8 becomes U+FFFD, every
// control character (newlines and tabs included) is written as a Go escape
// such as \x00 or \n (so are the bidirectional controls, U+202E and the
// like, which reorder what a terminal or a browser shows), and a line longer than MaxLineBytes is cut with "…".
func Line(s string) string {
	var b strings.Builder
	for i, r := range s {
		if b.Len() >= MaxLineBytes {
			b.WriteString("…")
			break
		}
		switch {
		case r == utf8.RuneError && !validAt(s, i):
			b.WriteRune(utf8.RuneError)
		case r == '\t':
			b.WriteByte(' ')
		case unicode.IsControl(r) || r == '\u2028' || r == '\u2029' || unicode.Is(unicode.Bidi_Control, r):
			b.WriteString(strings.Trim(fmt.Sprintf("%q", string(r)), `"`))
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// validAt reports whether the U+FFFD at s[i:] is written in s rather than
// decoded from invalid bytes.
func validAt(s string, i int) bool {
	r, size := utf8.DecodeRuneInString(s[i:])
	return r == utf8.RuneError && size == 3
}

// Lines makes a multi-line text (an error list, one error per line) fit to
// write: each line cleaned as Line does, at most MaxLines of them, then
// one line "… and N more" counting what was cut.
func Lines(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	n := len(lines)
	if n > MaxLines {
		lines = lines[:MaxLines]
	}
	for i, l := range lines {
		lines[i] = Line(l)
	}
	if n > MaxLines {
		lines = append(lines, fmt.Sprintf("… and %d more", n-MaxLines))
	}
	return strings.Join(lines, "\n")
}

// Truncate shortens s to its first n bytes and "..." for a message that
// quotes it (with %q, so a rune cut in two is escaped, not garbled); s of
// at most n bytes is returned as it is.
func Truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
