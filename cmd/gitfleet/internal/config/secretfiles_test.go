package config

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/agent"
)

// The agent's token and password files are secrets like its key files:
// one that others may read, a symbolic link or a file of another user is
// refused, naming the key and the file, never quoting it. (They were read
// whatever their mode.)
func TestAgentSecretFilesCheckedLikeKeyFiles(t *testing.T) {
	for _, field := range []string{"tokenFile", "passwordFile"} {
		t.Run(field, func(t *testing.T) {
			config := func(path string) string {
				return writeFile(t, "agent.yaml", "repo: {url: /srv/fleet.git, auth: {username: u, "+field+": "+path+"}}\nhost: hv-a\n")
			}
			good := writeFile(t, "secret", "s3cret-value\n")
			_, err := loadAgent(t, []string{"--config", config(good)}, nil)
			require.NoError(t, err, "mode 0600")

			for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o660} {
				p := writeFile(t, "secret", "s3cret-value\n")
				require.NoError(t, os.Chmod(p, mode))
				_, err := loadAgent(t, []string{"--config", config(p)}, nil)
				require.Error(t, err, "mode %04o", mode)
				assert.Contains(t, err.Error(), "repo.auth."+field)
				assert.Contains(t, err.Error(), "chmod 600")
				assert.NotContains(t, err.Error(), "s3cret-value")
			}

			link := filepath.Join(t.TempDir(), "link")
			require.NoError(t, os.Symlink(good, link))
			_, err = loadAgent(t, []string{"--config", config(link)}, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "symbolic link")

			if os.Geteuid() == 0 {
				p := writeFile(t, "secret", "s3cret-value\n")
				require.NoError(t, os.Chown(p, 4242, 4242))
				_, err := loadAgent(t, []string{"--config", config(p)}, nil)
				require.Error(t, err)
				assert.Contains(t, err.Error(), "owned by uid 4242")
			}
		})
	}
}

// Each backup repository's files are secrets too: the password file is
// required, an ssh key comes with its known_hosts, and a password file
// others may read is refused without quoting it.
func TestAgentBackupRepositorySecrets(t *testing.T) {
	config := func(entry string) string {
		return writeFile(t, "agent.yaml", "repo: {url: /srv/fleet.git}\nhost: hv-a\nbackupRepositories:\n  nas: "+entry+"\n")
	}
	pw := writeFile(t, "password", "restic-s3cret\n")
	key := writeFile(t, "id_ed25519", "key\n")
	c, err := loadAgent(t, []string{"--config", config("{passwordFile: " + pw + ", sshKeyFile: " + key + ", knownHostsFile: /etc/gitfleet/known_hosts}")}, nil)
	require.NoError(t, err)
	assert.Equal(t, agent.BackupSecrets{PasswordFile: pw, SSHKey: key, KnownHosts: "/etc/gitfleet/known_hosts"}, c.BackupSecrets["nas"])

	for _, tc := range []struct{ entry, want string }{
		{"{environmentFile: " + pw + "}", "backupRepositories.nas.passwordFile: missing"},
		{"{passwordFile: " + pw + ", sshKeyFile: " + key + "}", "sshKeyFile and knownHostsFile go together"},
		{"{passwordFile: /nonexistent/password}", "backupRepositories.nas.passwordFile"},
	} {
		_, err := loadAgent(t, []string{"--config", config(tc.entry)}, nil)
		require.Error(t, err, tc.entry)
		assert.Contains(t, err.Error(), tc.want)
	}
	open := writeFile(t, "password", "restic-s3cret\n")
	require.NoError(t, os.Chmod(open, 0o644))
	_, err = loadAgent(t, []string{"--config", config("{passwordFile: " + open + "}")}, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "chmod 600")
	assert.NotContains(t, err.Error(), "restic-s3cret")
	_, err = loadAgent(t, []string{"--config", writeFile(t, "agent.yaml", "repo: {url: /srv/fleet.git}\nhost: hv-a\nbackupRepositories:\n  NAS: {passwordFile: "+pw+"}\n")}, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "repository name")
}
