package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/internal/sealed"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// cliSecret is user-data whose secret must never leave the VM file's
// author and the host's seed.
const cliSecret = "#cloud-config\nchpasswd: {list: 'root:S3CR3T-cli-7e1f'}\n"

// ageKeygen runs gitfleet age-keygen into a temporary directory and
// returns the identity file and the recipient it printed.
func ageKeygen(t *testing.T) (string, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "age.key")
	code, out := runCLI(t, "age-keygen", "--out", path, "--host", "hv-a")
	require.Equal(t, 0, code, out)
	recipient := printedPublicKey(out)
	require.True(t, strings.HasPrefix(recipient, "age1"), out)
	for _, want := range []string{"ageIdentity: " + path, "ageRecipient: " + recipient, "gitfleet encrypt --host hv-a"} {
		assert.Contains(t, out, want, "the setup printed")
	}
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	code, _ = runCLI(t, "age-keygen", "--out", path)
	assert.Equal(t, 1, code, "an existing identity is never overwritten")
	return path, recipient
}

func hostWithRecipient(recipient string) string {
	return "apiVersion: gitfleet.dev/v1alpha1\nkind: Host\nmetadata: {name: hv-a}\nspec:\n  capacity: {vcpus: 2}\n  ageRecipient: " + recipient + "\n"
}

func vmWithUserData(name string) string {
	return testVM(name, "1") + "  cloudInit:\n    userData: |\n" + indentLines(cliSecret, "      ") + "  power: running\n"
}

func indentLines(s, pad string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if l != "" {
			b.WriteString(pad + l)
		}
	}
	return b.String()
}

func TestEncryptWritesTheFieldInPlace(t *testing.T) {
	identity, recipient := ageKeygen(t)
	dir := writeFleet(t, map[string]string{"hosts/hv-a.yaml": hostWithRecipient(recipient), "vms/web-01.yaml": vmWithUserData("web-01")})
	vmFile := filepath.Join(dir, "vms", "web-01.yaml")

	code, out := runCLI(t, "encrypt", "--repo", dir, "--host", "hv-b", vmFile)
	assert.Equal(t, 2, code, "a host other than the VM's: %s", out)

	code, out = runCLI(t, "encrypt", "--repo", dir, vmFile)
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "encrypted to host hv-a ("+recipient)
	data, err := os.ReadFile(vmFile)
	require.NoError(t, err)
	assert.NotContains(t, string(data), "S3CR3T")
	assert.Contains(t, string(data), "  power: running\n", "the lines after the user-data are kept")
	vm, err := desired.DecodeVMFile(vmFile, data)
	require.NoError(t, err)
	keys, err := sealed.LoadKeyring(identity)
	require.NoError(t, err)
	plain, err := keys.Open(vm.Spec.CloudInit.EncryptedUserData.Ciphertext, vm.Metadata.Name)
	require.NoError(t, err)
	assert.Equal(t, cliSecret, string(plain), "the host's identity opens exactly what was written")

	code, out = runCLI(t, "validate", dir)
	assert.Equal(t, 0, code, out)

	// Already encrypted: a new plaintext comes from --user-data.
	code, out = runCLI(t, "encrypt", "--repo", dir, vmFile)
	assert.Equal(t, 1, code, out)
	newUD := filepath.Join(t.TempDir(), "ud")
	require.NoError(t, os.WriteFile(newUD, []byte("#!/bin/sh\necho rotated\n"), 0o600))
	code, out = runCLI(t, "encrypt", "--repo", dir, "--user-data", newUD, "--stdout", vmFile)
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "encryptedUserData:")
	after, _ := os.ReadFile(vmFile)
	assert.Equal(t, string(data), string(after), "--stdout leaves the file alone")

	// User-data cloud-init would not run is refused before encrypting.
	require.NoError(t, os.WriteFile(newUD, []byte("#cloud-config\na: 1\na: 2\n"), 0o600))
	code, out, stderr := runCLIStderr(t, "encrypt", "--repo", dir, "--user-data", newUD, vmFile)
	assert.Equal(t, 1, code, out)
	assert.Contains(t, stderr, "user-data line 3")
}

// validate places a malformed recipient and a Host/VM key mismatch at
// FILE:LINE:COL.
func TestValidateReportsRecipientsAtTheirLine(t *testing.T) {
	_, recipient := ageKeygen(t)
	_, other := ageKeygen(t)
	dir := writeFleet(t, map[string]string{"hosts/hv-a.yaml": hostWithRecipient(recipient), "vms/web-01.yaml": vmWithUserData("web-01")})
	code, out := runCLI(t, "encrypt", "--repo", dir, filepath.Join(dir, "vms", "web-01.yaml"))
	require.Equal(t, 0, code, out)

	require.NoError(t, os.WriteFile(filepath.Join(dir, "hosts", "hv-a.yaml"), []byte(hostWithRecipient("age1qqqq-typo")), 0o644))
	code, out = runCLI(t, "validate", dir)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, filepath.ToSlash(dir)+"/hosts/hv-a.yaml:6:17: spec.ageRecipient: \"age1qqqq-typ\"… is not an age recipient")

	require.NoError(t, os.WriteFile(filepath.Join(dir, "hosts", "hv-a.yaml"), []byte(hostWithRecipient(other)), 0o644))
	code, out = runCLI(t, "validate", dir)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, filepath.ToSlash(dir)+"/vms/web-01.yaml:12:18: spec.cloudInit.encryptedUserData.recipient: the user-data is encrypted to "+recipient)
	assert.NotContains(t, out, "S3CR3T")

	// The command the error names re-encrypts the file to the new key: an
	// encrypted file takes its plaintext from --user-data.
	m := regexp.MustCompile(`\(gitfleet (encrypt [^)]*)\)`).FindStringSubmatch(out)
	require.NotNil(t, m, "the error names the command that fixes it: %s", out)
	plaintext := filepath.Join(t.TempDir(), "user-data")
	require.NoError(t, os.WriteFile(plaintext, []byte(cliSecret), 0o600))
	words := strings.Fields(m[1]) // encrypt --host hv-a --user-data PLAINTEXT VMFILE
	args := []string{words[0], "--repo", dir}
	for _, a := range words[1:] {
		switch a {
		case "PLAINTEXT":
			a = plaintext
		case "VMFILE":
			a = filepath.Join(dir, "vms", "web-01.yaml")
		}
		args = append(args, a)
	}
	code, out = runCLI(t, args...)
	require.Equal(t, 0, code, "gitfleet %s: %s", m[1], out)
	code, out = runCLI(t, "validate", dir)
	assert.Equal(t, 0, code, "re-encrypted as the error says, the fleet validates: %s", out)
}

// The agent refuses to start with an identity file others can read.
func TestAgentRefusesAReadableIdentity(t *testing.T) {
	identity, _ := ageKeygen(t)
	require.NoError(t, os.Chmod(identity, 0o644))
	cfg := writeAgentConfig(t, "repo: {url: /nowhere}\nhost: hv-a\nbackend: memory\nageIdentity: "+identity+"\n")
	code, _, stderr := runCLIStderr(t, "agent", "--once", "--state-dir", t.TempDir(), "--config", cfg)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "chmod 600 "+identity)
}

// A secret encrypted to hv-a appears in plaintext on no branch and in no
// commit of the repository, in no log line and no output, after the
// author's push, a controller pass and an agent pass over real git; the
// agent, which holds the key, creates the VM.
func TestEncryptedSecretReachesNoBranchNoLog(t *testing.T) {
	gittest.NeedGit(t)
	identity, recipient := ageKeygen(t)
	bare := gittest.NewBare(t)
	work := filepath.Join(t.TempDir(), "work")
	gittest.Git(t, "", "clone", "-q", bare, work)
	for p, c := range map[string]string{"fleet/hv-a.yaml": hostWithRecipient(recipient), "fleet/web-01.yaml": vmWithUserData("web-01")} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(work, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(work, p), []byte(c), 0o644))
	}
	var printed strings.Builder
	code, out := runCLI(t, "encrypt", "--repo", work, "--path", "fleet", filepath.Join(work, "fleet", "web-01.yaml"))
	require.Equal(t, 0, code, out)
	printed.WriteString(out)
	gittest.Git(t, work, "add", "-A")
	gittest.Git(t, work, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "web-01 with encrypted user-data")
	gittest.Git(t, work, "push", "-q", "origin", "HEAD")

	logf, err := os.CreateTemp(t.TempDir(), "log")
	require.NoError(t, err)
	defer logf.Close()
	saved := logrus.StandardLogger().Out
	logrus.SetOutput(logf)
	t.Cleanup(func() { logrus.SetOutput(saved) })

	code, out, errOut := runCLIStderr(t, "controller", "--repo", bare, "--path", "fleet", "--once")
	require.Equal(t, 0, code, out+errOut)
	printed.WriteString(out + errOut)
	snap := gittest.Show(t, bare, "refs/heads/gitfleet/snapshots", "hosts/hv-a.yaml")
	assert.Contains(t, snap, "BEGIN AGE ENCRYPTED FILE", "the snapshot carries the ciphertext")

	cfg := writeAgentConfig(t, "repo: {url: "+bare+"}\nhost: hv-a\nstateDir: "+filepath.Join(t.TempDir(), "state")+
		"\nbackend: memory\nlogLevel: debug\nageIdentity: "+identity+"\n")
	code, out, errOut = runCLIStderr(t, "agent", "--config", cfg, "--once")
	require.Equal(t, 0, code, out+errOut)
	printed.WriteString(out + errOut)
	st, err := status.Parse("hosts/hv-a.yaml", []byte(gittest.Show(t, bare, "refs/heads/"+status.HostBranch("hv-a"), "hosts/hv-a.yaml")+"\n"))
	require.NoError(t, err)
	require.Len(t, st.VMs, 1)
	assert.Equal(t, status.PhaseReady, st.VMs[0].Phase, "lastError: %s", st.VMs[0].LastError)
	// A second pass copies the host's status onto gitfleet/status.
	code, out, errOut = runCLIStderr(t, "controller", "--repo", bare, "--path", "fleet", "--once")
	require.Equal(t, 0, code, out+errOut)
	printed.WriteString(out + errOut)
	gittest.Show(t, bare, "refs/heads/gitfleet/status", "hosts/hv-a.yaml")

	refs := gittest.Git(t, bare, "for-each-ref", "--format=%(refname)")
	for _, b := range []string{"refs/heads/main", "refs/heads/gitfleet/snapshots", "refs/heads/gitfleet/status", "refs/heads/" + status.HostBranch("hv-a")} {
		require.Contains(t, refs, b, "the test proves nothing without every branch")
	}
	history := gittest.Git(t, bare, "log", "-p", "--all", "--format=%H %an %s%n%b")
	assert.NotContains(t, history, "S3CR3T", "a branch's history holds the plaintext")
	logs, _ := os.ReadFile(logf.Name())
	assert.NotEmpty(t, logs, "nothing was logged, so the test proves nothing")
	assert.NotContains(t, string(logs), "S3CR3T", "a log line holds the plaintext")
	assert.NotContains(t, printed.String(), "S3CR3T", "an output holds the plaintext")
}
