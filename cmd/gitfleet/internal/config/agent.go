package config

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/pflag"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/qemu"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/internal/secretfile"
	"github.com/gitfleet/gitfleet/trust"
)

// The agent's backends.
const (
	// BackendQEMU runs each VM as a QEMU process (package agent/qemu).
	BackendQEMU = "qemu"
	// BackendMemory keeps VMs in a table (no guest runs): for trying
	// gitfleet out. The table lives in the state directory, so a later
	// run (--once ones included) finds the VMs of the earlier one.
	BackendMemory = "memory"
)

// DefaultVMTimeout bounds one VM's pass when the config does not say: a
// create stuck on a hung server or a wedged QEMU ends, and the VM's next
// pass (a reviewed delete among them) runs.
const DefaultVMTimeout = 30 * time.Minute

// AgentFile is the agent's YAML configuration file, read strictly (an
// unknown field is an error naming its line):
//
//	repo:
//	  url: https://git.example.com/infra/fleet.git
//	  auth: {tokenFile: /etc/gitfleet/token}   # or username/password(File), sshKeyFile, knownHostsFile
//	statusRepo: {url: https://git.example.com/infra/fleet-status.git}  # the host branch there, not in repo (same auth)
//	host: hv-a
//	stateDir: /var/lib/gitfleet
//	backend: qemu                              # qemu (default) or memory
//	qemu: {accel: auto, systemdScope: true, user: gitfleet-qemu}  # systemdScope defaults to true; user: see below
//	artifacts:                                 # where VM images, kernels, initrds may come from
//	  fileRoots: [/srv/images]                 # file:// only under these (default: none)
//	  allowNetworks: [192.0.2.0/24]            # private/loopback ranges a download may reach (default: none)
//	  maxSizeGB: 64                            # largest artifact (default 64)
//	  timeout: 30m                             # one download, end to end (default 30m)
//	  stallTimeout: 60s                        # no byte for this long fails it (default 60s)
//	intervals: {tick: 10s, poll: 15s, heartbeat: 60s}
//	gitTimeout: 60s                            # bounds each fetch, ls-remote, push
//	appendStatus: false                        # true: every status write a new commit (a git host that forbids non-fast-forward updates)
//	graces: {tombstone: 5m, vanish: 1h, image: 24h}  # image: negative never collects the image cache
//	vmTimeout: 30m                             # per-VM watchdog (default 30m); 0 = none
//	readyTimeout: 10m                          # guest silent this long after boot: lastError says so
//	maxAttempts: 3
//	logLevel: info
//	ageIdentity: /etc/gitfleet/age.key         # opens user-data encrypted to this host (mode 0600; gitfleet age-keygen)
//	epochReset: {from: 9007199254740000, to: 41}  # reviewed: trust a lower epoch again (see DESIGN.md)
//	controllerKeys:                            # accept only snapshots signed by one of these (gitfleet keygen)
//	  - ssh-ed25519 AAAA… gitfleet-controller
//	controllerKeysFile: /etc/gitfleet/controller_signers  # or: an allowed-signers file of them
//	signingKey: /etc/gitfleet/agent_ed25519    # signs this host's status commits (mode 0600); the Host's spec.agentKey names its public key
//	backupRepositories:                        # secrets of each BackupRepository this host uses, by its name (never in git)
//	  nas:
//	    passwordFile: /etc/gitfleet/restic/nas.password    # required; mode 0600
//	    environmentFile: /etc/gitfleet/restic/nas.env      # backend credentials (AWS_*, RESTIC_REST_*, ...), mode 0600
//	    sshKeyFile: /etc/gitfleet/restic/id_ed25519         # sftp: the key and the server's known_hosts (both or neither)
//	    knownHostsFile: /etc/gitfleet/restic/known_hosts
//
// Durations are Go durations ("90s", "5m"). Secrets go in files
// (passwordFile, tokenFile) or GITFLEET_TOKEN, never on the command line.
type AgentFile struct {
	Repo struct {
		URL  string `yaml:"url"`
		Auth struct {
			Username       string `yaml:"username"`
			Password       string `yaml:"password"`
			PasswordFile   string `yaml:"passwordFile"`
			Token          string `yaml:"token"`
			TokenFile      string `yaml:"tokenFile"`
			SSHKeyFile     string `yaml:"sshKeyFile"`
			KnownHostsFile string `yaml:"knownHostsFile"`
		} `yaml:"auth"`
	} `yaml:"repo"`
	// StatusRepo is the repository of the host branch when it is not
	// repo's (the controller's --status-repo), reached with repo.auth.
	StatusRepo struct {
		URL string `yaml:"url"`
	} `yaml:"statusRepo"`
	Host     string `yaml:"host"`
	StateDir string `yaml:"stateDir"`
	Backend  string `yaml:"backend"`
	QEMU     struct {
		Accel string `yaml:"accel"`
		// Arch is the architecture of the host's guests, amd64 or arm64
		// (default: the agent's own); it picks qemu-system-x86_64 or
		// qemu-system-aarch64.
		Arch string `yaml:"arch"`
		// SystemdScope (default true) starts each QEMU in its own
		// transient scope when the agent runs under systemd, so a restart
		// of the agent's unit leaves the guests running.
		SystemdScope *bool `yaml:"systemdScope"`
		// User is the unprivileged user QEMU runs as, with the nftables
		// guard that keeps guests off the host's addresses; absent means
		// qemu.DefaultQEMUUser when the agent runs as root (else QEMU runs
		// as the agent's user), "root" keeps QEMU root without a guard
		// (see qemu.Config.RunAs).
		User *string `yaml:"user"`
		// NoSandbox turns QEMU's seccomp sandbox off (default on).
		NoSandbox bool `yaml:"noSandbox"`
	} `yaml:"qemu"`
	Artifacts struct {
		FileRoots     []string `yaml:"fileRoots"`
		AllowNetworks []string `yaml:"allowNetworks"`
		MaxSizeGB     int64    `yaml:"maxSizeGB"`
		Timeout       Duration `yaml:"timeout"`
		StallTimeout  Duration `yaml:"stallTimeout"`
	} `yaml:"artifacts"`
	Intervals struct {
		Tick      Duration `yaml:"tick"`
		Poll      Duration `yaml:"poll"`
		Heartbeat Duration `yaml:"heartbeat"`
	} `yaml:"intervals"`
	Graces struct {
		Tombstone Duration `yaml:"tombstone"`
		Vanish    Duration `yaml:"vanish"`
		// Image is how long a cached artifact no VM uses is kept (default
		// agent.DefaultImageGrace, 24 h; negative: never collected).
		Image SignedDuration `yaml:"image"`
	} `yaml:"graces"`
	// GitTimeout bounds each operation with the remote (default
	// gitsource.DefaultTimeout, 60 s); a stalled remote never holds the
	// agent past it, and never holds the reconcile tick at all.
	GitTimeout Duration `yaml:"gitTimeout"`
	// AppendStatus makes every status write a new commit on the host
	// branch (agent.Config.AppendStatus); default false: a heartbeat-only
	// write replaces a heartbeat-only tip.
	AppendStatus bool `yaml:"appendStatus"`
	// VMTimeout is the per-VM watchdog; nil (absent) means
	// DefaultVMTimeout, an explicit 0 none.
	VMTimeout    *Duration `yaml:"vmTimeout"`
	ReadyTimeout Duration  `yaml:"readyTimeout"`
	MaxAttempts  int       `yaml:"maxAttempts"`
	LogLevel     string    `yaml:"logLevel"`
	// Listen is the address of the agent's /metrics and /healthz, such
	// as agent.DefaultListen; absent or empty: no listener.
	Listen string `yaml:"listen"`
	// AgeIdentity is the host's age identity file, which opens VM
	// user-data encrypted to the Host's spec.ageRecipient; absent: none.
	AgeIdentity string `yaml:"ageIdentity"`
	// EpochReset makes the agent trust a lower epoch again: when its
	// accepted epoch is exactly from, it becomes to (below from) at the
	// next start (agent.EpochReset; docs/DESIGN.md, "Resetting an agent's
	// epoch"). Absent: no reset.
	EpochReset *struct {
		From uint64 `yaml:"from"`
		To   uint64 `yaml:"to"`
	} `yaml:"epochReset"`
	// ControllerKeys are the public keys the controller signs snapshots
	// with ("ssh-ed25519 AAAA… comment", several while a key is rotated);
	// ControllerKeysFile an allowed-signers file (ssh-keygen -Y format) of
	// them. With either, the agent accepts only snapshots signed by one
	// of the keys (docs/DESIGN.md, "Signed snapshots").
	ControllerKeys     []string `yaml:"controllerKeys"`
	ControllerKeysFile string   `yaml:"controllerKeysFile"`
	// SigningKey is the host's private SSH key file (unencrypted, mode
	// 0600) its status commits are signed with.
	SigningKey string `yaml:"signingKey"`
	// BackupRepositories holds, by BackupRepository name, the files with
	// the repository's secrets on this host.
	BackupRepositories map[string]BackupRepositoryFile `yaml:"backupRepositories"`
}

// BackupRepositoryFile is one entry of the agent file's
// backupRepositories: the files agent/backup's Repository reads.
type BackupRepositoryFile struct {
	PasswordFile    string `yaml:"passwordFile"`
	EnvironmentFile string `yaml:"environmentFile"`
	SSHKeyFile      string `yaml:"sshKeyFile"`
	KnownHostsFile  string `yaml:"knownHostsFile"`
}

// agentFileChecks are the checks of AgentFile's values beyond their Go
// types, by field.
var agentFileChecks = map[string]fieldCheck{
	"repo.url":                 checkURL,
	"statusRepo.url":           checkURL,
	"repo.auth.passwordFile":   checkPath,
	"repo.auth.tokenFile":      checkPath,
	"repo.auth.sshKeyFile":     checkPath,
	"repo.auth.knownHostsFile": checkPath,
	"host":                     agent.CheckHostName,
	"stateDir":                 checkPath,
	"ageIdentity":              checkPath,
	"controllerKeysFile":       checkPath,
	"signingKey":               checkPath,
	"controllerKeys[]": func(s string) error {
		_, err := trust.ParseKeys("key", []string{s})
		if err != nil {
			_, msg, _ := strings.Cut(err.Error(), ": ")
			return errors.New(msg)
		}
		return nil
	},
	"backend":    oneOf(BackendQEMU, BackendMemory),
	"qemu.accel": oneOf(qemu.AccelAuto, qemu.AccelKVM, qemu.AccelTCG),
	"qemu.arch":  oneOf(string(desired.ArchAMD64), string(desired.ArchARM64)),
	"artifacts.fileRoots[]": func(s string) error {
		if !filepath.IsAbs(s) {
			return fmt.Errorf("%q is not an absolute path", s)
		}
		return checkPath(s)
	},
	"artifacts.allowNetworks[]": func(s string) error {
		if _, err := netip.ParsePrefix(s); err != nil {
			return fmt.Errorf("%q is not a CIDR prefix like 192.0.2.0/24", s)
		}
		return nil
	},
	"artifacts.maxSizeGB": func(s string) error {
		if n, err := strconv.ParseInt(s, 0, 64); err == nil && n < 0 {
			return fmt.Errorf("%d: want 0 (the default) or more", n)
		}
		return nil
	},
	"maxAttempts": func(s string) error {
		if n, err := strconv.Atoi(s); err == nil && n < 0 {
			return fmt.Errorf("%d: want 0 (the default) or more", n)
		}
		return nil
	},
	"logLevel": func(s string) error {
		_, err := logrus.ParseLevel(s)
		return err
	},
}

func oneOf(values ...string) fieldCheck {
	return func(s string) error {
		for _, v := range values {
			if s == v {
				return nil
			}
		}
		return fmt.Errorf("%q: want %s", s, strings.Join(values, " or "))
	}
}

// ReadAgentFile reads the agent's config file at path strictly (see
// decodeStrict): every error names FILE:LINE:COL and the field. "" reads
// none: every field is absent.
func ReadAgentFile(path string) (*AgentFile, error) {
	var f AgentFile
	if path == "" {
		return &f, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read agent config: %w", err)
	}
	if err := decodeStrict(path, data, &f, agentFileChecks); err != nil {
		return nil, err
	}
	return &f, nil
}

// Agent is the agent's configuration, resolved (flags over environment over
// file over defaults) and validated. DefaultAgent holds the defaults; a
// zero duration or count takes the default of the component it configures.
type Agent struct {
	// File is the config file read; "" when none.
	File string
	// RepoURL is the fleet repository (required); Auth its credentials,
	// with the files the config names read.
	RepoURL string
	Auth    gitsource.Auth
	// StatusRepoURL is the repository of the host branch when not
	// RepoURL's ("": RepoURL's), with Auth.
	StatusRepoURL string
	// Host is this host's name, a DNS label (required).
	Host string
	// StateDir holds records, disks, volumes, networks (default
	// agent.DefaultStateDir). GitCacheDir (default StateDir/git) holds the
	// clone; ImageCacheDir (default StateDir/images) the QEMU backend's
	// artifacts.
	StateDir      string
	GitCacheDir   string
	ImageCacheDir string
	// Backend is BackendQEMU (default) or BackendMemory.
	Backend string
	QEMU    QEMU
	// Artifacts says where the QEMU backend may fetch images from.
	Artifacts qemu.ArtifactPolicy
	// TickInterval, PollInterval, Heartbeat and StopTimeout configure
	// agent.Config; TombstoneGrace, VanishGrace, ImageGrace (negative:
	// off), VMTimeout (default DefaultVMTimeout; 0 none), ReadyTimeout and
	// MaxAttempts agent.EngineConfig; GitTimeout the repository.
	TickInterval   time.Duration
	PollInterval   time.Duration
	Heartbeat      time.Duration
	StopTimeout    time.Duration
	GitTimeout     time.Duration
	TombstoneGrace time.Duration
	VanishGrace    time.Duration
	ImageGrace     time.Duration
	VMTimeout      time.Duration
	ReadyTimeout   time.Duration
	MaxAttempts    int
	// AppendStatus: see agent.Config.AppendStatus.
	AppendStatus bool
	// LogLevel is the agent's log level (default info).
	LogLevel logrus.Level
	// Version is the agent version reported in status.
	Version string
	// Listen is the address of /metrics and /healthz; "" serves nothing.
	Listen string
	// AgeIdentity is the path of the host's age identity file ("" for
	// none), read by Open (sealed.LoadKeyring: a file others can read is
	// refused): the engine and the QEMU backend open VM user-data
	// encrypted to this host with it.
	AgeIdentity string
	// EpochReset: see agent.EngineConfig; nil for none.
	EpochReset *agent.EpochReset
	// ControllerKeys are the keys of controllerKeys and
	// controllerKeysFile together; nil when neither is set (snapshots are
	// then not verified).
	ControllerKeys *trust.Signers
	// SigningKey is the signingKey file ("" for none), loaded by Open.
	SigningKey string
	// BackupSecrets are the backupRepositories entries, by repository
	// name, each file checked as secrets are (secretfile.Read).
	BackupSecrets map[string]agent.BackupSecrets
}

// QEMU configures the QEMU backend (see qemu.Config).
type QEMU struct {
	// Accel is auto (default), kvm or tcg.
	Accel string
	// Arch is amd64 or arm64, "" for the agent's own (qemu.Config.Arch).
	Arch string
	// SystemdScope runs each guest in its own scope under systemd
	// (default true).
	SystemdScope bool
	// RunAs is the user QEMU drops to, with the nftables guard, as
	// qemu.Config.RunAs: "" (default) is qemu.DefaultQEMUUser when the
	// agent runs as root and no drop when it does not; "root" keeps QEMU
	// root, unguarded.
	RunAs string
	// NoSandbox turns QEMU's seccomp sandbox off.
	NoSandbox bool
	// BootTimeout and PowerdownTimeout: 0 takes qemu.Config's defaults.
	BootTimeout      time.Duration
	PowerdownTimeout time.Duration
}

// DefaultAgent is the agent's configuration before any file, variable or
// flag: it lacks only RepoURL and Host.
func DefaultAgent() Agent {
	return Agent{
		StateDir:  agent.DefaultStateDir,
		Backend:   BackendQEMU,
		QEMU:      QEMU{Accel: qemu.AccelAuto, SystemdScope: true},
		VMTimeout: DefaultVMTimeout,
		LogLevel:  logrus.InfoLevel,
		Version:   "dev",
	}
}

// AgentFlags are the agent's flags: --config, --repo, --status-repo,
// --host, --state-dir, each with its variable (GITFLEET_CONFIG,
// GITFLEET_REPO, GITFLEET_STATUS_REPO, GITFLEET_HOST, GITFLEET_STATE_DIR).
// All but the first override the file.
type AgentFlags struct {
	flags                                            *Flags
	file, repoURL, statusURL, host, stateDir, listen string
}

// BindAgent binds the agent's flags on fs.
func BindAgent(fs *pflag.FlagSet) *AgentFlags {
	a := &AgentFlags{flags: NewFlags(fs)}
	a.flags.Path(&a.file, "config", "GITFLEET_CONFIG", "agent configuration file (YAML)")
	a.flags.URL(&a.repoURL, "repo", "GITFLEET_REPO", "fleet repository URL (overrides repo.url)")
	a.flags.URL(&a.statusURL, "status-repo", "GITFLEET_STATUS_REPO", "repository of this host's status branch, when not the fleet repository (overrides statusRepo.url)")
	a.flags.String(&a.host, "host", "GITFLEET_HOST", "this host's name (overrides host)")
	a.flags.Path(&a.stateDir, "state-dir", "GITFLEET_STATE_DIR", "state directory (overrides stateDir; default "+agent.DefaultStateDir+")")
	a.flags.String(&a.listen, "listen", "GITFLEET_AGENT_LISTEN", "address for /metrics and /healthz, such as "+agent.DefaultListen+"; off when empty (overrides listen)")
	return a
}

// StateDirFlags are the flags of a command that reads the agent's state
// directory on its host (gitfleet console): --config and --state-dir, with
// GITFLEET_CONFIG and GITFLEET_STATE_DIR.
type StateDirFlags struct {
	flags          *Flags
	file, stateDir string
}

// BindStateDir binds --config and --state-dir on fs.
func BindStateDir(fs *pflag.FlagSet) *StateDirFlags {
	s := &StateDirFlags{flags: NewFlags(fs)}
	s.flags.Path(&s.file, "config", "GITFLEET_CONFIG", "agent configuration file (YAML), for its stateDir")
	s.flags.Path(&s.stateDir, "state-dir", "GITFLEET_STATE_DIR", "the agent's state directory (overrides stateDir; default "+agent.DefaultStateDir+")")
	return s
}

// Load returns the state directory: the flag, else its variable, else the
// file's stateDir, else agent.DefaultStateDir. A malformed flag or
// variable wraps ErrUsage; a bad file is reported as ReadAgentFile does.
func (s *StateDirFlags) Load(env Env) (string, error) {
	if err := s.flags.FromEnv(env); err != nil {
		return "", err
	}
	if s.stateDir != "" {
		return s.stateDir, nil
	}
	if s.file != "" {
		f, err := ReadAgentFile(s.file)
		if err != nil {
			return "", err
		}
		if f.StateDir != "" {
			return f.StateDir, nil
		}
	}
	return agent.DefaultStateDir, nil
}

// Load resolves the agent's configuration once the command line is
// parsed: the flags, else their variables, over the file, over the
// defaults. A malformed flag or variable, or no repository or host, is an
// error wrapping ErrUsage, returned before the file is read when it can be;
// a fault of the file or of a file it names is not.
func (a *AgentFlags) Load(env Env) (*Agent, error) {
	if err := a.flags.FromEnv(env); err != nil {
		return nil, err
	}
	if a.host != "" {
		// Before anything else: the name becomes paths and a committer
		// address.
		if err := agent.CheckHostName(a.host); err != nil {
			return nil, usageError(fmt.Errorf("%s: %w", a.flags.Origin("host"), err))
		}
	}
	f, err := ReadAgentFile(a.file)
	if err != nil {
		return nil, err
	}
	setIf(&f.Repo.URL, a.repoURL)
	setIf(&f.StatusRepo.URL, a.statusURL)
	setIf(&f.Host, a.host)
	setIf(&f.StateDir, a.stateDir)
	setIf(&f.Listen, a.listen)
	if f.Repo.URL == "" || f.Host == "" {
		return nil, usageError(errors.New("agent needs a repository and a host: --config FILE, or --repo and --host"))
	}
	return f.resolve(a.file, env)
}

// resolve lays the file (read from path, "" for none) over DefaultAgent,
// reads the secret files it names and takes GITFLEET_TOKEN from env when
// it names no token. Its values were checked as ReadAgentFile read it.
func (f *AgentFile) resolve(path string, env Env) (*Agent, error) {
	c := DefaultAgent()
	c.File, c.RepoURL, c.StatusRepoURL, c.Host = path, f.Repo.URL, f.StatusRepo.URL, f.Host
	setIf(&c.StateDir, f.StateDir)
	setIf(&c.Backend, f.Backend)
	setIf(&c.QEMU.Accel, f.QEMU.Accel)
	setIf(&c.QEMU.Arch, f.QEMU.Arch)
	if f.QEMU.SystemdScope != nil {
		c.QEMU.SystemdScope = *f.QEMU.SystemdScope
	}
	if f.QEMU.User != nil {
		c.QEMU.RunAs = *f.QEMU.User
	}
	c.QEMU.NoSandbox = f.QEMU.NoSandbox
	a := f.Artifacts
	c.Artifacts = qemu.ArtifactPolicy{Timeout: time.Duration(a.Timeout), StallTimeout: time.Duration(a.StallTimeout), MaxSize: a.MaxSizeGB << 30}
	for _, r := range a.FileRoots {
		c.Artifacts.FileRoots = append(c.Artifacts.FileRoots, filepath.Clean(r))
	}
	for _, n := range a.AllowNetworks {
		pfx, err := netip.ParsePrefix(n)
		if err != nil {
			return nil, fmt.Errorf("agent config %s: artifacts.allowNetworks: %w", path, err)
		}
		c.Artifacts.AllowNetworks = append(c.Artifacts.AllowNetworks, pfx.Masked())
	}
	c.TickInterval, c.PollInterval = time.Duration(f.Intervals.Tick), time.Duration(f.Intervals.Poll)
	c.Heartbeat, c.GitTimeout = time.Duration(f.Intervals.Heartbeat), time.Duration(f.GitTimeout)
	c.TombstoneGrace, c.VanishGrace = time.Duration(f.Graces.Tombstone), time.Duration(f.Graces.Vanish)
	c.ImageGrace = time.Duration(f.Graces.Image)
	c.AppendStatus = f.AppendStatus
	if f.VMTimeout != nil {
		c.VMTimeout = time.Duration(*f.VMTimeout)
	}
	c.ReadyTimeout, c.MaxAttempts = time.Duration(f.ReadyTimeout), f.MaxAttempts
	if r := f.EpochReset; r != nil {
		if r.To >= r.From {
			return nil, fmt.Errorf("agent config %s: epochReset: to (%d) must be below from (%d)", path, r.To, r.From)
		}
		c.EpochReset = &agent.EpochReset{From: r.From, To: r.To}
	}
	c.Listen = f.Listen
	c.AgeIdentity = f.AgeIdentity
	c.SigningKey = f.SigningKey
	keys, err := f.controllerKeys(path)
	if err != nil {
		return nil, err
	}
	c.ControllerKeys = keys
	if f.LogLevel != "" {
		lvl, err := logrus.ParseLevel(f.LogLevel)
		if err != nil {
			return nil, fmt.Errorf("agent config %s: logLevel: %w", path, err)
		}
		c.LogLevel = lvl
	}
	auth, err := f.auth(path, env)
	if err != nil {
		return nil, err
	}
	c.Auth = auth
	if c.BackupSecrets, err = f.backupSecrets(path); err != nil {
		return nil, err
	}
	return &c, nil
}

// backupSecrets checks each backupRepositories entry: a repository name
// (a DNS label), a password file, an ssh key with its known_hosts or
// neither, and every file named readable as a secret (secretfile.Read:
// regular, not a link, mode 0600 or 0400, owned by root or the agent).
func (f *AgentFile) backupSecrets(path string) (map[string]agent.BackupSecrets, error) {
	if len(f.BackupRepositories) == 0 {
		return nil, nil
	}
	out := make(map[string]agent.BackupSecrets, len(f.BackupRepositories))
	for _, name := range slices.Sorted(maps.Keys(f.BackupRepositories)) {
		r := f.BackupRepositories[name]
		at := "backupRepositories." + name
		if err := agent.CheckHostName(name); err != nil {
			return nil, fmt.Errorf("agent config %s: %s: repository name: %w", path, at, err)
		}
		if r.PasswordFile == "" {
			return nil, fmt.Errorf("agent config %s: %s.passwordFile: missing; restic needs the repository's password", path, at)
		}
		if (r.SSHKeyFile == "") != (r.KnownHostsFile == "") {
			return nil, fmt.Errorf("agent config %s: %s: sshKeyFile and knownHostsFile go together (the server's key is checked strictly)", path, at)
		}
		for _, s := range []struct{ field, file string }{{"passwordFile", r.PasswordFile}, {"environmentFile", r.EnvironmentFile}, {"sshKeyFile", r.SSHKeyFile}} {
			if s.file == "" {
				continue
			}
			if err := checkPath(s.file); err != nil {
				return nil, fmt.Errorf("agent config %s: %s.%s: %w", path, at, s.field, err)
			}
			if _, err := secretfile.Read(s.file, at+"."+s.field, "others can read the backup repository's secret", maxSecretFile); err != nil {
				return nil, fmt.Errorf("agent config %s: %w", path, err)
			}
		}
		out[name] = agent.BackupSecrets{PasswordFile: r.PasswordFile, EnvironmentFile: r.EnvironmentFile, SSHKey: r.SSHKeyFile, KnownHosts: r.KnownHostsFile}
	}
	return out, nil
}

// controllerKeys reads controllerKeys and controllerKeysFile into one
// list of signers; nil when both are absent.
func (f *AgentFile) controllerKeys(path string) (*trust.Signers, error) {
	if len(f.ControllerKeys) == 0 && f.ControllerKeysFile == "" {
		return nil, nil
	}
	keys, err := trust.ParseKeys(path+": controllerKeys", f.ControllerKeys)
	if err != nil {
		return nil, fmt.Errorf("agent config %w", err)
	}
	if f.ControllerKeysFile != "" {
		data, err := os.ReadFile(f.ControllerKeysFile)
		if err != nil {
			return nil, fmt.Errorf("agent config %s: controllerKeysFile: %w", path, err)
		}
		more, err := trust.ParseAllowedSigners(f.ControllerKeysFile, data)
		if err != nil {
			return nil, fmt.Errorf("agent config %s: controllerKeysFile: %w", path, err)
		}
		if len(more) == 0 {
			return nil, fmt.Errorf("agent config %s: controllerKeysFile %s holds no key: snapshots would all be refused", path, f.ControllerKeysFile)
		}
		keys = append(keys, more...)
	}
	s, err := trust.New(keys, nil)
	if err != nil {
		return nil, fmt.Errorf("agent config %s: controllerKeys: %w", path, err)
	}
	return s, nil
}

func setIf(dst *string, v string) {
	if v != "" {
		*dst = v
	}
}

// maxSecretFile bounds a token or password file (bytes).
const maxSecretFile = 64 << 10

// auth builds the repository credentials, reading secrets from the files
// the config names (checked as key files are: secretfile.Read), or the
// token from GITFLEET_TOKEN when it names none.
func (f *AgentFile) auth(path string, env Env) (gitsource.Auth, error) {
	a := f.Repo.Auth
	auth := gitsource.Auth{Username: a.Username, Password: a.Password, Token: a.Token,
		SSHKeyFile: a.SSHKeyFile, KnownHostsFile: a.KnownHostsFile}
	for _, s := range []struct {
		field, path string
		dst         *string
	}{{"repo.auth.passwordFile", a.PasswordFile, &auth.Password}, {"repo.auth.tokenFile", a.TokenFile, &auth.Token}} {
		if s.path == "" {
			continue
		}
		// A secret like a key file: the same refusals (mode, owner, a
		// symbolic link), which name the file and never quote it.
		b, err := secretfile.Read(s.path, s.field, "others can read the credential that pushes to the repository", maxSecretFile)
		if err != nil {
			return auth, fmt.Errorf("agent config %s: %w", path, err)
		}
		*s.dst = strings.TrimSpace(string(b))
	}
	if auth.Token == "" {
		auth.Token = env("GITFLEET_TOKEN")
	}
	return auth, nil
}
