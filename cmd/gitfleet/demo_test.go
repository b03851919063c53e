package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/gitfleet/gitfleet/cmd/gitfleet/internal/demo"
)

// TestDemoWithoutQEMU pins that the demo stops before making anything when
// QEMU is missing, with exit code 1.
func TestDemoWithoutQEMU(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	dir := filepath.Join(t.TempDir(), "demo")
	code, _ := runCLI(t, "demo", "--dir", dir)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if _, err := os.Stat(filepath.Join(dir, "fleet.git")); !os.IsNotExist(err) {
		t.Fatalf("the demo made its repository without QEMU: %v", err)
	}
}

func TestDemoRejectsArguments(t *testing.T) {
	if code, _ := runCLI(t, "demo", "extra"); code != 2 {
		t.Fatalf("exit %d for an argument, want 2 (usage)", code)
	}
}

// TestDemoHelpNamesTheCacheLookup pins that --help states where the tiny
// guest's cache really is: its own, or the test suite's when only that
// holds a downloaded kernel (demo.DefaultCacheDir), and where the kernel
// comes from.
func TestDemoHelpNamesTheCacheLookup(t *testing.T) {
	code, out := runCLI(t, "demo", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	out = strings.Join(strings.Fields(out), " ")
	for _, want := range []string{
		"$XDG_CACHE_HOME/gitfleet/tinyguest (~/.cache/gitfleet/tinyguest)",
		"the test suite's cache ($XDG_CACHE_HOME/gitfleet-test/tinyguest) does, the demo uses that one",
		"/boot/vmlinuz-*",
		"apt-get download",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("demo --help does not say %q:\n%s", want, out)
		}
	}
}

// The demo's variables set its directory, cache and accelerator; a flag
// wins over its variable.
func TestDemoEnvironment(t *testing.T) {
	for _, tc := range []struct {
		env, flag, value string
		get              func(*demo.Config) string
	}{
		{"GITFLEET_DEMO_DIR", "dir", "/srv/demo", func(c *demo.Config) string { return c.Dir }},
		{"GITFLEET_DEMO_CACHE", "cache", "/srv/cache", func(c *demo.Config) string { return c.CacheDir }},
		{"GITFLEET_ACCEL", "accel", "tcg", func(c *demo.Config) string { return c.Accel }},
	} {
		t.Run(tc.env, func(t *testing.T) {
			for _, args := range [][]string{nil, {"--" + tc.flag, tc.value}} {
				cfg := demo.Config{Accel: "auto"}
				fs := pflag.NewFlagSet("demo", pflag.ContinueOnError)
				flags := demoFlags(fs, &cfg)
				if err := fs.Parse(args); err != nil {
					t.Fatal(err)
				}
				env := map[string]string{tc.env: tc.value}
				if args != nil {
					env[tc.env] = "/overridden"
				}
				if err := flags.FromEnv(func(name string) string { return env[name] }); err != nil {
					t.Fatal(err)
				}
				if got := tc.get(&cfg); got != tc.value {
					t.Errorf("%v with %v: %q, want %q", args, env, got, tc.value)
				}
			}
		})
	}
	for env, want := range map[string]string{
		"GITFLEET_DEMO_DIR": `GITFLEET_DEMO_DIR="~/demo": invalid path`,
		"GITFLEET_ACCEL":    `GITFLEET_ACCEL="~/demo": "~/demo": want auto or kvm or tcg (environment for --accel)`,
	} {
		t.Run("malformed "+env, func(t *testing.T) {
			t.Setenv(env, "~/demo")
			code, _, stderr := runCLIStderr(t, "demo")
			if code != 2 || !strings.Contains(stderr, want) {
				t.Fatalf("exit %d, stderr %q; want 2 saying %q", code, stderr, want)
			}
		})
	}
}
