package safetext

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

func TestLine(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain", "plain"},
		{"nul\x00byte", `nul\x00byte`},
		{"two\nlines", `two\nlines`},
		{"bad \xff utf8", "bad \uFFFD utf8"},
		{"real \uFFFD kept", "real \uFFFD kept"},
		{"bell\a and esc\x1b[31m", `bell\a and esc\x1b[31m`},
		{"tab\there", "tab here"},
		{"ok ünïcode ✓", "ok ünïcode ✓"},
	} {
		got := Line(tc.in)
		assert.Equal(t, tc.want, got, "%q", tc.in)
		assert.True(t, utf8.ValidString(got))
	}
	long := Line(strings.Repeat("x", 5000))
	assert.LessOrEqual(t, len(long), MaxLineBytes+len("…"))
	assert.True(t, strings.HasSuffix(long, "…"))
}

func TestLinesCutsAt50WithACount(t *testing.T) {
	var errs []string
	for i := 0; i < 10000; i++ {
		errs = append(errs, fmt.Sprintf("vms/vm-%05d.yaml:1:1: bad\x00", i))
	}
	got := Lines(strings.Join(errs, "\n"))
	lines := strings.Split(got, "\n")
	assert.Len(t, lines, MaxLines+1)
	assert.Equal(t, `vms/vm-00000.yaml:1:1: bad\x00`, lines[0])
	assert.Equal(t, "… and 9950 more", lines[MaxLines])
	assert.Less(t, len(got), 4096)
	assert.Equal(t, "one\ntwo", Lines("one\ntwo\n"))
}

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"abc", 3, "abc"},
		{"abcd", 3, "abc..."},
		{"", 0, ""},
	} {
		if got := Truncate(tc.s, tc.n); got != tc.want {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
}
