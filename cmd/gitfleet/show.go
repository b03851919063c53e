package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/gitfleet/gitfleet/desired"
)

// showArgs are show's settings: the checkout, the objects' directory in
// it and the output format.
type showArgs struct {
	repo, path, format string
}

func newShowCmd() *cobra.Command {
	a := showArgs{repo: ".", format: "text"}
	cmd := &cobra.Command{
		Use:   "show VM",
		Short: "Print a VM's effective spec, each field with the file and line it came from",
		Long: `Show loads the fleet in the checkout --repo (default ".", objects under
--path) as validate does and prints the effective spec of VM: for a VM that
names a profile, the profile's fields with the VM's own written over them,
as the controller publishes it. Each field is shown with the FILE:LINE:COL
of the value that won (the VM's file or the profile's), or "(default)".
Secret fields (cloudInit) show only that they are set.

Exit status: 0 when shown, 1 when the fleet does not validate (its errors
are printed), has no such VM, or could not be read, 2 for usage errors.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return &exitError{code: 2, err: fmt.Errorf("show takes one VM name, got %d arguments", len(args))}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runShow(cmd.OutOrStdout(), a, args[0])
		},
	}
	cmd.Flags().StringVar(&a.repo, "repo", a.repo, "the fleet's checkout (a directory)")
	cmd.Flags().StringVar(&a.path, "path", a.path, "directory of the objects in the checkout")
	cmd.Flags().StringVar(&a.format, "format", a.format, "output format: text or json")
	return cmd
}

func runShow(out io.Writer, a showArgs, vm string) error {
	if a.format != "text" && a.format != "json" {
		return &exitError{code: 2, err: fmt.Errorf("--format must be text or json, got %q", a.format)}
	}
	if st, err := os.Stat(a.repo); err != nil || !st.IsDir() {
		return &exitError{code: 2, err: fmt.Errorf("--repo %s is not a directory", a.repo)}
	}
	// Name files as the user reached them (REPO/vms/a.yaml), as validate does.
	var tree desired.Tree = desired.DirTree(a.repo)
	prefix := filepath.ToSlash(filepath.Clean(a.repo))
	if prefix == "." {
		prefix = ""
	} else {
		tree = desired.PrefixTree(tree, prefix)
	}
	ex, err := desired.ExplainVM(tree, path.Join(prefix, filepath.ToSlash(a.path)), vm)
	var list desired.ErrorList
	switch {
	case errors.As(err, &list):
		for _, e := range list {
			fmt.Fprintln(out, e)
		}
		return &exitError{code: 1, err: fmt.Errorf("%s: %s; the fleet does not validate", a.repo, plural(len(list), "error", "errors"))}
	case err != nil:
		return &exitError{code: 1, err: err}
	}
	if a.format == "json" {
		data, err := ex.JSON()
		if err != nil {
			return err
		}
		_, err = out.Write(data)
		return err
	}
	_, err = io.WriteString(out, ex.Text())
	return err
}
