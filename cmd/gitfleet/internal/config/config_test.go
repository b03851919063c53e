package config

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/qemu"
	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/trusttest"
)

// mapEnv is an environment of the variables in m.
func mapEnv(m map[string]string) Env { return func(name string) string { return m[name] } }

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

// loadController parses args as gitfleet controller does and applies env.
func loadController(t *testing.T, args []string, env map[string]string) (Controller, error) {
	t.Helper()
	c := DefaultController()
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	f := NewFlags(fs)
	c.Bind(f)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	return c, f.FromEnv(mapEnv(env))
}

// loadAgent parses args as gitfleet agent does and loads its configuration.
func loadAgent(t *testing.T, args []string, env map[string]string) (*Agent, error) {
	t.Helper()
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	a := BindAgent(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return a.Load(mapEnv(env))
}

// Every variable of the controller (and of plan and status, which share
// the repository's) sets its field, and the flag wins over it.
func TestControllerEnvironment(t *testing.T) {
	for _, tc := range []struct {
		env, flag, value string
		want             func(*Controller)
	}{
		{"GITFLEET_REPO", "repo", "https://git.example.com/fleet.git", func(c *Controller) { c.Repo.URL = "https://git.example.com/fleet.git" }},
		{"GITFLEET_STATUS_REPO", "status-repo", "https://git.example.com/fleet-status.git", func(c *Controller) { c.Repo.StatusURL = "https://git.example.com/fleet-status.git" }},
		{"GITFLEET_TOKEN", "token", "tok", func(c *Controller) { c.Repo.Token = "tok" }},
		{"GITFLEET_SSH_KEY", "ssh-key", "/etc/gitfleet/key", func(c *Controller) { c.Repo.SSHKey = "/etc/gitfleet/key" }},
		{"GITFLEET_KNOWN_HOSTS", "known-hosts", "/etc/gitfleet/known_hosts", func(c *Controller) { c.Repo.KnownHosts = "/etc/gitfleet/known_hosts" }},
		{"GITFLEET_BRANCH", "branch", "prod", func(c *Controller) { c.Branch = "prod" }},
		{"GITFLEET_PATH", "path", "fleet", func(c *Controller) { c.Path = "fleet" }},
		{"GITFLEET_CACHE_DIR", "cache-dir", "/var/cache/gitfleet", func(c *Controller) { c.CacheDir = "/var/cache/gitfleet" }},
		{"GITFLEET_INTERVAL", "interval", "45s", func(c *Controller) { c.Interval = 45 * time.Second }},
		{"GITFLEET_LISTEN", "listen", "127.0.0.1:9780", func(c *Controller) { c.Listen = "127.0.0.1:9780" }},
		{"GITFLEET_WEBHOOK_SECRET", "webhook-secret", "s3cret", func(c *Controller) { c.WebhookSecret = "s3cret" }},
		{"GITFLEET_ABANDON_GRACE", "abandon-grace", "1h", func(c *Controller) { c.AbandonGrace = time.Hour }},
		{"GITFLEET_OFFLINE_AFTER", "offline-after", "10m", func(c *Controller) { c.OfflineAfter = 10 * time.Minute }},
		{"GITFLEET_GIT_TIMEOUT", "git-timeout", "5s", func(c *Controller) { c.GitTimeout = 5 * time.Second }},
		{"GITFLEET_VERIFY_SIGNATURES", "verify-signatures", "every", func(c *Controller) { c.Signatures.Mode = "every" }},
		{"GITFLEET_ALLOWED_SIGNERS", "allowed-signers", "/etc/gitfleet/allowed_signers", func(c *Controller) { c.Signatures.AllowedSigners = "/etc/gitfleet/allowed_signers" }},
		{"GITFLEET_OPENPGP_KEYRING", "openpgp-keyring", "/etc/gitfleet/keyring.asc", func(c *Controller) { c.Signatures.Keyring = "/etc/gitfleet/keyring.asc" }},
		{"GITFLEET_MAX_DELETES", "max-deletes", "25", func(c *Controller) { c.MaxDeletes = 25 }},
	} {
		t.Run(tc.env, func(t *testing.T) {
			want := DefaultController()
			tc.want(&want)
			got, err := loadController(t, nil, map[string]string{tc.env: tc.value})
			require.NoError(t, err)
			assert.Equal(t, want, got)

			// The flag wins over the variable; an empty variable is unset.
			got, err = loadController(t, []string{"--" + tc.flag, tc.value}, map[string]string{tc.env: "0"})
			require.NoError(t, err)
			assert.Equal(t, want, got)
			got, err = loadController(t, nil, map[string]string{tc.env: ""})
			require.NoError(t, err)
			assert.Equal(t, DefaultController(), got)
		})
	}
}

func TestControllerDefaultsAndFleetConfig(t *testing.T) {
	c, err := loadController(t, []string{"--repo", "/srv/fleet.git"}, nil)
	require.NoError(t, err)
	fc, err := c.Fleet(nil)
	require.NoError(t, err)
	assert.Equal(t, fleet.VerifyOff, fc.Verify)
	assert.Equal(t, fleet.DefaultMaxDeletes, fc.MaxDeletes)
	assert.Equal(t, "/srv/fleet.git", fc.URL)
	assert.Equal(t, "main", fc.Branch)
	assert.Equal(t, "gitfleet/snapshots", fc.SnapshotsBranch)
	assert.Equal(t, "gitfleet/status", fc.StatusBranch)
	assert.Equal(t, 15*time.Minute, fc.AbandonGrace)
	assert.Equal(t, 3*time.Minute, fc.OfflineAfter)
	assert.Equal(t, gitsource.DefaultTimeout, fc.GitTimeout)
	assert.Equal(t, 15*time.Second, c.Interval)
	assert.ErrorIs(t, Controller{}.Repo.Check(), ErrUsage, "no repository is a usage error")
}

// Every key of the agent's file (README's reference) sets its field.
func TestAgentFileKeys(t *testing.T) {
	tokenFile := writeFile(t, "token", "file-token\n")
	passwordFile := writeFile(t, "password", "file-password\n")
	const head = "repo: {url: /srv/fleet.git}\nhost: hv-a\n"
	base := func() Agent {
		a := DefaultAgent()
		a.RepoURL, a.Host = "/srv/fleet.git", "hv-a"
		return a
	}
	for _, tc := range []struct {
		name, yaml string
		want       func(*Agent)
	}{
		{"repo.url", "repo: {url: 'https://git.example.com/fleet.git'}\nhost: hv-a\n", func(a *Agent) { a.RepoURL = "https://git.example.com/fleet.git" }},
		{"repo.auth.tokenFile", "repo: {url: /srv/fleet.git, auth: {tokenFile: " + tokenFile + "}}\nhost: hv-a\n", func(a *Agent) { a.Auth.Token = "file-token" }},
		{"repo.auth.token", "repo: {url: /srv/fleet.git, auth: {token: t0}}\nhost: hv-a\n", func(a *Agent) { a.Auth.Token = "t0" }},
		{"repo.auth.username and password", "repo: {url: /srv/fleet.git, auth: {username: u, password: p}}\nhost: hv-a\n", func(a *Agent) { a.Auth.Username, a.Auth.Password = "u", "p" }},
		{"repo.auth.passwordFile", "repo: {url: /srv/fleet.git, auth: {username: u, passwordFile: " + passwordFile + "}}\nhost: hv-a\n", func(a *Agent) { a.Auth.Username, a.Auth.Password = "u", "file-password" }},
		{"repo.auth.sshKeyFile and knownHostsFile", "repo: {url: /srv/fleet.git, auth: {sshKeyFile: /k, knownHostsFile: /kh}}\nhost: hv-a\n", func(a *Agent) { a.Auth.SSHKeyFile, a.Auth.KnownHostsFile = "/k", "/kh" }},
		{"host", "repo: {url: /srv/fleet.git}\nhost: hv-b\n", func(a *Agent) { a.Host = "hv-b" }},
		{"statusRepo.url", head + "statusRepo: {url: 'https://git.example.com/fleet-status.git'}\n", func(a *Agent) { a.StatusRepoURL = "https://git.example.com/fleet-status.git" }},
		{"stateDir", head + "stateDir: /srv/state\n", func(a *Agent) { a.StateDir = "/srv/state" }},
		{"backend", head + "backend: memory\n", func(a *Agent) { a.Backend = BackendMemory }},
		{"qemu.accel", head + "qemu: {accel: tcg}\n", func(a *Agent) { a.QEMU.Accel = "tcg" }},
		{"qemu.systemdScope", head + "qemu: {systemdScope: false}\n", func(a *Agent) { a.QEMU.SystemdScope = false }},
		{"qemu.user", head + "qemu: {user: vmuser}\n", func(a *Agent) { a.QEMU.RunAs = "vmuser" }},
		{"qemu.user root", head + "qemu: {user: root}\n", func(a *Agent) { a.QEMU.RunAs = "root" }},
		{"qemu.noSandbox", head + "qemu: {noSandbox: true}\n", func(a *Agent) { a.QEMU.NoSandbox = true }},
		{"artifacts", head + "artifacts: {fileRoots: [/srv/images/], allowNetworks: [10.1.2.3/16], maxSizeGB: 2, timeout: 5m, stallTimeout: 10s}\n", func(a *Agent) {
			a.Artifacts = qemu.ArtifactPolicy{FileRoots: []string{"/srv/images"}, AllowNetworks: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")},
				MaxSize: 2 << 30, Timeout: 5 * time.Minute, StallTimeout: 10 * time.Second}
		}},
		{"intervals", head + "intervals: {tick: 10s, poll: 15s, heartbeat: 60s}\n", func(a *Agent) {
			a.TickInterval, a.PollInterval, a.Heartbeat = 10*time.Second, 15*time.Second, time.Minute
		}},
		{"graces", head + "graces: {tombstone: 5m, vanish: 1h, image: 48h}\n", func(a *Agent) {
			a.TombstoneGrace, a.VanishGrace, a.ImageGrace = 5*time.Minute, time.Hour, 48*time.Hour
		}},
		{"graces.image negative is off", head + "graces: {image: -1s}\n", func(a *Agent) { a.ImageGrace = -time.Second }},
		{"vmTimeout", head + "vmTimeout: 45m\n", func(a *Agent) { a.VMTimeout = 45 * time.Minute }},
		{"vmTimeout 0 is none", head + "vmTimeout: 0s\n", func(a *Agent) { a.VMTimeout = 0 }},
		{"gitTimeout", head + "gitTimeout: 20s\n", func(a *Agent) { a.GitTimeout = 20 * time.Second }},
		{"appendStatus", head + "appendStatus: true\n", func(a *Agent) { a.AppendStatus = true }},
		{"readyTimeout", head + "readyTimeout: 3m\n", func(a *Agent) { a.ReadyTimeout = 3 * time.Minute }},
		{"maxAttempts", head + "maxAttempts: 5\n", func(a *Agent) { a.MaxAttempts = 5 }},
		{"logLevel", head + "logLevel: warn\n", func(a *Agent) { a.LogLevel = logrus.WarnLevel }},
		{"listen", head + "listen: 127.0.0.1:9781\n", func(a *Agent) { a.Listen = "127.0.0.1:9781" }},
		{"epochReset", head + "epochReset: {from: 9007199254740000, to: 41}\n", func(a *Agent) { a.EpochReset = &agent.EpochReset{From: 9007199254740000, To: 41} }},
		{"signingKey", head + "signingKey: /etc/gitfleet/agent_ed25519\n", func(a *Agent) { a.SigningKey = "/etc/gitfleet/agent_ed25519" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, "agent.yaml", tc.yaml)
			want := base()
			want.File = path
			tc.want(&want)
			got, err := loadAgent(t, []string{"--config", path}, nil)
			require.NoError(t, err)
			assert.Equal(t, want, *got)
		})
	}
}

func TestAgentDefaults(t *testing.T) {
	a, err := loadAgent(t, []string{"--repo", "/srv/fleet.git", "--host", "hv-a"}, nil)
	require.NoError(t, err)
	assert.Equal(t, "/var/lib/gitfleet", a.StateDir)
	assert.Equal(t, BackendQEMU, a.Backend)
	assert.Equal(t, QEMU{Accel: "auto", SystemdScope: true}, a.QEMU, "QEMU's user is the backend's choice (qemu.Config.RunAs)")
	assert.Equal(t, 30*time.Minute, a.VMTimeout, "a VM's pass is bounded by default")
	assert.Empty(t, a.Artifacts.FileRoots, "no file:// root by default")
	assert.Empty(t, a.Artifacts.AllowNetworks, "no denied network allowed by default")
	assert.Equal(t, logrus.InfoLevel, a.LogLevel)
}

// The agent's variables and flags: flag over variable over file over
// default, for each setting that has all of them.
func TestAgentPrecedence(t *testing.T) {
	file := writeFile(t, "agent.yaml", "repo: {url: /file.git}\nstatusRepo: {url: /file-status.git}\nhost: hv-file\nstateDir: /file-state\n")
	for _, tc := range []struct {
		env, flag, fileValue, value string
		get                         func(*Agent) string
	}{
		{"GITFLEET_REPO", "repo", "/file.git", "/other.git", func(a *Agent) string { return a.RepoURL }},
		{"GITFLEET_STATUS_REPO", "status-repo", "/file-status.git", "/other-status.git", func(a *Agent) string { return a.StatusRepoURL }},
		{"GITFLEET_HOST", "host", "hv-file", "hv-other", func(a *Agent) string { return a.Host }},
		{"GITFLEET_STATE_DIR", "state-dir", "/file-state", "/other-state", func(a *Agent) string { return a.StateDir }},
	} {
		t.Run(tc.env, func(t *testing.T) {
			a, err := loadAgent(t, []string{"--config", file}, nil)
			require.NoError(t, err)
			assert.Equal(t, tc.fileValue, tc.get(a), "file")
			a, err = loadAgent(t, []string{"--config", file}, map[string]string{tc.env: tc.value})
			require.NoError(t, err)
			assert.Equal(t, tc.value, tc.get(a), "variable over file")
			a, err = loadAgent(t, []string{"--config", file, "--" + tc.flag, tc.value}, map[string]string{tc.env: "/ignored"})
			require.NoError(t, err)
			assert.Equal(t, tc.value, tc.get(a), "flag over variable")
		})
	}
	t.Run("GITFLEET_CONFIG", func(t *testing.T) {
		a, err := loadAgent(t, nil, map[string]string{"GITFLEET_CONFIG": file})
		require.NoError(t, err)
		assert.Equal(t, file, a.File)
		assert.Equal(t, "hv-file", a.Host)
	})
	t.Run("GITFLEET_TOKEN", func(t *testing.T) {
		env := map[string]string{"GITFLEET_TOKEN": "env-token"}
		a, err := loadAgent(t, []string{"--config", file}, env)
		require.NoError(t, err)
		assert.Equal(t, "env-token", a.Auth.Token, "the variable supplies a token the file does not name")
		withToken := writeFile(t, "agent.yaml", "repo: {url: /file.git, auth: {token: file-token}}\nhost: hv-file\n")
		a, err = loadAgent(t, []string{"--config", withToken}, env)
		require.NoError(t, err)
		assert.Equal(t, "file-token", a.Auth.Token, "the file's token wins")
	})
}

// A malformed value of each kind, from the environment: the error names
// the variable, its value and the flag it stands in for, and is a usage
// error.
func TestMalformedEnvironment(t *testing.T) {
	for _, tc := range []struct {
		kind, cmd, env, value, want string
	}{
		{"duration", "controller", "GITFLEET_GIT_TIMEOUT", "5x", `GITFLEET_GIT_TIMEOUT="5x": invalid duration, like 90s or 5m (environment for --git-timeout)`},
		{"negative duration", "controller", "GITFLEET_INTERVAL", "-5s", `GITFLEET_INTERVAL="-5s": invalid duration, like 90s or 5m (environment for --interval)`},
		{"URL", "controller", "GITFLEET_REPO", "http://[::1", `GITFLEET_REPO="http://[::1": invalid URL: missing ']' in host (environment for --repo)`},
		{"path", "controller", "GITFLEET_CACHE_DIR", "~/cache", `GITFLEET_CACHE_DIR="~/cache": invalid path: ~ is not expanded here; give the full path (environment for --cache-dir)`},
		{"agent URL", "agent", "GITFLEET_REPO", "http://[::1", `GITFLEET_REPO="http://[::1": invalid URL`},
		{"agent path", "agent", "GITFLEET_STATE_DIR", "~/state", `GITFLEET_STATE_DIR="~/state": invalid path`},
		{"agent config path", "agent", "GITFLEET_CONFIG", "~/agent.yaml", `GITFLEET_CONFIG="~/agent.yaml": invalid path`},
		{"agent host", "agent", "GITFLEET_HOST", "../x", `GITFLEET_HOST: host "../x" is not a DNS label`},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			env := map[string]string{tc.env: tc.value}
			var err error
			if tc.cmd == "agent" {
				// Each setting but the one under test from a flag.
				var args []string
				for flag, v := range map[string]string{"GITFLEET_REPO": "--repo=/x", "GITFLEET_HOST": "--host=hv-a"} {
					if flag != tc.env {
						args = append(args, v)
					}
				}
				_, err = loadAgent(t, args, env)
			} else {
				_, err = loadController(t, nil, env)
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.ErrorIs(t, err, ErrUsage)
		})
	}
}

// The same kinds as flags: pflag's error names the flag and the value.
func TestMalformedFlags(t *testing.T) {
	for _, tc := range []struct{ kind, flag, value, want string }{
		{"duration", "--git-timeout", "5x", "invalid duration"},
		{"URL", "--repo", "http://[::1", "invalid URL"},
		{"URL with ~", "--repo", "~/fleet", "invalid URL: ~ is not expanded"},
		{"path", "--cache-dir", "~/cache", "invalid path"},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			_, err := loadController(t, []string{tc.flag, tc.value}, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.flag)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// A malformed value of each kind in the agent's file: FILE:LINE:COL, the
// field, the value and what was wanted.
func TestMalformedAgentFile(t *testing.T) {
	const head = "repo: {url: /x}\nhost: hv-a\n"
	for _, tc := range []struct{ kind, yaml, want string }{
		{"duration", head + "intervals: {tick: soon}\n", `:3:19: intervals.tick: "soon" is not a duration, like 90s or 5m`},
		{"negative duration", head + "gitTimeout: -1s\n", `:3:13: gitTimeout: "-1s" is not a duration`},
		{"signed duration", head + "graces: {image: never}\n", `:3:17: graces.image: "never" is not a duration`},
		{"int", head + "maxAttempts: many\n", `:3:14: maxAttempts: must be an integer, got the string "many"`},
		{"negative int", head + "artifacts: {maxSizeGB: -1}\n", `:3:24: artifacts.maxSizeGB: -1: want 0 (the default) or more`},
		{"bool", head + "qemu: {systemdScope: maybe}\n", `:3:22: qemu.systemdScope: must be true or false, got the string "maybe"`},
		{"URL", "repo: {url: 'http://[::1'}\nhost: hv-a\n", `:1:13: repo.url: invalid URL: missing ']' in host`},
		{"path", head + "stateDir: ~/state\n", `:3:11: stateDir: invalid path: ~ is not expanded here`},
		{"relative file root", head + "artifacts: {fileRoots: [images]}\n", `:3:25: artifacts.fileRoots[0]: "images" is not an absolute path`},
		{"network", head + "artifacts: {allowNetworks: [localhost]}\n", `:3:29: artifacts.allowNetworks[0]: "localhost" is not a CIDR prefix`},
		{"backend", head + "backend: xen\n", `:3:10: backend: "xen": want qemu or memory`},
		{"accel", head + "qemu: {accel: fast}\n", `:3:15: qemu.accel: "fast": want auto or kvm or tcg`},
		{"log level", head + "logLevel: loud\n", `:3:11: logLevel: not a valid logrus Level: "loud"`},
		{"host", "repo: {url: /x}\nhost: HV_A\n", `:2:7: host: host "HV_A" is not a DNS label`},
		{"mapping for a value", head + "gitTimeout: {a: 1}\n", `:3:13: gitTimeout: must be a string, got a mapping`},
		{"value for a section", head + "graces: 5m\n", `:3:9: graces: must be a mapping, got the string "5m"`},
		{"value for a list", head + "artifacts: {fileRoots: /srv}\n", `:3:24: artifacts.fileRoots: must be a list, got the string "/srv"`},
		{"not a mapping", "- a\n- b\n", `:1:1: a config file must be a mapping of settings; got a list`},
		{"unknown field", head + "graces:\n  vanish: 1h\n  tombstom: 5m\n", `:5:3: graces.tombstom: unknown field "tombstom"; did you mean "tombstone"?`},
		{"controller key", head + "controllerKeys:\n  - " + testKeyA + "\n  - ssh-ed25519 AAAAnotbase64\n", `:5:5: controllerKeys[1]: not an SSH public key line`},
		{"controller key with options", head + "controllerKeys: ['cert-authority " + testKeyA + "']\n", `:3:18: controllerKeys[0]: options are not allowed here`},
		{"signing key path", head + "signingKey: ~/.ssh/id_ed25519\n", `:3:13: signingKey: invalid path: ~ is not expanded here`},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			path := writeFile(t, "agent.yaml", tc.yaml)
			_, err := loadAgent(t, []string{"--config", path}, nil)
			require.Error(t, err)
			assert.Equal(t, path+tc.want, strings.SplitN(err.Error(), "\n", 2)[0][:len(path+tc.want)])
			assert.False(t, errors.Is(err, ErrUsage), "a fault of the file is not a usage error")
		})
	}
}

// A missing repository or host is a usage error; a missing file is not.
func TestAgentRequiredAndMissingFile(t *testing.T) {
	_, err := loadAgent(t, []string{"--repo", "/x"}, nil)
	assert.ErrorIs(t, err, ErrUsage)
	_, err = loadAgent(t, []string{"--host", "hv-a"}, nil)
	assert.ErrorIs(t, err, ErrUsage)
	_, err = loadAgent(t, []string{"--config", "/does/not/exist.yaml"}, nil)
	require.Error(t, err)
	assert.False(t, errors.Is(err, ErrUsage))
	_, err = loadAgent(t, []string{"--config", writeFile(t, "agent.yaml", "repo: {url: /x, auth: {tokenFile: /does/not/exist}}\nhost: hv-a\n")}, nil)
	assert.ErrorContains(t, err, "repo.auth.tokenFile")
}

// --verify-signatures reads the allowed signers: a mode without a file, a
// file that does not parse (named with its line) and --max-deletes 0 are
// usage errors; a good file gives the fleet.Config its signers.
func TestControllerSignaturesAndDeletes(t *testing.T) {
	good := writeFile(t, "allowed_signers", "ann@example.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGJ0sY7c5VbqOZ3zVtnDQ6hxrsNrZuqzlaaJD4o7TX5j\n")
	bad := writeFile(t, "bad_signers", "# maintainers\nann@example.com ssh-ed25519 nope\n")
	key := trusttest.NewSSHKey(t, "gitfleet-controller")
	readableKey := writeFile(t, "readable_key", "irrelevant")
	require.NoError(t, os.Chmod(readableKey, 0o644))
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"mode without files", []string{"--verify-signatures", "head"}, "needs --allowed-signers or --openpgp-keyring"},
		{"bad file", []string{"--verify-signatures", "every", "--allowed-signers", bad}, bad + ":2:"},
		{"missing file", []string{"--verify-signatures", "head", "--openpgp-keyring", "/nonexistent/keyring.asc"}, "/nonexistent/keyring.asc"},
		{"max deletes 0", []string{"--max-deletes", "0"}, "--max-deletes 0"},
		{"signing key others can read", []string{"--signing-key", readableKey}, "--signing-key: signing key " + readableKey + " has mode 0644"},
		{"signing key not a key", []string{"--signing-key", good}, "--signing-key: signing key " + good},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadController(t, append([]string{"--repo", "/srv/fleet.git"}, tc.args...), nil)
			require.NoError(t, err)
			_, err = c.Fleet(nil)
			require.ErrorIs(t, err, ErrUsage)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err := loadController(t, []string{"--repo", "/srv/fleet.git", "--verify-signatures", "sometimes"}, nil)
	require.Error(t, err, "an unknown mode is refused by the flag")

	c, err := loadController(t, []string{"--repo", "/srv/fleet.git", "--verify-signatures", "every", "--allowed-signers", good, "--max-deletes", "-1"}, nil)
	require.NoError(t, err)
	fc, err := c.Fleet(nil)
	require.NoError(t, err)
	assert.Equal(t, fleet.VerifyEvery, fc.Verify)
	assert.NotNil(t, fc.Signers)
	assert.Equal(t, -1, fc.MaxDeletes)
	assert.Nil(t, fc.SigningKey, "no --signing-key: nothing signed")

	c, err = loadController(t, []string{"--repo", "/srv/fleet.git", "--signing-key", key.Private}, nil)
	require.NoError(t, err)
	fc, err = c.Fleet(nil)
	require.NoError(t, err)
	require.NotNil(t, fc.SigningKey)
	sig, err := fc.SigningKey.SignCommit([]byte("tree 0\n"))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(sig, "-----BEGIN SSH SIGNATURE-----"), sig)
}

// Two public keys (ed25519, made for these tests; the private halves are
// not kept).
const (
	testKeyA = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMYho+K0VYK4PzBVjogDQiQYyYVZNkhc+WH4UipvMyX2 controller-2025"
	testKeyB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHE+RFQWADQ8ET0erG2aOsfqB3NhBE604r37X2Wn0eo9 controller-2026"
)

// controllerKeys and controllerKeysFile make one list of the keys the
// agent accepts snapshots from; neither leaves snapshots unverified.
func TestAgentControllerKeys(t *testing.T) {
	const head = "repo: {url: /srv/fleet.git}\nhost: hv-a\n"
	signers := writeFile(t, "controller_signers", "# the controller's keys\ngitfleet-controller "+testKeyB+"\n")
	empty := writeFile(t, "empty_signers", "# none yet\n")
	for _, tc := range []struct {
		name, yaml string
		keys       int
		wantErr    string
	}{
		{"none: not verified", head, 0, ""},
		{"a list", head + "controllerKeys: ['" + testKeyA + "', '" + testKeyB + "']\n", 2, ""},
		{"a file", head + "controllerKeysFile: " + signers + "\n", 1, ""},
		{"both", head + "controllerKeys: ['" + testKeyA + "']\ncontrollerKeysFile: " + signers + "\n", 2, ""},
		{"an empty file", head + "controllerKeysFile: " + empty + "\n", 0, "holds no key"},
		{"a missing file", head + "controllerKeysFile: /nonexistent/signers\n", 0, "controllerKeysFile: open /nonexistent/signers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, "agent.yaml", tc.yaml)
			got, err := loadAgent(t, []string{"--config", path}, nil)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				assert.Contains(t, err.Error(), path)
				return
			}
			require.NoError(t, err)
			if tc.keys == 0 {
				assert.Nil(t, got.ControllerKeys)
				return
			}
			require.NotNil(t, got.ControllerKeys)
			assert.Equal(t, tc.keys, got.ControllerKeys.Len())
		})
	}
}
