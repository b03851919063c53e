package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/gitfleet/gitfleet/desired"
)

func newValidateCmd() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "validate [DIR]",
		Short: "Check a fleet directory: every object file, and the objects against each other",
		Long: `Validate loads every *.yaml / *.yml object file under DIR (default ".")
exactly as the controller would, and checks each object and the whole fleet.

Exit status: 0 when the fleet is valid (a one-line summary is printed),
1 when it is not (every error is printed as FILE:LINE:COL: message, paths
relative to the current directory) or could not be read, 2 for usage errors.
--format json prints one JSON document instead, for machines.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 1 {
				return &exitError{code: 2, err: fmt.Errorf("validate takes at most one directory, got %d arguments", len(args))}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := "."
			if len(args) == 1 {
				dir = args[0]
			}
			return runValidate(cmd.OutOrStdout(), dir, format)
		},
	}
	cmd.Flags().StringVar(&format, "format", "text", "output format: text or json")
	return cmd
}

// validateReport is the --format json output of validate.
type validateReport struct {
	Dir     string `json:"dir"`
	Valid   bool   `json:"valid"`
	Objects int    `json:"objects"`
	VMs     int    `json:"vms"`
	Volumes int    `json:"volumes"`
	Hosts   int    `json:"hosts"`
	// Profiles are counted in Objects too: they are object files, on no host.
	Profiles int              `json:"profiles"`
	Errors   []*desired.Error `json:"errors"`
	// Warnings flag what validates but deserves a reviewer's eye: file://
	// artifact URLs, which name paths on the host.
	Warnings []string `json:"warnings,omitempty"`
	// ReadError is set when the directory could not be read at all.
	ReadError string `json:"readError,omitempty"`
}

func runValidate(out io.Writer, dir, format string) error {
	if format != "text" && format != "json" {
		return &exitError{code: 2, err: fmt.Errorf("--format must be text or json, got %q", format)}
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return &exitError{code: 2, err: fmt.Errorf("%s is not a directory", dir)}
	}
	rep := validateReport{Dir: dir, Errors: []*desired.Error{}}
	// Name files as the user reached them (DIR/vms/a.yaml), in locations and
	// in messages alike.
	var tree desired.Tree = desired.DirTree(dir)
	prefix := filepath.ToSlash(filepath.Clean(dir))
	if prefix == "." {
		prefix = ""
	} else {
		tree = desired.PrefixTree(tree, prefix)
	}
	fleet, err := desired.NewLoader(prefix).Load(tree)
	var list desired.ErrorList
	switch {
	case err == nil:
		rep.Valid = true
		rep.VMs, rep.Volumes, rep.Hosts, rep.Profiles = len(fleet.VMs), len(fleet.Volumes), len(fleet.Hosts), len(fleet.Profiles)
		rep.Objects = rep.VMs + rep.Volumes + rep.Hosts + rep.Profiles
		rep.Warnings = append(fleet.FileURLWarnings(), fleet.CloudInitUserWarnings()...)
	case errors.As(err, &list):
		rep.Errors = list
	default:
		rep.ReadError = err.Error()
	}

	if format == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		for _, e := range rep.Errors {
			fmt.Fprintln(out, e)
		}
		for _, w := range rep.Warnings {
			fmt.Fprintln(out, "warning: "+w)
		}
		if rep.Valid {
			fmt.Fprintln(out, summary(rep))
		}
	}
	switch {
	case rep.ReadError != "":
		return &exitError{code: 1, err: fmt.Errorf("read %s: %s", dir, rep.ReadError)}
	case !rep.Valid:
		return &exitError{code: 1, err: fmt.Errorf("%s: %s", dir, plural(len(rep.Errors), "error", "errors"))}
	}
	return nil
}

// summary is the one line validate prints for a valid fleet, such as
// "12 objects: 8 VMs, 2 volumes, 2 hosts" (and ", 1 profile" when the
// fleet has profiles).
func summary(r validateReport) string {
	s := fmt.Sprintf("%s: %s, %s, %s", plural(r.Objects, "object", "objects"),
		plural(r.VMs, "VM", "VMs"), plural(r.Volumes, "volume", "volumes"), plural(r.Hosts, "host", "hosts"))
	if r.Profiles > 0 {
		s += ", " + plural(r.Profiles, "profile", "profiles")
	}
	return s
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
