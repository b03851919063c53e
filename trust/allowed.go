package trust

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// SSHSigner is one line of an allowed-signers file: who (Principals, the
// line's first field, comma-separated patterns, reported only), the key,
// and the line's restrictions.
type SSHSigner struct {
	Principals string
	Key        ssh.PublicKey
	// Namespaces is the pattern list of the signature namespaces the key
	// may sign in (namespaces="git,file"), read as ssh-keygen reads it
	// (matchPatternList: * and ? wildcards, a !-negated pattern that
	// matches refuses); nil means any. A commit is signed in "git".
	Namespaces []string
	// ValidAfter and ValidBefore bound the time a signature counts at
	// (valid-after=, valid-before=): the time the verifier first saw the
	// commit (Signers.Verify), never the commit's own date, which its
	// signer writes; zero means unbounded.
	ValidAfter, ValidBefore time.Time
	// File and Line say where the line is, for messages.
	File string
	Line int
}

// Fingerprint is the key's SHA256 fingerprint, as ssh-keygen -l prints it.
func (s SSHSigner) Fingerprint() string { return ssh.FingerprintSHA256(s.Key) }

// ParseAllowedSigners reads an allowed-signers file (ssh-keygen(1), ALLOWED
// SIGNERS): one key per line as "principals [options] keytype base64-key
// [comment]"; empty lines and lines starting with # are skipped. The
// options understood are namespaces="…" (a pattern list, matched as
// ssh-keygen matches it), valid-after="…" and
// valid-before="…" (YYYYMMDD[HHMM[SS]], local time, or UTC with a Z
// suffix). cert-authority is refused: certificates are not supported, and
// a line silently dropped would read as a signer allowed. name is the file
// for messages; every error is "name:LINE: …".
//
// The key and its options are parsed by golang.org/x/crypto/ssh's
// ParseAuthorizedKey (the rest of the line is authorized_keys' format);
// only the principals field, which may be quoted, and the meaning of the
// options are read here.
func ParseAllowedSigners(name string, data []byte) ([]SSHSigner, error) {
	var out []SSHSigner
	for i, raw := range bytes.Split(data, []byte("\n")) {
		line := strings.TrimSpace(string(raw))
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s, err := parseSignerLine(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, i+1, err)
		}
		s.File, s.Line = name, i+1
		out = append(out, s)
	}
	return out, nil
}

// parseSignerLine parses one non-empty, non-comment line.
func parseSignerLine(line string) (SSHSigner, error) {
	principals, rest, err := cutPrincipals(line)
	if err != nil {
		return SSHSigner{}, err
	}
	key, _, options, _, err := ssh.ParseAuthorizedKey([]byte(rest))
	if err != nil {
		return SSHSigner{}, fmt.Errorf("principals %q: the key does not parse (want [options] keytype base64-key [comment]): %v", principals, err)
	}
	s := SSHSigner{Principals: principals, Key: key}
	for _, opt := range options {
		k, v, hasValue := strings.Cut(opt, "=")
		k = strings.ToLower(k)
		v = strings.Trim(v, `"`)
		switch {
		case k == "cert-authority" && !hasValue:
			return SSHSigner{}, errors.New("cert-authority: certificate authorities are not supported; list the signing keys themselves")
		case k == "namespaces" && hasValue:
			for _, n := range strings.Split(v, ",") {
				if n = strings.TrimSpace(n); n != "" {
					s.Namespaces = append(s.Namespaces, n)
				}
			}
			if len(s.Namespaces) == 0 {
				return SSHSigner{}, errors.New(`namespaces="": names no namespace`)
			}
		case (k == "valid-after" || k == "valid-before") && hasValue:
			t, err := parseKeyTime(v)
			if err != nil {
				return SSHSigner{}, fmt.Errorf("%s: %w", k, err)
			}
			if k == "valid-after" {
				s.ValidAfter = t
			} else {
				s.ValidBefore = t
			}
		default:
			return SSHSigner{}, fmt.Errorf("option %q is not one of namespaces=, valid-after=, valid-before=", k)
		}
	}
	return s, nil
}

// cutPrincipals splits the principals field off line: a token up to the
// first blank, or a double-quoted string.
func cutPrincipals(line string) (principals, rest string, err error) {
	if strings.HasPrefix(line, `"`) {
		end := strings.Index(line[1:], `"`)
		if end < 0 {
			return "", "", errors.New("principals: unterminated quote")
		}
		principals, rest = line[1:1+end], line[2+end:]
	} else {
		i := strings.IndexAny(line, " \t")
		if i < 0 {
			return "", "", errors.New("a line needs principals, then a key")
		}
		principals, rest = line[:i], line[i:]
	}
	if principals == "" {
		return "", "", errors.New("principals: empty")
	}
	if rest == "" || (rest[0] != ' ' && rest[0] != '\t') {
		return "", "", errors.New("principals: a blank must follow them")
	}
	return principals, strings.TrimSpace(rest), nil
}

// parseKeyTime parses ssh-keygen's YYYYMMDD[HHMM[SS]][Z]: local time, or
// UTC with a Z.
func parseKeyTime(v string) (time.Time, error) {
	loc := time.Local
	if strings.HasSuffix(v, "Z") {
		v, loc = strings.TrimSuffix(v, "Z"), time.UTC
	}
	layouts := map[int]string{8: "20060102", 12: "200601021504", 14: "20060102150405"}
	layout, ok := layouts[len(v)]
	if !ok {
		return time.Time{}, fmt.Errorf("%q is not YYYYMMDD[HHMM[SS]][Z]", v)
	}
	t, err := time.ParseInLocation(layout, v, loc)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is not YYYYMMDD[HHMM[SS]][Z]", v)
	}
	return t, nil
}

// allows reports whether s may sign in namespace a commit judged at when
// (the time the verifier first saw it; Signers.Verify). A refusal for the
// time wraps nothing but says which: kind is ErrKeyExpired past
// valid-before, ErrKeyNotYetValid before valid-after, nil for the
// namespace.
func (s SSHSigner) allows(namespace string, when time.Time) (kind, err error) {
	if s.Namespaces != nil && !matchPatternList(namespace, s.Namespaces) {
		return nil, fmt.Errorf("%s:%d allows namespaces %s, not %q", s.File, s.Line, strings.Join(s.Namespaces, ","), namespace)
	}
	if !s.ValidAfter.IsZero() && when.Before(s.ValidAfter) {
		return ErrKeyNotYetValid, fmt.Errorf("%s:%d is valid only after %s: not yet valid", s.File, s.Line, s.ValidAfter.UTC().Format(time.RFC3339))
	}
	if !s.ValidBefore.IsZero() && !when.Before(s.ValidBefore) {
		return ErrKeyExpired, fmt.Errorf("%s:%d is valid before %s: expired", s.File, s.Line, s.ValidBefore.UTC().Format(time.RFC3339))
	}
	return nil, nil
}

// matchPatternList reports whether name is allowed by patterns, as
// OpenSSH's match_pattern_list (match.c) decides for an allowed-signers
// line's namespaces=: a pattern of * (any run) and ? (any one character)
// wildcards, matched case-sensitively against the whole name; a pattern
// starting with ! that matches refuses name whatever the other patterns
// say; otherwise any matching pattern allows it.
func matchPatternList(name string, patterns []string) bool {
	allowed := false
	for _, p := range patterns {
		if neg, ok := strings.CutPrefix(p, "!"); ok {
			if matchPattern(name, neg) {
				return false
			}
			continue
		}
		if matchPattern(name, p) {
			allowed = true
		}
	}
	return allowed
}

// matchPattern matches name against an OpenSSH pattern of * and ?
// wildcards (no character classes: [ is an ordinary character).
func matchPattern(name, pattern string) bool {
	for pattern != "" {
		switch pattern[0] {
		case '*':
			rest := strings.TrimLeft(pattern, "*")
			if rest == "" {
				return true
			}
			for i := 0; i <= len(name); i++ {
				if matchPattern(name[i:], rest) {
					return true
				}
			}
			return false
		case '?':
			if name == "" {
				return false
			}
		default:
			if name == "" || name[0] != pattern[0] {
				return false
			}
		}
		name, pattern = name[1:], pattern[1:]
	}
	return name == ""
}

// ParseKeys reads public keys given one per entry, each as an
// authorized_keys line ("ssh-ed25519 AAAA… [comment]", the .pub file's
// line, no options), into allowed signers for any namespace and time:
// an agent's controllerKeys. name says where the list is, for messages
// ("FILE: controllerKeys"); an error is "name[i]: …". The comment (or
// "key i" without one) is the signer's principals, reported only.
func ParseKeys(name string, keys []string) ([]SSHSigner, error) {
	out := make([]SSHSigner, 0, len(keys))
	for i, k := range keys {
		pub, comment, options, rest, err := ssh.ParseAuthorizedKey([]byte(k))
		switch {
		case err != nil:
			return nil, fmt.Errorf("%s[%d]: not an SSH public key line (want keytype base64-key [comment], as in a .pub file): %v", name, i, err)
		case len(options) > 0:
			return nil, fmt.Errorf("%s[%d]: options are not allowed here; give the key line only", name, i)
		case len(bytes.TrimSpace(rest)) > 0:
			return nil, fmt.Errorf("%s[%d]: one key per entry", name, i)
		}
		if comment == "" {
			comment = fmt.Sprintf("key %d", i)
		}
		out = append(out, SSHSigner{Principals: comment, Key: pub, File: name, Line: i})
	}
	return out, nil
}
