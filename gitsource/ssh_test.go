package gitsource_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// TestSSH: fetch, ls-remote and a compare-and-swap push over ssh with a key
// checked against known_hosts; a server key that known_hosts does not name
// is refused.
func TestSSH(t *testing.T) {
	ctx := context.Background()
	dir := gittest.NewBare(t)
	c := gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{"a": "1"}})
	srv := gittest.ServeSSH(t, filepath.Dir(dir))
	url := srv.URL(filepath.Base(dir))
	auth := gitsource.Auth{SSHKeyFile: srv.KeyFile, KnownHostsFile: srv.KnownHostsFile}

	r := open(t, gitsource.Options{URL: url, Auth: auth, CacheDir: t.TempDir()})
	tip, err := r.Fetch(ctx, "main")
	require.NoError(t, err)
	assert.Equal(t, c, tip)
	head, err := r.RemoteHead(ctx, "main")
	require.NoError(t, err)
	assert.Equal(t, c, head)
	pushed, err := r.Update(ctx, "gitfleet/status", setFile("hosts/a.yaml", "a\n"))
	require.NoError(t, err)
	assert.Equal(t, pushed, gittest.Rev(t, dir, "gitfleet/status"))

	t.Run("host key mismatch", func(t *testing.T) {
		other := gittest.ServeSSH(t, filepath.Dir(dir))
		otherURL := other.URL(filepath.Base(dir))
		// known_hosts names other's address, but with srv's key.
		known := filepath.Join(t.TempDir(), "known_hosts")
		line := knownhosts.Line([]string{knownhosts.Normalize(other.Addr)}, srv.HostKey) + "\n"
		require.NoError(t, os.WriteFile(known, []byte(line), 0o600))
		r := open(t, gitsource.Options{URL: otherURL, Auth: gitsource.Auth{SSHKeyFile: other.KeyFile, KnownHostsFile: known}})
		_, err := r.RemoteHead(ctx, "main")
		assert.Error(t, err)
		_, err = r.Fetch(ctx, "main")
		assert.Error(t, err)

		// An address known_hosts does not list at all.
		r = open(t, gitsource.Options{URL: otherURL, Auth: gitsource.Auth{SSHKeyFile: other.KeyFile, KnownHostsFile: srv.KnownHostsFile}})
		_, err = r.RemoteHead(ctx, "main")
		assert.Error(t, err)

		// Control: the right known_hosts works.
		r = open(t, gitsource.Options{URL: otherURL, Auth: gitsource.Auth{SSHKeyFile: other.KeyFile, KnownHostsFile: other.KnownHostsFile}})
		_, err = r.RemoteHead(ctx, "main")
		assert.NoError(t, err)
	})
	t.Run("unknown client key", func(t *testing.T) {
		other := gittest.ServeSSH(t, t.TempDir())
		r := open(t, gitsource.Options{URL: url, Auth: gitsource.Auth{SSHKeyFile: other.KeyFile, KnownHostsFile: srv.KnownHostsFile}})
		_, err := r.Fetch(ctx, "main")
		assert.Error(t, err)
		assert.NotErrorIs(t, err, gitsource.ErrBranchNotFound)
	})
}
