package trust

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

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
	// (or its lines do not allow git's namespace).
	ErrUnknownKey = fmt.Errorf("%w: key not allowed", ErrSignature)
	// ErrBadSignature: the signature does not verify, is malformed, is of
	// an unsupported kind (X.509), or the commit carries several.
	ErrBadSignature = fmt.Errorf("%w: bad signature", ErrSignature)
	// ErrKeyExpired: the signature verifies, but the key was no longer
	// valid at the time the commit is judged at: past its allowed-signers
	// valid-before, its OpenPGP expiry, or its signature's.
	ErrKeyExpired = fmt.Errorf("%w: key expired", ErrSignature)
	// ErrKeyNotYetValid: the signature verifies, but the key was not yet
	// valid at the time the commit is judged at (before its
	// allowed-signers valid-after, or its OpenPGP creation).
	ErrKeyNotYetValid = fmt.Errorf("%w: key not yet valid", ErrSignature)
	// ErrKeyRevoked: the signature verifies, but the OpenPGP key was
	// revoked at the time the commit is judged at (or is revoked as
	// compromised, which counts at any time).
	ErrKeyRevoked = fmt.Errorf("%w: key revoked", ErrSignature)
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

// Verify checks c's signature against the allowed keys, judging the
// key's validity (an allowed-signers line's valid-after= and
// valid-before=, an OpenPGP key's creation, expiry and revocation, an
// OpenPGP signature's expiry) at at: a time its signer cannot choose,
// such as when the verifier first saw the commit. The commit's own dates
// are the signer's to write and count for nothing: a retired key's
// commit dated back before the key's bound is judged when it was first
// seen. at must not be zero. The error wraps ErrUnsigned, ErrUnknownKey,
// ErrBadSignature, ErrKeyExpired, ErrKeyNotYetValid or ErrKeyRevoked (and
// so ErrSignature), and names the commit, the key and, for a key out of
// its validity, its bound and at.
func (s *Signers) Verify(c *gitsource.SignedCommit, at time.Time) (Signer, error) {
	short := desired.Hash(c.Hash).Short()
	sig := c.Signature
	switch {
	case at.IsZero():
		return Signer{}, fmt.Errorf("verify commit %s: no time to judge its key's validity at", short)
	case strings.TrimSpace(sig) == "":
		return Signer{}, fmt.Errorf("%w: commit %s (%s) carries no signature", ErrUnsigned, short, c.Committer)
	case strings.Count(sig, "-----BEGIN ") > 1:
		// As git and go-git: a commit's provenance is one signer.
		return Signer{}, fmt.Errorf("%w: commit %s carries several signatures", ErrBadSignature, short)
	case strings.HasPrefix(sig, "-----BEGIN SSH SIGNATURE-----"):
		return s.verifySSH(c, short, at)
	case strings.HasPrefix(sig, "-----BEGIN PGP SIGNATURE-----"):
		return s.verifyPGP(c, short, at)
	}
	return Signer{}, fmt.Errorf("%w: commit %s: signature kind not supported (SSH and OpenPGP are; X.509 is not)", ErrBadSignature, short)
}

// seenAt is how a refusal names the time a commit is judged at, beside
// its committer date, which is the signer's to choose.
func seenAt(c *gitsource.SignedCommit, at time.Time) string {
	s := "judged at " + at.UTC().Format(time.RFC3339) + ", when it was first seen"
	if !c.CommitTime.IsZero() {
		s += " (its committer date, " + c.CommitTime.UTC().Format(time.RFC3339) + ", is the signer's to write and does not count)"
	}
	return s
}

// verifySSH checks an SSH signature in git's namespace: first that it
// verifies with the key it names, then that a line listing the key allows
// git's namespace and at.
func (s *Signers) verifySSH(c *gitsource.SignedCommit, short string, at time.Time) (Signer, error) {
	sig, err := sshsig.Unarmor([]byte(c.Signature))
	if err != nil {
		return Signer{}, fmt.Errorf("%w: commit %s: SSH signature malformed: %v", ErrBadSignature, short, err)
	}
	fp := "SSH key " + fingerprintOf(sig)
	if sig.Namespace != gitNamespace {
		return Signer{}, fmt.Errorf("%w: commit %s: signed by %s in namespace %q, not git's %q", ErrBadSignature, short, fp, sig.Namespace, gitNamespace)
	}
	var lines []SSHSigner
	for _, a := range s.ssh {
		if bytes.Equal(a.Key.Marshal(), sig.PublicKey.Marshal()) {
			lines = append(lines, a)
		}
	}
	if len(lines) == 0 {
		return Signer{}, fmt.Errorf("%w: commit %s: signed by %s, which is not on the allowed-signers list", ErrUnknownKey, short, fp)
	}
	if err := sshsig.Verify(bytes.NewReader(c.Payload), sig, lines[0].Key, sig.HashAlgorithm, gitNamespace); err != nil {
		return Signer{}, fmt.Errorf("%w: commit %s: signature by %s (%s) does not verify: %v", ErrBadSignature, short, fp, lines[0].Principals, err)
	}
	var why []string
	refusal := ErrUnknownKey
	for _, a := range lines {
		kind, err := a.allows(gitNamespace, at)
		if err == nil {
			return Signer{Kind: "ssh", Key: a.Fingerprint(), Who: a.Principals}, nil
		}
		why = append(why, err.Error())
		if kind != nil && (refusal == ErrUnknownKey || kind == ErrKeyExpired) {
			refusal = kind
		}
	}
	return Signer{}, fmt.Errorf("%w: commit %s: signed by %s, which %s; %s", refusal, short, fp, strings.Join(why, "; "), seenAt(c, at))
}

func fingerprintOf(sig *sshsig.Signature) string {
	if sig.PublicKey == nil {
		return "(none)"
	}
	return sig.PublicKey.Type() + " " + ssh.FingerprintSHA256(sig.PublicKey)
}

// maxClockSkew is how far after the time a commit is judged at its
// OpenPGP signature may say it was made and still be judged at that
// creation time instead (a signer's clock a little ahead; judged later, a
// key is only more likely expired or revoked). A signature made further
// ahead is judged at the time given, where it counts as made in the
// future: expired.
const maxClockSkew = 10 * time.Minute

// verifyPGP checks an armored OpenPGP detached signature, with the key's
// validity judged at at (see maxClockSkew).
func (s *Signers) verifyPGP(c *gitsource.SignedCommit, short string, at time.Time) (Signer, error) {
	issuer, created := pgpIssuer(c.Signature)
	if len(s.pgp) == 0 {
		return Signer{}, fmt.Errorf("%w: commit %s: signed by OpenPGP key %s; no OpenPGP keyring is configured", ErrUnknownKey, short, issuer)
	}
	judge := at
	if created.After(at) && created.Sub(at) <= maxClockSkew {
		judge = created
	}
	cfg := &packet.Config{Time: func() time.Time { return judge }}
	e, err := openpgp.CheckArmoredDetachedSignature(s.pgp, bytes.NewReader(c.Payload), strings.NewReader(c.Signature), cfg)
	switch {
	case errors.Is(err, pgperrors.ErrUnknownIssuer):
		return Signer{}, fmt.Errorf("%w: commit %s: signed by OpenPGP key %s, which is not in the keyring", ErrUnknownKey, short, issuer)
	case e != nil && (errors.Is(err, pgperrors.ErrKeyExpired) || errors.Is(err, pgperrors.ErrSignatureExpired) || errors.Is(err, pgperrors.ErrKeyRevoked)):
		// The signature verified: go-crypto returns the signer with the
		// refusal of its validity.
		return Signer{}, pgpValidity(err, e, short, issuer, created, judge, seenAt(c, at))
	case err != nil:
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

// pgpValidity is the refusal of a verified OpenPGP signature whose key or
// signature was not valid at judge: expired, not yet valid (a key made
// after judge) or revoked, with the bound where the key says it.
func pgpValidity(err error, e *openpgp.Entity, short, issuer string, created, judge time.Time, seen string) error {
	if errors.Is(err, pgperrors.ErrKeyRevoked) {
		return fmt.Errorf("%w: commit %s: signed by OpenPGP key %s, which was revoked; %s", ErrKeyRevoked, short, issuer, seen)
	}
	if e.PrimaryKey.CreationTime.After(judge) {
		return fmt.Errorf("%w: commit %s: signed by OpenPGP key %s, made only at %s; %s", ErrKeyNotYetValid, short, issuer, e.PrimaryKey.CreationTime.UTC().Format(time.RFC3339), seen)
	}
	what := "whose key expired"
	if errors.Is(err, pgperrors.ErrSignatureExpired) && created.After(judge) {
		what = "whose signature says it was made at " + created.UTC().Format(time.RFC3339) + ", after the commit was first seen"
	} else if errors.Is(err, pgperrors.ErrSignatureExpired) {
		what = "whose signature (made " + created.UTC().Format(time.RFC3339) + ") expired"
	} else if self, _ := e.PrimarySelfSignature(); self != nil && self.KeyLifetimeSecs != nil && *self.KeyLifetimeSecs > 0 {
		end := e.PrimaryKey.CreationTime.Add(time.Duration(*self.KeyLifetimeSecs) * time.Second)
		what = "whose key expired at " + end.UTC().Format(time.RFC3339)
	}
	return fmt.Errorf("%w: commit %s: signed by OpenPGP key %s, %s; %s", ErrKeyExpired, short, issuer, what, seen)
}

// pgpIssuer names the key an armored signature says it was made with
// (its issuer fingerprint, else its key ID, else "(unknown)") and the
// signature's creation time (zero when unreadable).
func pgpIssuer(armored string) (string, time.Time) {
	block, err := armor.Decode(strings.NewReader(armored))
	if err != nil {
		return "(unreadable)", time.Time{}
	}
	p, err := packet.Read(block.Body)
	if err != nil {
		return "(unreadable)", time.Time{}
	}
	sig, ok := p.(*packet.Signature)
	switch {
	case !ok:
		return "(unknown)", time.Time{}
	case len(sig.IssuerFingerprint) > 0:
		return strings.ToUpper(fmt.Sprintf("%x", sig.IssuerFingerprint)), sig.CreationTime
	case sig.IssuerKeyId != nil:
		return fmt.Sprintf("%016X", *sig.IssuerKeyId), sig.CreationTime
	}
	return "(unknown)", sig.CreationTime
}

// Len is the number of keys: SSH keys and OpenPGP keys together.
func (s *Signers) Len() int { return len(s.ssh) + len(s.pgp) }
