package agent

import "fmt"

// validName reports whether s is an RFC 1123 DNS label: 1 to 63 lowercase
// letters, digits and '-', starting and ending with a letter or digit. Every
// VM and volume name is checked with it before it is joined into a path, so a
// snapshot can never aim a file operation outside the state directory. A
// label holds no '.', which also keeps the store's own suffixed files
// (.partial, .tombstone, .tmp) apart from any name.
func validName(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '-' && i > 0 && i < len(s)-1:
		default:
			return false
		}
	}
	return true
}

// checkName returns ErrInvalidName wrapped with the offending name and its
// kind ("vm" or "volume") when name is not a DNS label.
func checkName(kind, name string) error {
	if !validName(name) {
		return fmt.Errorf("%s name %q: %w", kind, name, ErrInvalidName)
	}
	return nil
}

// CheckHostName returns an error wrapping ErrInvalidName, naming the host and
// the rule, when host is not an RFC 1123 DNS label. A host name becomes a
// path on the snapshots and status branches, a directory's owner and a
// committer address, so it is checked before any of them is built.
func CheckHostName(host string) error {
	if !validName(host) {
		return fmt.Errorf("host %q is %w: 1 to 63 lowercase letters, digits and '-', starting and ending with a letter or digit", host, ErrInvalidName)
	}
	return nil
}
