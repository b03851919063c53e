package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	neturl "net/url"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/spf13/cobra"

	"github.com/gitfleet/gitfleet/cmd/gitfleet/internal/config"
	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/fleet"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/internal/safetext"
	"github.com/gitfleet/gitfleet/snapshots"
	"github.com/gitfleet/gitfleet/status"
	"github.com/gitfleet/gitfleet/trust"
)

// statusLong is the help text of gitfleet status.
const statusLong = `Status reads every host's status file on the status branch and prints the
hosts (state as the controller judges it: online, offline, no status yet,
retired; heartbeat, accelerator, agent version, last accepted epoch, fence
violation, last report by the agent's clock); every VM a host reports (phase, power,
address, error, note): its VMs, the quarantined ones waiting for their
grace before a delete (with since when), the ones it has destroyed (destroy
acks the controller has not finalized yet) and the vanished ones (absent
from the snapshot without a tombstone: kept, never destroyed); and the
pending deletes, from the controller's ledger (ledger.yaml on the snapshots
branch): who removed what, with which commit and when. A VM that is not
running shows no address. A running VM is "booting" until its guest
answers, then "ready": a VM given sshAuthorizedKeys only while its sshd
answers (an SSH banner); any other at an SSH banner, a qemu-guest-agent
ping or the console line GITFLEET-GUEST-READY.

It also prints, each apart, why the controller's passes are failing now
(unreadable: git failed; refused: the controller will not act), when they
are, and the last rejected desired-state commit while no later one has
been applied.

It starts with the desired-state commit the snapshots carry, marks a
suspended host (it acts on nothing) in its note, gives each quarantined VM
and pending delete the time its host destroys it (and says when the host
waits for the controller to confirm the delete), and lists the objects
kept after a history rewrite, and what the controller refused as forged:
acks whose status commit the Host's agentKey did not sign, and snapshots
commits no controller key signed (with the ledger records it would not
act on).

--format json prints {"commit", "hosts", "unreadable", "pendingDeletes",
"pendingError", "lastRejected", "controllerFailing", "controllerError",
"applied", "retained", "forgedAcks", "forgedCommits", "liveness", "livenessError",
"controllerWrote", "lastWriteError", "ledgerWarning"}: the status files themselves, the hosts whose file
could not be read with why, the pending deletes (kind, name, host, commit,
author, time, epoch, publishedAt, destroyAt, confirm, awaitingConfirmation)
and why they could not be
read, if so, the ledger's last rejected commit (commit, reason, at,
superseded), the controller's failure (outcome, since, reason), the
applied commit (commit, branch, path), the retained objects (kind,
name, host, commit, since), the acks the controller did not act on
(ref, commit, reason), the snapshots commits and ledger records it
refused as forged (commit, signed, reason, at) and each host's state as the controller
judges it by its own clock (host, state: online, offline, no status yet
or status unreadable; retired when no Host object is left), and why that
could not be read, and when the controller last wrote the status branch
(at, refreshSeconds, ageSeconds, stale) and why that could not be read,
and how the ledger was read when it is not the tip a controller key signed.

The controller writes the status branch at least every 10 minutes, an
idle fleet included; when its last write is older than three of those
intervals, the table starts with a warning that the controller is
stopped or cannot write, and that what it shows is its last view.

Anyone who can push the snapshots branch can write a ledger there. With
--controller-keys (the allowed-signers file of the controller's public
keys, as plan takes it), status reads the ledger of the newest commit a
controller key signed, as the controller does, and says which unsigned
commits lie above it; without it, it says that the ledger it read is
unverified ("ledgerWarning" in the JSON).

With --status-repo (the controller's), the status branch is read from
that repository and the ledger from --repo.

Exit status: 0; 1 when the status branch is missing (no agent has
reported to this repository, or --repo names a clone rather than the
fleet's remote: point it at the remote) or cannot be read, or the pending
deletes cannot be read (what could be read is printed); 2 for usage
errors.`

func newStatusCmd() *cobra.Command {
	var (
		repo                    config.Repo
		branch, snapshots, form string
	)
	cmd := &cobra.Command{
		Use:   "status --repo URL",
		Short: "Show the fleet as the hosts report it on the status branch",
		Long:  statusLong,
		Args:  cobra.NoArgs,
	}
	flags := config.NewFlags(cmd.Flags())
	repo.Bind(flags)
	repo.BindStatus(flags)
	var controllerKeys string
	flags.Path(&controllerKeys, "controller-keys", "GITFLEET_CONTROLLER_KEYS", "allowed-signers file of the controller's public keys (its own and --controller-keys', as agents' controllerKeysFile): read the ledger of the newest snapshots commit one of them signed, as the controller does")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := flags.FromEnv(config.OS); err != nil {
			return usageOr(err)
		}
		if err := repo.Check(); err != nil {
			return usageOr(err)
		}
		if form != "table" && form != "json" {
			return &exitError{code: 2, err: fmt.Errorf("--format must be table or json, got %q", form)}
		}
		var keys *trust.Signers
		if controllerKeys != "" {
			var err error
			if keys, err = trust.Load(controllerKeys, ""); err != nil {
				return &exitError{code: 2, err: fmt.Errorf("--controller-keys: %w", err)}
			}
		}
		return runStatus(cmd.Context(), cmd.OutOrStdout(), repo, branch, snapshots, form, keys)
	}
	cmd.Flags().StringVar(&branch, "status-branch", fleet.DefaultStatusBranch, "branch the controller writes the fleet's status on (its summary and a copy of each host's status)")
	cmd.Flags().StringVar(&snapshots, "snapshots-branch", fleet.DefaultSnapshotsBranch, "branch the controller publishes snapshots and its ledger on")
	cmd.Flags().StringVar(&form, "format", "table", "output format: table or json")
	return cmd
}

// statusReport is the --format json output: every host's status, the hosts
// whose file could not be read with why, and the pending deletes from the
// controller's ledger.
type statusReport struct {
	Commit     string            `json:"commit"`
	Hosts      []*status.Status  `json:"hosts"`
	Unreadable map[string]string `json:"unreadable,omitempty"`
	// PendingDeletes are the tombstones the controller has published and
	// not finalized (ledger.yaml on the snapshots branch); empty when the
	// controller has published nothing yet.
	PendingDeletes []pendingDelete `json:"pendingDeletes"`
	// PendingError says why the pending deletes could not be read.
	PendingError string `json:"pendingError,omitempty"`
	// LastRejected is the ledger's last rejected desired-state commit (the
	// commit was invalid); ControllerFailing why the controller's passes
	// are not acting now (git failed, or it refused: controller.yaml on
	// the status branch). They are kept apart: one asks for a fix of the
	// commit, the other of git or the configuration.
	LastRejected      *snapshots.Rejection `json:"lastRejected,omitempty"`
	ControllerFailing *status.PassFailure  `json:"controllerFailing,omitempty"`
	// ControllerError says why controller.yaml could not be read.
	ControllerError string `json:"controllerError,omitempty"`
	// Applied is the desired-state commit the snapshots carry (the
	// ledger's), nil before the first publish; Retained the objects a
	// history rewrite dropped, kept running (the ledger's, without specs).
	Applied  *snapshots.AppliedCommit `json:"applied,omitempty"`
	Retained []retainedObject         `json:"retained"`
	// ForgedAcks are the acks the controller's last pass did not act on
	// (the status commit is not signed by the Host's agentKey);
	// ForgedCommits the snapshots commits no controller key signed and
	// the ledger records it refused (the ledger's, oldest first).
	ForgedAcks    []snapshots.ForgedAckRecord    `json:"forgedAcks"`
	ForgedCommits []snapshots.ForgedCommitRecord `json:"forgedCommits"`
	// Liveness is each host's state as the controller judges it by its
	// own clock (liveness.yaml on the status branch): online, offline, no
	// status yet or status unreadable, and retired (no Host object).
	// Absent before the controller's first summary, or when written by
	// a controller of an earlier release; LivenessError says why it could
	// not be read.
	Liveness      map[string]status.HostState `json:"liveness,omitempty"`
	LivenessError string                      `json:"livenessError,omitempty"`
	// ControllerWrote is when the controller last wrote the status branch
	// (last-write.yaml), how long before this reading, and whether that
	// is stale: older than status.StaleRefreshes of its refresh
	// intervals, so the rest is a stopped controller's last view. Absent
	// when a controller of an earlier release wrote the branch;
	// LastWriteError says why it could not be read.
	ControllerWrote *controllerWrote `json:"controllerWrote,omitempty"`
	LastWriteError  string           `json:"lastWriteError,omitempty"`
	// LedgerWarning says how the ledger was read when it is not the
	// snapshots tip a controller key signed: unverified (no
	// --controller-keys), or at the newest signed commit below unsigned
	// ones, or not at all.
	LedgerWarning string `json:"ledgerWarning,omitempty"`
}

// controllerWrote is status.LastWrite with its age at the reader's clock
// (whole seconds) and the verdict.
type controllerWrote struct {
	status.LastWrite
	AgeSeconds int64 `json:"ageSeconds"`
	Stale      bool  `json:"stale"`
}

// retainedObject is an object kept after a history rewrite: the rewriting
// commit and since when (the controller's clock).
type retainedObject struct {
	Kind   string    `json:"kind"`
	Name   string    `json:"name"`
	Host   string    `json:"host"`
	Commit string    `json:"commit"`
	Since  time.Time `json:"since"`
}

// pendingDelete is one tombstone: the object, the desired-state commit that
// removed it with its author and author time, the epoch that first
// published it and when the controller published it (its own clock).
type pendingDelete struct {
	Kind        string    `json:"kind"`
	Name        string    `json:"name"`
	Host        string    `json:"host"`
	Commit      string    `json:"commit"`
	Author      string    `json:"author"`
	Time        string    `json:"time"`
	Epoch       uint64    `json:"epoch"`
	PublishedAt time.Time `json:"publishedAt"`
	// SweptAt is set when the controller finalized the delete while the
	// host was offline: it waits for the host's ack all the same.
	SweptAt *time.Time `json:"sweptAt,omitempty"`
	// DestroyAt is when the host destroys the VM, from its status'
	// quarantine entry (the grace ends); absent until the host has shut
	// the VM down.
	DestroyAt *time.Time `json:"destroyAt,omitempty"`
	// Confirm is the host's quarantine nonce the controller published in
	// the tombstone (its confirmation); AwaitingConfirmation is set while
	// the host's quarantine of the object waits for a confirmation the
	// ledger does not carry (docs/DESIGN.md, "Delete confirmation").
	Confirm              string `json:"confirm,omitempty"`
	AwaitingConfirmation bool   `json:"awaitingConfirmation,omitempty"`
	// HostUnverified is set when the host's status is not signed by its
	// Host's agentKey (liveness.yaml's unsigned): destroyAt and
	// awaitingConfirmation are then not read from it.
	HostUnverified bool `json:"hostUnverified,omitempty"`
}

// runStatus prints the status; keys are the controller's public keys
// (nil: the ledger is read unverified at the tip).
func runStatus(ctx context.Context, out io.Writer, rf config.Repo, branch, snapshots, format string, keys *trust.Signers) error {
	return runStatusAt(ctx, out, rf, branch, snapshots, format, keys, time.Now())
}

// runStatusAt is runStatus reading at now (the reader's clock: the age of
// the controller's last write).
func runStatusAt(ctx context.Context, out io.Writer, rf config.Repo, branch, snapshots, format string, keys *trust.Signers, now time.Time) error {
	depth := 1
	if keys != nil {
		depth = fleet.MaxLedgerWalk + 1 // the walk back to a signed commit
	}
	repo, done, err := openScratch(ctx, gitsource.Options{URL: rf.URL, Auth: rf.Auth(), Depth: depth})
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	defer done()
	ledgerRepo, statusURL := repo, rf.URL
	if rf.StatusURL != "" && rf.StatusURL != rf.URL {
		var doneStatus func()
		repo, doneStatus, err = openScratch(ctx, gitsource.Options{URL: rf.StatusURL, Auth: rf.Auth(), Depth: 1})
		if err != nil {
			return &exitError{code: 1, err: fmt.Errorf("status repository: %w", err)}
		}
		defer doneStatus()
		statusURL = rf.StatusURL
	}
	rep := statusReport{Hosts: []*status.Status{}, PendingDeletes: []pendingDelete{}, Retained: []retainedObject{}}
	tip, err := repo.Fetch(ctx, branch)
	if errors.Is(err, gitsource.ErrBranchNotFound) {
		return &exitError{code: 1, err: missingStatusBranch(statusURL, branch)}
	}
	if err != nil {
		return &exitError{code: 1, err: err}
	}
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
	if err = readLedger(ctx, ledgerRepo, snapshots, keys, &rep); err != nil {
		rep.PendingDeletes, rep.PendingError = []pendingDelete{}, err.Error()
	}
	readControllerFiles(repo, tip, &rep, now)
	if format == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = writeStatusTable(out, rep)
	}
	if err != nil {
		return err
	}
	if rep.PendingError != "" {
		return &exitError{code: 1, err: fmt.Errorf("pending deletes: %s", rep.PendingError)}
	}
	return nil
}

// readControllerFiles reads what the controller writes on the status
// branch at tip beside the hosts' files into rep: its failing pass, the
// hosts' liveness (and with it when pending deletes are destroyed) and
// its last write. A file that is absent leaves its part empty; one that
// cannot be read or parsed is its part's error, never the command's.
func readControllerFiles(repo *gitsource.Repo, tip string, rep *statusReport, now time.Time) {
	switch data, err := repo.ReadFileMax(tip, status.ControllerPath, status.MaxControllerBytes); {
	case errors.Is(err, gitsource.ErrFileNotFound):
	case err != nil:
		rep.ControllerError = err.Error()
	default:
		if rep.ControllerFailing, err = status.ParsePassFailure(status.ControllerPath, data); err != nil {
			rep.ControllerError = err.Error()
		}
	}
	switch data, err := repo.ReadFileMax(tip, status.LivenessPath, status.MaxLivenessBytes); {
	case errors.Is(err, gitsource.ErrFileNotFound):
	case err != nil:
		rep.LivenessError = err.Error()
	default:
		if rep.Liveness, err = status.ParseLiveness(status.LivenessPath, data); err != nil {
			rep.LivenessError = err.Error()
		}
	}
	destroyAt(rep)
	switch data, err := repo.ReadFileMax(tip, status.LastWritePath, status.MaxLastWriteBytes); {
	case errors.Is(err, gitsource.ErrFileNotFound):
	case err != nil:
		rep.LastWriteError = err.Error()
	default:
		w, err := status.ParseLastWrite(status.LastWritePath, data)
		if err != nil {
			rep.LastWriteError = err.Error()
			break
		}
		rep.ControllerWrote = &controllerWrote{LastWrite: w, AgeSeconds: int64(w.Age(now) / time.Second), Stale: w.Stale(now)}
	}
}

// missingStatusBranch explains a repository without the status branch. A
// local clone of the fleet has it only as a remote-tracking branch (say
// origin/gitfleet/status): the statuses live on the fleet's remote, which
// the error names.
func missingStatusBranch(url, branch string) error {
	local, oerr := git.PlainOpen(strings.TrimPrefix(url, "file://"))
	if oerr == nil {
		if abs, aerr := filepath.Abs(strings.TrimPrefix(url, "file://")); aerr == nil {
			url = abs
		}
	}
	err := fmt.Errorf("%s has no branch %s: no controller has written its status there yet, or --repo does not name the fleet's repository", url, branch)
	if oerr != nil {
		return err
	}
	remotes, rerr := local.Remotes()
	if rerr != nil {
		return err
	}
	sort.Slice(remotes, func(i, j int) bool { return remotes[i].Config().Name < remotes[j].Config().Name })
	for _, r := range remotes {
		name := r.Config().Name
		if _, err := local.Reference(plumbing.NewRemoteReferenceName(name, branch), false); err != nil || len(r.Config().URLs) == 0 {
			continue
		}
		remote, creds := withoutUserinfo(r.Config().URLs[0])
		if creds {
			remote += " (its credentials in GITFLEET_TOKEN, not in the URL)"
		}
		return fmt.Errorf("%s has no branch %s, only %s/%s from its remote %q: this is a clone; point --repo at the fleet's remote: --repo %s",
			url, branch, name, branch, name, remote)
	}
	return err
}

// withoutUserinfo is raw without the user information of an http(s) URL,
// and whether it had any: a remote a clone was made with
// (https://TOKEN@host/r.git) is suggested as --repo without its token,
// which the redacted message would show as "***".
func withoutUserinfo(raw string) (string, bool) {
	u, err := neturl.Parse(raw)
	if err != nil || u.User == nil || (u.Scheme != "http" && u.Scheme != "https") {
		return raw, false
	}
	u.User = nil
	return u.String(), true
}

// readLedger fills rep from the controller's ledger on the snapshots
// branch: the pending deletes, the last rejected commit, the applied
// commit and the retained objects; none when the branch does not exist
// yet.
func readLedger(ctx context.Context, repo *gitsource.Repo, branch string, keys *trust.Signers, rep *statusReport) error {
	l, warning, err := statusLedger(ctx, repo, branch, keys)
	rep.LedgerWarning = warning
	if err != nil || l == nil {
		return err
	}
	for _, t := range l.Tombstones {
		rep.PendingDeletes = append(rep.PendingDeletes, pendingDelete{Kind: string(t.Kind), Name: t.Name, Host: t.Host, Commit: string(t.Tombstone.Commit),
			Author: t.Tombstone.Author, Time: t.Tombstone.Time, Epoch: t.Tombstone.Epoch, PublishedAt: t.PublishedAt, SweptAt: t.SweptAt,
			Confirm: t.Tombstone.Confirm})
	}
	for _, k := range l.Retained {
		rep.Retained = append(rep.Retained, retainedObject{Kind: string(k.Kind), Name: k.Name, Host: k.Host, Commit: string(k.Commit), Since: k.Since})
	}
	rep.LastRejected, rep.Applied = l.Rejected, l.Applied
	rep.ForgedAcks, rep.ForgedCommits = l.ForgedAcks, l.ForgedCommits
	return nil
}

// statusLedger reads the controller's ledger on branch for status, and a
// warning for a person ("" when the ledger is the tip a controller key
// signed, or there is none). Anyone who can push the branch can write a
// ledger there: without keys (the controller's public keys) it is read at
// the tip and said to be unverified; with them it is read as the
// controller reads it (fleet.WalkToSigned, docs/DESIGN.md "Authentic
// ledger"): at the newest signed first-parent commit, the warning naming
// the unsigned commits above it, and with none within
// fleet.MaxLedgerWalk, not at all (nil).
func statusLedger(ctx context.Context, repo *gitsource.Repo, branch string, keys *trust.Signers) (*snapshots.Ledger, string, error) {
	r, err := readControllerLedger(ctx, repo, branch, keys)
	switch {
	case r.tip == "":
		return r.ledger, "", err
	case keys == nil:
		return r.ledger, fmt.Sprintf("the controller's ledger (pending deletes, retained objects, the applied commit, forged commits) was read at %s@%s unverified: anyone who can push that branch can write it; give --controller-keys to read the one the controller signed", branch, desired.Hash(r.tip).Short()), err
	case err != nil || r.walk == nil:
		return r.ledger, "", err
	case r.walk.Signed == "":
		return nil, fmt.Sprintf("no commit of %s within %d of its tip %s is signed by a controller key (%s): the ledger there may be anyone's; pending deletes, retained objects and forged commits are not shown", branch, fleet.MaxLedgerWalk, desired.Hash(r.tip).Short(), forgedList(*r.walk)), nil
	}
	return r.ledger, fmt.Sprintf("the tip of %s is not signed by a controller key: %s above the signed %s, whose ledger this shows (the controller acts on it too and writes over the rest)", branch, forgedList(*r.walk), desired.Hash(r.walk.Signed).Short()), nil
}

// destroyAt gives each pending delete the time its host destroys the VM or
// removes the volume, when the host's status has it quarantined, and marks
// those whose quarantine waits for a confirmation the ledger does not
// carry; the deletes of a host whose status its agentKey did not sign
// (rep.Liveness, read first) are marked HostUnverified instead.
func destroyAt(rep *statusReport) {
	type key struct{ kind, host, name string }
	quarantined := map[key]status.Quarantine{}
	for _, st := range rep.Hosts {
		if rep.Liveness[st.Host].Unsigned != "" {
			// Not signed by the host's agentKey: what it says of its
			// quarantines is nobody's word.
			continue
		}
		for _, q := range st.Quarantined {
			quarantined[key{string(desired.KindVM), st.Host, q.Name}] = q
		}
		for _, q := range st.QuarantinedVolumes {
			quarantined[key{string(desired.KindVolume), st.Host, q.Name}] = q
		}
	}
	for i, p := range rep.PendingDeletes {
		if rep.Liveness[p.Host].Unsigned != "" {
			rep.PendingDeletes[i].HostUnverified = true
			continue
		}
		q, ok := quarantined[key{p.Kind, p.Host, p.Name}]
		if !ok {
			continue
		}
		if !q.DestroyAt.IsZero() {
			t := q.DestroyAt
			rep.PendingDeletes[i].DestroyAt = &t
		}
		rep.PendingDeletes[i].AwaitingConfirmation = q.AwaitsConfirmation() && q.Confirm != p.Confirm
	}
}

func writeStatusTable(out io.Writer, rep statusReport) error {
	writeLastWrite(out, rep)
	if rep.LedgerWarning != "" {
		fmt.Fprintf(out, "Note: %s.\n\n", safetext.Line(rep.LedgerWarning))
	}
	if a := rep.Applied; a != nil {
		fmt.Fprintf(out, "Desired state: %s at %s (applied).\n\n", dash(a.Branch), dash(a.Commit.Short()))
	} else if rep.PendingError == "" {
		fmt.Fprint(out, "Desired state: nothing applied yet.\n\n")
	}
	if len(rep.Hosts) == 0 && len(rep.Unreadable) == 0 {
		fmt.Fprintln(out, "No host has reported yet.")
	} else if err := writeHostsAndVMs(out, rep); err != nil {
		return err
	}
	fmt.Fprintln(out)
	writeControllerLines(out, rep)
	if err := writeForged(out, rep); err != nil {
		return err
	}
	if err := writeRetained(out, rep); err != nil {
		return err
	}
	switch {
	case rep.PendingError != "":
		_, err := fmt.Fprintf(out, "Pending deletes: unknown (%s)\n", safetext.Line(rep.PendingError))
		return err
	case len(rep.PendingDeletes) == 0:
		_, err := fmt.Fprintln(out, "Pending deletes: none.")
		return err
	}
	fmt.Fprintln(out, "Pending deletes:")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAME\tHOST\tREMOVED BY\tAUTHOR\tSINCE\tEPOCH\tDEADLINE")
	for _, p := range rep.PendingDeletes {
		since := dash(p.Time)
		if p.SweptAt != nil {
			since += " (swept: host offline; waits for its ack)"
		}
		sd := status.PendingDelete{Kind: p.Kind, Unconfirmed: p.AwaitingConfirmation, HostUnverified: p.HostUnverified}
		if p.DestroyAt != nil {
			sd.DestroyAt = *p.DestroyAt
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", dash(p.Kind), dash(p.Name), dash(p.Host), dash(desired.Hash(p.Commit).Short()), dash(p.Author), since, p.Epoch, sd.Deadline(0))
	}
	return tw.Flush()
}

// writeForged lists the acks the controller did not act on and the
// snapshots commits and ledger records it refused as forged.
func writeForged(out io.Writer, rep statusReport) error {
	if len(rep.ForgedAcks) > 0 {
		err := writeSection(out, "Forged acks (not acted on: the status commit is not signed by the Host's spec.agentKey; the deletes stay pending):",
			"OBJECT\tSTATUS COMMIT\tREASON", func(tw io.Writer) {
				for _, f := range rep.ForgedAcks {
					fmt.Fprintf(tw, "%s\t%s\t%s\n", dash(f.Ref), dash(f.Commit.Short()), dash(f.Reason))
				}
			})
		if err != nil {
			return err
		}
	}
	if len(rep.ForgedCommits) == 0 {
		return nil
	}
	return writeSection(out, "Forged snapshots commits and ledger records (never acted on; the controller wrote over them):",
		"COMMIT\tSIGNED COMMIT READ\tFOUND\tREASON", func(tw io.Writer) {
			for _, f := range rep.ForgedCommits {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", dash(f.Commit.Short()), dash(f.Signed.Short()), stampOrDash(f.At), dash(f.Reason))
			}
		})
}

// writeRetained lists the objects kept after a history rewrite.
func writeRetained(out io.Writer, rep statusReport) error {
	if len(rep.Retained) == 0 {
		return nil
	}
	return writeSection(out, "Kept after a history rewrite (running on their last spec; restore the file, or re-add and delete it in a reviewed commit):",
		"KIND\tNAME\tHOST\tREWRITTEN BY\tSINCE", func(tw io.Writer) {
			for _, k := range rep.Retained {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", dash(k.Kind), dash(k.Name), dash(k.Host), dash(desired.Hash(k.Commit).Short()), stampOrDash(k.Since))
			}
		})
}

// writeSection writes heading, then a table of header and the rows rows
// writes (tab-separated lines), then a blank line.
func writeSection(out io.Writer, heading, header string, rows func(tw io.Writer)) error {
	fmt.Fprintln(out, heading)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	rows(tw)
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(out)
	return err
}

// writeControllerLines prints why the controller's passes fail, if they
// do, and the last rejected commit while it stands, each on a line of its
// own (the reasons cut to their first line; --format json has them whole).
// writeLastWrite says how old the controller's view is: a warning above
// everything when it is stale (what follows is its last view, not the
// fleet now), else one line with its age.
func writeLastWrite(out io.Writer, rep statusReport) {
	switch w := rep.ControllerWrote; {
	case rep.LastWriteError != "":
		fmt.Fprintf(out, "Controller last wrote: unknown (%s)\n\n", safetext.Line(rep.LastWriteError))
	case w == nil:
		// A controller of an earlier release, or none yet: nothing to say.
	case w.Stale:
		fmt.Fprintf(out, "WARNING: the controller last wrote %s ago (at %s; it writes at least every %s): it is stopped or cannot write to this repository. What follows is its last view, not the fleet now.\n\n",
			ageText(w.AgeSeconds), stampOrDash(w.At), w.Refresh())
	default:
		fmt.Fprintf(out, "Controller last wrote %s ago (at %s).\n", ageText(w.AgeSeconds), stampOrDash(w.At))
	}
}

// ageText is seconds as a duration to the second ("1h2m3s").
func ageText(seconds int64) string { return (time.Duration(seconds) * time.Second).String() }

func writeControllerLines(out io.Writer, rep statusReport) {
	first := func(s string) string { l, _, _ := strings.Cut(s, "\n"); return safetext.Line(l) }
	switch f := rep.ControllerFailing; {
	case rep.ControllerError != "":
		fmt.Fprintf(out, "Controller: unknown (%s)\n", safetext.Line(rep.ControllerError))
	case f != nil:
		why := "unreadable: git failed"
		if f.Outcome == status.FailureRefused {
			why = "refused: the controller will not act on what it read"
		}
		fmt.Fprintf(out, "Controller: every pass %s, since %s; the last good snapshots stay: %s\n", why, stampOrDash(f.Since), first(f.Reason))
	}
	if r := rep.LastRejected; r != nil && r.Superseded == "" {
		fmt.Fprintf(out, "Last rejected commit: %s at %s, the last good snapshots stay: %s\n", dash(desired.Hash(r.Commit).Short()), stampOrDash(r.At), first(r.Reason))
	}
	if rep.ControllerError != "" || rep.ControllerFailing != nil || (rep.LastRejected != nil && rep.LastRejected.Superseded == "") {
		fmt.Fprintln(out)
	}
}

func writeHostsAndVMs(out io.Writer, rep statusReport) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tSTATE\tHEARTBEAT\tEPOCH\tACCEL\tAGENT\tVMS\tREPORTED\tNOTE")
	for _, st := range rep.Hosts {
		note := hostNote(st)
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%d\t%s\t%s\n", dash(st.Host), dash(reportedHostState(rep, st)), st.Heartbeat, st.LastSeenEpoch,
			dash(st.Agent.Accel), dash(st.Agent.Version), len(st.VMs), stampOrDash(st.ObservedAt), dash(note))
	}
	bad := make([]string, 0, len(rep.Unreadable))
	for h := range rep.Unreadable {
		bad = append(bad, h)
	}
	sort.Strings(bad)
	for _, h := range bad {
		fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\t-\tunreadable: %s\n", dash(h), dash(hostState(rep, h)), dash(rep.Unreadable[h]))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	n := 0
	for _, st := range rep.Hosts {
		n += len(st.VMs) + len(st.Quarantined) + len(st.Destroyed) + len(st.Vanished)
	}
	if n == 0 {
		return nil
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VM\tHOST\tPHASE\tPOWER\tADDRESS\tERROR\tNOTE")
	for _, st := range rep.Hosts {
		live, listed := rep.Liveness[st.Host]
		hostNote := status.VMHostNote(live.State, st.Suspended != nil)
		switch {
		case live.Unsigned != "":
			hostNote = status.JoinNotes(status.UnsignedNote, hostNote)
		case !listed && rep.Liveness != nil:
			// The controller does not list the host (no Host object,
			// nothing delivered): it neither verifies nor acts on what
			// its status claims.
			hostNote = notInFleetNote
		}
		for _, vm := range st.VMs {
			addr := ""
			if vm.Power == "running" {
				addr = vm.IP
				if vm.SSH != "" {
					if addr != "" {
						addr += " "
					}
					addr += "ssh " + vm.SSH
				}
			}
			note := status.JoinNotes(vm.Message, status.BackupNote(vm.Backup))
			if hostNote != "" {
				note = status.JoinNotes(note, hostNote)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", dash(vm.Name), dash(st.Host), dash(vm.Phase), dash(vm.Power), dash(addr), dash(vm.LastError), dash(note))
		}
		for _, q := range st.Quarantined {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t-\t%s\t%s\n", dash(q.Name), dash(st.Host), status.PhaseQuarantined, "stopped", dash(q.LastError),
				dash(status.QuarantineNote(q)))
		}
		for _, name := range st.Destroyed {
			note := "destroy acked; the controller finalizes the delete"
			if forgedAck(rep.ForgedAcks, st.Host, name) {
				note = "ack not signed by the host's agentKey: not acted on, the delete stays pending (see forged acks)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\t-\t%s\n", name, st.Host, "destroyed", note)
		}
		for _, v := range st.Vanished {
			note := "not in the snapshot, no tombstone, since " + stampOrDash(v.Since) + ": left as it is, never destroyed"
			if v.Quarantined {
				note = "not in the snapshot, no tombstone, since " + stampOrDash(v.Since) + ": shut down and kept, never destroyed"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t-\t%s\t%s\n", dash(v.Name), dash(st.Host), "vanished", dash(v.Power), dash(v.LastError), note)
		}
	}
	return tw.Flush()
}

// notInFleetNote is the note of each VM row of a host liveness.yaml does
// not list.
const notInFleetNote = "host not in the fleet: its status is neither verified nor acted on"

// hostNote is the NOTE of st's host row: a refused snapshot or a fence
// violation, a suspension, and each degraded network.
func hostNote(st *status.Status) string {
	note := st.SnapshotError
	if st.FenceViolation {
		note = "fence violation " + note
	}
	if sus := st.Suspended; sus != nil {
		note = strings.TrimSpace(fmt.Sprintf("suspended since epoch %d, acts on nothing: %s %s", sus.Epoch, sus.Reason, note))
	}
	for _, n := range st.Networks {
		note = status.JoinNotes(note, status.DegradedNote(n))
	}
	return note
}

// reportedHostState is hostState of st's host; an offline one's says
// since when it sent no status (st's observedAt), all the controller and
// this command can know.
func reportedHostState(rep statusReport, st *status.Status) string {
	state := hostState(rep, st.Host)
	if h, ok := rep.Liveness[st.Host]; ok && h.State == status.StateOffline && rep.LivenessError == "" {
		if since := status.NoStatusSince(st.ObservedAt); since != "" {
			state = strings.Replace(state, status.StateOffline, status.StateOffline+": "+since, 1)
		}
	}
	return state
}

// hostState is host's state as the controller judges it (liveness.yaml),
// with the retired note and the unsigned one; a host the file does not list is retired with
// nothing delivered to it; "" when there is no file (a controller of an
// earlier release), or "unknown (why)" when it could not be read.
func hostState(rep statusReport, host string) string {
	if rep.LivenessError != "" {
		return "unknown (" + rep.LivenessError + ")"
	}
	h, ok := rep.Liveness[host]
	switch {
	case !ok && rep.Liveness != nil:
		// The controller lists every host it knows: this one's status
		// file outlived its Host object and every delivery.
		return "not in the fleet: no Host object, nothing delivered to it"
	case !ok:
		return ""
	}
	state := h.State
	if h.Retired {
		state += ", " + status.RetiredNote
	}
	if h.Unsigned != "" {
		state += ", " + status.UnsignedNote + ": " + h.Unsigned
	}
	return state
}

func stampOrDash(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// dash is s as one printable line (status files are written by agents,
// or forged: no control character reaches the terminal), or "-" when
// empty.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return safetext.Line(s)
}

// forgedAck reports whether the controller's last pass refused host's ack
// of VM name as forged (ledger forgedAcks).
func forgedAck(acks []snapshots.ForgedAckRecord, host, name string) bool {
	ref := snapshots.Ref{Kind: desired.KindVM, Name: name, Host: host}.Key()
	for _, f := range acks {
		if f.Ref == ref {
			return true
		}
	}
	return false
}
