package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing/transport"
)

// The value kinds a flag, a variable or a file field can be malformed as.
// Each parse function's error says what was wanted, without the value:
// the caller names the value and where it came from.

// parseDuration parses a Go duration ("90s", "5m", "1h30m"), 0 or more.
func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, errors.New("invalid duration, like 90s or 5m")
	}
	return d, nil
}

// checkURL accepts what gitsource opens: a URL (file, http(s), ssh, git),
// scp-like user@host:path, or a local path.
func checkURL(s string) error {
	if p := pathProblem(s); p != "" {
		return errors.New("invalid URL: " + p)
	}
	if _, err := transport.NewEndpoint(s); err != nil {
		return fmt.Errorf("invalid URL: %s", urlReason(err))
	}
	return nil
}

// urlReason is why net/url refused a URL, without the URL (which may hold
// a secret: the caller prints it redacted).
func urlReason(err error) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		return msg[i+2:]
	}
	return msg
}

// checkPath refuses what is never a usable path: a NUL byte, and a leading
// ~, which no shell expanded (systemd's Environment= and YAML do not).
func checkPath(s string) error {
	if p := pathProblem(s); p != "" {
		return errors.New("invalid path: " + p)
	}
	return nil
}

// pathProblem is what is wrong with s as a local path (a URL may be one),
// or "".
func pathProblem(s string) string {
	switch {
	case strings.ContainsRune(s, 0):
		return "it holds a NUL byte"
	case strings.HasPrefix(s, "~"):
		return "~ is not expanded here; give the full path"
	}
	return ""
}

// A kind of string value with its check, for flags and variables.
type stringKind struct {
	name  string // pflag's Type(), shown in --help
	check func(string) error
}

var (
	plainString = stringKind{"string", nil}
	urlString   = stringKind{"url", checkURL}
	pathString  = stringKind{"path", checkPath}
)

// stringValue is a pflag.Value for a string of a kind.
type stringValue struct {
	p    *string
	kind stringKind
}

func (v *stringValue) String() string { return *v.p }
func (v *stringValue) Type() string   { return v.kind.name }
func (v *stringValue) Set(s string) error {
	if v.kind.check != nil && s != "" {
		if err := v.kind.check(s); err != nil {
			return err
		}
	}
	*v.p = s
	return nil
}

// durationValue is a pflag.Value for a duration of 0 or more.
type durationValue struct{ p *time.Duration }

func (v *durationValue) String() string { return v.p.String() }
func (v *durationValue) Type() string   { return "duration" }
func (v *durationValue) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	*v.p = d
	return nil
}

// intValue is a pflag.Value for an integer.
type intValue struct{ p *int }

func (v *intValue) String() string { return strconv.Itoa(*v.p) }
func (v *intValue) Type() string   { return "int" }
func (v *intValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("invalid integer, like 10 or -1")
	}
	*v.p = n
	return nil
}

// boolValue is a flag given alone (--flag) or as --flag=true|false.
type boolValue struct{ p *bool }

func (v *boolValue) String() string { return strconv.FormatBool(*v.p) }
func (v *boolValue) Type() string   { return "bool" }
func (v *boolValue) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("invalid boolean, want true or false")
	}
	*v.p = b
	return nil
}

// Duration is a time.Duration written in YAML as a Go duration ("90s",
// "5m"), 0 or more.
type Duration time.Duration

// UnmarshalText parses a Go duration (desired.Decode gives it the text).
func (d *Duration) UnmarshalText(text []byte) error {
	v, err := parseDuration(string(text))
	if err != nil {
		return fmt.Errorf("%q is not a duration, like 90s or 5m", text)
	}
	*d = Duration(v)
	return nil
}

// SignedDuration is a Duration that may be negative ("-1s"), for the
// settings where a negative value turns something off.
type SignedDuration time.Duration

// UnmarshalText parses a Go duration (desired.Decode gives it the text).
func (d *SignedDuration) UnmarshalText(text []byte) error {
	v, err := time.ParseDuration(string(text))
	if err != nil {
		return fmt.Errorf("%q is not a duration, like 90s or 5m", text)
	}
	*d = SignedDuration(v)
	return nil
}
