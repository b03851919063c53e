package desired

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// seconds is a TextUnmarshaler like a configuration's duration.
type seconds time.Duration

func (s *seconds) UnmarshalText(b []byte) error {
	d, err := time.ParseDuration(string(b))
	if err != nil || d < 0 {
		return fmt.Errorf("%q is not a duration like 10s or 5m", b)
	}
	*s = seconds(d)
	return nil
}

// config is a file shape no object has: nested sections, pointers, a
// TextUnmarshaler, times.
type config struct {
	Host    string `yaml:"host"`
	Retries int    `yaml:"retries"`
	Net     struct {
		Timeout seconds  `yaml:"timeout"`
		Allow   []string `yaml:"allow"`
	} `yaml:"net"`
	Scope *bool      `yaml:"scope"`
	Wait  *seconds   `yaml:"wait"`
	Since time.Time  `yaml:"since"`
	Until *time.Time `yaml:"until"`
	Tags  map[string]string
}

func TestDecodeStrict(t *testing.T) {
	in := "host: hv-a\nretries: 3\nnet:\n  timeout: 90s\n  allow: [a, b]\nscope: false\nwait: 0\nsince: 2026-01-02T03:04:05Z\nuntil: \"2026-01-02T03:04:05.5+01:00\"\ntags: {k: v}\n"
	var c config
	if err := DecodeStrict("agent.yaml", []byte(in), &c); err != nil {
		t.Fatal(err)
	}
	until := time.Date(2026, 1, 2, 3, 4, 5, 5e8, time.FixedZone("", 3600))
	if c.Host != "hv-a" || c.Retries != 3 || c.Net.Timeout != seconds(90*time.Second) || !reflect.DeepEqual(c.Net.Allow, []string{"a", "b"}) ||
		c.Scope == nil || *c.Scope || c.Wait == nil || *c.Wait != 0 || !c.Since.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) ||
		c.Until == nil || !c.Until.Equal(until) || c.Tags["k"] != "v" {
		t.Fatalf("decoded %+v", c)
	}

	for _, tc := range []struct{ name, in, want string }{
		{"unknown field", "hots: hv-a\n", `agent.yaml:1:1: hots: unknown field "hots"; did you mean "host"?`},
		{"unknown nested field", "net:\n  timout: 5s\n", `agent.yaml:2:3: net.timout: unknown field "timout"; did you mean "timeout"?`},
		{"every error at once", "host: 1\nretries: \"3\"\n", "agent.yaml:1:7: host: must be a string, got the integer 1; if you mean the text, quote it: \"1\"\n" +
			"agent.yaml:2:10: retries: must be an integer, got the string \"3\""},
		{"duplicate key", "host: a\nhost: b\n", `agent.yaml:2:1: host: duplicate key "host" (first written at line 1); a key may appear only once`},
		{"alias", "net: &n {timeout: 5s}\n", "agent.yaml:1:6: net: anchors (&n) are not supported; write the value out in full"},
		{"text unmarshaler error", "net: {timeout: soon}\n", `agent.yaml:1:16: net.timeout: "soon" is not a duration like 10s or 5m`},
		{"text unmarshaler boolean", "net: {timeout: true}\n", "agent.yaml:1:16: net.timeout: must be a string, got the boolean true"},
		{"bad time", "since: 2026-01-02\n", `agent.yaml:1:8: since: must be a time such as 2006-01-02T15:04:05Z (RFC 3339), got "2026-01-02"`},
		{"not a mapping", "[a]\n", "agent.yaml:1:1: a file must be a mapping; got a list"},
		{"empty", "# only a comment\n", "agent.yaml:1:1: empty file; a file is a mapping"},
		{"two documents", "host: a\n---\nhost: b\n", "agent.yaml:3:1: a second YAML document; a file is one document"},
		{"too large", "host: a\n#" + strings.Repeat("x", MaxFileSize), fmt.Sprintf("agent.yaml:1:1: file is %d bytes; a file may be at most %d bytes", MaxFileSize+9, MaxFileSize)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c config
			err := DecodeStrict("agent.yaml", []byte(tc.in), &c)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("DecodeStrict error:\n%v\nwant\n%s", err, tc.want)
			}
			var list ErrorList
			if !errors.As(err, &list) || !errors.Is(err, ErrInvalid) {
				t.Errorf("error %T is not an ErrorList matching ErrInvalid", err)
			}
		})
	}
}

func TestDecodeFormat(t *testing.T) {
	f := Format{Noun: "agent config", Shape: "a mapping with host and net", MaxBytes: 16}
	var c config
	for in, want := range map[string]string{
		"":                      "1:1: empty agent config; an agent config is a mapping with host and net",
		"- a\n":                 "1:1: an agent config must be a mapping with host and net; got a list",
		"host: a\n# 17 bytes\n": "1:1: file is 19 bytes; an agent config may be at most 16 bytes",
	} {
		if err := Decode("", []byte(in), &c, f).Err(); err == nil || err.Error() != want {
			t.Errorf("Decode(%q) error = %v, want %s", in, err, want)
		}
	}
	// AllowEmpty reads a file without a document as every field left out.
	for _, in := range []string{"", "# comment\n", "---\n"} {
		c = config{}
		doc := Decode("", []byte(in), &c, Format{AllowEmpty: true})
		if err := doc.Err(); err != nil || !reflect.DeepEqual(c, config{}) {
			t.Errorf("Decode(%q) with AllowEmpty = %+v, %v", in, c, err)
		}
		if doc.Required("host"); doc.Err() == nil || doc.Err().Error() != "1:1: host: missing" {
			t.Errorf("Required(host) of an empty file: %v", doc.Err())
		}
	}
	// A negative MaxBytes is no bound.
	big := "host: a\n#" + strings.Repeat("x", MaxFileSize) + "\n"
	if err := Decode("", []byte(big), &c, Format{MaxBytes: -1}).Err(); err != nil {
		t.Errorf("Decode with no bound: %v", err)
	}
}

func TestDocumentChecks(t *testing.T) {
	type item struct {
		Name string `yaml:"name"`
	}
	type file struct {
		Host  string `yaml:"host"`
		Items []item `yaml:"items"`
	}
	var f file
	doc := Decode("f.yaml", []byte("host: HV_A\nitems:\n  - name: a\n  - {}\n"), &f, Format{})
	if !doc.Required("host") {
		t.Error("Required(host) = false for a written host")
	}
	if doc.Name("host", f.Host) {
		t.Error("Name accepted HV_A")
	}
	if doc.Required("missing") {
		t.Error("Required(missing) = true")
	}
	doc.Required("items[1].name")
	if doc.Required("items[0].name") {
		doc.Errorf("items[0].name", "%q is taken", f.Items[0].Name)
	}
	want := "f.yaml:1:1: missing: missing\n" +
		"f.yaml:1:7: host: \"HV_A\" is not a DNS label (RFC 1123): lowercase letters, digits and '-', starting and ending with a letter or digit\n" +
		"f.yaml:3:11: items[0].name: \"a\" is taken\n" +
		"f.yaml:4:5: items[1].name: missing"
	if err := doc.Err(); err == nil || err.Error() != want {
		t.Errorf("Err:\n%v\nwant\n%s", err, want)
	}

	// After a document-level error the checks add nothing.
	doc = Decode("f.yaml", []byte("- a\n"), &f, Format{})
	doc.Required("host")
	doc.Name("host", "")
	doc.Errorf("host", "never")
	if err := doc.Err(); err == nil || err.Error() != "f.yaml:1:1: a file must be a mapping; got a list" {
		t.Errorf("Err after a document error = %v", err)
	}
	if err := Decode("f.yaml", []byte("host: a\n"), &f, Format{}).Err(); err != nil {
		t.Errorf("Err of a clean file = %v, want nil", err)
	}
}
