package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// SIGHUP reaches the running agent's or controller's pass trigger
// (Agent.ReconcileNow, Controller.Kick), as gitfleet reconcile sends it.
func TestReconcileSignalTriggersAPass(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	passes := make(chan struct{}, 1)
	onReconcileSignal(ctx, func() { passes <- struct{}{} })
	if err := syscall.Kill(os.Getpid(), reconcileSignal); err != nil {
		t.Fatal(err)
	}
	select {
	case <-passes:
	case <-time.After(time.Minute):
		t.Fatal("SIGHUP did not ask for a pass")
	}
}

// gitfleet reconcile --pid signals only a gitfleet agent or controller:
// SIGHUP ends most other programs.
func TestReconcileRefusesAnotherProcess(t *testing.T) {
	code, _ := runCLI(t, "reconcile", "agent", "--pid", strconv.Itoa(os.Getpid()))
	if code != 1 {
		t.Errorf("reconcile of the test binary: exit %d, want 1 (refused)", code)
	}
	for _, args := range [][]string{{"reconcile"}, {"reconcile", "web-01"}} {
		if code, _ := runCLI(t, args...); code != 2 {
			t.Errorf("gitfleet %v: exit %d, want 2", args, code)
		}
	}
}

// A usage error says what reconcile takes; a machine without systemd (a
// process started by hand) is told to give the process: --pid PID.
func TestReconcileSaysWhatToDo(t *testing.T) {
	code, _, out := runCLIStderr(t, "reconcile")
	if code != 2 || !strings.Contains(out, "usage: gitfleet reconcile agent|controller [--pid PID]), got none") {
		t.Errorf("gitfleet reconcile: exit %d:\n%s", code, out)
	}
	bin := t.TempDir()
	systemctl := "#!/bin/sh\necho \"System has not been booted with systemd as init system (PID 1). Can't operate.\" >&2\nexit 1\n"
	if err := os.WriteFile(filepath.Join(bin, "systemctl"), []byte(systemctl), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	code, _, out = runCLIStderr(t, "reconcile", "agent")
	if code != 1 || !strings.Contains(out, "(an agent not run by systemd: gitfleet reconcile agent --pid PID)") {
		t.Errorf("gitfleet reconcile agent without systemd: exit %d:\n%s", code, out)
	}
}
