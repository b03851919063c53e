// Package cloudinittest runs Python under the interpreter of the installed
// cloud-init, so tests can compare gitfleet's reading of user-data and seeds
// with cloud-init's own loader and renderers. It is imported by tests only.
package cloudinittest

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Python returns the interpreter named on the #! line of the cloud-init
// script on PATH, the one that can import its modules. The test skips when
// cloud-init is not installed (scripts/install-deps.sh installs it) and
// fails when the script has no #! line.
func Python(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("cloud-init")
	if err != nil {
		t.Skip("cloud-init not installed (scripts/install-deps.sh installs it)")
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(strings.TrimPrefix(line, "#!"))
	if !strings.HasPrefix(line, "#!") || len(fields) == 0 {
		t.Fatalf("%s has no #! line naming its python", bin)
	}
	return fields[0]
}

// Run runs script under Python(t) with input encoded as JSON on its
// standard input and returns what it wrote to standard output. A script
// that fails fails the test with its standard error.
func Run(t testing.TB, script string, input any) []byte {
	t.Helper()
	in, err := json.Marshal(input)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(Python(t), "-c", script)
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("cloud-init's python: %v: %s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	return out
}
