package gitsource

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"testing"

	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	gitssh "github.com/go-git/go-git/v5/plumbing/transport/ssh"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// sshFixtures writes a client key and a known_hosts file naming host with
// hostKey, and returns their paths.
func sshFixtures(t *testing.T, host string, hostKey ssh.PublicKey) (keyFile, knownHosts string) {
	t.Helper()
	dir := t.TempDir()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	block, err := ssh.MarshalPrivateKey(priv, "")
	require.NoError(t, err)
	keyFile = filepath.Join(dir, "id_ed25519")
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(block), 0o600))
	knownHosts = filepath.Join(dir, "known_hosts")
	line := knownhosts.Line([]string{knownhosts.Normalize(host)}, hostKey) + "\n"
	require.NoError(t, os.WriteFile(knownHosts, []byte(line), 0o600))
	return keyFile, knownHosts
}

func newHostKey(t *testing.T) ssh.PublicKey {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	k, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	return k
}

func TestAuthMethodHTTP(t *testing.T) {
	for _, tc := range []struct {
		name string
		auth Auth
		want *githttp.BasicAuth
	}{
		{"none", Auth{}, nil},
		{"token defaults user git", Auth{Token: "t0k"}, &githttp.BasicAuth{Username: "git", Password: "t0k"}},
		{"token with user", Auth{Token: "t0k", Username: "bot"}, &githttp.BasicAuth{Username: "bot", Password: "t0k"}},
		{"basic", Auth{Username: "u", Password: "pa55word"}, &githttp.BasicAuth{Username: "u", Password: "pa55word"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := tc.auth.method("https://git.example.com/fleet.git")
			require.NoError(t, err)
			if tc.want == nil {
				assert.Nil(t, m)
				return
			}
			assert.Equal(t, tc.want, m)
			assert.NotContains(t, m.String(), tc.want.Password, "the method's String never shows the secret")
		})
	}
	_, err := Auth{SSHKeyFile: "/k"}.method("https://git.example.com/fleet.git")
	assert.Error(t, err, "an ssh key for an https remote is a configuration mistake")
	m, err := Auth{Token: "t"}.method("/srv/git/fleet.git")
	require.NoError(t, err)
	assert.Nil(t, m, "local remotes take no credentials")
}

func TestAuthMethodSSH(t *testing.T) {
	hostKey := newHostKey(t)
	keyFile, known := sshFixtures(t, "git.example.com:2222", hostKey)
	for _, url := range []string{
		"ssh://deploy@git.example.com:2222/fleet.git",
		"ssh://git.example.com:2222/fleet.git",
	} {
		t.Run(url, func(t *testing.T) {
			m, err := Auth{SSHKeyFile: keyFile, KnownHostsFile: known}.method(url)
			require.NoError(t, err)
			keys, ok := m.(*gitssh.PublicKeys)
			require.True(t, ok, "an ssh key gives public-key auth, got %T", m)
			if url[6:12] == "deploy" {
				assert.Equal(t, "deploy", keys.User)
			} else {
				assert.Equal(t, "git", keys.User)
			}
			assert.Equal(t, []string{ssh.KeyAlgoED25519}, keys.HostKeyAlgorithms)
			addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2222}
			assert.NoError(t, keys.HostKeyCallback("git.example.com:2222", addr, hostKey), "the known host key is accepted")
			assert.Error(t, keys.HostKeyCallback("git.example.com:2222", addr, newHostKey(t)), "another key for the host is refused")
			assert.Error(t, keys.HostKeyCallback("evil.example.com:2222", addr, hostKey), "an unknown host is refused")
		})
	}
	t.Run("scp-like", func(t *testing.T) {
		keyFile, known := sshFixtures(t, "git.example.com", hostKey)
		m, err := Auth{SSHKeyFile: keyFile, KnownHostsFile: known}.method("git@git.example.com:org/fleet.git")
		require.NoError(t, err)
		keys := m.(*gitssh.PublicKeys)
		assert.Equal(t, "git", keys.User)
		assert.NoError(t, keys.HostKeyCallback("git.example.com:22", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 22}, hostKey))
	})
	t.Run("errors", func(t *testing.T) {
		_, err := Auth{SSHKeyFile: filepath.Join(t.TempDir(), "missing")}.method("ssh://git.example.com/fleet.git")
		assert.Error(t, err)
		_, err = Auth{SSHKeyFile: keyFile, KnownHostsFile: filepath.Join(t.TempDir(), "missing")}.method("ssh://git.example.com/fleet.git")
		assert.Error(t, err)
		_, err = Auth{Token: "t"}.method("ssh://git.example.com/fleet.git")
		assert.Error(t, err)
	})
}

func TestRedactURL(t *testing.T) {
	assert.Equal(t, "https://***@example.com/r.git", redactURL("https://u:pw@example.com/r.git"))
	assert.Equal(t, "https://***@example.com/r.git?private_token=***", redactURL("https://TOKEN@example.com/r.git?private_token=TOKEN"))
	assert.Equal(t, "https://example.com/r.git", redactURL("https://example.com/r.git"))
}
