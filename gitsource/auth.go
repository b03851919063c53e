package gitsource

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	gitssh "github.com/go-git/go-git/v5/plumbing/transport/ssh"

	"github.com/gitfleet/gitfleet/internal/redact"
	"github.com/gitfleet/gitfleet/internal/secretfile"
)

// maxSSHKeyFile bounds an ssh private key file (an RSA 16384-bit key is
// about 13 kB).
const maxSSHKeyFile = 64 << 10

// method builds the go-git auth method for url: nil for local remotes and
// for a network remote without credentials; HTTP basic auth (Token as the
// password) for http(s); a public key checked against known_hosts for ssh.
// Credentials of the wrong kind for the URL are an error, so a typo in a
// configuration does not silently go unauthenticated.
func (a Auth) method(url string) (transport.AuthMethod, error) {
	ep, err := transport.NewEndpoint(url)
	if err != nil {
		return nil, err
	}
	switch ep.Protocol {
	case "file":
		return nil, nil
	case "http", "https":
		if a.SSHKeyFile != "" {
			return nil, fmt.Errorf("an ssh key is set for %s remote", ep.Protocol)
		}
		if a.Token != "" {
			user := a.Username
			if user == "" {
				user = "git"
			}
			return &githttp.BasicAuth{Username: user, Password: a.Token}, nil
		}
		if a.Username != "" || a.Password != "" {
			return &githttp.BasicAuth{Username: a.Username, Password: a.Password}, nil
		}
		return nil, nil
	case "ssh":
		if a.Token != "" {
			return nil, errors.New("a token is set for an ssh remote (tokens are for http(s))")
		}
		if a.SSHKeyFile == "" {
			return nil, nil
		}
		user := ep.User
		if user == "" {
			user = a.Username
		}
		if user == "" {
			user = "git"
		}
		// Refused as ssh refuses an identity file (mode, owner, a
		// symbolic link). Password, when set, unlocks an encrypted key.
		pem, err := secretfile.Read(a.SSHKeyFile, "ssh key", "others can read the key that pushes to the repository", maxSSHKeyFile)
		if err != nil {
			return nil, err
		}
		keys, err := gitssh.NewPublicKeys(user, pem, a.Password)
		if err != nil {
			return nil, fmt.Errorf("ssh key %s: %w", a.SSHKeyFile, err)
		}
		known := a.KnownHostsFile
		if known == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return nil, fmt.Errorf("known_hosts: %w", err)
			}
			known = filepath.Join(home, ".ssh", "known_hosts")
		}
		db, err := gitssh.NewKnownHostsDb(known)
		if err != nil {
			return nil, fmt.Errorf("known_hosts %s: %w", known, err)
		}
		keys.HostKeyCallback = db.HostKeyCallback()
		port := ep.Port
		if port == 0 {
			port = 22
		}
		// Offer only the key types known_hosts holds for this host, so the
		// server does not present a key of another type that would fail.
		keys.HostKeyAlgorithms = db.HostKeyAlgorithms(net.JoinHostPort(ep.Host, strconv.Itoa(port)))
		return keys, nil
	default:
		return nil, fmt.Errorf("unsupported protocol %q: gitfleet reads file, http(s) and ssh URLs", ep.Protocol)
	}
}

// redactURL drops the credentials a URL may carry (user, password, query
// tokens) before it reaches a log line or an error.
func redactURL(url string) string { return redact.URL(url) }
