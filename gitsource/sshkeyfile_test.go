package gitsource

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The ssh key of a remote (the controller's --ssh-key, an agent's
// sshKeyFile) is refused as ssh refuses an identity file: readable by
// others, a symbolic link, or owned by another user.
func TestSSHKeyFileCheckedLikeAKey(t *testing.T) {
	hostKey := newHostKey(t)
	keyFile, known := sshFixtures(t, "git.example.com", hostKey)
	const url = "ssh://git.example.com/fleet.git"
	_, err := Auth{SSHKeyFile: keyFile, KnownHostsFile: known}.method(url)
	require.NoError(t, err)

	require.NoError(t, os.Chmod(keyFile, 0o644))
	_, err = Auth{SSHKeyFile: keyFile, KnownHostsFile: known}.method(url)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "mode 0644")
	require.NoError(t, os.Chmod(keyFile, 0o600))

	link := filepath.Join(t.TempDir(), "id")
	require.NoError(t, os.Symlink(keyFile, link))
	_, err = Auth{SSHKeyFile: link, KnownHostsFile: known}.method(url)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "symbolic link")

	if os.Geteuid() == 0 {
		require.NoError(t, os.Chown(keyFile, 4242, 4242))
		_, err = Auth{SSHKeyFile: keyFile, KnownHostsFile: known}.method(url)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "owned by uid 4242")
	}
}
