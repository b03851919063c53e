package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/gitfleet/gitfleet/agent"
	"github.com/gitfleet/gitfleet/agent/inmem"
	"github.com/gitfleet/gitfleet/agent/qemu"
	"github.com/gitfleet/gitfleet/cmd/gitfleet/internal/config"
)

func newConsoleCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "console VM",
		Short: "Attach to a running VM's serial console on this host",
		Long: `Console connects the terminal to the first serial port of VM, a guest
the agent on this host runs with QEMU (the socket vms/VM/serial.sock in the
agent's state directory: --state-dir, or stateDir of the agent's --config;
run it as the agent's user, root). Ctrl-] detaches; so does the end of
standard input. One console at a time: a second one is refused, naming the
pid attached. The guest's output goes on to vms/VM/serial.log whether or not
a console is attached.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return &exitError{code: 2, err: fmt.Errorf("console takes one VM name, got %q", args)}
			}
			return nil
		},
	}
	flags := config.BindStateDir(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		root, err := flags.Load(config.OS)
		if err != nil {
			return usageOr(err)
		}
		dir, err := agent.VMDirIn(root, args[0])
		if err != nil {
			return &exitError{code: 2, err: err}
		}
		if _, err := os.Stat(dir); err != nil {
			return fmt.Errorf("console: no VM %s on this host (%s): %w", args[0], root, err)
		}
		if _, err := os.Stat(filepath.Join(root, inmem.StateFile)); err == nil {
			return fmt.Errorf("console: %s is run by the memory backend (%s), which runs no guest: there is no console to attach to", args[0], filepath.Join(root, inmem.StateFile))
		}
		ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM)
		defer stop()
		in := cmd.InOrStdin()
		if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			// Raw: every key, ^C included, goes to the guest; Ctrl-] is
			// the way out.
			old, err := term.MakeRaw(int(f.Fd()))
			if err != nil {
				return fmt.Errorf("console: %w", err)
			}
			defer term.Restore(int(f.Fd()), old)
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "console of %s; Ctrl-] detaches\r\n", args[0])
		return qemu.AttachConsole(ctx, dir, in, cmd.OutOrStdout())
	}
	return cmd
}
