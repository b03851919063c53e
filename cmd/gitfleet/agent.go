package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/hostnet"
	"github.com/gitfleet/gitfleet/agent/inmem"
	"github.com/gitfleet/gitfleet/agent/qemu"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/internal/redact"
)

// agentFileConfig is the agent's YAML configuration file:
//
//	repo:
//	  url: https://git.example.com/infra/fleet.git
//	  auth: {tokenFile: /etc/gitfleet/token}   # or username/password(File), sshKeyFile, knownHostsFile
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
//	graces: {tombstone: 5m, vanish: 1h}
//	vmTimeout: 30m                             # per-VM watchdog (default 30m); 0 = none
//	readyTimeout: 10m                          # guest silent this long after boot: lastError says so
//	maxAttempts: 3
//	logLevel: info
//
// Durations are Go durations ("90s", "5m"). Secrets go in files
// (passwordFile, tokenFile) or GITFLEET_TOKEN, never on the command line.
type agentFileConfig struct {
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
	Host     string `yaml:"host"`
	StateDir string `yaml:"stateDir"`
	Backend  string `yaml:"backend"`
	QEMU     struct {
		Accel string `yaml:"accel"`
		// SystemdScope (default true) starts each QEMU in its own
		// transient scope when the agent runs under systemd, so a restart
		// of the agent's unit leaves the guests running.
		SystemdScope *bool `yaml:"systemdScope"`
		// User is the unprivileged user QEMU runs as, with the nftables
		// guard that keeps guests off the host's addresses; absent means
		// qemu.DefaultQEMUUser, "root" keeps QEMU root without a guard.
		User *string `yaml:"user"`
		// NoSandbox turns QEMU's seccomp sandbox off (default on).
		NoSandbox bool `yaml:"noSandbox"`
	} `yaml:"qemu"`
	Artifacts struct {
		FileRoots     []string `yaml:"fileRoots"`
		AllowNetworks []string `yaml:"allowNetworks"`
		MaxSizeGB     int64    `yaml:"maxSizeGB"`
		Timeout       duration `yaml:"timeout"`
		StallTimeout  duration `yaml:"stallTimeout"`
	} `yaml:"artifacts"`
	Intervals struct {
		Tick      duration `yaml:"tick"`
		Poll      duration `yaml:"poll"`
		Heartbeat duration `yaml:"heartbeat"`
	} `yaml:"intervals"`
	Graces struct {
		Tombstone duration `yaml:"tombstone"`
		Vanish    duration `yaml:"vanish"`
	} `yaml:"graces"`
	// GitTimeout bounds each operation with the remote (default
	// gitsource.DefaultTimeout, 60 s); a stalled remote never holds the
	// agent past it, and never holds the reconcile tick at all.
	GitTimeout duration `yaml:"gitTimeout"`
	// VMTimeout is the per-VM watchdog; nil (absent) means
	// defaultVMTimeout, an explicit 0 none.
	VMTimeout    *duration `yaml:"vmTimeout"`
	ReadyTimeout duration  `yaml:"readyTimeout"`
	MaxAttempts  int       `yaml:"maxAttempts"`
	LogLevel     string    `yaml:"logLevel"`
}

// defaultVMTimeout bounds one VM's pass when the config does not say: a
// create stuck on a hung server or a wedged QEMU ends, and the VM's next
// pass (a reviewed delete among them) runs.
const defaultVMTimeout = 30 * time.Minute

func (c *agentFileConfig) vmTimeout() time.Duration {
	if c.VMTimeout == nil {
		return defaultVMTimeout
	}
	return time.Duration(*c.VMTimeout)
}

// duration is a time.Duration written as a Go duration string in YAML.
type duration time.Duration

func (d *duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil || v < 0 {
		return fmt.Errorf("line %d, column %d: %q is not a duration like 10s or 5m", n.Line, n.Column, n.Value)
	}
	*d = duration(v)
	return nil
}

// loadAgentConfig reads path strictly: an unknown field is an error of the
// form "FILE:LINE:COL: unknown field "x" in graces (known: ...)".
func loadAgentConfig(path string) (*agentFileConfig, error) {
	var c agentFileConfig
	if path == "" {
		return &c, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read agent config: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("agent config %s: %w", path, err)
	}
	if len(doc.Content) > 0 {
		if err := checkKnownFields(path, doc.Content[0], reflect.TypeOf(c), ""); err != nil {
			return nil, err
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("agent config %s: %w", path, err)
	}
	return &c, nil
}

// checkKnownFields walks the mappings of n against the yaml tags of the
// struct type t and returns the first key t does not know, as
// FILE:LINE:COL with its section (a dotted path; "" is the top level).
func checkKnownFields(path string, n *yaml.Node, t reflect.Type, section string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind != yaml.MappingNode || t.Kind() != reflect.Struct {
		return nil
	}
	fields := map[string]reflect.Type{}
	var known []string
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		fields[name] = t.Field(i).Type
		known = append(known, name)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		ft, ok := fields[key.Value]
		if !ok {
			where := "the top level"
			if section != "" {
				where = section
			}
			return fmt.Errorf("%s:%d:%d: unknown field %q in %s (known: %s)", path, key.Line, key.Column, key.Value, where, strings.Join(known, ", "))
		}
		sub := key.Value
		if section != "" {
			sub = section + "." + key.Value
		}
		if err := checkKnownFields(path, val, ft, sub); err != nil {
			return err
		}
	}
	return nil
}

// The QEMU backend reports accelerator and download progress in status.
var (
	_ agent.AccelReporter    = (*qemu.Provisioner)(nil)
	_ agent.ProgressReporter = (*qemu.Provisioner)(nil)
)

// backends builds the provisioner a config's backend names.
var backends = map[string]func(c *agentFileConfig, store *agent.Store, log *logrus.Logger) (agent.Provisioner, error){
	"qemu": func(c *agentFileConfig, store *agent.Store, log *logrus.Logger) (agent.Provisioner, error) {
		nets, err := hostnet.New(hostnet.Config{Dir: filepath.Join(store.Root(), "networks"), Logger: log})
		if err != nil {
			return nil, err
		}
		policy, err := artifactPolicy(c)
		if err != nil {
			return nil, err
		}
		runAs := "" // qemu.DefaultQEMUUser for an agent running as root
		if c.QEMU.User != nil {
			runAs = *c.QEMU.User
		}
		return qemu.New(qemu.Config{
			RunAs:        runAs,
			NoSandbox:    c.QEMU.NoSandbox,
			Artifacts:    policy,
			CacheDir:     filepath.Join(store.Root(), "images"),
			MachineDir:   store.VMDir,
			Accel:        c.QEMU.Accel,
			SystemdScope: c.QEMU.SystemdScope == nil || *c.QEMU.SystemdScope,
			Networks:     nets,
			Logger:       log,
		})
	},
	// memory keeps VMs in a table (no guest runs): for trying gitfleet
	// out. The table lives in the state directory, so a later run
	// (--once ones included) finds the VMs of the earlier one.
	"memory": func(_ *agentFileConfig, store *agent.Store, _ *logrus.Logger) (agent.Provisioner, error) {
		return inmem.Open(filepath.Join(store.Root(), inmem.StateFile))
	},
}

// artifactPolicy turns the config's artifacts section into the QEMU
// backend's policy: roots must be absolute, networks CIDR prefixes.
func artifactPolicy(c *agentFileConfig) (qemu.ArtifactPolicy, error) {
	a := c.Artifacts
	p := qemu.ArtifactPolicy{Timeout: time.Duration(a.Timeout), StallTimeout: time.Duration(a.StallTimeout), MaxSize: a.MaxSizeGB << 30}
	if a.MaxSizeGB < 0 {
		return p, fmt.Errorf("agent config: artifacts.maxSizeGB %d: want a positive number", a.MaxSizeGB)
	}
	for _, r := range a.FileRoots {
		if !filepath.IsAbs(r) {
			return p, fmt.Errorf("agent config: artifacts.fileRoots: %q is not an absolute path", r)
		}
		p.FileRoots = append(p.FileRoots, filepath.Clean(r))
	}
	for _, n := range a.AllowNetworks {
		pfx, err := netip.ParsePrefix(n)
		if err != nil {
			return p, fmt.Errorf("agent config: artifacts.allowNetworks: %q is not a CIDR prefix like 192.0.2.0/24", n)
		}
		p.AllowNetworks = append(p.AllowNetworks, pfx.Masked())
	}
	return p, nil
}

func init() {
	var (
		configPath, repoURL, host, stateDir string
		once                                bool
	)
	cmd := &cobra.Command{
		Use:   "agent --config FILE",
		Short: "Run this host's agent: reconcile its VMs and volumes with its snapshot",
		Long: `Agent fetches this host's snapshot from the gitfleet/snapshots branch,
reconciles VMs and volumes toward it, and writes the host's status to the
gitfleet/status branch. --repo, --host and --state-dir override the config
file (environment: GITFLEET_CONFIG, GITFLEET_REPO, GITFLEET_HOST,
GITFLEET_STATE_DIR; GITFLEET_TOKEN supplies a token).

SIGTERM or SIGINT finishes the work under way, writes the status and exits 0;
VMs keep running. --once runs one pass, waits for it, writes the status and
exits: 0 on success, 1 on failure.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return &exitError{code: 2, err: fmt.Errorf("agent takes no arguments, got %q", args)}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			fromEnv(&configPath, "GITFLEET_CONFIG")
			fromEnv(&repoURL, "GITFLEET_REPO")
			fromEnv(&host, "GITFLEET_HOST")
			fromEnv(&stateDir, "GITFLEET_STATE_DIR")
			if host != "" {
				// Before anything else: the name becomes paths and a
				// committer address.
				if err := agent.CheckHostName(host); err != nil {
					return &exitError{code: 2, err: fmt.Errorf("--host: %w", err)}
				}
			}
			c, err := loadAgentConfig(configPath)
			if err != nil {
				return &exitError{code: 1, err: err}
			}
			if host == "" && c.Host != "" {
				if err := agent.CheckHostName(c.Host); err != nil {
					return &exitError{code: 1, err: fmt.Errorf("agent config %s: %w", configPath, err)}
				}
			}
			if repoURL != "" {
				c.Repo.URL = repoURL
			}
			if host != "" {
				c.Host = host
			}
			if stateDir != "" {
				c.StateDir = stateDir
			}
			if c.Repo.URL == "" || c.Host == "" {
				return &exitError{code: 2, err: errors.New("agent needs a repository and a host: --config FILE, or --repo and --host")}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return runAgent(ctx, c, once, cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "agent configuration file (YAML)")
	cmd.Flags().StringVar(&repoURL, "repo", "", "fleet repository URL (overrides repo.url)")
	cmd.Flags().StringVar(&host, "host", "", "this host's name (overrides host)")
	cmd.Flags().StringVar(&stateDir, "state-dir", "", "state directory (overrides stateDir; default "+agent.DefaultStateDir+")")
	cmd.Flags().BoolVar(&once, "once", false, "run one pass, write the status and exit")
	rootCmd.AddCommand(cmd)
}

// fromEnv sets *v from the environment variable when the flag was not given.
func fromEnv(v *string, name string) {
	if *v == "" {
		*v = os.Getenv(name)
	}
}

func runAgent(ctx context.Context, c *agentFileConfig, once bool, logOut io.Writer) error {
	log := redact.Logger(logrus.New())
	log.SetOutput(logOut)
	if c.LogLevel != "" {
		lvl, err := logrus.ParseLevel(c.LogLevel)
		if err != nil {
			return &exitError{code: 1, err: fmt.Errorf("agent config: logLevel: %w", err)}
		}
		log.SetLevel(lvl)
	}
	auth, err := repoAuth(c)
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	backend := c.Backend
	if backend == "" {
		backend = "qemu"
	}
	newBackend, ok := backends[backend]
	if !ok {
		return &exitError{code: 1, err: fmt.Errorf("agent config: backend %q: want qemu or memory", backend)}
	}
	store, err := agent.OpenStore(c.StateDir)
	if err != nil {
		return err
	}
	prov, err := newBackend(c, store, log)
	if err != nil {
		return fmt.Errorf("backend %s: %w", backend, err)
	}
	// Preflight checks the host and installs what confines the guests
	// (the QEMU backend's nftables guard) before any VM is touched.
	if err := prov.Preflight(ctx); err != nil {
		return fmt.Errorf("backend %s: %w", backend, err)
	}
	repo, err := gitsource.Open(ctx, gitsource.Options{
		URL: c.Repo.URL, CacheDir: filepath.Join(store.Root(), "git"), Auth: auth, Depth: 1,
		Timeout:   time.Duration(c.GitTimeout),
		Committer: "gitfleet agent " + c.Host + " <agent@" + c.Host + ">",
		Logger:    log.WithField("host", c.Host),
	})
	if err != nil {
		return err
	}
	eng, err := agent.NewEngine(agent.EngineConfig{
		Host: c.Host, Store: store, Provisioner: prov,
		TombstoneGrace: time.Duration(c.Graces.Tombstone), VanishGrace: time.Duration(c.Graces.Vanish),
		MaxAttempts: c.MaxAttempts, VMTimeout: c.vmTimeout(), ReadyTimeout: time.Duration(c.ReadyTimeout), Log: log,
	})
	if err != nil {
		return err
	}
	cfg := agent.Config{
		Host: c.Host, Repo: repo, Engine: eng, Store: store, Version: version,
		TickInterval: time.Duration(c.Intervals.Tick), PollInterval: time.Duration(c.Intervals.Poll),
		Heartbeat: time.Duration(c.Intervals.Heartbeat), Log: log,
	}
	if !once {
		// READY=1 once the state is loaded, before any git operation;
		// watchdog pings from the reconcile loop, on every tick.
		cfg.Ready = func() { _, _ = daemon.SdNotify(false, daemon.SdNotifyReady) }
		if every, err := daemon.SdWatchdogEnabled(false); err == nil && every > 0 {
			cfg.AliveEvery = every / 3
			cfg.Alive = func() { _, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog) }
		}
	}
	ag, err := agent.New(cfg)
	if err != nil {
		return err
	}
	if once {
		err := ag.Once(ctx)
		closeCtx, cancel := context.WithTimeout(context.Background(), agent.DefaultStopTimeout)
		defer cancel()
		eng.Close(closeCtx)
		return err
	}
	err = ag.Run(ctx)
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
	return err
}

// repoAuth builds the repository credentials, reading secrets from files
// or GITFLEET_TOKEN.
func repoAuth(c *agentFileConfig) (gitsource.Auth, error) {
	a := c.Repo.Auth
	auth := gitsource.Auth{Username: a.Username, Password: a.Password, Token: a.Token,
		SSHKeyFile: a.SSHKeyFile, KnownHostsFile: a.KnownHostsFile}
	for _, f := range []struct {
		path string
		dst  *string
	}{{a.PasswordFile, &auth.Password}, {a.TokenFile, &auth.Token}} {
		if f.path == "" {
			continue
		}
		b, err := os.ReadFile(f.path)
		if err != nil {
			return auth, fmt.Errorf("agent config: %w", err)
		}
		*f.dst = strings.TrimSpace(string(b))
	}
	if auth.Token == "" {
		auth.Token = os.Getenv("GITFLEET_TOKEN")
	}
	return auth, nil
}
