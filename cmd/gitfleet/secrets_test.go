package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/gitfleet/gitfleet/internal/redact"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// A token given in the repository URL, in any form, reaches no log line,
// no error printed, and no commit on any branch — also when the fetch
// fails and the controller records why.
func TestRepoTokenReachesNoLogAndNoBranch(t *testing.T) {
	const token = "glpat-SeCrEt-0123456789"
	root := t.TempDir()
	bare := filepath.Join(root, "fleet.git")
	gittest.Git(t, "", "clone", "-q", "--bare", cliFleet(t), bare)
	gittest.Git(t, bare, "config", "http.receivepack", "true")
	base := gittest.Serve(t, root)
	host := strings.TrimPrefix(base, "http://")

	logf, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	saved := logrus.StandardLogger().Out
	logrus.SetOutput(logf)
	t.Cleanup(func() { logrus.SetOutput(saved) })

	var printed strings.Builder
	for _, url := range []string{
		"http://" + token + "@" + host + "/fleet.git",
		"http://oauth2:" + token + "@" + host + "/fleet.git",
		"http://" + host + "/fleet.git?private_token=" + token,
	} {
		// A branch that does not exist: the pass fails and says why (the
		// controller now refuses to publish then; earlier versions wrote
		// the reason, URL and all, into the ledger and the summary).
		code, out, errOut := runCLIStderr(t, "controller", "--repo", url, "--branch", "nosuch", "--path", "fleet", "--once")
		t.Logf("nosuch: exit %d: %s", code, redact.Text(errOut))
		printed.WriteString(out + errOut)
		_, out, errOut = runCLIStderr(t, "controller", "--repo", url, "--path", "fleet", "--once")
		printed.WriteString(out + errOut)
		_, out, errOut = runCLIStderr(t, "status", "--repo", url)
		printed.WriteString(out + errOut)
	}
	if refs := gittest.Git(t, bare, "for-each-ref"); !strings.Contains(refs, "gitfleet/snapshots") {
		t.Fatalf("the controller wrote no branch, so the test proves nothing: %s", refs)
	}
	history := gittest.Git(t, bare, "log", "-p", "--all", "--format=%H %an %ae %s%n%b")
	if strings.Contains(history, token) {
		t.Errorf("a branch's history holds the token")
	}
	logs, _ := os.ReadFile(logf.Name())
	if len(logs) == 0 {
		t.Error("the controller logged nothing, so the test proves nothing")
	}
	for name, text := range map[string]string{"log": string(logs), "output": printed.String()} {
		for _, line := range strings.Split(text, "\n") {
			if strings.Contains(line, token) {
				t.Errorf("%s line holds the token: %s", name, line)
			}
		}
	}
}

// The controller's --cache-dir holds the clone (user-data) and the
// remote's URL: it is made 0700, and an existing one is closed down.
func TestControllerCacheDirIsPrivate(t *testing.T) {
	dir := cliFleet(t)
	for _, existing := range []bool{false, true} {
		cache := filepath.Join(t.TempDir(), "cache")
		if existing {
			if err := os.Mkdir(cache, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if code, _ := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--cache-dir", cache, "--once"); code != 0 {
			t.Fatalf("exit %d", code)
		}
		fi, err := os.Stat(cache)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o700 {
			t.Errorf("cache dir (existing: %v) has mode %o, want 700", existing, fi.Mode().Perm())
		}
	}
}

// validate never echoes a secret field's value, not even a prefix.
func TestValidateEchoesNoSecret(t *testing.T) {
	vm := testVM("a", "1") + "  cloudInit:\n    sshAuthorizedKeys: \"S3CR3T-key-not-a-list\"\n    userData: 12345678\n"
	code, out := runCLI(t, "validate", writeFleet(t, map[string]string{"h.yaml": testHost, "a.yaml": vm}))
	if code != 1 || !strings.Contains(out, "spec.cloudInit.sshAuthorizedKeys") || !strings.Contains(out, "spec.cloudInit.userData") {
		t.Fatalf("exit %d, output %q: want both fields reported", code, out)
	}
	if strings.Contains(out, "S3CR3T") || strings.Contains(out, "12345678") {
		t.Errorf("validate echoes a secret: %s", out)
	}
}

// The agent's unit is hardened: systemd-analyze security rates its
// exposure 4.0 or lower (the unhardened unit rated 9.6, "UNSAFE").
func TestAgentUnitIsHardened(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze not installed (apt-get install systemd)")
	}
	unit := filepath.Join("..", "..", "examples", "systemd", "gitfleet-agent.service")
	out, err := exec.Command("systemd-analyze", "security", "--offline=true", "--threshold=40", unit).CombinedOutput()
	if err != nil {
		t.Errorf("%v: exposure above 4.0:\n%s", err, out)
	}
}

// A forged 50 MB status file is refused by its size: the controller reports
// it as the host's status error, and its peak memory stays under 300 MB.
// The controller runs as shipped defaults have it (no --cache-dir: a
// clone on disk in a temporary directory); the figure is the child's own
// VmHWM (rusage's Maxrss would count this test's memory too).
func TestForgedHugeStatusIsRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("commits a 50 MB file; skipped with -short")
	}
	dir := cliFleet(t)
	if code, _ := runCLI(t, "controller", "--repo", dir, "--path", "fleet", "--once"); code != 0 {
		t.Fatalf("first pass: exit %d", code)
	}
	huge := "host: hv-a\nheartbeat: 1\nvms:\n" + strings.Repeat("  - {name: web-01, phase: ready, lastError: \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}\n", 50<<20/80)
	gittest.Commit(t, dir, gittest.Edit{Branch: "gitfleet/status", Write: map[string]string{"hosts/hv-a.yaml": huge}})

	rss := cliPeakRSS(t, "controller", "--repo", dir, "--path", "fleet", "--once")
	t.Logf("controller peak RSS with a %d MB status: %.0f MB", len(huge)>>20, rss)
	if rss > 300 {
		t.Errorf("controller peak RSS %.0f MB, want under 300 MB", rss)
	}
	readme := gittest.Show(t, dir, "refs/heads/gitfleet/status", "README.md")
	if !strings.Contains(readme, "status file too large") {
		t.Errorf("README does not report the refused status:\n%.2000s", readme)
	}
	if len(readme) > 1<<20 {
		t.Errorf("README is %d bytes", len(readme))
	}
}

// A remote that wants credentials gitfleet was not given, or refuses the
// ones it was, gets an error that says where credentials go; an ssh remote
// without a key is told to give one. The remote keeps its name in the
// message (an scp-like one too), without its user.
func TestCredentialErrorsSayWhatToDo(t *testing.T) {
	gittest.NeedGit(t)
	root := t.TempDir()
	bare := filepath.Join(root, "fleet.git")
	gittest.Git(t, "", "init", "--quiet", "--bare", "--initial-branch=main", bare)
	url := gittest.ServeWith(t, root, gittest.ServeOptions{Username: "git", Password: "right-token"}) + "/fleet.git"
	for _, token := range []string{"", "wrong-token"} {
		t.Setenv("GITFLEET_TOKEN", token)
		code, _, errOut := runCLIStderr(t, "status", "--repo", url)
		if code != 1 || !strings.Contains(errOut, "authentication required: unauthorized (the remote wants credentials it accepts: over HTTPS a token that can read the repository") {
			t.Errorf("token %q: exit %d:\n%s", token, code, errOut)
		}
	}
	t.Setenv("GITFLEET_TOKEN", "")
	t.Setenv("SSH_AUTH_SOCK", "")
	code, _, errOut := runCLIStderr(t, "status", "--repo", "git@127.0.0.1:example-org/fleet.git")
	if code != 1 || !strings.Contains(errOut, "an ssh remote needs a key: --ssh-key FILE or GITFLEET_SSH_KEY") || !strings.Contains(errOut, "***@127.0.0.1:example-org/fleet.git") {
		t.Errorf("ssh without a key: exit %d:\n%s", code, errOut)
	}
}
