package agent

import (
	"errors"
	"io/fs"
	"os"
	"regexp"
	"strings"
	"testing"
)

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func TestValidName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"web-01", true}, {"a", true}, {"0", true}, {strings.Repeat("a", 63), true}, {strings.Repeat("a", 64), false},
		{"", false}, {"-a", false}, {"a-", false}, {"A", false}, {"a.b", false}, {"../x", false},
		{"a/b", false}, {"a_b", false}, {"é", false},
	} {
		if got := validName(tc.name); got != tc.ok {
			t.Errorf("validName(%q) = %v, want %v", tc.name, got, tc.ok)
		}
	}
}

func TestCheckHostName(t *testing.T) {
	if err := CheckHostName("hv-a"); err != nil {
		t.Errorf("CheckHostName(hv-a) = %v", err)
	}
	for _, h := range []string{"../README", "hv-a.example.com", "HV-A", ""} {
		err := CheckHostName(h)
		if !errors.Is(err, ErrInvalidName) || !strings.Contains(err.Error(), "host \""+h+"\" is not a DNS label") {
			t.Errorf("CheckHostName(%q) = %v, want ErrInvalidName naming the host", h, err)
		}
	}
}

// FuzzValidName holds validName to the RFC 1123 label grammar.
func FuzzValidName(f *testing.F) {
	for _, s := range []string{"web-01", "", "-", "a--b", "../etc", "x.y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validName(s), dnsLabel.MatchString(s); got != want {
			t.Fatalf("validName(%q) = %v, grammar says %v", s, got, want)
		}
	})
}

// FuzzLoadRecord feeds arbitrary bytes to the record decoder: it never
// panics, and a record it returns names its own directory. Anything else is
// unreadable, never absent.
func FuzzLoadRecord(f *testing.F) {
	f.Add([]byte(`{"name":"web-01","spec":{"vcpus":1}}`))
	f.Add([]byte(`{"name":"other"}`))
	f.Add([]byte(`{not json`))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := OpenStore(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(st.VMDir("web-01"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(st.RecordPath("web-01"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		rec, err := st.LoadRecord("web-01")
		switch {
		case err == nil && rec.Name != "web-01":
			t.Fatalf("record names %q", rec.Name)
		case errors.Is(err, fs.ErrNotExist):
			t.Fatalf("a present record read as absent: %v", err)
		case err != nil && !errors.Is(err, ErrRecordUnreadable):
			t.Fatalf("unexpected error kind: %v", err)
		}
	})
}
