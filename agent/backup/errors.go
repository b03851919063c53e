package backup

import (
	"errors"
	"fmt"
	"strings"
)

// Classes of restic failures, for errors.Is on an *Error (or any error
// wrapping one).
var (
	// ErrWrongPassword: the password file's password opens no key of the
	// repository.
	ErrWrongPassword = errors.New("wrong repository password")
	// ErrRepositoryMissing: there is no repository at the URL (Init makes
	// one, and only when asked).
	ErrRepositoryMissing = errors.New("no repository at this location")
	// ErrRepositoryExists: Init found a repository already there.
	ErrRepositoryExists = errors.New("repository already exists")
	// ErrUnreachable: the repository's server could not be reached or
	// refused the connection (DNS, TCP, ssh, TLS, HTTP authentication).
	ErrUnreachable = errors.New("repository unreachable")
	// ErrTimeout: restic ran past its bound (Timeout, IdleTimeout,
	// MaintenanceTimeout) and was stopped.
	ErrTimeout = errors.New("restic did not finish in time")
	// ErrLocked: another restic holds a lock that conflicts, and it was
	// still held after LockWait.
	ErrLocked = errors.New("repository is locked")
	// ErrNoSpace: the repository's storage is full.
	ErrNoSpace = errors.New("repository storage is full")
	// ErrNotFound: no such snapshot, or no such file in it.
	ErrNotFound = errors.New("snapshot or file not found")
	// ErrIncomplete: restic made a snapshot from input it could not read
	// whole (exit status 3); the snapshot was forgotten.
	ErrIncomplete = errors.New("restic could not read all of its input")
	// ErrProducer: the stream given to Backup failed, or ended before or
	// after BackupRequest.Size bytes; restic was stopped before it saved a
	// snapshot.
	ErrProducer = errors.New("backup stream failed")
	// ErrDamaged: check found errors in the repository.
	ErrDamaged = errors.New("repository check found errors")
	// ErrConfig: the Repository or the request is unusable as given (a
	// URL with a password, a password file others can read, a bad
	// environment file line, a tag with a comma). Retrying does not help.
	ErrConfig = errors.New("backup configuration")
	// ErrOutOfScope: a Forget named snapshots outside its scope, or a
	// scope without gitfleet's tag and a host.
	ErrOutOfScope = errors.New("outside gitfleet's scope")
)

// Error is a failed restic run. Op is the restic command ("backup",
// "snapshots", …), Kind the class (one of the Err sentinels, or nil when
// restic's output names none), ExitCode restic's exit status (-1 when it
// was killed or never started), Stderr the last lines of its standard
// error with every secret removed, and Err a further cause (a timeout, an
// exec failure, a stream's error).
type Error struct {
	Op       string
	Kind     error
	ExitCode int
	Stderr   string
	Err      error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("restic " + e.Op)
	if e.Kind != nil {
		b.WriteString(": " + e.Kind.Error())
	}
	if e.Err != nil {
		b.WriteString(": " + e.Err.Error())
	}
	if e.ExitCode > 0 {
		fmt.Fprintf(&b, " (exit status %d)", e.ExitCode)
	}
	if e.Stderr != "" {
		b.WriteString(": " + e.Stderr)
	}
	return b.String()
}

// Is reports whether target is e's Kind.
func (e *Error) Is(target error) bool { return e.Kind != nil && target == e.Kind }

// Unwrap returns the further cause.
func (e *Error) Unwrap() error { return e.Err }

// configError is an ErrConfig *Error for op.
func configError(op, format string, args ...any) error {
	return &Error{Op: op, Kind: ErrConfig, ExitCode: -1, Err: fmt.Errorf(format, args...)}
}

// Exit statuses restic documents: 3 for a snapshot made from partly
// unreadable input (backup), and since 0.17 10, 11 and 12 for a missing
// repository, a lock and a wrong password. 130 is an interrupt.
const (
	exitIncomplete = 3
	exitNoRepo     = 10
	exitLocked     = 11
	exitPassword   = 12
)

// stderrClasses map phrases of restic's (and its backends', ssh's) error
// text to classes, first match wins: network failures come before "unable
// to open config file", which restic also prints when the config could
// not be fetched at all.
var stderrClasses = []struct {
	phrase string
	kind   error
}{
	{"wrong password or no key found", ErrWrongPassword},
	{"repository is already locked", ErrLocked},
	{"unable to create lock in backend", ErrLocked},
	{"no space left on device", ErrNoSpace},
	{"disk quota exceeded", ErrNoSpace},
	{"insufficient storage", ErrNoSpace},
	{"file too large", ErrNoSpace},
	{"config file already exists", ErrRepositoryExists},
	{"connection refused", ErrUnreachable},
	{"no route to host", ErrUnreachable},
	{"network is unreachable", ErrUnreachable},
	{"no such host", ErrUnreachable},
	{"i/o timeout", ErrUnreachable},
	{"connection timed out", ErrUnreachable},
	{"connection reset", ErrUnreachable},
	{"host key verification failed", ErrUnreachable},
	{"permission denied (publickey", ErrUnreachable},
	{"unable to start the sftp session", ErrUnreachable},
	{"ssh command exited", ErrUnreachable},
	{"unauthorized", ErrUnreachable},
	{"tls: ", ErrUnreachable},
	{"x509: ", ErrUnreachable},
	{"repository does not exist", ErrRepositoryMissing},
	{"is there a repository at the following location", ErrRepositoryMissing},
	{"unable to open config file", ErrRepositoryMissing},
	{"no matching id found", ErrNotFound},
	{"no snapshot found", ErrNotFound},
	{"not found in snapshot", ErrNotFound},
	{"cannot dump file", ErrNotFound},
	{"does not exist in snapshot", ErrNotFound},
	{"repository contains errors", ErrDamaged},
}

// classify names the class of a restic run that exited with code and
// wrote stderr (already redacted); nil when nothing says.
func classify(code int, stderr string) error {
	switch code {
	case exitNoRepo:
		return ErrRepositoryMissing
	case exitLocked:
		return ErrLocked
	case exitPassword:
		return ErrWrongPassword
	}
	low := strings.ToLower(stderr)
	for _, c := range stderrClasses {
		if strings.Contains(low, c.phrase) {
			return c.kind
		}
	}
	if code == exitIncomplete {
		return ErrIncomplete
	}
	return nil
}
