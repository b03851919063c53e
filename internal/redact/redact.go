// Package redact removes credentials from URLs and from text that may
// contain URLs, before the text reaches a log line, an error stored on a
// branch (status lastError, the ledger's rejected reason, the summary) or a
// metric.
//
// One rule for every URL form: user information (https://TOKEN@host,
// https://user:password@host) becomes "***" as a whole, and the value of
// every query parameter becomes "***" with its name kept
// (?private_token=***&ref=***). Query values are all redacted, not only
// those named like a token, because a signed URL carries its secret in
// parameters of any name. Paths and hosts are kept: they say which
// repository or artifact an error is about.
//
// Text redacts every URL it finds in free text (an error message that
// quotes a URL, a log line), including scp-like git remotes with a user
// (user@host:path stays, it names no secret) and URLs that do not parse.
package redact

import (
	"bytes"
	"net/url"
	"regexp"
	"strings"

	"github.com/sirupsen/logrus"
)

// Mask replaces a secret.
const Mask = "***"

// urlPattern finds URL-like runs in text: a scheme followed by "://" and
// everything up to white space or a character that ends a quoted URL.
var urlPattern = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s"'<>\x60]+`)

// scpLike is git's scp-like remote, user@host:path; its host and path
// are submatch 1.
var scpLike = regexp.MustCompile(`^[^\s@:/]+@([A-Za-z0-9.-]+:[^\s@:]*)$`)

// URL returns raw with its user information and query values masked. A
// string that does not parse as a URL is masked from its "://" on after
// the host, since it may still carry a secret; a scp-like git remote
// (git@github.com:org/fleet.git) keeps its host and path
// (***@github.com:org/fleet.git).
func URL(raw string) string {
	if m := scpLike.FindStringSubmatch(raw); m != nil {
		return Mask + "@" + m[1] // like any URL's user information
	}
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" {
		return unparsable(raw)
	}
	if u.User != nil {
		u.User = url.User(Mask)
	}
	if u.RawQuery != "" {
		u.RawQuery = query(u.RawQuery)
	}
	if u.Fragment != "" || u.RawFragment != "" {
		u.Fragment, u.RawFragment = Mask, ""
	}
	// url.URL.String escapes the mask in user info; keep it readable.
	return strings.Replace(u.String(), "%2A%2A%2A@", Mask+"@", 1)
}

// query masks every value of a raw query, keeping names and order.
func query(raw string) string {
	parts := strings.Split(raw, "&")
	for i, p := range parts {
		name, _, hasValue := strings.Cut(p, "=")
		if hasValue {
			parts[i] = name + "=" + Mask
		} else if p != "" {
			// A bare value (?TOKEN) is as secret as a named one.
			parts[i] = Mask
		}
	}
	return strings.Join(parts, "&")
}

// unparsable keeps the scheme and host of a URL that does not parse and
// masks the rest.
func unparsable(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return Mask
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		rest = rest[at+1:]
	}
	host, _, _ := strings.Cut(rest, "/")
	host, _, _ = strings.Cut(host, "?")
	return scheme + "://" + host + "/" + Mask
}

// Text returns s with every URL in it redacted by URL.
func Text(s string) string {
	if !strings.Contains(s, "://") {
		return s
	}
	return urlPattern.ReplaceAllStringFunc(s, func(m string) string {
		// Trailing punctuation belongs to the sentence, not the URL.
		trimmed := strings.TrimRight(m, ".,;:)]}")
		return URL(trimmed) + m[len(trimmed):]
	})
}

// Formatter wraps a logrus formatter and redacts every URL in each
// formatted entry (message and fields alike), so no logger that uses it
// writes a credential whatever a caller passes it.
type Formatter struct {
	Inner logrus.Formatter
}

// Format formats e with the inner formatter and redacts the result.
func (f Formatter) Format(e *logrus.Entry) ([]byte, error) {
	b, err := f.Inner.Format(e)
	if err != nil || !bytes.Contains(b, []byte("://")) {
		return b, err
	}
	return []byte(Text(string(b))), nil
}

// Logger sets log's formatter to redact everything it writes (wrapping the
// formatter it has) and returns log.
func Logger(log *logrus.Logger) *logrus.Logger {
	if _, ok := log.Formatter.(Formatter); !ok {
		log.SetFormatter(Formatter{Inner: log.Formatter})
	}
	return log
}
