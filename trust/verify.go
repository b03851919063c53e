package trust

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	pgperrors "github.com/ProtonMail/go-crypto/openpgp/errors"
	"github.com/ProtonMail/go-crypto/openpgp/packet"
	"github.com/hiddeco/sshsig"
	"golang.org/x/crypto/ssh"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
)

// Refusals of Verify. Each wraps ErrSignature, which callers test to
// reject a commit.
var (
	// ErrSignature is matched by every refusal of a commit's signature.
	ErrSignature = errors.New("commit signature refused")
	// ErrUnsigned: the commit carries no signature.
	ErrUnsigned = fmt.Errorf("%w: unsigned", ErrSignature)
	// ErrUnknownKey: the signing key is not on the allowed-signers list
	// (or not allowed for git's namespace or at the commit's time).
	ErrUnknownKey = fmt.Errorf("%w: key not allowed", ErrSignature)
	// ErrBadSignature: the signature does not verify, is malformed, is of
	// an unsupported kind (X.509), or the commit carries several.
	ErrBadSignature = fmt.Errorf("%w: bad signature", ErrSignature)
)

// gitNamespace is the namespace git signs commits in with SSH keys.
const gitNamespace = "git"

// Signers is the list of keys allowed to sign desired-state commits.
type Signers struct {
	ssh []SSHSigner
	pgp openpgp.EntityList
}

// HoldsSSH reports whether s lists the SSH key whose fingerprint is
// fingerprint (ssh.FingerprintSHA256's "SHA256:…").
func (s *Signers) HoldsSSH(fingerprint string) bool {
	for _, k := range s.ssh {
		if k.Fingerprint() == fingerprint {
			return true
		}
	}
	return false
}

// Signer says who signed a verified commit.
type Signer struct {
	// Kind is "ssh" or "openpgp".
	Kind string
	// Key is the key's fingerprint: SHA256:… for SSH, 40 hex digits for
	// OpenPGP (the primary key's).
	Key string
	// Who is the allowed-signers line's principals, or the key's first
	// user ID.
	Who string
}

// String is "who (kind key)".
func (s Signer) String() string { return fmt.Sprintf("%s (%s %s)", s.Who, s.Kind, s.Key) }

// New returns the Signers of ssh keys and an OpenPGP keyring (either may
// be empty). At least one key is needed: an empty list would refuse every
// commit, which is a configuration error, not a policy.
func New(sshKeys []SSHSigner, keyring openpgp.EntityList) (*Signers, error) {
	if len(sshKeys) == 0 && len(keyring) == 0 {
		return nil, errors.New("no allowed signer: the allowed-signers file and the OpenPGP keyring hold no key")
	}
	return &Signers{ssh: sshKeys, pgp: keyring}, nil
}

// Load reads an allowed-signers file and an armored OpenPGP keyring (either
// path may be empty) and returns their Signers. Errors name the file (and
// the line, for the allowed-signers file).
func Load(allowedSigners, keyring string) (*Signers, error) {
	var sshKeys []SSHSigner
	var pgp openpgp.EntityList
	if allowedSigners != "" {
		data, err := os.ReadFile(allowedSigners)
		if err != nil {
			return nil, fmt.Errorf("allowed signers: %w", err)
		}
		if sshKeys, err = ParseAllowedSigners(allowedSigners, data); err != nil {
			return nil, err
		}
	}
	if keyring != "" {
		data, err := os.ReadFile(keyring)
		if err != nil {
			return nil, fmt.Errorf("OpenPGP keyring: %w", err)
		}
		if pgp, err = ParseKeyring(keyring, data); err != nil {
			return nil, err
		}
	}
	return New(sshKeys, pgp)
}

// ParseKeyring reads armored OpenPGP public keys (`gpg --export --armor`);
// several armored blocks may follow one another (each is decoded apart:
// the armor decoder reads ahead). name is the file, for messages.
func ParseKeyring(name string, data []byte) (openpgp.EntityList, error) {
	const end = "-----END PGP PUBLIC KEY BLOCK-----"
	var out openpgp.EntityList
	rest := string(data)
	for strings.TrimSpace(rest) != "" {
		chunk := rest
		if i := strings.Index(rest, end); i >= 0 {
			chunk, rest = rest[:i+len(end)], rest[i+len(end):]
		} else {
			rest = ""
		}
		block, err := armor.Decode(strings.NewReader(chunk))
		if err != nil {
			return nil, fmt.Errorf("%s: not an armored OpenPGP keyring: %w", name, err)
		}
		if block.Type != openpgp.PublicKeyType {
			return nil, fmt.Errorf("%s: armored block %q is not %q (export public keys with gpg --export --armor)", name, block.Type, openpgp.PublicKeyType)
		}
		el, err := openpgp.ReadKeyRing(block.Body)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out = append(out, el...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no OpenPGP public key in it", name)
	}
	return out, nil
}

// Verify checks c's signature against the allowed keys. The error wraps
// ErrUnsigned, ErrUnknownKey or ErrBadSignature (and so ErrSignature), and
// names the commit and the key.
func (s *Signers) Verify(c *gitsource.SignedCommit) (Signer, error) {
	short := desired.Hash(c.Hash).Short()
	sig := c.Signature
	switch {
	case strings.TrimSpace(sig) == "":
		return Signer{}, fmt.Errorf("%w: commit %s (%s) carries no signature", ErrUnsigned, short, c.Committer)
	case strings.Count(sig, "-----BEGIN ") > 1:
		// As git and go-git: a commit's provenance is one signer.
		return Signer{}, fmt.Errorf("%w: commit %s carries several signatures", ErrBadSignature, short)
	case strings.HasPrefix(sig, "-----BEGIN SSH SIGNATURE-----"):
		return s.verifySSH(c, short)
	case strings.HasPrefix(sig, "-----BEGIN PGP SIGNATURE-----"):
		return s.verifyPGP(c, short)
	}
	return Signer{}, fmt.Errorf("%w: commit %s: signature kind not supported (SSH and OpenPGP are; X.509 is not)", ErrBadSignature, short)
}

// verifySSH checks an SSH signature in git's namespace.
func (s *Signers) verifySSH(c *gitsource.SignedCommit, short string) (Signer, error) {
	sig, err := sshsig.Unarmor([]byte(c.Signature))
	if err != nil {
		return Signer{}, fmt.Errorf("%w: commit %s: SSH signature malformed: %v", ErrBadSignature, short, err)
	}
	fp := "SSH key " + fingerprintOf(sig)
	if sig.Namespace != gitNamespace {
		return Signer{}, fmt.Errorf("%w: commit %s: signed by %s in namespace %q, not git's %q", ErrBadSignature, short, fp, sig.Namespace, gitNamespace)
	}
	var why []string
	for _, a := range s.ssh {
		if !bytes.Equal(a.Key.Marshal(), sig.PublicKey.Marshal()) {
			continue
		}
		if err := a.allows(gitNamespace, c.CommitTime); err != nil {
			why = append(why, err.Error())
			continue
		}
		if err := sshsig.Verify(bytes.NewReader(c.Payload), sig, a.Key, sig.HashAlgorithm, gitNamespace); err != nil {
			return Signer{}, fmt.Errorf("%w: commit %s: signature by %s (%s) does not verify: %v", ErrBadSignature, short, fp, a.Principals, err)
		}
		return Signer{Kind: "ssh", Key: a.Fingerprint(), Who: a.Principals}, nil
	}
	if len(why) > 0 {
		return Signer{}, fmt.Errorf("%w: commit %s: signed by %s, which %s", ErrUnknownKey, short, fp, strings.Join(why, "; "))
	}
	return Signer{}, fmt.Errorf("%w: commit %s: signed by %s, which is not on the allowed-signers list", ErrUnknownKey, short, fp)
}

func fingerprintOf(sig *sshsig.Signature) string {
	if sig.PublicKey == nil {
		return "(none)"
	}
	return sig.PublicKey.Type() + " " + ssh.FingerprintSHA256(sig.PublicKey)
}

// verifyPGP checks an armored OpenPGP detached signature.
func (s *Signers) verifyPGP(c *gitsource.SignedCommit, short string) (Signer, error) {
	issuer := pgpIssuer(c.Signature)
	if len(s.pgp) == 0 {
		return Signer{}, fmt.Errorf("%w: commit %s: signed by OpenPGP key %s; no OpenPGP keyring is configured", ErrUnknownKey, short, issuer)
	}
	e, err := openpgp.CheckArmoredDetachedSignature(s.pgp, bytes.NewReader(c.Payload), strings.NewReader(c.Signature), nil)
	if errors.Is(err, pgperrors.ErrUnknownIssuer) {
		return Signer{}, fmt.Errorf("%w: commit %s: signed by OpenPGP key %s, which is not in the keyring", ErrUnknownKey, short, issuer)
	}
	if err != nil {
		return Signer{}, fmt.Errorf("%w: commit %s: signature by OpenPGP key %s does not verify: %v", ErrBadSignature, short, issuer, err)
	}
	who := ""
	for name := range e.Identities {
		if who == "" || name < who {
			who = name
		}
	}
	return Signer{Kind: "openpgp", Key: strings.ToUpper(fmt.Sprintf("%x", e.PrimaryKey.Fingerprint)), Who: who}, nil
}

// pgpIssuer names the key an armored signature says it was made with: its
// issuer fingerprint, else its key ID, else "(unknown)".
func pgpIssuer(armored string) string {
	block, err := armor.Decode(strings.NewReader(armored))
	if err != nil {
		return "(unreadable)"
	}
	p, err := packet.Read(block.Body)
	if err != nil {
		return "(unreadable)"
	}
	sig, ok := p.(*packet.Signature)
	switch {
	case !ok:
		return "(unknown)"
	case len(sig.IssuerFingerprint) > 0:
		return strings.ToUpper(fmt.Sprintf("%x", sig.IssuerFingerprint))
	case sig.IssuerKeyId != nil:
		return fmt.Sprintf("%016X", *sig.IssuerKeyId)
	}
	return "(unknown)"
}

// Len is the number of keys: SSH keys and OpenPGP keys together.
func (s *Signers) Len() int { return len(s.ssh) + len(s.pgp) }
