// Package trust decides whether a desired-state commit was signed by a key
// allowed to change the fleet (docs/DESIGN.md, "Signed desired state").
//
// A Signers list holds SSH keys, read from an allowed-signers file in the
// format of ssh-keygen(1) ALLOWED SIGNERS (the file git's
// gpg.ssh.allowedSignersFile names), and OpenPGP keys, read from an armored
// keyring (`gpg --export --armor`). Verify checks one commit's signature,
// as `git verify-commit` does:
//
//	s, err := trust.Load("/etc/gitfleet/allowed_signers", "/etc/gitfleet/keyring.asc")
//	c, err := repo.Signed(head)          // gitsource: signature and signed payload
//	signer, err := s.Verify(c, firstSeen) // errors.Is(err, trust.ErrSignature): refuse the commit
//
// SSH signatures (git's gpg.format=ssh) are checked with
// github.com/hiddeco/sshsig in git's namespace "git"; OpenPGP signatures
// with github.com/ProtonMail/go-crypto's openpgp, the library go-git's
// Commit.Verify uses, over the payload go-git's EncodeWithoutSignature
// gives (the keyring is parsed once, not once per commit). As with git, the
// key decides: the principals of an allowed-signers line and the user IDs
// of an OpenPGP key are reported, not matched against the commit's author
// or committer.
//
// A key's validity (an allowed-signers line's valid-after= and
// valid-before=, an OpenPGP key's expiry and revocation) is judged at a
// time the caller gives, one the signer cannot choose: when the caller
// first saw the commit (a controller records it, see docs/DESIGN.md,
// "Signed desired state"), never the commit's own dates, which its signer
// writes. FirstSeen keeps such times for a caller.
//
// Every refusal wraps ErrSignature (and one of ErrUnsigned, ErrUnknownKey,
// ErrBadSignature, ErrKeyExpired, ErrKeyNotYetValid, ErrKeyRevoked) and
// names the commit and the key. A Signers is read-only after Load and safe
// for concurrent use.
package trust
