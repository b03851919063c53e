package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// reconcileSignal is the signal that makes a running agent or controller
// run a pass at once; the shipped units send it on systemctl reload.
const reconcileSignal = syscall.SIGHUP

// onReconcileSignal calls now on every reconcileSignal until ctx ends.
func onReconcileSignal(ctx context.Context, now func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, reconcileSignal)
	go func() {
		defer signal.Stop(ch)
		for {
			select {
			case <-ctx.Done():
				return
			case <-ch:
				now()
			}
		}
	}()
}

func newReconcileCmd() *cobra.Command {
	var pid int
	cmd := &cobra.Command{
		Use:   "reconcile agent|controller [--pid PID]",
		Short: "Make the running agent or controller on this machine run a pass now",
		Long: `Reconcile sends SIGHUP to the running gitfleet agent or controller, which
then runs a pass at once: the agent fetches its snapshot, ticks on it and
writes its status; the controller reads the desired branch and publishes.
Without --pid it asks systemd (systemctl reload gitfleet-agent or
gitfleet-controller: the shipped units send SIGHUP to the main process);
with --pid it signals that process after checking /proc/PID/cmdline is
gitfleet's agent or controller. A suspended host's pass still acts on
nothing.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 || (args[0] != "agent" && args[0] != "controller") {
				return &exitError{code: 2, err: fmt.Errorf("reconcile takes one argument, agent or controller (usage: gitfleet reconcile agent|controller [--pid PID]), got %s", describeArgs(args))}
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&pid, "pid", 0, "the process to signal, instead of the systemd unit")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		which := args[0]
		if pid == 0 {
			unit := "gitfleet-" + which + ".service"
			out, err := exec.CommandContext(cmd.Context(), "systemctl", "reload", unit).CombinedOutput()
			if err != nil {
				article := "a"
				if which == "agent" {
					article = "an"
				}
				return fmt.Errorf("systemctl reload %s: %v: %s (%s %s not run by systemd: gitfleet reconcile %s --pid PID)",
					unit, err, strings.TrimSpace(string(out)), article, which, which)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "asked %s for a pass\n", unit)
			return nil
		}
		if err := checkGitfleetProcess(pid, which); err != nil {
			return err
		}
		if err := syscall.Kill(pid, reconcileSignal); err != nil {
			return fmt.Errorf("signal pid %d: %w", pid, err)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "asked gitfleet %s (pid %d) for a pass\n", which, pid)
		return nil
	}
	return cmd
}

// describeArgs names the arguments given, for a usage error: "none", or
// each quoted.
func describeArgs(args []string) string {
	if len(args) == 0 {
		return "none"
	}
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = strconv.Quote(a)
	}
	return strings.Join(q, " ")
}

// checkGitfleetProcess refuses to signal pid unless its command line is
// "gitfleet <which> ...": SIGHUP ends most other programs.
func checkGitfleetProcess(pid int, which string) error {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return fmt.Errorf("pid %d: %w", pid, err)
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if len(args) < 2 || !strings.HasPrefix(filepath.Base(args[0]), "gitfleet") || args[1] != which {
		return fmt.Errorf("pid %d is not a gitfleet %s (its command line is %q); not signalled", pid, which, strings.Join(args, " "))
	}
	return nil
}
