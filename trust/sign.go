package trust

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"

	"github.com/gitfleet/gitfleet/internal/secretfile"
	"github.com/hiddeco/sshsig"
	"golang.org/x/crypto/ssh"
)

// CommitSigner signs commits with an SSH private key the way
// `git -c gpg.format=ssh commit -S` does: an SSH signature (sshsig,
// PROTOCOL.sshsig) in git's namespace "git" with SHA-512, armored
// ("-----BEGIN SSH SIGNATURE-----"), over the commit object without its
// gpgsig header. `git verify-commit` with an allowed-signers file naming
// the public key accepts it, and so does Signers.Verify. It is what
// gitsource.Write.Signer asks for. Safe for concurrent use.
type CommitSigner struct {
	signer ssh.Signer
	// File is the private key file it was loaded from.
	File string
}

// maxKeyFile bounds a private key file read (an RSA 16384-bit key is
// about 13 kB).
const maxKeyFile = 64 << 10

// LoadCommitSigner reads an unencrypted OpenSSH private key file (as
// `ssh-keygen -t ed25519 -N "" -f FILE` writes it). Like ssh, it refuses a
// file others may read or write (mode must be 0600 or 0400), a symbolic
// link, a file owned by neither root nor this process's user, and a key
// with a passphrase (a daemon has no one to ask). Errors name the file and
// never quote the key.
func LoadCommitSigner(path string) (*CommitSigner, error) {
	data, err := secretfile.Read(path, "signing key", "others can read the private key", maxKeyFile)
	if err != nil {
		return nil, err
	}
	signer, err := ssh.ParsePrivateKey(data)
	var missing *ssh.PassphraseMissingError
	if errors.As(err, &missing) {
		return nil, fmt.Errorf("signing key %s has a passphrase: the daemon cannot ask for it; make a key without one (ssh-keygen -N \"\") and keep the file mode 0600", path)
	}
	if err != nil {
		return nil, fmt.Errorf("signing key %s: not an OpenSSH private key: %v", path, err)
	}
	return &CommitSigner{signer: signer, File: path}, nil
}

// SignCommit signs payload, a commit object without its gpgsig header,
// and returns the armored SSH signature git keeps in that header.
func (s *CommitSigner) SignCommit(payload []byte) (string, error) {
	sig, err := sshsig.Sign(bytes.NewReader(payload), s.signer, sshsig.HashSHA512, gitNamespace)
	if err != nil {
		return "", fmt.Errorf("sign commit with %s: %w", s.Fingerprint(), err)
	}
	return string(sshsig.Armor(sig)), nil
}

// PublicKey is the signing key's public half.
func (s *CommitSigner) PublicKey() ssh.PublicKey { return s.signer.PublicKey() }

// Fingerprint is the public key's SHA256 fingerprint ("SHA256:…", as
// ssh-keygen -l prints it).
func (s *CommitSigner) Fingerprint() string { return ssh.FingerprintSHA256(s.signer.PublicKey()) }

// AuthorizedKey is the public key as one line, "ssh-ed25519 AAAA…"
// without a newline: what an allowed-signers line, an agent's
// controllerKeys and a Host's spec.agentKey hold.
func (s *CommitSigner) AuthorizedKey() string {
	return authorizedKey(s.signer.PublicKey())
}

// authorizedKey is key as one authorized_keys line without a newline.
func authorizedKey(key ssh.PublicKey) string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key)))
}

// GenerateKey makes a new ed25519 key for signing commits and returns the
// private key as an unencrypted OpenSSH private key file (what
// `ssh-keygen -t ed25519 -N ""` writes; LoadCommitSigner reads it) and the
// public key line with comment ("ssh-ed25519 AAAA… comment", no newline).
func GenerateKey(comment string) (private []byte, public string, err error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, "", fmt.Errorf("generate an ed25519 key: %w", err)
	}
	block, err := ssh.MarshalPrivateKey(priv, comment)
	if err != nil {
		return nil, "", fmt.Errorf("encode the private key: %w", err)
	}
	pub, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		return nil, "", fmt.Errorf("encode the public key: %w", err)
	}
	public = authorizedKey(pub)
	if comment != "" {
		public += " " + comment
	}
	return pem.EncodeToMemory(block), public, nil
}
