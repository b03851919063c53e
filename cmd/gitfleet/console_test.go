package main

import (
	"bufio"
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gitfleet/gitfleet/internal/syncbuf"

	"github.com/gitfleet/gitfleet/agent/inmem"
	"github.com/gitfleet/gitfleet/agent/qemu"
)

// gitfleet console finds the VM's serial socket under the state directory
// and joins the terminal to it. QEMU's end is stood in for by a listener
// that answers each line (the real guest: agent/qemu's
// TestSerialConsoleAcrossRestarts).
func TestConsoleCommand(t *testing.T) {
	state := t.TempDir()
	dir := filepath.Join(state, "vms", "web-01")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(dir, qemu.SerialSocket))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			c.Write([]byte("guest says " + sc.Text() + "\n"))
		}
	}()

	out := &syncbuf.Buffer{}
	root := newRootCmd()
	root.SetOut(out)
	root.SetErr(&bytes.Buffer{})
	// The line, then Ctrl-] once the guest's answer arrived.
	root.SetIn(&answerThenEscape{line: "uptime\n", out: out, want: "guest says uptime"})
	if code := execute(root, []string{"console", "--state-dir", state, "web-01"}); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(out.String(), "guest says uptime") {
		t.Errorf("console printed %q, want the guest's answer", out.String())
	}

	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"console", "--state-dir", state, "../etc"}, 2},
		{[]string{"console", "--state-dir", state}, 2},
		{[]string{"console", "--state-dir", state, "db-01"}, 1},
	} {
		if code, _ := runCLI(t, tc.args...); code != tc.code {
			t.Errorf("gitfleet %v: exit %d, want %d", tc.args, code, tc.code)
		}
	}
}

// answerThenEscape reads as line, then, once out holds want, as Ctrl-].
type answerThenEscape struct {
	line string
	out  *syncbuf.Buffer
	want string
	sent bool
}

func (a *answerThenEscape) Read(p []byte) (int, error) {
	if !a.sent {
		a.sent = true
		return copy(p, a.line), nil
	}
	for !strings.Contains(a.out.String(), a.want) {
		time.Sleep(10 * time.Millisecond)
	}
	p[0] = qemu.ConsoleEscape
	return 1, nil
}

// The memory backend runs no guest: console says so instead of asking
// whether the VM runs.
func TestConsoleOnTheMemoryBackend(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "vms", "web-01"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, inmem.StateFile), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCLIStderr(t, "console", "web-01", "--state-dir", root)
	if code != 1 || !strings.Contains(errOut, "run by the memory backend") || !strings.Contains(errOut, "no console to attach to") {
		t.Errorf("exit %d:\n%s", code, errOut)
	}
}
