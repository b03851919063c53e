package config

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/testsupport/trusttest"
)

// operatingGuide is the text of docs/operating.md.
func operatingGuide(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../../../../docs/operating.md")
	require.NoError(t, err)
	return string(data)
}

// The configuration docs/operating.md tells an operator to write reads as
// it says: the agent file strictly, and every GITFLEET_* variable it sets
// for the controller (in controller.env and in the SSH drop-in) is one the
// controller reads. A renamed key or variable fails here, not on a host.
func TestOperatingGuideConfigRead(t *testing.T) {
	doc := operatingGuide(t)

	// The agent file: the first yaml block after its heading line.
	at := strings.Index(doc, "`/etc/gitfleet/agent.yaml` on `hv-a`")
	require.GreaterOrEqual(t, at, 0, "the guide shows hv-a's agent.yaml")
	block := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindStringSubmatch(doc[at:])
	require.NotNil(t, block, "a yaml block follows")
	path := filepath.Join(t.TempDir(), "agent.yaml")
	require.NoError(t, os.WriteFile(path, []byte(block[1]), 0o600))
	f, err := ReadAgentFile(path)
	require.NoError(t, err)
	assert.Equal(t, "hv-a", f.Host)
	assert.Equal(t, "/etc/gitfleet/ssh/known_hosts", f.Repo.Auth.KnownHostsFile)
	assert.Equal(t, "127.0.0.1:9781", f.Listen)

	// Every variable the guide sets for the controller.
	known := controllerVariables(t)
	vars := regexp.MustCompile(`\bGITFLEET_[A-Z_]+=`).FindAllString(doc, -1)
	require.NotEmpty(t, vars)
	notController := map[string]bool{"GITFLEET_VERSION=": true} // the pull-request workflow's, not the controller's
	for _, v := range vars {
		if notController[v] {
			continue
		}
		assert.True(t, known[strings.TrimSuffix(v, "=")], "%s in docs/operating.md is a variable the controller reads", v)
	}
}

// Section 14 rehearses the guide on one machine: its agent file reads as
// the memory backend, the controller flags it names exist, and the webhook
// it sends with openssl and curl is one the controller accepts (the same
// HMAC, header and path), while a wrong secret is refused.
func TestOperatingGuideRehearsal(t *testing.T) {
	doc := operatingGuide(t)
	at := strings.Index(doc, "## 14. Rehearsing on one machine")
	require.GreaterOrEqual(t, at, 0)
	rehearsal := doc[at:]

	agentFile := regexp.MustCompile(`(?s)cat > agent-\$h.yaml <<EOF\n(.*?)\nEOF`).FindStringSubmatch(rehearsal)
	require.NotNil(t, agentFile, "section 14 writes each agent's file")
	text := strings.NewReplacer("$h", "a", "$n", "1").Replace(agentFile[1])
	path := filepath.Join(t.TempDir(), "agent-a.yaml")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
	f, err := ReadAgentFile(path)
	require.NoError(t, err)
	assert.Equal(t, "memory", f.Backend)
	assert.Equal(t, "hv-a", f.Host)

	c, fl := DefaultController(), NewFlags(pflag.NewFlagSet("controller", pflag.ContinueOnError))
	c.Bind(fl)
	checked := map[string]bool{}
	for _, use := range regexp.MustCompile("(?m)^gitfleet controller .*$|--(offline-after|abandon-grace) [0-9a-z]+").FindAllString(rehearsal, -1) {
		for _, name := range regexp.MustCompile(`--([a-z-]+)`).FindAllStringSubmatch(use, -1) {
			assert.NotNil(t, fl.fs.Lookup(name[1]), "--%s named in section 14 is a controller flag", name[1])
			checked[name[1]] = true
		}
	}
	for _, name := range []string{"repo", "cache-dir", "listen", "webhook-listen", "offline-after", "abandon-grace"} {
		assert.True(t, checked[name], "section 14 uses --%s, and the test checked it", name)
	}

	secret := regexp.MustCompile(`GITFLEET_WEBHOOK_SECRET=(\w+)`).FindStringSubmatch(rehearsal)
	body := regexp.MustCompile(`body='([^']*)'`).FindStringSubmatch(rehearsal)
	hmacKey := regexp.MustCompile(`openssl dgst -sha256 -hmac (\w+)`).FindStringSubmatch(rehearsal)
	header := regexp.MustCompile(`-H "(X-Hub-Signature-256): sha256=\$sig"`).FindStringSubmatch(rehearsal)
	hooks := regexp.MustCompile(`--webhook-listen (127\.0\.0\.1:[0-9]+)`).FindStringSubmatch(rehearsal)
	require.NotNil(t, hooks, "section 14 serves the webhooks (--webhook-listen)")
	target := regexp.MustCompile(`http://` + regexp.QuoteMeta(hooks[1]) + `(/hooks/\w+)`).FindStringSubmatch(rehearsal)
	require.True(t, secret != nil && body != nil && hmacKey != nil && header != nil && target != nil, "section 14 shows the webhook request whole, sent to --webhook-listen")
	require.Equal(t, secret[1], hmacKey[1], "the request is signed with the controller's secret")
	mac := hmac.New(sha256.New, []byte(hmacKey[1]))
	mac.Write([]byte(body[1])) // printf %s: no newline
	kicked := 0
	h := fleet.WebhookHandler([]byte(secret[1]), func() { kicked++ })
	send := func(sig string) int {
		req := httptest.NewRequest(http.MethodPost, target[1], strings.NewReader(body[1]))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-GitHub-Event", "push")
		req.Header.Set(header[1], "sha256="+sig)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	assert.Equal(t, http.StatusAccepted, send(hex.EncodeToString(mac.Sum(nil))))
	assert.Equal(t, 1, kicked, "an accepted webhook starts a pass")
	assert.Equal(t, http.StatusUnauthorized, send(strings.Repeat("0", 64)))
}

// Section 14's rehearsal of the trust features: every controller flag it
// names exists (the signature mode it sets parses), and the lines it
// appends to each agent's file read as the verification and signing
// setup, with the controller's public key where the shell puts it.
func TestOperatingGuideRehearsesTrust(t *testing.T) {
	doc := operatingGuide(t)
	at := strings.Index(doc, "- **Signed changes, snapshots and acks")
	require.GreaterOrEqual(t, at, 0, "section 14 rehearses the signing keys")
	bullet := doc[at:]
	if end := strings.Index(bullet[1:], "\n- **"); end >= 0 {
		bullet = bullet[:end+1]
	}

	// An applied unsigned commit: one pass in head mode, then every.
	lines := regexp.MustCompile(`(?m)^[ \t]*gitfleet controller (.*?)(?: >.*)?$`).FindAllStringSubmatch(bullet, -1)
	require.Len(t, lines, 2, "the bullet runs the controller once in head mode, then for good")
	for i, mode := range []string{"head", "every"} {
		c, fl := DefaultController(), NewFlags(pflag.NewFlagSet("controller", pflag.ContinueOnError))
		c.Bind(fl)
		args := strings.Fields(strings.Replace(lines[i][1], "--once", "", 1)) // cmd/gitfleet's own flag
		require.NoError(t, fl.fs.Parse(args), "the controller line of section 14 parses: %s", lines[i][0])
		for _, name := range []string{"verify-signatures", "allowed-signers", "signing-key"} {
			assert.True(t, fl.fs.Changed(name), "section 14's controller line sets --%s", name)
		}
		got, err := fl.fs.GetString("verify-signatures")
		require.NoError(t, err)
		assert.Equal(t, mode, got)
	}
	assert.True(t, strings.Contains(lines[0][1], "--once"), "the head-mode pass is a single one")

	appended := regexp.MustCompile(`(?s)cat >> agent-\$h.yaml <<EOF\n(.*?)\n\s*EOF`).FindStringSubmatch(bullet)
	require.NotNil(t, appended, "the bullet appends the keys to each agent's file")
	key := trusttest.NewSSHKey(t, "gitfleet-controller")
	base := "repo: {url: /tmp/rehearsal/fleet.git}\nhost: hv-a\nstateDir: /tmp/rehearsal/state-a\nbackend: memory\n"
	text := strings.NewReplacer("$(cat keys/controller_ed25519.pub)", key.Public, "$h", "a").Replace(dedent(appended[1]))
	path := filepath.Join(t.TempDir(), "agent-a.yaml")
	require.NoError(t, os.WriteFile(path, []byte(base+text+"\n"), 0o600))
	f, err := ReadAgentFile(path)
	require.NoError(t, err, "%s", text)
	assert.Equal(t, []string{key.Public}, f.ControllerKeys)
	assert.Equal(t, "/tmp/rehearsal/keys/agent-hv-a", f.SigningKey)
	assert.Contains(t, bullet, "keygen --host hv-$h --out /tmp/rehearsal/keys/agent-hv-$h", "the key the agent file names is the one keygen writes")
}

// dedent removes the indentation of a code block inside a list item.
func dedent(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "  ")
	}
	return strings.Join(lines, "\n")
}

// The controller runs as a dynamic user that reads the allowed-signers
// file and the keyring the guide puts under /etc/gitfleet: no step of the
// guide makes that directory unreadable to it (install -d sets the mode
// of a directory that exists already).
func TestOperatingGuideKeepsEtcGitfleetReadable(t *testing.T) {
	doc := operatingGuide(t)
	require.Contains(t, doc, "GITFLEET_ALLOWED_SIGNERS=/etc/gitfleet/", "the guide puts a file the controller reads under /etc/gitfleet")
	modes := regexp.MustCompile(`install -d -m (0[0-7]{3}) /etc/gitfleet(\s|$)`).FindAllStringSubmatch(doc, -1)
	require.NotEmpty(t, modes, "section 1 makes /etc/gitfleet")
	for _, m := range modes {
		mode, err := strconv.ParseUint(m[1], 8, 32)
		require.NoError(t, err)
		assert.NotZero(t, mode&0o001, "install -d -m %s /etc/gitfleet: the controller's dynamic user can no longer reach the files in it", m[1])
	}
}
