// Command gitfleet runs virtual machines on a fleet of hosts from YAML files
// in a git repository. Each subcommand lives in its own file as a
// constructor (newAgentCmd, ...) that newRootCmd calls; the configuration
// they read (flags, environment, the agent's file) is package
// internal/config's. main only runs the root and maps errors to exit codes.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/spf13/cobra"

	"github.com/gitfleet/gitfleet/cmd/gitfleet/internal/config"
	"github.com/gitfleet/gitfleet/internal/redact"
)

// version is set at build time by the Makefile and scripts/release.sh
// with -ldflags "-X main.version=..."; commit only by a packager building
// outside git ("-X main.commit=..."). Without them buildVersion reads what
// the Go toolchain recorded (the module version of go install …@vX.Y.Z,
// the vcs.revision and vcs.modified of a build in a git checkout).
var (
	version = "dev"
	commit  = ""
)

// buildVersion returns the version and commit to report: the -ldflags
// values when set, else the module version and the VCS revision (with
// "-dirty" when vcs.modified) from bi, else "dev" and "unknown".
func buildVersion(version, commit string, bi *debug.BuildInfo) (string, string) {
	if bi != nil {
		if version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			version = bi.Main.Version
		}
		if commit == "" {
			var dirty bool
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					commit = s.Value
				case "vcs.modified":
					dirty = s.Value == "true"
				}
			}
			if commit != "" && dirty {
				commit += "-dirty"
			}
		}
	}
	if commit == "" {
		commit = "unknown"
	}
	return version, commit
}

// versions is buildVersion of this binary.
func versions() (string, string) {
	bi, _ := debug.ReadBuildInfo()
	return buildVersion(version, commit, bi)
}

// exitError carries a specific exit code out of a subcommand: 1 for a
// rejected input (validation errors), 2 for usage errors.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageOr returns err as a usage error (exit 2) when it wraps
// config.ErrUsage, else as a rejected input (exit 1).
func usageOr(err error) error {
	if errors.Is(err, config.ErrUsage) {
		return &exitError{code: 2, err: err}
	}
	return &exitError{code: 1, err: err}
}

// noArgs refuses arguments as a usage error naming the command.
func noArgs(name string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) > 0 {
			return &exitError{code: 2, err: fmt.Errorf("%s takes no arguments, got %q", name, args)}
		}
		return nil
	}
}

// newRootCmd builds the command tree afresh: no state is shared between two
// roots.
func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "gitfleet",
		Short:         "Run VMs on your own hosts from a git repository",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newVersionCmd(), newAgentCmd(), newControllerCmd(), newPlanCmd(),
		newStatusCmd(), newValidateCmd(), newSchemaCmd(), newDemoCmd(), newConsoleCmd(), newReconcileCmd(),
		newEncryptCmd(), newAgeKeygenCmd(), newKeygenCmd(), newShowCmd(), newImportCmd())
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &exitError{code: 2, err: err}
	})
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the gitfleet version and the commit it was built from",
		Long: `Version prints "gitfleet VERSION (commit COMMIT)": the release version and
git commit make build stamps in, else what the Go toolchain recorded (the
module version of go install, the checkout's revision, "-dirty" when it had
changes), else "dev" and "unknown".`,
		Args: cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			v, c := versions()
			fmt.Fprintf(cmd.OutOrStdout(), "gitfleet %s (commit %s)\n", v, c)
		},
	}
}

func main() {
	// Clones, caches and state hold secrets (cloud-init user-data, the
	// remote's URL): nothing gitfleet creates is readable by others.
	syscall.Umask(0o077)
	os.Exit(run(os.Args[1:]))
}

// run executes the command line args and returns the process exit code.
func run(args []string) int { return execute(newRootCmd(), args) }

// execute runs root with args, prints its error, if any, on standard error
// and returns the exit code.
func execute(root *cobra.Command, args []string) int {
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil && ee.err.Error() != "" {
			fmt.Fprintln(os.Stderr, "gitfleet:", strings.TrimRight(redact.Text(ee.err.Error()), "\n")+credentialHint(ee.err))
		}
		return ee.code
	}
	fmt.Fprintln(os.Stderr, "gitfleet:", strings.TrimRight(redact.Text(err.Error()), "\n")+credentialHint(err))
	if strings.HasPrefix(err.Error(), "unknown command ") {
		// cobra reports a mistyped subcommand as a plain error; it is a
		// usage error like any other.
		return 2
	}
	return 1
}

// credentialHint is what to do about a remote that refused gitfleet's
// credentials or asked for some it was not given ("" for any other
// error): the error itself is go-git's ("authentication required: 401",
// "SSH agent requested but SSH_AUTH_SOCK not-specified").
func credentialHint(err error) string {
	switch {
	case errors.Is(err, transport.ErrAuthenticationRequired), errors.Is(err, transport.ErrAuthorizationFailed):
		return " (the remote wants credentials it accepts: over HTTPS a token that can read the repository, and write it for the controller and the agents, in GITFLEET_TOKEN or the agent's repo.auth.tokenFile; over ssh:// a key, --ssh-key or repo.auth.sshKeyFile)"
	case strings.Contains(err.Error(), "SSH_AUTH_SOCK"):
		return " (an ssh remote needs a key: --ssh-key FILE or GITFLEET_SSH_KEY, or repo.auth.sshKeyFile in agent.yaml, with a known_hosts file: --known-hosts or repo.auth.knownHostsFile)"
	}
	return ""
}
