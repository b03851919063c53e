package config

import (
	"testing"

	"github.com/spf13/pflag"
)

// gitfleet console finds the agent's state directory as the agent does:
// the flag, else GITFLEET_STATE_DIR, else the file's stateDir, else the
// default.
func TestStateDirFlags(t *testing.T) {
	file := writeFile(t, "agent.yaml", "repo: {url: /r.git}\nhost: hv-a\nstateDir: /file-state\n")
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"default", nil, nil, "/var/lib/gitfleet"},
		{"the file's", []string{"--config", file}, nil, "/file-state"},
		{"the variable over the file", []string{"--config", file}, map[string]string{"GITFLEET_STATE_DIR": "/env-state"}, "/env-state"},
		{"the flag over all", []string{"--config", file, "--state-dir", "/flag-state"}, map[string]string{"GITFLEET_STATE_DIR": "/env-state"}, "/flag-state"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("console", pflag.ContinueOnError)
			s := BindStateDir(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			got, err := s.Load(mapEnv(tc.env))
			if err != nil || got != tc.want {
				t.Errorf("state dir = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	fs := pflag.NewFlagSet("console", pflag.ContinueOnError)
	s := BindStateDir(fs)
	if err := fs.Parse([]string{"--config", writeFile(t, "bad.yaml", "stateDir: ~/x\n")}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(mapEnv(nil)); err == nil {
		t.Error("a bad stateDir in the file was accepted")
	}
}
