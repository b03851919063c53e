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
	f, err := ReadAgentFile("../../examples/agent.yaml")
	require.NoError(t, err)
	assert.Equal(t, "hv-a", f.Host)
	assert.Equal(t, "/etc/gitfleet/token", f.Repo.Auth.TokenFile)
	assert.Equal(t, "/var/lib/gitfleet", f.StateDir)

	c, fl := DefaultController(), NewFlags(pflag.NewFlagSet("controller", pflag.ContinueOnError))
	c.Bind(fl)
	known := controllerVariables(t)
	file, err := os.Open("../../examples/controller.env")
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
