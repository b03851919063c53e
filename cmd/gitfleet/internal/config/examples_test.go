package config

import (
	"bufio"
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The configuration examples the package ships (examples/agent.yaml and
// examples/controller.env, installed under /usr/share/doc/gitfleet) read
// as what they say: the agent file strictly, and every variable of the
// controller's file is one the controller reads.
func TestShippedExamplesRead(t *testing.T) {
	f, err := ReadAgentFile("../../../../examples/agent.yaml")
	require.NoError(t, err)
	assert.Equal(t, "hv-a", f.Host)
	assert.Equal(t, "/etc/gitfleet/token", f.Repo.Auth.TokenFile)
	assert.Equal(t, "/var/lib/gitfleet", f.StateDir)

	c, fl := DefaultController(), NewFlags(pflag.NewFlagSet("controller", pflag.ContinueOnError))
	c.Bind(fl)
	known := controllerVariables(t)
	file, err := os.Open("../../../../examples/controller.env")
	require.NoError(t, err)
	defer file.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		require.True(t, ok, "%q is KEY=VALUE", line)
		require.True(t, known[k], "%s is a variable the controller reads", k)
		env[k] = v
	}
	require.NoError(t, sc.Err())
	require.NoError(t, fl.FromEnv(mapEnv(env)))
	assert.Equal(t, "https://git.example.com/infra/fleet.git", c.Repo.URL)
}

// controllerVariables is the set of GITFLEET_* variables the controller
// reads.
func controllerVariables(t *testing.T) map[string]bool {
	t.Helper()
	c, fl := DefaultController(), NewFlags(pflag.NewFlagSet("controller", pflag.ContinueOnError))
	c.Bind(fl)
	known := map[string]bool{}
	for _, b := range fl.vars {
		if b.env != "" {
			known[b.env] = true
		}
	}
	return known
}

// What the shipped files point an operator at exists: the units'
// Documentation= names the guide, which the package installs where the
// second link says; the example fleet's README validates the way it reads
// once copied into a fleet repository; the pull-request workflow says its
// comment step is GitHub's and pins a version.
func TestShippedFilesPointAtWhatExists(t *testing.T) {
	nfpm, err := os.ReadFile("../../../../packaging/nfpm.yaml")
	require.NoError(t, err)
	for _, unit := range []string{"gitfleet-agent.service", "gitfleet-controller.service"} {
		data, err := os.ReadFile("../../../../examples/systemd/" + unit)
		require.NoError(t, err)
		var doc string
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "Documentation="); ok {
				doc = v
			}
		}
		for _, link := range strings.Fields(doc) {
			switch {
			case strings.HasPrefix(link, "https://github.com/gitfleet/gitfleet/blob/main/"):
				_, err := os.Stat("../../../../" + strings.TrimPrefix(link, "https://github.com/gitfleet/gitfleet/blob/main/"))
				assert.NoError(t, err, "%s: %s names a file of the repository", unit, link)
			case strings.HasPrefix(link, "file:"):
				assert.Contains(t, string(nfpm), "dst: "+strings.TrimPrefix(link, "file:"), "%s: the package installs %s", unit, link)
			default:
				t.Errorf("%s: Documentation= link %q", unit, link)
			}
		}
		assert.Contains(t, doc, "docs/operating.md", "%s: Documentation= names the operating guide", unit)
	}

	readme, err := os.ReadFile("../../../../examples/fleet/README.md")
	require.NoError(t, err)
	assert.Contains(t, string(readme), "\n    gitfleet validate .\n", "the command as run in a fleet repository's root")

	wf, err := os.ReadFile("../../../../examples/github/gitfleet-pr.yml")
	require.NoError(t, err)
	comment := strings.Index(string(wf), "- name: Comment the plan")
	require.Greater(t, comment, 0)
	assert.Contains(t, string(wf)[:comment], "# GitHub only: gh comments on the pull request.")
	assert.NotContains(t, string(wf), "gitfleet@latest")
	assert.Contains(t, string(wf), "@${{ env.GITFLEET_VERSION }}")
}
