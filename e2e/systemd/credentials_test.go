package systemd

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// The controller's unit reaches an ssh remote with the key and known_hosts
// that docs/operating.md hands it as systemd credentials. Under
// DynamicUser=yes and ProtectHome=yes it can open neither a root-only file
// nor a home directory; the guide's drop-in (LoadCredential= and
// GITFLEET_SSH_KEY=%d/…) is taken from the guide itself, so the test fails
// when the guide's drop-in stops working.
func TestSystemdControllerSSHCredentials(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operating.md")
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)```ini\n(\\[Service\\]\nLoadCredential=ssh-key:.*?)```").FindSubmatch(doc)
	require.NotNil(t, m, "docs/operating.md shows the controller's ssh drop-in")
	dropIn := string(m[1])

	s, f := bootSystemd(t, "backend: memory\n")
	f.push("a host", map[string]string{"hosts/" + host + ".yaml": hostFile})
	l, err := s.m.Listen("127.0.0.1:0")
	require.NoError(t, err)
	srv := gittest.ServeSSHOn(t, filepath.Dir(f.bare), l)
	key, err := os.ReadFile(srv.KeyFile)
	require.NoError(t, err)
	known, err := os.ReadFile(srv.KnownHostsFile)
	require.NoError(t, err)

	// The guide's steps, with the test server's key and host key in place
	// of ssh-keygen and ssh-keyscan.
	s.sh(fmt.Sprintf(`install -d -m 0700 /etc/gitfleet/controller
cat >/etc/gitfleet/controller/id_ed25519 <<'EOF'
%sEOF
cat >/etc/gitfleet/controller/known_hosts <<'EOF'
%sEOF
chmod 0600 /etc/gitfleet/controller/id_ed25519 /etc/gitfleet/controller/known_hosts
printf 'GITFLEET_REPO=%%s\nGITFLEET_INTERVAL=%%s\n' %q %q >/etc/gitfleet/controller.env
install -d /etc/systemd/system/gitfleet-controller.service.d
cat >/etc/systemd/system/gitfleet-controller.service.d/ssh.conf <<'EOF'
%sEOF
systemctl daemon-reload`, key, known, srv.URL(filepath.Base(f.bare)), controllerInterval, dropIn))

	s.timed("systemctl", "start", "gitfleet-controller")
	f.waitFor("the controller (a dynamic user) publishes over ssh with its credentials", func() (bool, string) {
		return f.snapshot() != nil, "no snapshot for " + host + "; the controller's journal:\n" + s.journal("gitfleet-controller")
	})
}
