package desired

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrInvalid is what every ErrorList matches with errors.Is: the desired
// state was read completely and was rejected. An error from Load that does
// not match ErrInvalid is a failure to read the tree (a missing git object,
// an unreadable directory), never a verdict on its content.
var ErrInvalid = errors.New("invalid desired state")

// Error is one rejected piece of input. File is slash-separated and relative
// to the tree root; Line and Col are 1-based (Col is 1 when the YAML parser
// gives no column). Field is the dotted path of the offending field, such as
// "spec.volumes[1]", or empty for whole-file errors. Msg says what is wrong
// and, where it helps, how to fix it.
type Error struct {
	File  string `json:"file"`
	Line  int    `json:"line"`
	Col   int    `json:"col"`
	Field string `json:"field,omitempty"`
	Msg   string `json:"message"`
}

// Error formats the error as FILE:LINE:COL: FIELD: MSG, leaving out
// "FIELD: " when Field is empty and "FILE:" when File is empty.
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteByte(':')
	}
	fmt.Fprintf(&b, "%d:%d: ", e.Line, e.Col)
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Is reports whether target is ErrInvalid.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

// ErrorList is every error found in a tree, sorted by file, line, column and
// message. Load returns a non-empty ErrorList or nil, never an empty list.
type ErrorList []*Error

// Error joins the errors one per line.
func (l ErrorList) Error() string {
	var b strings.Builder
	for i, e := range l {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// Is reports whether target is ErrInvalid.
func (l ErrorList) Is(target error) bool { return target == ErrInvalid }

// Sort orders the list by file, line, column, field and message.
func (l ErrorList) Sort() {
	sort.SliceStable(l, func(i, j int) bool {
		a, b := l[i], l[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		if a.Col != b.Col {
			return a.Col < b.Col
		}
		if a.Field != b.Field {
			return a.Field < b.Field
		}
		return a.Msg < b.Msg
	})
}
