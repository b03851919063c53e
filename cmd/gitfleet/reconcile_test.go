package main

import (
	"context"
	"os"
	"strconv"
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
