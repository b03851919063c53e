package desired

import "regexp"

// Hash is a hex digest as gitfleet records it: a git commit or blob id (40
// hex digits, or 64 in a SHA-256 repository), a VM's spec hash (SpecHash,
// 64), a snapshot's content key or file hash in the ledger (16). The empty
// Hash is "none".
type Hash string

// fullHashRE matches a full SHA-1 or SHA-256 hash in lowercase hex.
var fullHashRE = regexp.MustCompile(`^([0-9a-f]{40}|[0-9a-f]{64})$`)

// Short abbreviates a full hash (40 or 64 lowercase hex digits) to its
// first 12 for a person, as git's own abbreviations do; anything else (a
// shorter digest, a branch name, a revision such as HEAD~1, "") is
// returned unchanged.
func (h Hash) Short() string {
	if !fullHashRE.MatchString(string(h)) {
		return string(h)
	}
	return string(h[:12])
}
