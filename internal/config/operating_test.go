package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The configuration docs/operating.md tells an operator to write reads as
// it says: the agent file strictly, and every GITFLEET_* variable it sets
// for the controller (in controller.env and in the SSH drop-in) is one the
// controller reads. A renamed key or variable fails here, not on a host.
func TestOperatingGuideConfigRead(t *testing.T) {
	data, err := os.ReadFile("../../docs/operating.md")
	require.NoError(t, err)
	doc := string(data)

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
