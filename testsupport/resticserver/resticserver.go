// Package resticserver runs real servers a restic repository can live on,
// for tests: OpenSSH's sshd serving sftp with its own host key and one
// authorized client key, and rclone's REST server (`rclone serve
// restic`) behind HTTP basic authentication. Both listen only on an
// address the caller gives, which must be inside a network namespace the
// test made (testsupport/netnstest) or on loopback; AddAddress puts one on
// an interface of the current namespace.
//
// Servers stop when the test ends. Every file they use lives in the
// test's temporary directories.
package resticserver

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
	"golang.org/x/crypto/ssh"
)

// AddAddress gives the current network namespace a veth pair, dev and
// dev+"p", with cidr ("198.51.100.1/24") on dev, both up: other
// addresses of the subnet answer nothing. Run it only inside a namespace
// the test made (netnstest.Enter).
func AddAddress(t testing.TB, dev, cidr string) {
	t.Helper()
	for _, args := range [][]string{
		{"link", "add", dev, "type", "veth", "peer", "name", dev + "p"},
		{"addr", "add", cidr, "dev", dev},
		{"link", "set", dev + "p", "up"},
		{"link", "set", dev, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
}

// SFTP is a running sshd serving sftp.
type SFTP struct {
	// Addr is the host:port sshd listens on.
	Addr string
	// Host and Port are Addr's parts.
	Host, Port string
	// User is the account clients log in as (the test's own user).
	User string
	// KeyFile is the client's private key (OpenSSH format, mode 0600).
	KeyFile string
	// KnownHostsFile names the server's host key for Addr.
	KnownHostsFile string
	// Root is a directory for repositories, writable by User.
	Root string

	cmd *exec.Cmd
}

// URL is the restic sftp location of the repository dir under Root.
func (s *SFTP) URL(dir string) string {
	return "sftp://" + s.User + "@" + s.Addr + "/" + filepath.Join(s.Root, dir)
}

// StartSFTP runs `sshd -D -f <config>` listening on host (an address of
// this namespace) at a free port, with a fresh ed25519 host key and one
// authorized client key (KeyFile), the internal sftp server, no password
// or keyboard-interactive login and no PAM. It skips the test when sshd is
// missing or the test is not root (sshd changes to the user's identity).
func StartSFTP(t testing.TB, host string) *SFTP {
	t.Helper()
	sshd, err := exec.LookPath("sshd")
	if err != nil {
		if sshd, err = exec.LookPath("/usr/sbin/sshd"); err != nil {
			t.Skip("sshd not installed (openssh-server)")
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("sshd needs root")
	}
	// sshd's privilege separation directory; the Debian package makes it
	// at service start only.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := &SFTP{Host: host, User: "root", Root: filepath.Join(dir, "repos")}
	if err := os.MkdirAll(s.Root, 0o700); err != nil {
		t.Fatal(err)
	}
	hostPub := writeKey(t, filepath.Join(dir, "host_ed25519"))
	clientPub := writeKey(t, filepath.Join(dir, "client_ed25519"))
	s.KeyFile = filepath.Join(dir, "client_ed25519")
	auth := filepath.Join(dir, "authorized_keys")
	writeFile(t, auth, string(ssh.MarshalAuthorizedKey(clientPub)))
	s.Port = freePort(t, host)
	s.Addr = net.JoinHostPort(host, s.Port)
	known := s.Addr
	if s.Port != "22" {
		known = "[" + host + "]:" + s.Port
	}
	s.KnownHostsFile = filepath.Join(dir, "known_hosts")
	writeFile(t, s.KnownHostsFile, known+" "+string(ssh.MarshalAuthorizedKey(hostPub)))
	conf := filepath.Join(dir, "sshd_config")
	writeFile(t, conf, strings.Join([]string{
		"ListenAddress " + s.Addr,
		"HostKey " + filepath.Join(dir, "host_ed25519"),
		"PidFile " + filepath.Join(dir, "sshd.pid"),
		"AuthorizedKeysFile " + auth,
		"PermitRootLogin prohibit-password",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"UsePAM no",
		"StrictModes no",
		"Subsystem sftp internal-sftp",
		"LogLevel ERROR",
		"",
	}, "\n"))
	s.cmd = exec.Command(sshd, "-D", "-e", "-f", conf)
	s.cmd.Stderr = os.Stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.cmd.Process.Kill(); s.cmd.Wait() })
	waitListening(t, s.Addr)
	return s
}

// Stop ends sshd (the repository becomes unreachable).
func (s *SFTP) Stop() {
	s.cmd.Process.Kill()
	s.cmd.Wait()
}

// REST is a running `rclone serve restic`.
type REST struct {
	// Addr is host:port the server listens on.
	Addr string
	// User and Password are the HTTP basic credentials it accepts.
	User, Password string
	// Root is the directory it serves.
	Root string
}

// URL is the restic rest location of the repository dir (no credentials:
// give them as RESTIC_REST_USERNAME and RESTIC_REST_PASSWORD).
func (s *REST) URL(dir string) string { return "rest:http://" + s.Addr + "/" + dir + "/" }

// StartREST runs rclone's restic REST server on host (an address of this
// namespace) at a free port, serving a fresh directory, with a random
// password kept in an htpasswd file (bcrypt) rather than on rclone's
// command line. It skips the test when rclone is missing.
func StartREST(t testing.TB, host string) *REST {
	t.Helper()
	rclone, err := exec.LookPath("rclone")
	if err != nil {
		t.Skip("rclone not installed")
	}
	dir := t.TempDir()
	s := &REST{User: "gitfleet", Password: randomText(t), Root: filepath.Join(dir, "data")}
	if err := os.MkdirAll(s.Root, 0o700); err != nil {
		t.Fatal(err)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(s.Password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	htpasswd := filepath.Join(dir, "htpasswd")
	writeFile(t, htpasswd, s.User+":"+string(hash)+"\n")
	s.Addr = net.JoinHostPort(host, freePort(t, host))
	cmd := exec.Command(rclone, "serve", "restic", "--config", filepath.Join(dir, "rclone.conf"),
		"--addr", s.Addr, "--htpasswd", htpasswd, "--log-level", "ERROR", s.Root)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitListening(t, s.Addr)
	return s
}

// writeKey makes an ed25519 key pair, the private half at path (0600,
// OpenSSH format) and the public one returned.
func writeKey(t testing.TB, path string) ssh.PublicKey {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

func writeFile(t testing.TB, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func randomText(t testing.TB) string {
	b := make([]byte, 18)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", b)
}

// freePort asks the kernel for a free TCP port on host.
func freePort(t testing.TB, host string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// waitListening waits (at most 20 s) until addr accepts a connection.
func waitListening(t testing.TB, addr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("nothing listens on %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
