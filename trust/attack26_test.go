package trust_test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha512"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hiddeco/sshsig"
	"golang.org/x/crypto/ssh"

	"github.com/gitfleet/gitfleet/testsupport/trusttest"
	"github.com/gitfleet/gitfleet/trust"
)

// Signatures an allowed signer's key made, or seems to have made, that
// git's own verifier (ssh-keygen -Y verify) refuses for a commit, are
// refused here too: one made in another namespace over the commit's exact
// bytes, one whose embedded public key was swapped for the allowed key's,
// and an RSA signature with SHA-1 ("ssh-rsa"), which OpenSSH's sshsig
// refuses for RSA keys (only rsa-sha2-256 and rsa-sha2-512).
func TestAttackSSHSignaturesGitRefusesAreRefused(t *testing.T) {
	w := newWorktree(t)
	ann := trusttest.NewSSHKey(t, "ann")
	eve := trusttest.NewSSHKey(t, "eve")
	allowed := sshSigners(t, "ann@example.com "+ann.Public+"\n")
	signed := w.commit(ann.Sign())
	if _, err := allowed.Verify(signed, time.Now()); err != nil {
		t.Fatalf("the genuine commit: %v", err)
	}
	payload := filepath.Join(t.TempDir(), "payload")
	if err := os.WriteFile(payload, signed.Payload, 0o600); err != nil {
		t.Fatal(err)
	}
	sshSign := func(key, namespace string) string {
		out, err := exec.Command("ssh-keygen", "-Y", "sign", "-f", key, "-n", namespace, payload).CombinedOutput()
		if err != nil {
			t.Fatalf("ssh-keygen -Y sign: %v: %s", err, out)
		}
		b, err := os.ReadFile(payload + ".sig")
		if err != nil {
			t.Fatal(err)
		}
		os.Remove(payload + ".sig")
		return string(b)
	}

	t.Run("another namespace", func(t *testing.T) {
		c := *signed
		c.Signature = sshSign(ann.Private, "file")
		if _, err := allowed.Verify(&c, time.Now()); !errors.Is(err, trust.ErrSignature) {
			t.Errorf("a signature in namespace file: %v; want it refused", err)
		}
	})

	t.Run("the allowed key swapped in", func(t *testing.T) {
		sig, err := sshsig.Unarmor([]byte(sshSign(eve.Private, "git")))
		if err != nil {
			t.Fatal(err)
		}
		pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(ann.Public))
		if err != nil {
			t.Fatal(err)
		}
		sig.PublicKey = pub
		c := *signed
		c.Signature = string(sshsig.Armor(sig))
		if _, err := allowed.Verify(&c, time.Now()); !errors.Is(err, trust.ErrBadSignature) {
			t.Errorf("eve's signature under ann's key: %v; want ErrBadSignature", err)
		}
	})

	t.Run("RSA with SHA-1", func(t *testing.T) {
		priv, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		signer, err := ssh.NewSignerFromKey(priv)
		if err != nil {
			t.Fatal(err)
		}
		h := sha512.Sum512(signed.Payload)
		data := append([]byte("SSHSIG"), ssh.Marshal(struct{ Namespace, Reserved, Hash, H string }{"git", "", "sha512", string(h[:])})...)
		raw, err := signer.(ssh.AlgorithmSigner).SignWithAlgorithm(rand.Reader, data, ssh.KeyAlgoRSA)
		if err != nil {
			t.Fatal(err)
		}
		sig := &sshsig.Signature{Version: 1, PublicKey: signer.PublicKey(), Namespace: "git", HashAlgorithm: sshsig.HashSHA512, Signature: raw}
		rsaAllowed := sshSigners(t, "ann@example.com "+strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))+"\n")
		c := *signed
		c.Signature = string(sshsig.Armor(sig))
		// The check proves something: ssh-keygen refuses it too.
		allowedFile := filepath.Join(t.TempDir(), "allowed")
		os.WriteFile(allowedFile, []byte("ann@example.com "+string(ssh.MarshalAuthorizedKey(signer.PublicKey()))), 0o600)
		sigFile := payload + ".rsa.sig"
		os.WriteFile(sigFile, []byte(c.Signature), 0o600)
		cmd := exec.Command("ssh-keygen", "-Y", "verify", "-f", allowedFile, "-I", "ann@example.com", "-n", "git", "-s", sigFile)
		cmd.Stdin = strings.NewReader(string(signed.Payload))
		out, kerr := cmd.CombinedOutput()
		if kerr == nil {
			t.Fatalf("ssh-keygen -Y verify accepts the SHA-1 signature (the check below proves nothing): %s", out)
		}
		if _, err := rsaAllowed.Verify(&c, time.Now()); !errors.Is(err, trust.ErrBadSignature) {
			t.Errorf("an ssh-rsa (SHA-1) signature: %v; want ErrBadSignature, as ssh-keygen: %s", err, strings.TrimSpace(string(out)))
		}
	})
}
