package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gitfleet/gitfleet/cmd/gitfleet/internal/config"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/trust"
)

// planArgs are plan's settings: the repository, the two revisions, the
// objects' directory, the output format and the snapshots branch whose
// ledger says what the fleet runs.
type planArgs struct {
	repo                   config.Repo
	base, head, path, form string
	snapshotsBranch        string
	// sigs and maxDeletes are the controller's guards, to say whether it
	// would reject the head.
	sigs       config.Signatures
	maxDeletes int
	// controllerKeys is the allowed-signers file of the controller's
	// public keys ("": the ledger at the tip is read unverified).
	controllerKeys string
}

// planLong is the help text of gitfleet plan.
const planLong = `Plan loads the desired state at --base and at --head and prints, per host, the creates, updates (field by field),
deletes, un-deletes (a pending delete the head brings back), host moves
(destroy and create) and volume deletes (data loss). Secret fields show only
that they changed. --format markdown is a pull-request comment.

A revision is a branch name or a commit hash (full or at least 4 hex
digits) on any repository; when --repo is a local repository (a path or
file:// URL naming its top directory) it is any git revision expression
there too: HEAD, HEAD~1, main~1, origin/main, a tag. For the first commit
of a repository, --base ` + nullCommit + ` (git's null id, which
GitHub gives as the commit before a first push) or the empty tree
` + emptyTree + ` plans against an empty fleet: every object is a
create.

A name defined twice in head is reported at the file the change added
(relative to the commit the controller applied, else to the base).

Exit status follows head alone: 0 when head is valid, 1 when head has
validation errors (they are printed; the controller would reject it) or git
failed, 2 for usage errors. A base that does not validate (a pull request
fixing a broken main) still gets a plan: it is computed against the last
commit the controller applied (applied.commit of ledger.yaml on the
snapshots branch; in a clone that has the snapshots branch only as
origin/<branch>, as a CI checkout does, that copy), the state the fleet
actually runs, or, when there is
none or it does not validate either, against an empty base; a warning at
the top of the plan says which.

Given the controller's guard settings (--verify-signatures with
--allowed-signers or --openpgp-keyring, --max-deletes; the same variables
as the controller's), plan lists under "Controller guards" what would make
the controller reject the head as it stands: a commit whose signature is
refused (base..head, first parents), or more deletes than the mass-delete
guard allows, with the trailer "Gitfleet-Allow-Deletes: <n>" that lets
them through. Guards do not change the exit status: a pull request's own
commits are not what lands when it is merged through a signed web merge.

Anyone who can push the snapshots branch can write a ledger there. With
--controller-keys (the allowed-signers file of the controller's public
keys, its own included: the file agents take as controllerKeysFile), plan
reads the ledger of the newest commit a controller key signed, as the
controller does, and names the unsigned commits above it. Without it the
plan says that the ledger it read is unverified.`

func newPlanCmd() *cobra.Command {
	a := planArgs{form: "text", snapshotsBranch: snapshots.Branch, maxDeletes: fleet.DefaultMaxDeletes,
		sigs: config.Signatures{Mode: string(fleet.VerifyOff)}}
	cmd := &cobra.Command{
		Use:   "plan --repo R --base REV --head REV",
		Short: "Show what merging head over base would do, host by host",
		Long:  planLong,
		Args:  cobra.NoArgs,
	}
	flags := config.NewFlags(cmd.Flags())
	a.repo.Bind(flags)
	flags.String(&a.path, "path", "GITFLEET_PATH", "directory of the objects in the repository")
	cmd.Flags().StringVar(&a.base, "base", "", "revision the change starts from: a branch or commit hash; in a local repository also HEAD~1, origin/main, a tag")
	cmd.Flags().StringVar(&a.head, "head", "", "revision of the change: a branch or commit hash; in a local repository also HEAD, main~1, a tag")
	cmd.Flags().StringVar(&a.form, "format", a.form, "output format: text, markdown or json")
	cmd.Flags().StringVar(&a.snapshotsBranch, "snapshots-branch", a.snapshotsBranch, "branch the controller publishes snapshots and its ledger on")
	a.sigs.Bind(flags)
	flags.Int(&a.maxDeletes, "max-deletes", "GITFLEET_MAX_DELETES", "the controller's mass-delete limit (negative: off), to show whether the change needs the Gitfleet-Allow-Deletes trailer")
	flags.Path(&a.controllerKeys, "controller-keys", "GITFLEET_CONTROLLER_KEYS", "allowed-signers file of the controller's public keys (its own and --controller-keys', as agents' controllerKeysFile): read the ledger of the newest snapshots commit one of them signed, as the controller does")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := flags.FromEnv(config.OS); err != nil {
			return usageOr(err)
		}
		if err := a.repo.Check(); err != nil {
			return usageOr(err)
		}
		if a.base == "" || a.head == "" {
			return &exitError{code: 2, err: errors.New("--base and --head are required")}
		}
		if a.form != "text" && a.form != "markdown" && a.form != "json" {
			return &exitError{code: 2, err: fmt.Errorf("--format must be text, markdown or json, got %q", a.form)}
		}
		if _, _, err := a.sigs.Load(); err != nil {
			return usageOr(err)
		}
		var keys *trust.Signers
		if a.controllerKeys != "" {
			var err error
			if keys, err = trust.Load(a.controllerKeys, ""); err != nil {
				return &exitError{code: 2, err: fmt.Errorf("--controller-keys: %w", err)}
			}
		}
		return runPlan(cmd.Context(), cmd.OutOrStdout(), a, keys)
	}
	return cmd
}

// planSource loads the desired state of a repository at a revision.
type planSource struct {
	repo *gitsource.Repo
	path string
}

func (s planSource) load(ctx context.Context, rev string) (string, *desired.Fleet, error) {
	return s.loadAgainst(ctx, rev, "")
}

// loadAgainst is load with baseline, a commit whose tree says which file
// a change added (desired.Loader.SetBaseline): a name defined twice is
// reported there. An unreadable baseline is no baseline.
func (s planSource) loadAgainst(ctx context.Context, rev, baseline string) (string, *desired.Fleet, error) {
	commit, err := s.repo.ResolveExpr(ctx, rev)
	if err != nil {
		return "", nil, err
	}
	tree, err := s.repo.Tree(commit, "")
	if err != nil {
		return commit, nil, err
	}
	l := desired.NewLoader(s.path)
	if baseline != "" {
		if bt, err := s.repo.Tree(baseline, ""); err == nil {
			_ = l.SetBaseline(bt)
		}
	}
	f, err := l.Load(tree)
	return commit, f, err
}

// Revisions that name no commit but "nothing before": --base of a first
// commit. NullCommit is git's null object id, which git hooks and GitHub
// give as the commit before a branch's first push; EmptyTree is git's
// empty tree.
const (
	nullCommit = "0000000000000000000000000000000000000000"
	emptyTree  = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
)

// emptyBase reports whether rev says "nothing before" (see nullCommit).
func emptyBase(rev string) bool {
	return rev == nullCommit || rev == emptyTree
}

// runPlan plans a's change; keys are the controller's public keys (nil:
// the ledger is read unverified).
func runPlan(ctx context.Context, out io.Writer, a planArgs, keys *trust.Signers) error {
	repo, done, err := openScratch(ctx, gitsource.Options{URL: a.repo.URL, Auth: a.repo.Auth()})
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	defer done()
	src := planSource{repo: repo, path: a.path}
	ledger, ledgerWarnings := planLedger(ctx, repo, a.snapshotsBranch, keys)
	baseCommit, baseFleet, warnings, err := planBase(ctx, src, a.base, ledger)
	if err != nil {
		return err
	}
	// What the base is comes first; how the ledger was read after it.
	warnings = append(warnings, ledgerWarnings...)
	// A name defined twice is reported at the file the change added,
	// relative to the commit the fleet runs (else to the base).
	baseline := string(ledger.AppliedHash())
	if baseline == "" {
		baseline = baseCommit
	}
	headCommit, headFleet, headErr := src.loadAgainst(ctx, a.head, baseline)
	var list desired.ErrorList
	if headErr != nil && !errors.As(headErr, &list) {
		return &exitError{code: 1, err: fmt.Errorf("--head: %w", headErr)}
	}
	var p *desired.Plan
	if headErr == nil {
		p = desired.ComputePlan(baseFleet, headFleet, desired.PlanOptions{Pending: pendingDeletes(ledger), Retained: retainedObjects(ledger)})
		warnings = append(warnings, headFleet.FileURLWarnings()...)
		warnings = append(warnings, headFleet.CloudInitUserWarnings()...)
		var allowed []string
		if p.Guards, allowed, err = planGuards(repo, a, baseCommit, headCommit, baseFleet, p); err != nil {
			return &exitError{code: 1, err: err}
		}
		warnings = append(warnings, allowed...)
	} else {
		p = &desired.Plan{Hosts: []desired.HostPlan{}}
		for _, e := range list {
			p.Errors = append(p.Errors, e.Error())
		}
	}
	p.Base, p.Head = label(a.base, baseCommit), label(a.head, headCommit)
	if emptyBase(a.base) {
		p.Base = "(empty)"
	}
	p.Warnings = warnings
	if err := writePlan(out, p, a.form); err != nil {
		return err
	}
	if len(p.Errors) > 0 {
		return &exitError{code: 1, err: fmt.Errorf("head %s: %s", a.head, plural(len(p.Errors), "validation error", "validation errors"))}
	}
	return nil
}

// planBase loads the base at rev. A base that does not validate is
// replaced by the last commit the controller applied, else by an empty
// fleet (nil), with a warning saying which. A base that says "nothing
// before" (emptyBase: a first commit) is the empty fleet, and the warning
// says so.
func planBase(ctx context.Context, src planSource, rev string, ledger *snapshots.Ledger) (string, *desired.Fleet, []string, error) {
	if emptyBase(rev) {
		what := "base " + desired.Hash(rev).Short() + " is empty (a first commit: nothing before it): every object of head shows as a create"
		if applied := string(ledger.AppliedHash()); applied != "" {
			what += fmt.Sprintf("; note that the controller already applied %s, which this plan does not compare with", desired.Hash(applied).Short())
		}
		return "", nil, []string{what}, nil
	}
	commit, f, err := src.load(ctx, rev)
	var list desired.ErrorList
	if errors.Is(err, gitsource.ErrUnknownRevision) {
		return "", nil, nil, &exitError{code: 1, err: fmt.Errorf("--base: %w (for the first commit of a repository, plan with --base %s)", err, nullCommit)}
	}
	if err != nil && !errors.As(err, &list) {
		return "", nil, nil, &exitError{code: 1, err: fmt.Errorf("--base: %w", err)}
	}
	if err == nil {
		return commit, f, nil, nil
	}
	what := fmt.Sprintf("base %s does not validate (%s)", rev, plural(len(list), "error", "errors"))
	if applied := string(ledger.AppliedHash()); applied != "" {
		if _, af, aerr := src.load(ctx, applied); aerr == nil {
			return commit, af, []string{fmt.Sprintf("%s; planned against %s, the last commit the controller applied", what, desired.Hash(applied).Short())}, nil
		}
	}
	return commit, nil, []string{what + "; planned against an empty base: every object of head shows as a create"}, nil
}

// writePlan writes p in format: text, markdown or json.
func writePlan(out io.Writer, p *desired.Plan, format string) error {
	switch format {
	case "markdown":
		_, err := io.WriteString(out, p.Markdown())
		return err
	case "json":
		data, err := p.JSON()
		if err == nil {
			_, err = out.Write(data)
		}
		return err
	}
	_, err := io.WriteString(out, p.Text())
	return err
}

// planLedger reads the controller's ledger (the applied commit and the
// pending deletes) from the snapshots branch: on the remote, or in a local
// clone from its remote-tracking copy (origin/<branch>), which is all a CI
// checkout has. No branch yet plans against the base alone, silently: no
// controller has run. A ledger that exists but cannot be read gives an
// empty one and a warning, since un-deletes then show as creates and a
// broken base cannot fall back to the applied commit.
//
// Anyone who can push the branch can write a ledger there. With keys (the
// controller's public keys) the ledger is read as the controller reads it
// (fleet.WalkToSigned, docs/DESIGN.md "Authentic ledger"): at the tip when
// a controller key signed it, else at the newest signed first-parent
// commit, with a warning naming the unsigned commits above it; with none
// within fleet.MaxLedgerWalk, planned without a ledger. Without keys, a
// ledger read at the tip carries a one-line warning that it is unverified.
func planLedger(ctx context.Context, repo *gitsource.Repo, branch string, keys *trust.Signers) (*snapshots.Ledger, []string) {
	r, err := readControllerLedger(ctx, repo, branch, keys)
	switch {
	case err != nil:
		return snapshots.NewLedger(), []string{fmt.Sprintf("the controller's ledger on %s cannot be read (%v): planned without it, so pending deletes show as creates and a broken base has no applied commit to fall back to", branch, err)}
	case r.walk != nil && r.walk.Signed == "":
		return snapshots.NewLedger(), []string{fmt.Sprintf("no commit of %s within %d of its tip %s is signed by a controller key (%s): the ledger there may be anyone's, planned without it, so pending deletes show as creates",
			branch, fleet.MaxLedgerWalk, desired.Hash(r.tip).Short(), forgedList(*r.walk))}
	case r.walk != nil:
		return r.ledger, []string{fmt.Sprintf("the tip of %s is not signed by a controller key: %s above the signed %s, whose ledger this plan reads (the controller acts on it too and writes over the rest)",
			branch, forgedList(*r.walk), desired.Hash(r.walk.Signed).Short())}
	case r.ledger == nil:
		return snapshots.NewLedger(), nil // no branch (no controller has run), or no ledger on it
	case keys == nil:
		return r.ledger, []string{fmt.Sprintf("the controller's ledger (pending deletes, retained objects, the applied commit) was read at %s@%s unverified: anyone who can push that branch can write it; give --controller-keys to read the one the controller signed", branch, desired.Hash(r.tip).Short())}
	}
	return r.ledger, nil
}

// forgedList names the unsigned commits of walk for a person: the count
// and the newest few, short.
func forgedList(walk fleet.LedgerWalk) string {
	const shown = 5
	n := plural(len(walk.Forged), "unsigned commit", "unsigned commits")
	if walk.More {
		n = fmt.Sprintf("%d unsigned commits and more", len(walk.Forged))
	}
	names := make([]string, 0, shown)
	for i, f := range walk.Forged {
		if i == shown {
			names = append(names, "…")
			break
		}
		names = append(names, desired.Hash(f.Commit).Short())
	}
	return fmt.Sprintf("%s (%s)", n, strings.Join(names, ", "))
}

// label names a revision for a person: the name given, and the commit when
// the name was not already the full hash.
func label(rev, commit string) string {
	if rev == commit || commit == "" {
		return commit
	}
	return rev + " (" + desired.Hash(commit).Short() + ")"
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

// retainedObjects are the ledger's objects kept after a history rewrite.
func retainedObjects(l *snapshots.Ledger) []desired.ObjectRef {
	var refs []desired.ObjectRef
	for _, k := range l.Retained {
		refs = append(refs, desired.ObjectRef{Kind: k.Kind, Name: k.Name, Host: k.Host})
	}
	return refs
}

// planGuards lists what would make the controller reject head over base
// beyond validation: a refused signature in base..head (as
// --verify-signatures asks) and the mass-delete guard with the trailer it
// needs. allowed says which mass delete the change's trailer lets
// through, for the plan's warnings: a reviewer sees the trailer at work.
// An error is git's.
func planGuards(repo *gitsource.Repo, a planArgs, base, head string, baseFleet *desired.Fleet, p *desired.Plan) (guards, allowed []string, err error) {
	mode, signers, err := a.sigs.Load()
	if err != nil {
		return nil, nil, err
	}
	rng, truncated, err := fleet.AppliedRange(repo, base, head)
	if err != nil {
		return nil, nil, err
	}
	if mode != fleet.VerifyOff {
		err := fleet.Signatures{Mode: mode, Signers: signers, Repo: repo}.Verify(rng, truncated)
		switch {
		case errors.Is(err, trust.ErrSignature):
			guards = append(guards, err.Error()+"; a merge or squash made in your git host's web UI is signed with its key (README: Signed changes)")
		case err != nil:
			return nil, nil, err
		}
	}
	d := planDeletes(baseFleet, p)
	guard := fleet.DeleteGuard{Max: a.maxDeletes}
	if guard.Trips(d) != "" {
		all, err := fleet.WithMergedCommits(repo, rng)
		if err != nil {
			return nil, nil, err
		}
		n, found := fleet.AllowedDeletes(all)
		if err := guard.Check(d, n, found); err != nil {
			guards = append(guards, err.Error())
		} else {
			allowed = append(allowed, fmt.Sprintf("mass delete: the change newly tombstones %d object(s) (%s), let through by the trailer \"%s: %d\" in the change",
				d.Total, guard.Trips(d), fleet.AllowDeletesTrailer, n))
		}
	}
	return guards, allowed, nil
}

// planDeletes counts the plan's deletes as the mass-delete guard does:
// VMs and volumes, host moves included, and the VMs each host held in the
// base.
func planDeletes(base *desired.Fleet, p *desired.Plan) fleet.Deletes {
	d := fleet.Deletes{VMs: map[string]int{}, Held: map[string]int{}}
	for _, h := range p.Hosts {
		for _, c := range h.Changes {
			if c.Action != desired.ActionDelete {
				continue
			}
			switch c.Kind {
			case desired.KindVM:
				d.VMs[h.Host]++
				d.Total++
			case desired.KindVolume:
				d.Total++
			}
		}
	}
	if base != nil {
		for _, vm := range base.VMs {
			d.Held[vm.Spec.Host]++
		}
	}
	return d
}
