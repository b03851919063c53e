// Package backup drives the restic command-line program for gitfleet's
// backups: one Repository value per restic repository a host writes to,
// with a method per restic command gitfleet uses (Init, Backup, Dump,
// Snapshots, Forget, Prune, Check, Unlock, Version), and the layout of a
// gitfleet backup inside a repository (layout.go), which is the contract a
// person restores by hand with restic alone.
//
// Usage:
//
//	repo := &backup.Repository{
//		URL:          "sftp:backup@nas.example:/srv/restic",
//		PasswordFile: "/etc/gitfleet/restic/password",   // 0600, root's
//		SSHKey:       "/etc/gitfleet/restic/id_ed25519",
//		KnownHosts:   "/etc/gitfleet/restic/known_hosts",
//		CacheDir:     "/var/cache/gitfleet/restic",
//	}
//	res, err := repo.Backup(ctx, stream, backup.BackupRequest{
//		Filename: backup.DiskFilename("web-01", "root"), Host: "hv-a",
//		Tags: backup.DiskTags("web-01", "root", id), Size: size})
//
// How restic is run. Every argument is explicit: the repository (--repo,
// or --repository-file), --cache-dir, --json where the command has it, and
// for sftp an ssh command built from SSHKey and KnownHosts (strict host key
// checking, no user or system ssh configuration). Secrets never appear on
// a command line or in a log: the password reaches restic as
// RESTIC_PASSWORD_FILE, credentials (AWS_*, B2_*, RESTIC_REST_*, …) from
// EnvironmentFile as environment variables, and restic inherits nothing
// else of the agent's environment but PATH, HOME and TMPDIR. Every run is
// bounded in time (Timeout, IdleTimeout for streams, MaintenanceTimeout
// for prune and check) and ends by SIGINT, then SIGKILL of its process
// group (restic's ssh included). Every exit status is checked: restic's 3
// (snapshot made from unreadable input) is a failure, and the snapshot it
// made is forgotten.
//
// A stream that fails or is cut short never becomes a snapshot: restic
// saves a --stdin snapshot when its standard input ends, so Backup keeps
// restic's input open when the producer fails (or yields a byte count other
// than BackupRequest.Size) and interrupts restic first; restic then exits
// without saving. The caller's stream must in turn return io.EOF only once
// it is whole (see agent.DiskStream).
//
// Errors are *Error values whose Kind is one of the sentinels below, for
// errors.Is: ErrWrongPassword, ErrRepositoryMissing, ErrRepositoryExists,
// ErrUnreachable, ErrTimeout, ErrLocked, ErrNoSpace, ErrNotFound,
// ErrIncomplete, ErrProducer, ErrDamaged, ErrConfig, ErrOutOfScope. Their
// text carries the last lines of restic's standard error with the
// password, every credential value and every URL's user information
// removed.
//
// Locks. Backups take restic's shared lock, so several hosts back up into
// one repository at once; Forget, Prune and Check take its exclusive lock.
// A lock held by someone else is waited for up to LockWait (restic 0.16's
// --retry-lock where present, else a retry loop here); between attempts
// Unlock removes stale locks only — those of a restic that died on this
// host, or not refreshed for 30 minutes — never with --remove-all.
//
// Versions. Debian 12 ships restic 0.14, the oldest supported. Newer
// behaviour is used only where Version reports it: --retry-lock (0.16),
// RESTIC_REST_USERNAME/RESTIC_REST_PASSWORD (0.16.1; older versions get
// the credentials in a URL inside a private --repository-file instead),
// and the exit codes 10, 11 and 12 (0.17) for a missing repository, a lock
// and a wrong password, which older versions report only in text.
//
// A Repository is safe for concurrent use: each call runs its own restic
// process. It must not be copied after first use.
package backup
