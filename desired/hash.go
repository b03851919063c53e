package desired

import "regexp"

// Hash is a hex digest as gitfleet records it: a git commit or blob id (40
// hex digits, or 64 in a SHA-256 repository), a VM's spec hash (SpecHash,
// 64), a snapshot's content key or file hash in the ledger (16). The empty
// Hash is "none".
type Hash string

// longHexRE matches lowercase hex digits, more than a Short hash has.
var longHexRE = regexp.MustCompile(`^[0-9a-f]{13,}$`)

// Short abbreviates a hash for a person to its first 12 hex digits, as
// git's own abbreviations do. Anything that is not lowercase hex (a branch
// name, a revision such as HEAD~1) or already 12 digits or fewer is
// returned unchanged.
func (h Hash) Short() string {
	if !longHexRE.MatchString(string(h)) {
		return string(h)
	}
	return string(h[:12])
}
