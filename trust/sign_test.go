package trust_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
	"github.com/gitfleet/gitfleet/testsupport/trusttest"
	"github.com/gitfleet/gitfleet/trust"
)

// writeSigned writes one file to branch of the bare repository dir
// through gitsource, the commit signed by signer, and returns the commit.
func writeSigned(t *testing.T, dir, branch string, signer gitsource.CommitSigner) (*gitsource.Repo, string) {
	t.Helper()
	ctx := context.Background()
	repo, err := gitsource.Open(ctx, gitsource.Options{URL: dir})
	if err != nil {
		t.Fatal(err)
	}
	tip, err := repo.Edit(ctx, branch, func(*gitsource.Commit, func(string) ([]byte, error)) (gitsource.Write, error) {
		return gitsource.Write{Files: map[string][]byte{"hosts/hv-a.yaml": []byte("host: hv-a\n")}, Message: "snapshots: epoch 1", Signer: signer}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return repo, tip
}

// verifyCommit runs `git verify-commit` on commit in the repository dir
// with allowed as gpg.ssh.allowedSignersFile and returns its output.
func verifyCommit(dir, allowed, commit string) (string, error) {
	cmd := exec.Command("git", "-c", "gpg.format=ssh", "-c", "gpg.ssh.allowedSignersFile="+allowed, "verify-commit", "-v", commit)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The controller's commits carry the signature git itself makes with
// gpg.format=ssh: the real git CLI verifies them against an
// allowed-signers file, and refuses them against one naming another key.
func TestCommitSignerGitVerifies(t *testing.T) {
	ctl := trusttest.NewSSHKey(t, "controller")
	eve := trusttest.NewSSHKey(t, "eve")
	signer, err := trust.LoadCommitSigner(ctl.Private)
	if err != nil {
		t.Fatal(err)
	}
	if signer.AuthorizedKey()+" controller" != ctl.Public {
		t.Errorf("AuthorizedKey = %q, want the key of %q", signer.AuthorizedKey(), ctl.Public)
	}
	dir := gittest.NewBare(t)
	repo, tip := writeSigned(t, dir, "gitfleet/snapshots", signer)

	allowed := filepath.Join(t.TempDir(), "allowed_signers")
	if err := os.WriteFile(allowed, []byte(ctl.AllowedSigner("gitfleet-controller")), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := verifyCommit(dir, allowed, tip)
	if err != nil {
		t.Fatalf("git verify-commit refused the controller's commit: %v\n%s", err, out)
	}
	if !strings.Contains(out, `Good "git" signature for gitfleet-controller`) {
		t.Errorf("git verify-commit said %q, want a good signature for gitfleet-controller", out)
	}
	raw := gittest.Git(t, dir, "cat-file", "commit", tip)
	if !strings.Contains(raw, "\ngpgsig -----BEGIN SSH SIGNATURE-----\n") {
		t.Errorf("commit has no SSH gpgsig header:\n%s", raw)
	}

	other := filepath.Join(t.TempDir(), "allowed_signers")
	if err := os.WriteFile(other, []byte(eve.AllowedSigner("eve")), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := verifyCommit(dir, other, tip); err == nil {
		t.Errorf("git verify-commit accepted the commit against an allowed-signers file without its key:\n%s", out)
	}

	// Signers.Verify reads the same signature the same way.
	c, err := repo.Signed(tip)
	if err != nil {
		t.Fatal(err)
	}
	got, err := sshSigners(t, ctl.AllowedSigner("gitfleet-controller")).Verify(c, time.Now())
	if err != nil || got.Who != "gitfleet-controller" || got.Key != signer.Fingerprint() {
		t.Errorf("Verify = %+v, %v; want gitfleet-controller %s", got, err, signer.Fingerprint())
	}
	if _, err := sshSigners(t, eve.AllowedSigner("eve")).Verify(c, time.Now()); !errors.Is(err, trust.ErrUnknownKey) {
		t.Errorf("Verify against another key: %v, want ErrUnknownKey", err)
	}
}

// A commit written without a Signer carries no signature: nothing signs
// by accident, and Verify says so.
func TestUnsignedWriteIsUnsigned(t *testing.T) {
	ctl := trusttest.NewSSHKey(t, "controller")
	dir := gittest.NewBare(t)
	repo, tip := writeSigned(t, dir, "gitfleet/snapshots", nil)
	c, err := repo.Signed(tip)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sshSigners(t, ctl.AllowedSigner("c")).Verify(c, time.Now()); !errors.Is(err, trust.ErrUnsigned) {
		t.Errorf("Verify = %v, want ErrUnsigned", err)
	}
}

func TestLoadCommitSignerRefuses(t *testing.T) {
	key := trusttest.NewSSHKey(t, "controller")
	data, err := os.ReadFile(key.Private)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, data []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	readable := write("readable", data, 0o644)
	garbage := write("garbage", []byte("not a key\n"), 0o600)
	link := filepath.Join(dir, "link")
	if err := os.Symlink(key.Private, link); err != nil {
		t.Fatal(err)
	}
	withPass := filepath.Join(dir, "withpass")
	trusttest.SSHKeygen(t, "-q", "-t", "ed25519", "-N", "secret", "-C", "p", "-f", withPass)

	for _, tc := range []struct {
		name, path, want string
	}{
		{"others may read it", readable, "mode 0644"},
		{"not a key", garbage, "not an OpenSSH private key"},
		{"a symbolic link", link, "symbolic link"},
		{"a passphrase", withPass, "has a passphrase"},
		{"missing", filepath.Join(dir, "absent"), "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := trust.LoadCommitSigner(tc.path)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("LoadCommitSigner(%s) = %v, want an error containing %q", tc.path, err, tc.want)
			}
			if strings.Contains(err.Error(), "PRIVATE KEY") {
				t.Errorf("error quotes the key: %v", err)
			}
		})
	}
}

// BenchmarkSnapshotSignature prints the cost of signed snapshots and acks
// per commit: signing one commit as the controller (or an agent) does,
// and reading a signed commit from the repository and verifying it against
// an agent's controllerKeys (the controller verifies an ack the same way).
// Target: under 5 ms per commit.
//
//	go test ./trust -run '^$' -bench SnapshotSignature
func BenchmarkSnapshotSignature(b *testing.B) {
	gittest.NeedGit(b)
	key := trusttest.NewSSHKey(b, "gitfleet-controller")
	signer, err := trust.LoadCommitSigner(key.Private)
	if err != nil {
		b.Fatal(err)
	}
	dir := gittest.NewBare(b)
	ctx := context.Background()
	repo, err := gitsource.Open(ctx, gitsource.Options{URL: dir})
	if err != nil {
		b.Fatal(err)
	}
	tip, err := repo.Edit(ctx, "gitfleet/snapshots", func(*gitsource.Commit, func(string) ([]byte, error)) (gitsource.Write, error) {
		return gitsource.Write{Files: map[string][]byte{"hosts/hv-a.yaml": []byte("host: hv-a\nepoch: 1\n")}, Message: "Publish 1 host snapshot(s)", Signer: signer}, nil
	})
	if err != nil {
		b.Fatal(err)
	}
	keys, err := trust.ParseKeys("controllerKeys", []string{key.Public})
	if err != nil {
		b.Fatal(err)
	}
	verifier, err := trust.New(keys, nil)
	if err != nil {
		b.Fatal(err)
	}
	signed, err := repo.Signed(tip)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("sign", func(b *testing.B) {
		start, cpu0 := time.Now(), cpuTime(b)
		for b.Loop() {
			if _, err := signer.SignCommit(signed.Payload); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "ms/commit")
		b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/commit")
	})
	b.Run("read-and-verify", func(b *testing.B) {
		start, cpu0 := time.Now(), cpuTime(b)
		for b.Loop() {
			c, err := repo.Signed(tip)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := verifier.Verify(c, time.Now()); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "ms/commit")
		b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/commit")
	})
}

// ParseKeys reads controllerKeys entries: one .pub line each, the comment
// as who; options, a second key and a line that is no key are errors
// naming the entry.
func TestParseKeys(t *testing.T) {
	key := trusttest.NewSSHKey(t, "gitfleet-controller")
	bare := strings.Fields(key.Public)[0] + " " + strings.Fields(key.Public)[1]
	got, err := trust.ParseKeys("agent.yaml: controllerKeys", []string{key.Public, bare})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Principals != "gitfleet-controller" || got[1].Principals != "key 1" {
		t.Errorf("signers = %+v", got)
	}
	for _, tc := range []struct{ name, entry, want string }{
		{"options", "restrict " + key.Public, "agent.yaml: controllerKeys[0]: options are not allowed"},
		{"two keys", key.Public + "\n" + key.Public, "agent.yaml: controllerKeys[0]: one key per entry"},
		{"not a key", "gitfleet-controller", "agent.yaml: controllerKeys[0]: not an SSH public key line"},
		{"empty", "", "agent.yaml: controllerKeys[0]: not an SSH public key line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := trust.ParseKeys("agent.yaml: controllerKeys", []string{tc.entry})
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("ParseKeys(%q) = %v, want %q…", tc.entry, err, tc.want)
			}
		})
	}
}

// failingSigner is a signer whose key is gone (an agent that cannot sign).
type failingSigner struct{}

func (failingSigner) SignCommit([]byte) (string, error) {
	return "", errors.New("the key is unavailable")
}

// A commit that cannot be signed is not written: the write fails and the
// branch stays where it was.
func TestUnsignableWriteWritesNothing(t *testing.T) {
	dir := gittest.NewBare(t)
	_, tip := writeSigned(t, dir, "gitfleet/snapshots", nil)
	repo, err := gitsource.Open(context.Background(), gitsource.Options{URL: dir})
	if err != nil {
		t.Fatal(err)
	}
	_, err = repo.Edit(context.Background(), "gitfleet/snapshots", func(*gitsource.Commit, func(string) ([]byte, error)) (gitsource.Write, error) {
		return gitsource.Write{Files: map[string][]byte{"hosts/hv-a.yaml": []byte("host: hv-a\nepoch: 2\n")}, Signer: failingSigner{}}, nil
	})
	if err == nil || !strings.Contains(err.Error(), "the key is unavailable") {
		t.Fatalf("Edit = %v, want the signer's error", err)
	}
	if got := gittest.Rev(t, dir, "refs/heads/gitfleet/snapshots"); got != tip {
		t.Errorf("the branch moved to %s after a failed signature", got)
	}
}
