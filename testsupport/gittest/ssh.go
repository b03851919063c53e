package gittest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// SSHServer is a git server over ssh on 127.0.0.1 for tests: it accepts one
// client key, runs git-upload-pack and git-receive-pack on repositories
// under its root, and nothing else.
type SSHServer struct {
	// Addr is host:port of the server.
	Addr string
	// KeyFile is the client's private key (OpenSSH PEM, no passphrase).
	KeyFile string
	// KnownHostsFile names the server's host key for Addr.
	KnownHostsFile string
	// HostKey is the server's public host key.
	HostKey ssh.PublicKey
}

// URL is the ssh:// URL of the repository at root/name.
func (s *SSHServer) URL(name string) string {
	return "ssh://git@" + s.Addr + "/" + name
}

// ServeSSH serves the repositories under root over ssh on 127.0.0.1 until
// the test ends.
func ServeSSH(t testing.TB, root string) *SSHServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ServeSSHOn(t, root, ln)
}

// ServeSSHOn is ServeSSH on a listener of the caller's (one inside a
// container's network namespace, say); KnownHostsFile names ln's address.
// ln is closed when the test ends.
func ServeSSHOn(t testing.TB, root string, ln net.Listener) *SSHServer {
	t.Helper()
	NeedGit(t)
	dir := t.TempDir()
	_, hostPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	hostSigner, err := ssh.NewSignerFromKey(hostPriv)
	if err != nil {
		t.Fatal(err)
	}
	clientPub, clientPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(clientPriv, "")
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "id_ed25519")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	allowed, err := ssh.NewPublicKey(clientPub)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
			if string(k.Marshal()) == string(allowed.Marshal()) {
				return nil, nil
			}
			return nil, fmt.Errorf("unknown key")
		},
	}
	cfg.AddHostKey(hostSigner)
	srv := &SSHServer{Addr: ln.Addr().String(), KeyFile: keyFile, HostKey: hostSigner.PublicKey()}
	srv.KnownHostsFile = filepath.Join(dir, "known_hosts")
	line := knownhosts.Line([]string{knownhosts.Normalize(srv.Addr)}, srv.HostKey) + "\n"
	if err := os.WriteFile(srv.KnownHostsFile, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				serveSSHConn(conn, cfg, root)
			}()
		}
	}()
	return srv
}

func serveSSHConn(conn net.Conn, cfg *ssh.ServerConfig, root string) {
	defer conn.Close()
	sc, chans, reqs, err := ssh.NewServerConn(conn, cfg)
	if err != nil {
		return
	}
	defer sc.Close()
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "session only")
			continue
		}
		ch, requests, err := nc.Accept()
		if err != nil {
			return
		}
		go serveSSHSession(ch, requests, root)
	}
}

// serveSSHSession runs one exec request: git-upload-pack or
// git-receive-pack '<path>'.
func serveSSHSession(ch ssh.Channel, requests <-chan *ssh.Request, root string) {
	defer ch.Close()
	for req := range requests {
		if req.Type != "exec" || len(req.Payload) < 4 {
			_ = req.Reply(false, nil)
			continue
		}
		n := binary.BigEndian.Uint32(req.Payload)
		command := string(req.Payload[4 : 4+n])
		service, arg, _ := strings.Cut(command, " ")
		arg = strings.Trim(arg, "'\"")
		if (service != "git-upload-pack" && service != "git-receive-pack") || strings.Contains(arg, "..") {
			_ = req.Reply(false, nil)
			return
		}
		_ = req.Reply(true, nil)
		cmd := exec.Command("git", strings.TrimPrefix(service, "git-"), filepath.Join(root, filepath.Clean("/"+arg)))
		cmd.Env = baseEnv()
		cmd.Stdout, cmd.Stderr = ch, ch.Stderr()
		// Not cmd.Stdin = ch: Wait would then wait for the client to close
		// its side, and the client waits for the exit status.
		stdin, err := cmd.StdinPipe()
		status := uint32(1)
		if err == nil && cmd.Start() == nil {
			go func() {
				_, _ = io.Copy(stdin, ch)
				_ = stdin.Close()
			}()
			if cmd.Wait() == nil {
				status = 0
			}
		}
		_ = ch.CloseWrite()
		_, _ = ch.SendRequest("exit-status", false, binary.BigEndian.AppendUint32(nil, status))
		return
	}
}
