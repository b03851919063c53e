package config

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/trust"
)

// Repo names a remote repository and its credentials, for the controller,
// plan and status.
type Repo struct {
	// URL is a URL (file, http(s), ssh) or a local path.
	URL string
	// StatusURL is the repository of the status branch and the host
	// branches when they are not in URL's ("": URL's; fleet.Config
	// StatusURL), reached with the same credentials.
	StatusURL string
	// Token authenticates to an http(s) remote; SSHKey and KnownHosts are
	// files for an ssh remote (KnownHosts default ~/.ssh/known_hosts).
	Token, SSHKey, KnownHosts string
}

// Bind binds --repo, --token, --ssh-key and --known-hosts with their
// variables GITFLEET_REPO, GITFLEET_TOKEN, GITFLEET_SSH_KEY and
// GITFLEET_KNOWN_HOSTS.
func (r *Repo) Bind(f *Flags) {
	f.URL(&r.URL, "repo", "GITFLEET_REPO", "fleet repository: URL (file, http(s), ssh) or local path")
	f.String(&r.Token, "token", "GITFLEET_TOKEN", "token for an http(s) remote; better set the variable, which stays off the command line")
	f.Path(&r.SSHKey, "ssh-key", "GITFLEET_SSH_KEY", "private key file for an ssh remote")
	f.Path(&r.KnownHosts, "known-hosts", "GITFLEET_KNOWN_HOSTS", "known_hosts file for an ssh remote (default ~/.ssh/known_hosts)")
}

// BindStatus binds --status-repo with GITFLEET_STATUS_REPO (the
// controller and status commands).
func (r *Repo) BindStatus(f *Flags) {
	f.URL(&r.StatusURL, "status-repo", "GITFLEET_STATUS_REPO", "repository of the status branch and the agents' host branches, when not --repo (agents: statusRepo.url); same credentials")
}

// Check returns an ErrUsage error when no repository is named.
func (r Repo) Check() error {
	if r.URL == "" {
		return usageError(errors.New("--repo is required (or set GITFLEET_REPO)"))
	}
	return nil
}

// Auth is the repository's credentials.
func (r Repo) Auth() gitsource.Auth {
	return gitsource.Auth{Token: r.Token, SSHKeyFile: r.SSHKey, KnownHostsFile: r.KnownHosts}
}

// Controller is the controller's configuration: flags over their
// variables over DefaultController. Check and fleet.New validate it.
type Controller struct {
	Repo Repo
	// Branch holds the desired state, Path the objects' directory in it,
	// CacheDir the local clone kept between runs ("": fleet.Config's
	// default; gitfleet controller then clones into a private temporary
	// directory).
	Branch, Path, CacheDir string
	// Interval is the poll interval (jittered; fleet.Controller.Run keeps it
	// at most OfflineAfter/6).
	Interval time.Duration
	// Listen is the address of /metrics and /healthz ("" off);
	// WebhookListen the address of the webhooks, on a server of their own
	// ("" off); WebhookSecret the webhooks' shared secret.
	Listen, WebhookListen, WebhookSecret string
	// AbandonGrace, OfflineAfter and GitTimeout: see fleet.Config.
	AbandonGrace, OfflineAfter, GitTimeout time.Duration
	// SnapshotsBranch and StatusBranch: see fleet.Config.
	SnapshotsBranch, StatusBranch string
	// Signatures says which commits must be signed, and by whom.
	Signatures Signatures
	// MaxDeletes is the mass-delete guard's limit (fleet.DeleteGuard):
	// default fleet.DefaultMaxDeletes, negative off.
	MaxDeletes int
	// SigningKey is the private SSH key file the controller signs its
	// snapshots commits with (trust.LoadCommitSigner: unencrypted, mode 0600); ""
	// signs nothing.
	SigningKey string
	// ControllerKeys is an allowed-signers file (ssh-keygen -Y format, as
	// an agent's controllerKeysFile) of the other controllers' keys whose
	// snapshots commits this one trusts besides its own ("": none);
	// TrustUnsignedLedgerOnce is the full hash of the snapshots commit
	// whose unsigned ledger a person checked, adopted at the first start
	// with a signing key when it is the tip (fleet.Config); "" adopts
	// none.
	ControllerKeys          string
	TrustUnsignedLedgerOnce string
}

// Signatures is the signed-desired-state setting of the controller and of
// plan: the mode (off, head or every, see fleet.VerifyMode) and the files
// of the allowed signers.
type Signatures struct {
	Mode string
	// AllowedSigners is an allowed-signers file (ssh-keygen -Y format);
	// Keyring an armored OpenPGP keyring. Either or both.
	AllowedSigners, Keyring string
}

// Bind binds --verify-signatures, --allowed-signers and --openpgp-keyring
// with GITFLEET_VERIFY_SIGNATURES, GITFLEET_ALLOWED_SIGNERS and
// GITFLEET_OPENPGP_KEYRING.
func (s *Signatures) Bind(f *Flags) {
	f.Choice(&s.Mode, "verify-signatures", "GITFLEET_VERIFY_SIGNATURES", "which desired-state commits must carry an allowed signature: off, head or every (every first-parent commit since the last applied)", fleet.VerifyModes...)
	f.Path(&s.AllowedSigners, "allowed-signers", "GITFLEET_ALLOWED_SIGNERS", "allowed-signers file of the SSH keys that may sign desired-state commits (ssh-keygen -Y format, as git's gpg.ssh.allowedSignersFile)")
	f.Path(&s.Keyring, "openpgp-keyring", "GITFLEET_OPENPGP_KEYRING", "armored OpenPGP keyring of the keys that may sign desired-state commits (gpg --export --armor)")
}

// Load returns the mode and, unless it is off, the allowed signers read
// from the files. A mode other than off without a file, or a file that
// does not parse, is an ErrUsage error naming the flag and the file (and
// line).
func (s Signatures) Load() (fleet.VerifyMode, *trust.Signers, error) {
	mode, err := fleet.ParseVerifyMode(s.Mode)
	if err != nil {
		return "", nil, usageError(err)
	}
	if mode == fleet.VerifyOff {
		return mode, nil, nil
	}
	if s.AllowedSigners == "" && s.Keyring == "" {
		return "", nil, usageError(fmt.Errorf("--verify-signatures=%s needs --allowed-signers or --openpgp-keyring", mode))
	}
	signers, err := trust.Load(s.AllowedSigners, s.Keyring)
	if err != nil {
		return "", nil, usageError(fmt.Errorf("--verify-signatures=%s: %w", mode, err))
	}
	return mode, signers, nil
}

// DefaultController is the controller's configuration before any variable
// or flag: it lacks only the repository.
func DefaultController() Controller {
	return Controller{
		Branch:          fleet.DefaultBranch,
		Interval:        fleet.DefaultInterval,
		AbandonGrace:    fleet.DefaultAbandonGrace,
		OfflineAfter:    fleet.DefaultOfflineAfter,
		GitTimeout:      gitsource.DefaultTimeout,
		SnapshotsBranch: fleet.DefaultSnapshotsBranch,
		StatusBranch:    fleet.DefaultStatusBranch,
		Signatures:      Signatures{Mode: string(fleet.VerifyOff)},
		MaxDeletes:      fleet.DefaultMaxDeletes,
	}
}

// Bind binds the controller's flags, with their variables, to c; c's
// values are their defaults.
func (c *Controller) Bind(f *Flags) {
	c.Repo.Bind(f)
	c.Repo.BindStatus(f)
	f.String(&c.Branch, "branch", "GITFLEET_BRANCH", "branch holding the desired state")
	f.String(&c.Path, "path", "GITFLEET_PATH", "directory of the objects in the repository; default the root")
	f.Path(&c.CacheDir, "cache-dir", "GITFLEET_CACHE_DIR", "directory for the local clone, kept between runs; default a private temporary directory removed at exit")
	f.Duration(&c.Interval, "interval", "GITFLEET_INTERVAL", "poll interval, jittered")
	f.String(&c.Listen, "listen", "GITFLEET_LISTEN", "address for /metrics and /healthz, such as "+fleet.DefaultListen+"; off when empty")
	f.String(&c.WebhookListen, "webhook-listen", "GITFLEET_WEBHOOK_LISTEN", "address for the push webhooks (/hooks/*), apart from /metrics and /healthz, such as "+fleet.DefaultWebhookListen+" behind a reverse proxy; off when empty")
	f.String(&c.WebhookSecret, "webhook-secret", "GITFLEET_WEBHOOK_SECRET", "webhook secret; better set the variable")
	f.Duration(&c.AbandonGrace, "abandon-grace", "GITFLEET_ABANDON_GRACE", "how long a delete waits on an offline host before the controller finalizes it")
	f.Duration(&c.GitTimeout, "git-timeout", "GITFLEET_GIT_TIMEOUT", "bound of each git operation (fetch, ls-remote, push) on every transport")
	f.Duration(&c.OfflineAfter, "offline-after", "GITFLEET_OFFLINE_AFTER", "no status change for this long makes a host offline: at least three of the agents' heartbeats (intervals.heartbeat)")
	f.String(&c.SnapshotsBranch, "snapshots-branch", "", "branch the snapshots are published on")
	f.String(&c.StatusBranch, "status-branch", "", "branch the agents report on")
	c.Signatures.Bind(f)
	f.Path(&c.SigningKey, "signing-key", "GITFLEET_SIGNING_KEY", "private SSH key file (mode 0600, no passphrase) the controller signs its snapshots commits with (never its status commits); agents whose controllerKeys name its public key accept only snapshots signed with it")
	f.Path(&c.ControllerKeys, "controller-keys", "GITFLEET_CONTROLLER_KEYS", "allowed-signers file (ssh-keygen -Y format, the agents' controllerKeysFile) of other controllers' public keys: with --signing-key the controller acts only on the ledger of the newest snapshots commit signed by its own key or one of these (a second controller, a rotated key)")
	f.String(&c.TrustUnsignedLedgerOnce, "trust-unsigned-ledger-once", "GITFLEET_TRUST_UNSIGNED_LEDGER_ONCE", "full hash of the snapshots commit whose ledger.yaml you checked: with --signing-key, adopt its ledger when it is the snapshots tip and no commit there is signed by a controller key yet (the first start with a key), until this process has published; remove it afterwards")
	f.Int(&c.MaxDeletes, "max-deletes", "GITFLEET_MAX_DELETES", "reject a change that newly tombstones more objects than this (or more than 25% of a host's VMs) unless a commit carries the trailer Gitfleet-Allow-Deletes: <n>; negative turns the guard off")
}

// Fleet is the controller's fleet.Config, logging to log. The error is
// Signatures.Load's, or an ErrUsage error naming --signing-key when the
// key does not load.
func (c *Controller) Fleet(log *logrus.Entry) (fleet.Config, error) {
	mode, signers, err := c.Signatures.Load()
	if err != nil {
		return fleet.Config{}, err
	}
	var signingKey gitsource.CommitSigner
	if c.SigningKey != "" {
		k, err := trust.LoadCommitSigner(c.SigningKey)
		if err != nil {
			return fleet.Config{}, usageError(fmt.Errorf("--signing-key: %w", err))
		}
		if log != nil {
			log.WithField("key", k.Fingerprint()).Info("signing snapshots commits (status commits stay unsigned)")
		}
		signingKey = k
	}
	var controllerKeys []trust.SSHSigner
	if c.ControllerKeys != "" {
		data, err := os.ReadFile(c.ControllerKeys)
		if err != nil {
			return fleet.Config{}, usageError(fmt.Errorf("--controller-keys: %w", err))
		}
		if controllerKeys, err = trust.ParseAllowedSigners(c.ControllerKeys, data); err != nil {
			return fleet.Config{}, usageError(fmt.Errorf("--controller-keys: %w", err))
		}
	}
	if c.MaxDeletes == 0 {
		// fleet.Config reads 0 as its default: refused rather than
		// silently read as 10.
		return fleet.Config{}, usageError(errors.New("--max-deletes 0: give 1 or more, or a negative number to turn the guard off"))
	}
	return fleet.Config{
		URL: c.Repo.URL, StatusURL: c.Repo.StatusURL, Auth: c.Repo.Auth(), CacheDir: c.CacheDir,
		Branch: c.Branch, Path: c.Path, SnapshotsBranch: c.SnapshotsBranch, StatusBranch: c.StatusBranch,
		AbandonGrace: c.AbandonGrace, OfflineAfter: c.OfflineAfter, GitTimeout: c.GitTimeout,
		Verify: mode, Signers: signers, MaxDeletes: c.MaxDeletes,
		SigningKey: signingKey, ControllerKeys: controllerKeys, TrustUnsignedLedgerOnce: c.TrustUnsignedLedgerOnce,
		Logger: log,
	}, nil
}
