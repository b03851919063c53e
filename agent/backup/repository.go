package backup

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gitfleet/gitfleet/internal/redact"
	"github.com/gitfleet/gitfleet/internal/secretfile"
)

// Repository is one restic repository as this host reaches it. Only URL,
// PasswordFile and CacheDir are required; zero values take the defaults
// given. Paths are the host's own (from the agent's configuration), never
// from git.
type Repository struct {
	// URL is restic's repository location (see CheckURL): an absolute
	// local path, sftp:user@host:/path, rest:https://host/path, s3:…,
	// and so on, with no secret in it.
	URL string
	// PasswordFile holds the repository password (restic reads it through
	// RESTIC_PASSWORD_FILE). It must be a regular file of mode 0600 or
	// 0400 owned by root or this process's user, at most 4 KiB.
	PasswordFile string
	// EnvironmentFile, optional, holds credentials for the backend, one
	// KEY=VALUE a line ('#' comments, blank lines, and a value in single
	// or double quotes allowed): AWS_*, B2_*, AZURE_*, GOOGLE_*, OS_*,
	// ST_*, RESTIC_REST_USERNAME, RESTIC_REST_PASSWORD. Mode as
	// PasswordFile; any other key is refused with the file and line.
	EnvironmentFile string
	// SSHKey and KnownHosts, for an sftp: URL, are the private key ssh
	// logs in with and the known_hosts file that must name the server's
	// host key (checked strictly: an unknown or changed key fails). Both
	// or neither; SFTPCommand replaces them.
	SSHKey     string
	KnownHosts string
	// SFTPCommand, for an sftp: URL, is the whole command restic runs to
	// reach the server (restic's -o sftp.command), for setups SSHKey and
	// KnownHosts do not cover. "" builds it from SSHKey and KnownHosts, or
	// leaves restic's default (ssh with the agent user's configuration)
	// when those are empty too.
	SFTPCommand string
	// CacheDir is restic's cache (--cache-dir). Required.
	CacheDir string
	// TempDir is where restic writes temporary pack files (TMPDIR);
	// "" inherits TMPDIR, else /tmp.
	TempDir string
	// Restic is the restic binary (default "restic", from PATH).
	Restic string
	// Timeout bounds a command that moves no disk stream: version,
	// snapshots, init, unlock, forget (default 5 min).
	Timeout time.Duration
	// IdleTimeout stops a Backup or Dump during which no byte moved and
	// restic printed nothing for this long (default 5 min); the stream
	// itself may take as long as it keeps moving (and the caller's
	// context allows).
	IdleTimeout time.Duration
	// MaintenanceTimeout bounds Prune and Check (default 12 h).
	MaintenanceTimeout time.Duration
	// LockWait is how long a command waits for a conflicting lock held by
	// another restic (default 10 min).
	LockWait time.Duration

	mu      sync.Mutex
	version *Version
}

// Defaults of the Repository's durations.
const (
	DefaultTimeout            = 5 * time.Minute
	DefaultIdleTimeout        = 5 * time.Minute
	DefaultMaintenanceTimeout = 12 * time.Hour
	DefaultLockWait           = 10 * time.Minute
)

func (r *Repository) timeout() time.Duration     { return orDefault(r.Timeout, DefaultTimeout) }
func (r *Repository) idleTimeout() time.Duration { return orDefault(r.IdleTimeout, DefaultIdleTimeout) }
func (r *Repository) lockWait() time.Duration    { return orDefault(r.LockWait, DefaultLockWait) }
func (r *Repository) maintenanceTimeout() time.Duration {
	return orDefault(r.MaintenanceTimeout, DefaultMaintenanceTimeout)
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

func (r *Repository) binary() string {
	if r.Restic == "" {
		return "restic"
	}
	return r.Restic
}

// secretLimit bounds the password, key and environment files.
const secretLimit = 64 << 10

// session is what one restic run needs from the Repository's files: the
// environment, the global arguments, the secrets to redact from its
// output, and files to remove afterwards.
type session struct {
	env     []string
	global  []string
	secrets []string
	cleanup func()
}

// redact removes every secret of s, and every URL's user information,
// from text.
func (s *session) redact(text string) string {
	for _, v := range s.secrets {
		if len(v) >= 3 {
			text = strings.ReplaceAll(text, v, redact.Mask)
		}
	}
	return redact.Text(text)
}

// credentialKey is what an environment file may set: the credentials
// restic's backends read (restic's "Environment variables" list).
var credentialKey = regexp.MustCompile(`^(AWS_|B2_|AZURE_|GOOGLE_|OS_|ST_)[A-Z0-9_]+$|^RESTIC_REST_(USERNAME|PASSWORD)$`)

// readEnvironmentFile parses an EnvironmentFile (see Repository).
func readEnvironmentFile(path string) ([]string, []string, error) {
	data, err := secretfile.Read(path, "restic environment file", "others can read the repository's credentials", secretLimit)
	if err != nil {
		return nil, nil, configError("repository", "%v", err)
	}
	var env, values []string
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(strings.TrimSuffix(line, "\r"))
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		key = strings.TrimSpace(strings.TrimPrefix(key, "export "))
		if !ok || !credentialKey.MatchString(key) {
			return nil, nil, configError("repository", "%s line %d: %q is not a credential restic reads (want AWS_*, B2_*, AZURE_*, GOOGLE_*, OS_*, ST_*, RESTIC_REST_USERNAME or RESTIC_REST_PASSWORD = value)", path, i+1, key)
		}
		if n := len(value); n >= 2 && (value[0] == '"' || value[0] == '\'') && value[n-1] == value[0] {
			value = value[1 : n-1]
		}
		env = append(env, key+"="+value)
		values = append(values, value)
	}
	return env, values, nil
}

// prepare checks the Repository and builds a session for one run of op.
func (r *Repository) prepare(op string) (*session, error) {
	loc, err := ParseURL(r.URL)
	if err != nil {
		return nil, err
	}
	if r.CacheDir == "" {
		return nil, configError(op, "Repository.CacheDir is required")
	}
	if r.PasswordFile == "" {
		return nil, configError(op, "Repository.PasswordFile is required")
	}
	pw, err := secretfile.Read(r.PasswordFile, "restic password file", "others can read the repository password", 4096)
	if err != nil {
		return nil, configError(op, "%v", err)
	}
	s := &session{cleanup: func() {}}
	if p := strings.TrimRight(string(pw), "\r\n"); p != "" {
		s.secrets = append(s.secrets, p)
	} else {
		return nil, configError(op, "restic password file %s is empty", r.PasswordFile)
	}
	s.env = baseEnv(r.TempDir)
	s.env = append(s.env, "RESTIC_PASSWORD_FILE="+r.PasswordFile)
	if r.EnvironmentFile != "" {
		env, values, err := readEnvironmentFile(r.EnvironmentFile)
		if err != nil {
			return nil, err
		}
		s.env = append(s.env, env...)
		s.secrets = append(s.secrets, values...)
	}
	s.global = []string{"--repo=" + r.URL, "--cache-dir=" + r.CacheDir}
	if loc.Backend == BackendSFTP {
		cmd, err := r.sftpCommand(loc)
		if err != nil {
			return nil, err
		}
		if cmd != "" {
			s.global = append(s.global, "--option=sftp.command="+cmd)
		}
	}
	return s, nil
}

// baseEnv is the part of the agent's environment restic inherits.
func baseEnv(tmp string) []string {
	env := []string{"PATH=" + envOr("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")}
	if h := os.Getenv("HOME"); h != "" {
		env = append(env, "HOME="+h)
	}
	if tmp == "" {
		tmp = os.Getenv("TMPDIR")
	}
	if tmp != "" {
		env = append(env, "TMPDIR="+tmp)
	}
	return env
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// sftpCommand is the ssh command restic runs for an sftp location: the
// configured SFTPCommand, or one built from SSHKey and KnownHosts that
// reads no ssh configuration, never prompts, checks the host key strictly
// and gives up on a dead connection after about a minute.
func (r *Repository) sftpCommand(loc Location) (string, error) {
	if r.SFTPCommand != "" {
		if r.SSHKey != "" || r.KnownHosts != "" {
			return "", configError("repository", "SFTPCommand replaces SSHKey and KnownHosts: give one or the other")
		}
		return r.SFTPCommand, nil
	}
	if r.SSHKey == "" && r.KnownHosts == "" {
		return "", nil
	}
	if r.SSHKey == "" || r.KnownHosts == "" {
		return "", configError("repository", "an sftp repository needs both SSHKey and KnownHosts (strict host key checking)")
	}
	if _, err := secretfile.Read(r.SSHKey, "ssh key", "others can read the private key", secretLimit); err != nil {
		return "", configError("repository", "%v", err)
	}
	if _, err := os.Stat(r.KnownHosts); err != nil {
		return "", configError("repository", "known_hosts: %v", err)
	}
	for _, p := range []string{r.SSHKey, r.KnownHosts} {
		if strings.ContainsAny(p, "\"'\\ \t\n") {
			return "", configError("repository", "ssh file %q: quotes, backslashes and white space are not allowed in its path", p)
		}
	}
	args := []string{"ssh", "-F", "/dev/null",
		"-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-i", r.SSHKey,
		"-o", "UserKnownHostsFile=" + r.KnownHosts, "-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=" + strconv.Itoa(connectTimeout(r.timeout())),
		"-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4"}
	if loc.Port != "" {
		args = append(args, "-p", loc.Port)
	}
	if loc.User != "" {
		args = append(args, "-l", loc.User)
	}
	host := loc.Host
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if strings.HasPrefix(host, "-") {
		return "", configError("repository", "sftp host %q starts with '-'", host)
	}
	args = append(args, host, "-s", "sftp")
	return strings.Join(args, " "), nil
}

// tail keeps the last max bytes written to it, starting at a line.
type tail struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - 2*t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := bytes.TrimSpace(t.buf)
	if len(b) > t.max {
		b = b[len(b)-t.max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 && i < len(b)-1 {
			b = b[i+1:]
		}
	}
	// restic clears its progress line with ANSI sequences even when not
	// on a terminal.
	return strings.ReplaceAll(string(b), "\x1b[2K", "")
}

// checkTags refuses tags restic would split or misread: empty, with a
// comma (restic's AND separator) or white space.
func checkTags(op string, tags []string) error {
	for _, t := range tags {
		if t == "" || strings.ContainsAny(t, ", \t\n") {
			return configError(op, "tag %q: empty, or has a comma or white space", t)
		}
	}
	return nil
}

func formatDuration(d time.Duration) string {
	return fmt.Sprintf("%ds", int64((d+time.Second-1)/time.Second))
}

// connectTimeout is ssh's ConnectTimeout in seconds: half the command's
// bound, between 5 and 30 s, so an unreachable server is reported as such
// before the command's own bound ends it.
func connectTimeout(timeout time.Duration) int {
	return int(min(max(timeout/2, 5*time.Second), 30*time.Second) / time.Second)
}
