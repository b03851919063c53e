package trust

import (
	"strings"
	"testing"
)

// FuzzParseAllowedSigners: any input parses or fails with the file and
// line; a parsed signer always has a key and principals.
func FuzzParseAllowedSigners(f *testing.F) {
	key := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGJ0sY7c5VbqOZ3zVtnDQ6hxrsNrZuqzlaaJD4o7TX5j"
	for _, seed := range []string{
		"ann " + key + "\n",
		`"ann,bob" namespaces="git" valid-after="20240101" ` + key + " c\n",
		"# c\n\nann cert-authority " + key,
		"\"ann " + key,
		"ann valid-before=\"2024010112Z\" " + key,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data string) {
		got, err := ParseAllowedSigners("f", []byte(data))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f:") {
				t.Fatalf("error %q does not name the file and line", err)
			}
			return
		}
		for _, s := range got {
			if s.Key == nil || s.Principals == "" || s.Line < 1 {
				t.Fatalf("parsed %+v", s)
			}
		}
	})
}
