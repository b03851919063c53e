package trust_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/trusttest"
	"github.com/gitfleet/gitfleet/trust"
)

// worktree is a non-bare repository where commits are made with
// `git commit`, signed as a person's git would sign them.
type worktree struct {
	t   testing.TB
	dir string
	n   int
}

func newWorktree(t testing.TB) *worktree {
	gittest.NeedGit(t)
	w := &worktree{t: t, dir: t.TempDir()}
	w.git(nil, "init", "-q", "-b", "main")
	return w
}

func (w *worktree) git(env []string, args ...string) string {
	w.t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = w.dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=Ann", "GIT_AUTHOR_EMAIL=ann@example.com", "GIT_COMMITTER_NAME=Ann", "GIT_COMMITTER_EMAIL=ann@example.com")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		w.t.Fatalf("git %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// commit commits a new file, signed with sign (nil: unsigned), as
// `git -c … commit -S`, and returns the commit's signature and payload.
func (w *worktree) commit(sign *gittest.Signing) *gitsource.SignedCommit {
	w.t.Helper()
	w.n++
	if err := os.WriteFile(filepath.Join(w.dir, "f.txt"), []byte(strings.Repeat("x", w.n)), 0o644); err != nil {
		w.t.Fatal(err)
	}
	w.git(nil, "add", "f.txt")
	args := []string{"commit", "-q", "-m", "change"}
	var env []string
	if sign != nil {
		var pre []string
		for _, kv := range sign.Config {
			pre = append(pre, "-c", kv)
		}
		args = append(append(pre, args...), "-S")
		env = sign.Env
	}
	w.git(env, args...)
	head := w.git(nil, "rev-parse", "HEAD")
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: w.dir})
	if err != nil {
		w.t.Fatal(err)
	}
	if _, err := repo.Fetch(context.Background(), "main"); err != nil {
		w.t.Fatal(err)
	}
	c, err := repo.Signed(head)
	if err != nil {
		w.t.Fatal(err)
	}
	return c
}

func sshSigners(t testing.TB, lines string) *trust.Signers {
	t.Helper()
	keys, err := trust.ParseAllowedSigners("allowed_signers", []byte(lines))
	if err != nil {
		t.Fatal(err)
	}
	s, err := trust.New(keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func pgpSigners(t testing.TB, armored string) *trust.Signers {
	t.Helper()
	kr, err := trust.ParseKeyring("keyring.asc", []byte(armored))
	if err != nil {
		t.Fatal(err)
	}
	s, err := trust.New(nil, kr)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestVerifySSHCommits(t *testing.T) {
	w := newWorktree(t)
	ann := trusttest.NewSSHKey(t, "ann")
	eve := trusttest.NewSSHKey(t, "eve")
	allowed := sshSigners(t, "# the fleet's maintainers\nann@example.com "+ann.Public+"\n")

	signed := w.commit(ann.Sign())
	got, err := allowed.Verify(signed, time.Now())
	if err != nil {
		t.Fatalf("commit signed by an allowed key: %v", err)
	}
	if got.Kind != "ssh" || got.Who != "ann@example.com" || !strings.HasPrefix(got.Key, "SHA256:") {
		t.Errorf("signer = %+v", got)
	}

	unsigned := w.commit(nil)
	_, err = allowed.Verify(unsigned, time.Now())
	if !errors.Is(err, trust.ErrUnsigned) || !strings.Contains(err.Error(), desiredShort(unsigned.Hash)) {
		t.Errorf("unsigned commit: %v, want ErrUnsigned naming the commit", err)
	}

	byEve := w.commit(eve.Sign())
	_, err = allowed.Verify(byEve, time.Now())
	if !errors.Is(err, trust.ErrUnknownKey) || !errors.Is(err, trust.ErrSignature) {
		t.Fatalf("commit signed by an unknown key: %v, want ErrUnknownKey", err)
	}
	if !strings.Contains(err.Error(), "SHA256:") || !strings.Contains(err.Error(), desiredShort(byEve.Hash)) {
		t.Errorf("refusal %q should name the key's fingerprint and the commit", err)
	}

	// The payload altered after signing (a forged commit reusing a
	// signature) does not verify.
	forged := *signed
	forged.Payload = append([]byte(nil), signed.Payload...)
	forged.Payload[len(forged.Payload)-2] ^= 1
	if _, err := allowed.Verify(&forged, time.Now()); !errors.Is(err, trust.ErrBadSignature) {
		t.Errorf("altered payload: %v, want ErrBadSignature", err)
	}
}

func TestVerifySSHRestrictions(t *testing.T) {
	w := newWorktree(t)
	ann := trusttest.NewSSHKey(t, "ann")
	c := w.commit(ann.Sign())
	for _, tc := range []struct {
		name, line string
		ok         bool
	}{
		{"namespace git", `ann namespaces="git,file" ` + ann.Public, true},
		{"other namespace only", `ann namespaces="file" ` + ann.Public, false},
		// namespaces= is a pattern list, as ssh-keygen reads it: a
		// negated match refuses whatever else the list holds.
		{"namespace negated", `ann namespaces="git,!git" ` + ann.Public, false},
		{"namespace negated after wildcard", `ann namespaces="*,!git" ` + ann.Public, false},
		{"namespace wildcard", `ann namespaces="*" ` + ann.Public, true},
		{"namespace single-character wildcard", `ann namespaces="file,g?t" ` + ann.Public, true},
		{"namespace wildcard elsewhere", `ann namespaces="gi*x" ` + ann.Public, false},
		{"valid since long ago", `ann valid-after="20000101" ` + ann.Public, true},
		{"valid only later", `ann valid-after="29990101Z" ` + ann.Public, false},
		{"expired", `ann valid-before="20000101000000Z" ` + ann.Public, false},
		{"quoted principals", `"ann@example.com,bob@example.com" ` + ann.Public, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sshSigners(t, tc.line).Verify(c, time.Now())
			if tc.ok && err != nil {
				t.Fatalf("want accepted: %v", err)
			}
			want := trust.ErrUnknownKey
			switch {
			case strings.Contains(tc.line, "valid-after"):
				want = trust.ErrKeyNotYetValid
			case strings.Contains(tc.line, "valid-before"):
				want = trust.ErrKeyExpired
			}
			if !tc.ok && !errors.Is(err, want) {
				t.Fatalf("want %v, got %v", want, err)
			}
		})
	}
}

func TestParseAllowedSignersErrors(t *testing.T) {
	key := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGJ0sY7c5VbqOZ3zVtnDQ6hxrsNrZuqzlaaJD4o7TX5j"
	for _, tc := range []struct{ name, text, want string }{
		{"key missing", "ann\n", "allowed_signers:1: a line needs principals"},
		{"bad key", "\n# c\nann ssh-ed25519 AAAAnotbase64\n", "allowed_signers:3: principals \"ann\": the key does not parse"},
		{"cert-authority", "ann cert-authority " + key + "\n", "allowed_signers:1: cert-authority"},
		{"unknown option", "ann no-touch-required " + key + "\n", "allowed_signers:1: option \"no-touch-required\""},
		{"bad time", "ann valid-after=\"2024\" " + key + "\n", "allowed_signers:1: valid-after: \"2024\""},
		{"unterminated quote", "\"ann " + key + "\n", "allowed_signers:1: principals: unterminated quote"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := trust.ParseAllowedSigners("allowed_signers", []byte(tc.text))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
	got, err := trust.ParseAllowedSigners("allowed_signers", []byte("ann,bob "+key+" laptop\n"))
	if err != nil || len(got) != 1 || got[0].Principals != "ann,bob" || got[0].Line != 1 {
		t.Fatalf("parsed %+v, %v", got, err)
	}
}

func TestVerifyOpenPGPCommits(t *testing.T) {
	w := newWorktree(t)
	ann := trusttest.NewGPGKey(t, "Ann <ann@example.com>")
	eve := trusttest.NewGPGKey(t, "Eve <eve@example.com>")
	allowed := pgpSigners(t, ann.Armored)

	signed := w.commit(ann.Sign())
	got, err := allowed.Verify(signed, time.Now())
	if err != nil {
		t.Fatalf("commit signed by a key in the keyring: %v", err)
	}
	if got.Kind != "openpgp" || got.Key != ann.Fingerprint || got.Who != "Ann <ann@example.com>" {
		t.Errorf("signer = %+v, want Ann's key %s", got, ann.Fingerprint)
	}

	byEve := w.commit(eve.Sign())
	_, err = allowed.Verify(byEve, time.Now())
	if !errors.Is(err, trust.ErrUnknownKey) || !strings.Contains(err.Error(), eve.Fingerprint) {
		t.Errorf("commit by a key outside the keyring: %v, want ErrUnknownKey naming %s", err, eve.Fingerprint)
	}
	if _, err := allowed.Verify(w.commit(nil), time.Now()); !errors.Is(err, trust.ErrUnsigned) {
		t.Errorf("unsigned: %v", err)
	}
	// An SSH-only list refuses an OpenPGP signature as an unknown key.
	ssh := sshSigners(t, "ann "+trusttest.NewSSHKey(t, "ann").Public)
	if _, err := ssh.Verify(signed, time.Now()); !errors.Is(err, trust.ErrUnknownKey) {
		t.Errorf("OpenPGP signature against SSH keys only: %v", err)
	}
	// A keyring of two armored blocks holds both keys.
	both := pgpSigners(t, ann.Armored+eve.Armored)
	if _, err := both.Verify(byEve, time.Now()); err != nil {
		t.Errorf("keyring of two blocks: %v", err)
	}
}

func TestNewNeedsAKey(t *testing.T) {
	if _, err := trust.New(nil, openpgp.EntityList{}); err == nil {
		t.Fatal("an empty allowed-signers list must be a configuration error")
	}
	if _, err := trust.ParseKeyring("k.asc", []byte("not armored")); err == nil || !strings.Contains(err.Error(), "k.asc") {
		t.Fatalf("ParseKeyring of garbage: %v", err)
	}
}

// BenchmarkVerify measures the cost of verifying one commit's signature
// (target < 5 ms per commit), reading the commit from the repository as
// the controller does (gitsource's Signed) and checking it; it reports
// ms/commit of wall time and cpu-ms/commit of the process's CPU time (the
// figure that holds on a loaded machine).
func BenchmarkVerify(b *testing.B) {
	w := newWorktree(b)
	sshKey := trusttest.NewSSHKey(b, "ann")
	gpgKey := trusttest.NewGPGKey(b, "Ann <ann@example.com>")
	kr, err := trust.ParseKeyring("keyring.asc", []byte(gpgKey.Armored))
	if err != nil {
		b.Fatal(err)
	}
	keys, err := trust.ParseAllowedSigners("allowed", []byte(sshKey.AllowedSigner("ann")))
	if err != nil {
		b.Fatal(err)
	}
	s, err := trust.New(keys, kr)
	if err != nil {
		b.Fatal(err)
	}
	sshCommit, gpgCommit := w.commit(sshKey.Sign()), w.commit(gpgKey.Sign())
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: w.dir})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := repo.Fetch(context.Background(), "main"); err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		hash string
	}{{"ssh", sshCommit.Hash}, {"openpgp", gpgCommit.Hash}} {
		b.Run(tc.name, func(b *testing.B) {
			start, cpu0 := time.Now(), cpuTime(b)
			for b.Loop() {
				c, err := repo.Signed(tc.hash)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := s.Verify(c, time.Now()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "ms/commit")
			b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/commit")
		})
	}
}

// cpuTime is the user and system CPU time the process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func desiredShort(h string) string { return h[:12] }
