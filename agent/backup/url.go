package backup

import (
	"fmt"
	"net"
	"net/url"
	"path"
	"strings"
)

// Backends of restic's repository locations (restic's "Preparing a new
// repository" documentation), as Location.Backend.
const (
	BackendLocal  = "local"
	BackendSFTP   = "sftp"
	BackendREST   = "rest"
	BackendS3     = "s3"
	BackendB2     = "b2"
	BackendAzure  = "azure"
	BackendGS     = "gs"
	BackendSwift  = "swift"
	BackendRclone = "rclone"
)

// Location is a parsed restic repository location. Backend is one of the
// Backend constants; for sftp and rest User, Host and Port (empty when the
// location names none) say which server is reached, for s3 Host is the
// endpoint; Path is the path on it (local: the directory).
type Location struct {
	Backend string
	User    string
	Host    string
	Port    string
	Path    string
}

// CheckURL reports whether s is a repository location gitfleet accepts:
// one restic parses (an absolute local path, sftp:, rest:, s3:, b2:,
// azure:, gs:, swift:, rclone:) that carries no secret. A password in the
// location (rest:https://user:pass@host/, sftp://user:pass@host/) is
// refused: credentials belong in the host's environment file
// (RESTIC_REST_USERNAME and RESTIC_REST_PASSWORD, AWS_*, …), never in git.
// So are a query string (where signed URLs keep their secrets), white
// space and control characters, and a leading "-". Errors wrap ErrConfig
// and never quote the rejected secret.
func CheckURL(s string) error {
	_, err := ParseURL(s)
	return err
}

// ParseURL parses s as CheckURL checks it.
func ParseURL(s string) (Location, error) {
	bad := func(format string, args ...any) (Location, error) {
		return Location{}, configError("repository", "location %s: %s", redactLocation(s), fmt.Sprintf(format, args...))
	}
	if s == "" {
		return bad("empty")
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f {
			return bad("white space or a control character")
		}
	}
	if strings.HasPrefix(s, "-") {
		return bad("starts with '-'")
	}
	if strings.HasPrefix(s, "/") {
		return Location{Backend: BackendLocal, Path: path.Clean(s)}, nil
	}
	backend, rest, ok := strings.Cut(s, ":")
	if !ok {
		return bad("not an absolute path and no backend prefix (sftp:, rest:, s3:, …)")
	}
	if strings.Contains(rest, "?") {
		return bad("a query string: credentials belong in the environment file")
	}
	switch backend {
	case BackendLocal:
		if !strings.HasPrefix(rest, "/") {
			return bad("a local repository needs an absolute path")
		}
		return Location{Backend: BackendLocal, Path: path.Clean(rest)}, nil
	case BackendSFTP:
		return parseSFTP(s, rest)
	case BackendREST:
		return parseHTTP(s, BackendREST, rest)
	case BackendS3:
		if strings.Contains(rest, "://") {
			return parseHTTP(s, BackendS3, rest)
		}
		host, p, _ := strings.Cut(rest, "/")
		if host == "" || strings.Contains(host, "@") {
			return bad("s3: want s3:host/bucket or s3:https://host/bucket")
		}
		return Location{Backend: BackendS3, Host: host, Path: "/" + p}, nil
	case BackendB2, BackendAzure, BackendGS, BackendSwift, BackendRclone:
		if rest == "" || strings.Contains(rest, "@") || strings.Contains(rest, "://") {
			return bad("%s: want %s:<container>:<path> without credentials", backend, backend)
		}
		return Location{Backend: backend, Path: rest}, nil
	}
	return bad("unknown backend %q", backend)
}

// parseSFTP parses restic's two sftp forms: sftp:[user@]host:path and
// sftp://[user@]host[:port]/path (restic reads the path after the host's
// slash, so //srv/repo is absolute).
func parseSFTP(s, rest string) (Location, error) {
	bad := func(why string) (Location, error) {
		return Location{}, configError("repository", "location %s: %s", redactLocation(s), why)
	}
	if strings.HasPrefix(rest, "//") {
		u, err := url.Parse(s)
		if err != nil {
			return bad("not a URL")
		}
		if _, has := u.User.Password(); has {
			return bad("a password in the location: use an ssh key (sshKey) instead")
		}
		if u.Hostname() == "" {
			return bad("no host")
		}
		return Location{Backend: BackendSFTP, User: u.User.Username(), Host: u.Hostname(), Port: u.Port(), Path: strings.TrimPrefix(u.Path, "/")}, nil
	}
	userHost, p, ok := cutHostPath(rest)
	if !ok || p == "" {
		return bad("want sftp:[user@]host:/path")
	}
	loc := Location{Backend: BackendSFTP, Host: userHost, Path: p}
	if at := strings.LastIndex(userHost, "@"); at >= 0 {
		loc.User, loc.Host = userHost[:at], userHost[at+1:]
		if strings.Contains(loc.User, ":") {
			return bad("a password in the location: use an ssh key (sshKey) instead")
		}
	}
	loc.Host = strings.TrimSuffix(strings.TrimPrefix(loc.Host, "["), "]")
	if loc.Host == "" {
		return bad("no host")
	}
	return loc, nil
}

// cutHostPath splits "[user@]host:path" (host may be a bracketed IPv6
// address) at the colon after the host.
func cutHostPath(s string) (host, p string, ok bool) {
	start := 0
	if at := strings.LastIndex(s, "@"); at >= 0 {
		start = at + 1
	}
	if strings.HasPrefix(s[start:], "[") {
		end := strings.Index(s[start:], "]")
		if end < 0 {
			return "", "", false
		}
		start += end
	}
	i := strings.Index(s[start:], ":")
	if i < 0 {
		return "", "", false
	}
	return s[:start+i], s[start+i+1:], true
}

// parseHTTP parses rest:URL and s3:URL.
func parseHTTP(s, backend, raw string) (Location, error) {
	bad := func(why string) (Location, error) {
		return Location{}, configError("repository", "location %s: %s", redactLocation(s), why)
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return bad(backend + ": want " + backend + ":https://host[:port]/path")
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			return bad("a password in the location: put RESTIC_REST_USERNAME and RESTIC_REST_PASSWORD (or the backend's credentials) in the environment file")
		}
		return bad("a user in the location: put it in the environment file (RESTIC_REST_USERNAME)")
	}
	if u.Fragment != "" {
		return bad("a fragment")
	}
	return Location{Backend: backend, Host: u.Hostname(), Port: u.Port(), Path: u.Path}, nil
}

// redactLocation is s with anything that may be a secret (user
// information, a query) masked, for errors.
func redactLocation(s string) string {
	if i := strings.Index(s, "?"); i >= 0 {
		s = s[:i] + "?***"
	}
	scheme := strings.Index(s, "://")
	at := strings.LastIndex(s, "@")
	switch {
	case at >= 0 && scheme >= 0 && at > scheme:
		return s[:scheme+3] + "***" + s[at:]
	case at >= 0:
		head, _, _ := strings.Cut(s, ":")
		return head + ":***" + s[at:]
	}
	return s
}

// hostPort joins a Location's host and port for ssh ("" port: ssh's
// default).
func (l Location) hostPort() string {
	if l.Port == "" {
		return l.Host
	}
	return net.JoinHostPort(l.Host, l.Port)
}
