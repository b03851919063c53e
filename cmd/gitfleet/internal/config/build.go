package config

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/hostnet"
	"github.com/gitfleet/gitfleet/agent/inmem"
	"github.com/gitfleet/gitfleet/agent/qemu"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/internal/redact"
	"github.com/gitfleet/gitfleet/internal/sealed"
	"github.com/gitfleet/gitfleet/trust"
)

// The QEMU backend reports accelerator and download progress in status.
var (
	_ agent.AccelReporter    = (*qemu.Provisioner)(nil)
	_ agent.ArchReporter     = (*qemu.Provisioner)(nil)
	_ agent.ProgressReporter = (*qemu.Provisioner)(nil)
)

// Logger is the agent's logger: secrets redacted, at c.LogLevel, to out.
func (c *Agent) Logger(out io.Writer) *logrus.Logger {
	log := redact.Logger(logrus.New())
	log.SetOutput(out)
	log.SetLevel(c.LogLevel)
	return log
}

// AgentParts is an agent wired from its configuration, not yet running.
type AgentParts struct {
	Store       *agent.Store
	Provisioner agent.Provisioner
	Engine      *agent.Engine
	// Config is ready for agent.New; the caller adds what only it knows
	// (systemd's Ready and Alive).
	Config agent.Config
	// Registry holds the agent's metrics (agent.NewMetrics), for the
	// listener's /metrics.
	Registry *prometheus.Registry
}

// Open wires the agent c configures: it opens the state store, makes the
// backend and runs its Preflight (which checks the host and installs what
// confines the guests, the QEMU backend's nftables guard, before any VM is
// touched), opens the repository and makes the engine. It starts nothing;
// the caller runs agent.New(parts.Config) and closes the engine when the
// agent is done with it.
func (c *Agent) Open(ctx context.Context, log *logrus.Logger) (*AgentParts, error) {
	var keys *sealed.Keyring
	if c.AgeIdentity != "" {
		k, err := sealed.LoadKeyring(c.AgeIdentity)
		if err != nil {
			return nil, err
		}
		keys = k
		log.WithField("recipients", k.Recipients()).Info("age identity loaded: user-data encrypted to these recipients can be decrypted here")
	}
	var signer *trust.CommitSigner
	if c.SigningKey != "" {
		k, err := trust.LoadCommitSigner(c.SigningKey)
		if err != nil {
			return nil, fmt.Errorf("agent config %s: signingKey: %w", c.File, err)
		}
		if c.ControllerKeys != nil && c.ControllerKeys.HoldsSSH(k.Fingerprint()) {
			return nil, fmt.Errorf("agent config %s: signingKey %s is one of controllerKeys: a status commit this agent signs, on a host branch whose tree anyone who can push there chose, would pass for a snapshots commit of the controller; give the agent its own key (gitfleet keygen --host %s)", c.File, k.Fingerprint(), c.Host)
		}
		signer = k
		log.WithField("key", k.Fingerprint()).Info("signing status commits: the Host's spec.agentKey must name this key")
	}
	if c.ControllerKeys != nil {
		log.Info("verifying snapshots: only commits signed by a key of controllerKeys are accepted")
	}
	store, err := agent.OpenStore(c.StateDir)
	if err != nil {
		return nil, err
	}
	prov, err := c.backend(store, keys, log)
	if err != nil {
		return nil, fmt.Errorf("backend %s: %w", c.Backend, err)
	}
	if err := prov.Preflight(ctx); err != nil {
		return nil, fmt.Errorf("backend %s: preflight: %w", c.Backend, err)
	}
	repo, err := gitsource.Open(ctx, gitsource.Options{
		URL: c.RepoURL, CacheDir: orUnder(c.GitCacheDir, store, "git"), Auth: c.Auth, Depth: 1,
		Timeout:   c.GitTimeout,
		Committer: "gitfleet agent " + c.Host + " <agent@" + c.Host + ">",
		Logger:    log.WithField("host", c.Host),
	})
	if err != nil {
		return nil, err
	}
	statusRepo, err := c.openStatusRepo(ctx, store, log)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	metrics, err := agent.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	eng, err := agent.NewEngine(agent.EngineConfig{
		Host: c.Host, Store: store, Provisioner: prov, Metrics: metrics,
		TombstoneGrace: c.TombstoneGrace, VanishGrace: c.VanishGrace, ImageGrace: c.ImageGrace,
		MaxAttempts: c.MaxAttempts, VMTimeout: c.VMTimeout, ReadyTimeout: c.ReadyTimeout, Log: log,
		AgeIdentity: keys,
		EpochReset:  c.EpochReset,
		Backups:     agent.BackupConfig{Secrets: c.BackupSecrets},
	})
	if err != nil {
		return nil, err
	}
	return &AgentParts{Store: store, Provisioner: prov, Engine: eng, Registry: reg, Config: agent.Config{
		Host: c.Host, Repo: repo, StatusRepo: statusRepo, Engine: eng, Store: store, Version: c.Version,
		TickInterval: c.TickInterval, PollInterval: c.PollInterval, Heartbeat: c.Heartbeat,
		StopTimeout: c.StopTimeout, AppendStatus: c.AppendStatus, Metrics: metrics, Log: log,
		ControllerKeys: verifier(c.ControllerKeys), SigningKey: commitSigner(signer),
	}}, nil
}

// openStatusRepo opens StatusRepoURL at depth 1, cached beside the fleet
// repository's clone (GitCacheDir, or StateDir/git, plus "-status"); nil
// when the host branch is in the fleet repository.
func (c *Agent) openStatusRepo(ctx context.Context, store *agent.Store, log *logrus.Logger) (*gitsource.Repo, error) {
	if c.StatusRepoURL == "" || c.StatusRepoURL == c.RepoURL {
		return nil, nil
	}
	repo, err := gitsource.Open(ctx, gitsource.Options{
		URL: c.StatusRepoURL, CacheDir: orUnder(c.GitCacheDir, store, "git") + "-status", Auth: c.Auth, Depth: 1,
		Timeout:   c.GitTimeout,
		Committer: "gitfleet agent " + c.Host + " <agent@" + c.Host + ">",
		Logger:    log.WithField("host", c.Host),
	})
	if err != nil {
		return nil, fmt.Errorf("status repository: %w", err)
	}
	return repo, nil
}

// verifier is keys as an agent.CommitVerifier: nil (verify nothing) when
// keys is nil, never a non-nil interface holding a nil pointer.
func verifier(keys *trust.Signers) agent.CommitVerifier {
	if keys == nil {
		return nil
	}
	return keys
}

// commitSigner is k as a gitsource.CommitSigner, nil when k is nil.
func commitSigner(k *trust.CommitSigner) gitsource.CommitSigner {
	if k == nil {
		return nil
	}
	return k
}

// orUnder is dir, or name under the store's root when dir is "".
func orUnder(dir string, store *agent.Store, name string) string {
	if dir != "" {
		return dir
	}
	return filepath.Join(store.Root(), name)
}

// backend builds the provisioner c.Backend names.
func (c *Agent) backend(store *agent.Store, keys *sealed.Keyring, log *logrus.Logger) (agent.Provisioner, error) {
	switch c.Backend {
	case BackendQEMU:
		return c.qemuBackend(store, keys, log)
	case BackendMemory:
		return memoryBackend(store)
	}
	return nil, fmt.Errorf("unknown backend %q: want qemu or memory", c.Backend)
}

func (c *Agent) qemuBackend(store *agent.Store, keys *sealed.Keyring, log *logrus.Logger) (*qemu.Provisioner, error) {
	nets, err := hostnet.New(hostnet.Config{Dir: filepath.Join(store.Root(), "networks"), Logger: log})
	if err != nil {
		return nil, err
	}
	return qemu.New(qemu.Config{
		RunAs:            c.QEMU.RunAs,
		NoSandbox:        c.QEMU.NoSandbox,
		Artifacts:        c.Artifacts,
		CacheDir:         orUnder(c.ImageCacheDir, store, "images"),
		MachineDir:       store.VMDir,
		AdoptedDisk:      store.AdoptedDisk,
		Accel:            c.QEMU.Accel,
		Arch:             c.QEMU.Arch,
		SystemdScope:     c.QEMU.SystemdScope,
		BootTimeout:      c.QEMU.BootTimeout,
		PowerdownTimeout: c.QEMU.PowerdownTimeout,
		Networks:         nets,
		AgeIdentity:      keys,
		Logger:           log,
	})
}

// memoryBackend keeps VMs in a table in the state directory (see
// BackendMemory).
func memoryBackend(store *agent.Store) (agent.Provisioner, error) {
	return inmem.Open(filepath.Join(store.Root(), inmem.StateFile))
}
