package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/status"
)

func init() {
	var (
		repo         repoFlags
		branch, form string
	)
	cmd := &cobra.Command{
		Use:   "status --repo URL",
		Short: "Show the fleet as the hosts report it on the status branch",
		Long: `Status reads every host's status file on the status branch and prints the
hosts (heartbeat, accelerator, last accepted epoch, fence violation, last
report by the agent's clock) and their VMs (phase, power, address, error).
--format json prints the status files themselves.

Exit status: 0, or 1 when the status branch cannot be read (a repository
without one has no statuses yet and prints none), 2 for usage errors.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := repo.check(); err != nil {
				return err
			}
			if form != "table" && form != "json" {
				return &exitError{code: 2, err: fmt.Errorf("--format must be table or json, got %q", form)}
			}
			return runStatus(cmd.Context(), cmd.OutOrStdout(), repo, branch, form)
		},
	}
	repo.add(cmd)
	cmd.Flags().StringVar(&branch, "status-branch", fleet.DefaultStatusBranch, "branch the agents report on")
	cmd.Flags().StringVar(&form, "format", "table", "output format: table or json")
	rootCmd.AddCommand(cmd)
}

// statusReport is the --format json output: every host's status, and the
// hosts whose file could not be read with why.
type statusReport struct {
	Commit     string            `json:"commit"`
	Hosts      []*status.Status  `json:"hosts"`
	Unreadable map[string]string `json:"unreadable,omitempty"`
}

func runStatus(ctx context.Context, out io.Writer, rf repoFlags, branch, format string) error {
	if ctx == nil {
		ctx = context.Background()
	}
	repo, err := gitsource.Open(ctx, gitsource.Options{URL: rf.url, Auth: rf.auth(), Depth: 1})
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	rep := statusReport{Hosts: []*status.Status{}}
	tip, err := repo.Fetch(ctx, branch)
	switch {
	case errors.Is(err, gitsource.ErrBranchNotFound):
	case err != nil:
		return &exitError{code: 1, err: err}
	default:
		rep.Commit = tip
		tree, err := repo.Tree(tip, "")
		if err != nil {
			return &exitError{code: 1, err: err}
		}
		reports, err := status.NewReader().ReadAll(tree)
		if err != nil {
			return &exitError{code: 1, err: err}
		}
		for _, r := range reports {
			if r.Err != nil {
				if rep.Unreadable == nil {
					rep.Unreadable = map[string]string{}
				}
				rep.Unreadable[r.Host] = r.Err.Error()
				continue
			}
			rep.Hosts = append(rep.Hosts, r.Status)
		}
	}
	if format == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return writeStatusTable(out, rep)
}

func writeStatusTable(out io.Writer, rep statusReport) error {
	if len(rep.Hosts) == 0 && len(rep.Unreadable) == 0 {
		_, err := fmt.Fprintln(out, "No host has reported yet.")
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tHEARTBEAT\tEPOCH\tACCEL\tVMS\tREPORTED\tNOTE")
	for _, st := range rep.Hosts {
		note := st.SnapshotError
		if st.FenceViolation {
			note = "fence violation " + note
		}
		reported := "-"
		if !st.ObservedAt.IsZero() {
			reported = st.ObservedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%s\t%s\n", st.Host, st.Heartbeat, st.LastSeenEpoch, dash(st.Agent.Accel), len(st.VMs), reported, dash(note))
	}
	bad := make([]string, 0, len(rep.Unreadable))
	for h := range rep.Unreadable {
		bad = append(bad, h)
	}
	sort.Strings(bad)
	for _, h := range bad {
		fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\tunreadable: %s\n", h, rep.Unreadable[h])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	n := 0
	for _, st := range rep.Hosts {
		n += len(st.VMs)
	}
	if n == 0 {
		return nil
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VM\tHOST\tPHASE\tPOWER\tADDRESS\tERROR")
	for _, st := range rep.Hosts {
		for _, vm := range st.VMs {
			addr := vm.IP
			if vm.SSH != "" {
				if addr != "" {
					addr += " "
				}
				addr += "ssh " + vm.SSH
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", vm.Name, st.Host, vm.Phase, dash(vm.Power), dash(addr), dash(vm.LastError))
		}
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
