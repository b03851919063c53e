package desired

import "testing"

func TestHashShort(t *testing.T) {
	sha1 := "0123456789abcdef0123456789abcdef01234567"
	sha256 := sha1 + "89abcdef0123456789abcdef"
	for in, want := range map[string]string{
		sha1:                         "0123456789ab",
		sha256:                       "0123456789ab",
		"0123456789abcdef":           "0123456789ab", // a ledger content key
		"0123456789ab":               "0123456789ab",
		"":                           "",
		"c1":                         "c1",
		"HEAD~1":                     "HEAD~1",
		"feature/a-long-branch-name": "feature/a-long-branch-name",
		"0123456789ABCDEF0123456789ABCDEF01234567": "0123456789ABCDEF0123456789ABCDEF01234567", // not git's spelling
	} {
		if got := Hash(in).Short(); got != want {
			t.Errorf("Hash(%q).Short() = %q, want %q", in, got, want)
		}
	}
}
