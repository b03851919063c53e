package main

import (
	"os"
	"path/filepath"
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
