// Command gitfleet runs virtual machines on a fleet of hosts from YAML files
// in a git repository. Each subcommand lives in its own file and registers
// itself with rootCmd from an init function; main only runs it and maps
// errors to exit codes.
package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/gitfleet/gitfleet/internal/redact"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

var rootCmd = &cobra.Command{
	Use:           "gitfleet",
	Short:         "Run VMs on your own hosts from a git repository",
	SilenceUsage:  true,
	SilenceErrors: true,
}

// exitError carries a specific exit code out of a subcommand: 1 for a
// rejected input (validation errors), 2 for usage errors.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func init() {
	rootCmd.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the gitfleet version",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), version) },
	})
	rootCmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &exitError{code: 2, err: err}
	})
}

func main() {
	// Clones, caches and state hold secrets (cloud-init user-data, the
	// remote's URL): nothing gitfleet creates is readable by others.
	syscall.Umask(0o077)
	os.Exit(run(os.Args[1:]))
}

// run executes the command line args and returns the process exit code.
func run(args []string) int {
	rootCmd.SetArgs(args)
	err := rootCmd.Execute()
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil && ee.err.Error() != "" {
			fmt.Fprintln(os.Stderr, "gitfleet:", redact.Text(ee.err.Error()))
		}
		return ee.code
	}
	fmt.Fprintln(os.Stderr, "gitfleet:", redact.Text(err.Error()))
	if strings.HasPrefix(err.Error(), "unknown command ") {
		// cobra reports a mistyped subcommand as a plain error; it is a
		// usage error like any other.
		return 2
	}
	return 1
}
