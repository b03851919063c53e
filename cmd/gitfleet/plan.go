package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
)

func init() {
	var (
		repo                   repoFlags
		base, head, path, form string
		snapshotsBranch        string
	)
	cmd := &cobra.Command{
		Use:   "plan --repo R --base REV --head REV",
		Short: "Show what merging head over base would do, host by host",
		Long: `Plan loads the desired state at --base and at --head and prints, per host, the creates, updates (field by field),
deletes, un-deletes (a pending delete the head brings back), host moves
(destroy and create) and volume deletes (data loss). Secret fields show only
that they changed. --format markdown is a pull-request comment.

A revision is a branch name or a commit hash (full or at least 4 hex
digits) on any repository; when --repo is a local repository (a path or
file:// URL naming its top directory) it is any git revision expression
there too: HEAD, HEAD~1, main~1, origin/main, a tag.

Exit status follows head alone: 0 when head is valid, 1 when head has
validation errors (they are printed; the controller would reject it) or git
failed, 2 for usage errors. A base that does not validate (a pull request
fixing a broken main) still gets a plan: it is computed against the last
commit the controller applied (applied.commit of ledger.yaml on the
snapshots branch; in a clone that has the snapshots branch only as
origin/<branch>, as a CI checkout does, that copy), the state the fleet
actually runs, or, when there is
none or it does not validate either, against an empty base; a warning at
the top of the plan says which.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := repo.check(); err != nil {
				return err
			}
			if base == "" || head == "" {
				return &exitError{code: 2, err: errors.New("--base and --head are required")}
			}
			if form != "text" && form != "markdown" && form != "json" {
				return &exitError{code: 2, err: fmt.Errorf("--format must be text, markdown or json, got %q", form)}
			}
			return runPlan(cmd.Context(), cmd.OutOrStdout(), repo, base, head, path, form, snapshotsBranch)
		},
	}
	repo.add(cmd)
	cmd.Flags().StringVar(&base, "base", "", "revision the change starts from: a branch or commit hash; in a local repository also HEAD~1, origin/main, a tag")
	cmd.Flags().StringVar(&head, "head", "", "revision of the change: a branch or commit hash; in a local repository also HEAD, main~1, a tag")
	cmd.Flags().StringVar(&path, "path", envOr("GITFLEET_PATH", ""), "directory of the objects in the repository ($GITFLEET_PATH)")
	cmd.Flags().StringVar(&form, "format", "text", "output format: text, markdown or json")
	cmd.Flags().StringVar(&snapshotsBranch, "snapshots-branch", snapshots.Branch, "branch the controller publishes snapshots and its ledger on")
	rootCmd.AddCommand(cmd)
}

func runPlan(ctx context.Context, out io.Writer, rf repoFlags, baseRev, headRev, path, format, snapshotsBranch string) error {
	repo, done, err := openScratch(ctx, gitsource.Options{URL: rf.url, Auth: rf.auth()})
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	defer done()
	load := func(rev string) (string, *desired.Fleet, error) {
		commit, err := repo.ResolveExpr(ctx, rev)
		if err != nil {
			return "", nil, err
		}
		tree, err := repo.Tree(commit, "")
		if err != nil {
			return commit, nil, err
		}
		f, err := desired.NewLoader(path).Load(tree)
		return commit, f, err
	}
	ledger, warnings := planLedger(ctx, repo, snapshotsBranch)
	baseCommit, baseFleet, err := load(baseRev)
	var baseList desired.ErrorList
	if errors.As(err, &baseList) {
		// The base does not validate: plan against the state the fleet
		// runs, else against nothing, and say so at the top.
		what := fmt.Sprintf("base %s does not validate (%s)", baseRev, plural(len(baseList), "error", "errors"))
		if applied := appliedCommit(ledger); applied != "" {
			if _, f, aerr := load(applied); aerr == nil {
				baseFleet = f
				warnings = append(warnings, fmt.Sprintf("%s; planned against %s, the last commit the controller applied", what, desired.Hash(applied).Short()))
			}
		}
		if baseFleet == nil {
			warnings = append(warnings, what+"; planned against an empty base: every object of head shows as a create")
		}
	} else if err != nil {
		return &exitError{code: 1, err: fmt.Errorf("--base: %w", err)}
	}
	headCommit, headFleet, headErr := load(headRev)
	var list desired.ErrorList
	if headErr != nil && !errors.As(headErr, &list) {
		return &exitError{code: 1, err: fmt.Errorf("--head: %w", headErr)}
	}
	var p *desired.Plan
	if headErr == nil {
		p = desired.ComputePlan(baseFleet, headFleet, desired.PlanOptions{Pending: pendingDeletes(ledger)})
		warnings = append(warnings, headFleet.FileURLWarnings()...)
	} else {
		p = &desired.Plan{Hosts: []desired.HostPlan{}}
		for _, e := range list {
			p.Errors = append(p.Errors, e.Error())
		}
	}
	p.Base, p.Head = label(baseRev, baseCommit), label(headRev, headCommit)
	p.Warnings = warnings
	switch format {
	case "markdown":
		_, err = io.WriteString(out, p.Markdown())
	case "json":
		var data []byte
		if data, err = p.JSON(); err == nil {
			_, err = out.Write(data)
		}
	default:
		_, err = io.WriteString(out, p.Text())
	}
	if err != nil {
		return err
	}
	if len(p.Errors) > 0 {
		return &exitError{code: 1, err: fmt.Errorf("head %s: %s", headRev, plural(len(p.Errors), "validation error", "validation errors"))}
	}
	return nil
}

// planLedger reads the controller's ledger (the applied commit and the
// pending deletes) from the snapshots branch: on the remote, or in a local
// clone from its remote-tracking copy (origin/<branch>), which is all a CI
// checkout has. No branch yet plans against the base alone, silently: no
// controller has run. A ledger that exists but cannot be read gives an
// empty one and a warning, since un-deletes then show as creates and a
// broken base cannot fall back to the applied commit.
func planLedger(ctx context.Context, repo *gitsource.Repo, branch string) (*snapshots.Ledger, []string) {
	tip, _, err := repo.ResolveTracking(ctx, branch)
	if errors.Is(err, gitsource.ErrBranchNotFound) {
		return snapshots.NewLedger(), nil
	}
	var l *snapshots.Ledger
	if err == nil {
		l, err = snapshots.LedgerAt(func(p string) ([]byte, error) { return repo.ReadFileMax(tip, p, fleet.MaxLedgerBytes) })
	}
	if err != nil {
		return snapshots.NewLedger(), []string{fmt.Sprintf("the controller's ledger on %s cannot be read (%v): planned without it, so pending deletes show as creates and a broken base has no applied commit to fall back to", branch, err)}
	}
	return l, nil
}

// label names a revision for a person: the name given, and the commit when
// the name was not already the full hash.
func label(rev, commit string) string {
	if rev == commit || commit == "" {
		return commit
	}
	return rev + " (" + desired.Hash(commit).Short() + ")"
}

// appliedCommit is the last desired-state commit the controller applied
// (applied.commit of ledger.yaml); "" when there is none.
func appliedCommit(l *snapshots.Ledger) string {
	if l.Applied == nil {
		return ""
	}
	return string(l.Applied.Commit)
}

// pendingDeletes lists the tombstones the controller published (the
// ledger's, the same the host snapshots carry), so the plan tells an
// un-delete from a create.
func pendingDeletes(l *snapshots.Ledger) []desired.ObjectRef {
	var refs []desired.ObjectRef
	for _, t := range l.Tombstones {
		refs = append(refs, desired.ObjectRef{Kind: t.Kind, Name: t.Name, Host: t.Host})
	}
	return refs
}
