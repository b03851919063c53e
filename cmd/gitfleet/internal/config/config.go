// Package config is the configuration of gitfleet's controller and agent:
// the flags, the environment variables that stand in for them, the agent's
// YAML file, their defaults, and the one place they are validated. It also
// turns a configuration into the components it configures (fleet.Config,
// an agent's store, backend, engine and agent.Config), so the commands and
// the demo wire them the same way.
//
// # Precedence
//
// For every setting: a flag given on the command line, else its environment
// variable when set and not empty, else the agent's config file, else the
// default. One exception: GITFLEET_TOKEN supplies the agent's token only
// when its file names none (repo.auth.token or repo.auth.tokenFile).
//
// # Settings
//
//	flag              environment              agent file                commands
//	--config          GITFLEET_CONFIG          (the file itself)         agent
//	--repo            GITFLEET_REPO            repo.url                  agent, controller, plan, status
//	--status-repo     GITFLEET_STATUS_REPO     statusRepo.url            agent, controller, status
//	--host            GITFLEET_HOST            host                      agent
//	--state-dir       GITFLEET_STATE_DIR       stateDir                  agent
//	--token           GITFLEET_TOKEN           repo.auth.token(File)     controller, plan, status; agent: variable and file
//	--ssh-key         GITFLEET_SSH_KEY         repo.auth.sshKeyFile      controller, plan, status; agent: file
//	--known-hosts     GITFLEET_KNOWN_HOSTS     repo.auth.knownHostsFile  controller, plan, status; agent: file
//	--branch          GITFLEET_BRANCH                                    controller
//	--path            GITFLEET_PATH                                      controller, plan
//	--cache-dir       GITFLEET_CACHE_DIR                                 controller
//	--interval        GITFLEET_INTERVAL                                  controller
//	--listen          GITFLEET_LISTEN                                    controller
//	--listen          GITFLEET_AGENT_LISTEN    listen                    agent
//	--webhook-secret  GITFLEET_WEBHOOK_SECRET                            controller
//	--abandon-grace   GITFLEET_ABANDON_GRACE                             controller
//	--offline-after   GITFLEET_OFFLINE_AFTER                             controller
//	--git-timeout     GITFLEET_GIT_TIMEOUT     gitTimeout                controller; agent: file
//	--dir             GITFLEET_DEMO_DIR                                  demo
//	--cache           GITFLEET_DEMO_CACHE                                demo
//	--accel           GITFLEET_ACCEL           qemu.accel                demo; agent: file
//
// The rest of the agent's file (see AgentFile) has no flag or variable.
//
// # Errors
//
// A malformed value is an error that names where it came from and what was
// wanted: a flag as pflag reports it (`invalid argument "5x" for
// "--git-timeout" flag: invalid duration, like 90s or 5m`), a variable as
// `GITFLEET_GIT_TIMEOUT="5x": invalid duration, like 90s or 5m (environment
// for --git-timeout)` (an *EnvError), a file's value as
// `FILE:LINE:COL: intervals.tick: "soon" is not a duration, like 90s or 5m`.
// Values are checked by kind: durations (Go durations, not negative),
// integers, booleans, repository URLs (as gitsource parses them), paths (no
// NUL byte, no unexpanded ~) and the enumerations and names each field
// documents. An error the command line or the environment caused wraps
// ErrUsage; one of the file, or of what it names, does not.
package config

import (
	"errors"
	"fmt"
	"os"
)

// Env reads one environment variable; "" means unset. OS reads the
// process's environment; tests pass a map's lookup instead.
type Env func(name string) string

// OS is the process's environment.
var OS Env = os.Getenv

// ErrUsage marks an error in what the command line or the environment gave
// (gitfleet exits 2 for it), as opposed to the config file or what it names.
var ErrUsage = errors.New("usage")

// EnvError is a malformed value in an environment variable.
type EnvError struct {
	// Var is the variable, Value its value, Flag the flag it stands in for
	// (without dashes; "" when it has none), Err what is wrong.
	Var, Value, Flag string
	Err              error
}

func (e *EnvError) Error() string {
	msg := fmt.Sprintf("%s=%q: %v", e.Var, e.Value, e.Err)
	if e.Flag != "" {
		msg += " (environment for --" + e.Flag + ")"
	}
	return msg
}

// Unwrap returns ErrUsage and the cause.
func (e *EnvError) Unwrap() []error { return []error{ErrUsage, e.Err} }

// usageError wraps err with ErrUsage.
func usageError(err error) error { return &usageErr{err} }

type usageErr struct{ err error }

func (e *usageErr) Error() string   { return e.err.Error() }
func (e *usageErr) Unwrap() []error { return []error{ErrUsage, e.err} }
