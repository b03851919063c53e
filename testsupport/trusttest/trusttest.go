// Package trusttest makes real signing keys for tests: an SSH key with
// ssh-keygen and an OpenPGP key in a throwaway GNUPGHOME with gpg, each
// with the gittest.Signing that makes git sign commits with it. It is
// test support only; no command imports it.
package trusttest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// SSHKey is an ed25519 key made by ssh-keygen.
type SSHKey struct {
	// Private is the private key file; Public its "ssh-ed25519 AAAA… comment" line.
	Private, Public string
}

// Sign makes git sign with the key (gpg.format=ssh).
func (k SSHKey) Sign() *gittest.Signing {
	return &gittest.Signing{Config: []string{"gpg.format=ssh", "user.signingkey=" + k.Private}}
}

// AllowedSigner is the key's allowed-signers line for principals.
func (k SSHKey) AllowedSigner(principals string) string {
	return principals + " " + k.Public + "\n"
}

// NewSSHKey makes an ed25519 key without passphrase in a fresh directory.
// It skips the test when ssh-keygen is missing.
func NewSSHKey(t testing.TB, comment string) SSHKey {
	t.Helper()
	if _, err := exec.LookPath("ssh-keygen"); err != nil {
		t.Skip("ssh-keygen is not installed (openssh-client): these tests sign commits with a real SSH key")
	}
	priv := filepath.Join(t.TempDir(), "id_ed25519")
	run(t, nil, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", priv)
	pub, err := os.ReadFile(priv + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return SSHKey{Private: priv, Public: strings.TrimSpace(string(pub))}
}

// GPGKey is an OpenPGP signing key in a throwaway GNUPGHOME.
type GPGKey struct {
	Home, Fingerprint string
	// Armored is the public key, `gpg --export --armor`.
	Armored string
}

// Sign makes git sign with the key (gpg.format=openpgp, GNUPGHOME).
func (k GPGKey) Sign() *gittest.Signing {
	return &gittest.Signing{Config: []string{"gpg.format=openpgp", "user.signingkey=" + k.Fingerprint}, Env: []string{"GNUPGHOME=" + k.Home}}
}

// NewGPGKey makes an ed25519 signing key for uid ("Name <email>") without
// passphrase in a fresh GNUPGHOME, whose agent is stopped at the end of
// the test. It skips the test when gpg is missing.
func NewGPGKey(t testing.TB, uid string) GPGKey {
	t.Helper()
	return newGPGKey(t, uid, "never")
}

// newGPGKey makes the key with gpg's expire argument, more of gpg's
// options before the command, and a gpg-at wrapper in its GNUPGHOME that
// runs gpg as if the clock read $GITFLEET_TEST_GPG_TIME (SignAt).
func newGPGKey(t testing.TB, uid, expire string, options ...string) GPGKey {
	t.Helper()
	if _, err := exec.LookPath("gpg"); err != nil {
		t.Skip("gpg is not installed (gnupg): these tests sign commits with a real OpenPGP key")
	}
	// A short path: gpg-agent's socket lives in it.
	home, err := os.MkdirTemp("", "gfgpg")
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"GNUPGHOME=" + home}
	t.Cleanup(func() {
		_ = exec.Command("gpgconf", "--homedir", home, "--kill", "all").Run()
		os.RemoveAll(home)
	})
	wrapper := "#!/bin/sh\nexec gpg --faked-system-time \"$GITFLEET_TEST_GPG_TIME\" \"$@\"\n"
	if err := os.WriteFile(filepath.Join(home, "gpg-at"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--batch", "--pinentry-mode", "loopback", "--passphrase", ""}, options...)
	run(t, env, "gpg", append(args, "--quick-generate-key", uid, "ed25519", "sign", expire)...)
	out := run(t, env, "gpg", "--batch", "--with-colons", "--list-secret-keys", uid)
	fpr := ""
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Split(line, ":"); len(f) > 9 && f[0] == "fpr" {
			fpr = f[9]
			break
		}
	}
	if fpr == "" {
		t.Fatalf("gpg listed no fingerprint for %s:\n%s", uid, out)
	}
	pub := run(t, env, "gpg", "--batch", "--export", "--armor", fpr)
	return GPGKey{Home: home, Fingerprint: fpr, Armored: pub}
}

func run(t testing.TB, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// SSHKeygen runs ssh-keygen with args (a test's own key, with a
// passphrase or of another type). It skips the test when ssh-keygen is
// missing.
func SSHKeygen(t testing.TB, args ...string) {
	t.Helper()
	if _, err := exec.LookPath("ssh-keygen"); err != nil {
		t.Skip("ssh-keygen is not installed (openssh-client)")
	}
	run(t, nil, "ssh-keygen", args...)
}

// NewGPGKeyAt is NewGPGKey for a key gpg makes as if the clock read
// created (gpg's --faked-system-time), valid for expire (gpg's expire
// argument: "3d", "1y", "never"): a key that has expired by now, for
// commits signed while it was valid (SignAt).
func NewGPGKeyAt(t testing.TB, uid string, created time.Time, expire string) GPGKey {
	t.Helper()
	return newGPGKey(t, uid, expire, "--faked-system-time", gpgTime(created))
}

// SignAt makes git sign with the key as if gpg's clock read when (the
// signature's creation time; the commit's dates are the caller's).
func (k GPGKey) SignAt(when time.Time) *gittest.Signing {
	s := k.Sign()
	s.Config = append(s.Config, "gpg.program="+filepath.Join(k.Home, "gpg-at"))
	s.Env = append(s.Env, "GITFLEET_TEST_GPG_TIME="+gpgTime(when))
	return s
}

// Revoke revokes the key (gpg --edit-key's revkey, reason "no reason
// specified", made as if the clock read at) and returns the public key
// with the revocation, armored: a keyring that revokes it from at on.
func (k GPGKey) Revoke(t testing.TB, at time.Time) string {
	t.Helper()
	env := []string{"GNUPGHOME=" + k.Home}
	// revkey asks to confirm, why (0: no reason), a description (an empty
	// line ends it) and to confirm again; save writes it.
	cmd := exec.Command("gpg", "--batch", "--yes", "--command-fd", "0", "--status-fd", "2", "--faked-system-time", gpgTime(at),
		"--pinentry-mode", "loopback", "--passphrase", "", "--edit-key", k.Fingerprint)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader("revkey\ny\n0\n\ny\nsave\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gpg --edit-key revkey: %v: %s", err, out)
	}
	return run(t, env, "gpg", "--batch", "--export", "--armor", k.Fingerprint)
}

// gpgTime is t as gpg's --faked-system-time takes it (UTC, frozen).
func gpgTime(t time.Time) string { return t.UTC().Format("20060102T150405") + "!" }
