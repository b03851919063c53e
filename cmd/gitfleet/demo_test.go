package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
