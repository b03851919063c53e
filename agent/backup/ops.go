package backup

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Init creates the repository (restic init). It is run only when asked
// (a command, a test's set-up), never to recover from ErrRepositoryMissing.
// A repository already there is ErrRepositoryExists, and left as it is.
func (r *Repository) Init(ctx context.Context) error {
	if err := r.cacheDir(); err != nil {
		return err
	}
	_, err := r.run(ctx, "init", r.timeout(), "init")
	return err
}

// Snapshot is one restic snapshot as `restic snapshots --json` lists it.
// ID is the full 64-hex id, ShortID its first 8 characters, Paths the
// files it holds (a --stdin snapshot holds one, "/"+its stdin filename).
type Snapshot struct {
	ID       string    `json:"id"`
	ShortID  string    `json:"short_id"`
	Time     time.Time `json:"time"`
	Hostname string    `json:"hostname"`
	Tags     []string  `json:"tags"`
	Paths    []string  `json:"paths"`
}

// HasTag reports whether the snapshot carries tag.
func (s Snapshot) HasTag(tag string) bool {
	for _, t := range s.Tags {
		if t == tag {
			return true
		}
	}
	return false
}

// Filter selects snapshots: Host (if not "") is the snapshot's host, and
// the snapshot carries every one of Tags.
type Filter struct {
	Host string
	Tags []string
}

// args renders f as restic's --host and --tag (comma: all of them).
func (f Filter) args(op string) ([]string, error) {
	if err := checkTags(op, f.Tags); err != nil {
		return nil, err
	}
	var a []string
	if f.Host != "" {
		a = append(a, "--host="+f.Host)
	}
	if len(f.Tags) > 0 {
		a = append(a, "--tag="+strings.Join(f.Tags, ","))
	}
	return a, nil
}

// Snapshots lists the snapshots f selects, oldest first.
func (r *Repository) Snapshots(ctx context.Context, f Filter) ([]Snapshot, error) {
	fa, err := f.args("snapshots")
	if err != nil {
		return nil, err
	}
	return r.snapshots(ctx, append(fa, "--json"))
}

func (r *Repository) snapshots(ctx context.Context, args []string) ([]Snapshot, error) {
	out, err := r.run(ctx, "snapshots", r.timeout(), append([]string{"snapshots"}, args...)...)
	if err != nil {
		return nil, err
	}
	var list []Snapshot
	if err := json.Unmarshal(out, &list); err != nil {
		return nil, &Error{Op: "snapshots", ExitCode: 0, Err: fmt.Errorf("decode restic's --json output: %w", err)}
	}
	sort.SliceStable(list, func(i, j int) bool { return list[i].Time.Before(list[j].Time) })
	return list, nil
}

// snapshotByID returns the snapshot whose id is or starts with id.
func (r *Repository) snapshotByID(ctx context.Context, id string) (Snapshot, error) {
	if !snapshotID.MatchString(id) {
		return Snapshot{}, configError("snapshots", "snapshot id %q: want 8 to 64 lowercase hex digits", id)
	}
	list, err := r.snapshots(ctx, []string{"--json", id})
	if err != nil {
		return Snapshot{}, err
	}
	if len(list) != 1 {
		return Snapshot{}, &Error{Op: "snapshots", Kind: ErrNotFound, ExitCode: 0, Err: fmt.Errorf("%d snapshots match %s", len(list), id)}
	}
	return list[0], nil
}

var snapshotID = regexp.MustCompile(`^[0-9a-f]{8,64}$`)

// Scope is what a Forget may touch: snapshots of Host carrying every one
// of Tags. Tags must include TagOwner ("gitfleet") and Host must be set:
// restic's forget is never run on anything gitfleet did not write, nor on
// another host's snapshots.
type Scope Filter

func (s Scope) check() error {
	owned := false
	for _, t := range s.Tags {
		owned = owned || t == TagOwner
	}
	if !owned || s.Host == "" {
		return &Error{Op: "forget", Kind: ErrOutOfScope, ExitCode: -1, Err: fmt.Errorf("scope %v on host %q: want tag %q and a host", s.Tags, s.Host, TagOwner)}
	}
	return nil
}

// KeepPolicy is restic forget's --keep-* policy: the newest Last
// snapshots, and the newest of each of the last Hourly hours, Daily days,
// Weekly weeks, Monthly months and Yearly years, plus every snapshot
// younger than Within. A policy keeping nothing is refused.
type KeepPolicy struct {
	Last, Hourly, Daily, Weekly, Monthly, Yearly int
	Within                                       time.Duration
}

func (k KeepPolicy) args() []string {
	var a []string
	for _, f := range []struct {
		flag string
		n    int
	}{{"last", k.Last}, {"hourly", k.Hourly}, {"daily", k.Daily}, {"weekly", k.Weekly}, {"monthly", k.Monthly}, {"yearly", k.Yearly}} {
		if f.n > 0 {
			a = append(a, "--keep-"+f.flag+"="+strconv.Itoa(f.n))
		}
	}
	if k.Within > 0 {
		// restic's duration: y m d h (no minutes).
		a = append(a, "--keep-within="+strconv.FormatInt(int64((k.Within+time.Hour-1)/time.Hour), 10)+"h")
	}
	return a
}

// ForgetResult says what a Forget removed and kept, by full snapshot id.
type ForgetResult struct {
	Removed []string
	Kept    []string
}

// Forget applies policy to the snapshots in scope (restic forget --host
// --tag, grouped by restic's default host and paths, so each disk of each
// VM is its own group), then runs Prune when prune is set. Nothing outside
// scope is touched.
func (r *Repository) Forget(ctx context.Context, scope Scope, policy KeepPolicy, prune bool) (ForgetResult, error) {
	if err := scope.check(); err != nil {
		return ForgetResult{}, err
	}
	keep := policy.args()
	if len(keep) == 0 {
		return ForgetResult{}, configError("forget", "a keep policy that keeps nothing")
	}
	fa, err := Filter(scope).args("forget")
	if err != nil {
		return ForgetResult{}, err
	}
	out, err := r.run(ctx, "forget", r.timeout(), append(append([]string{"forget", "--json"}, fa...), keep...)...)
	if err != nil {
		return ForgetResult{}, err
	}
	var groups []struct {
		Keep   []Snapshot `json:"keep"`
		Remove []Snapshot `json:"remove"`
	}
	if err := json.Unmarshal(out, &groups); err != nil {
		return ForgetResult{}, &Error{Op: "forget", ExitCode: 0, Err: fmt.Errorf("decode restic's --json output: %w", err)}
	}
	var res ForgetResult
	for _, g := range groups {
		for _, s := range g.Keep {
			res.Kept = append(res.Kept, s.ID)
		}
		for _, s := range g.Remove {
			res.Removed = append(res.Removed, s.ID)
		}
	}
	if prune && len(res.Removed) > 0 {
		return res, r.Prune(ctx)
	}
	return res, nil
}

// ForgetSnapshots forgets the snapshots named by ids (full ids or unique
// prefixes of at least 8 characters), each of which must be in scope: an
// id that is not is ErrOutOfScope and nothing is forgotten. Ids already
// gone are skipped, so a retry after a partial failure converges. It runs
// Prune afterwards when prune is set. It is how a backup that is not
// whole (a disk or the meta snapshot missing) is taken back.
func (r *Repository) ForgetSnapshots(ctx context.Context, scope Scope, ids []string, prune bool) error {
	if err := scope.check(); err != nil {
		return err
	}
	if len(ids) == 0 {
		return nil
	}
	inScope, err := r.Snapshots(ctx, Filter(scope))
	if err != nil {
		return err
	}
	var forget []string
	for _, id := range ids {
		if !snapshotID.MatchString(id) {
			return configError("forget", "snapshot id %q: want 8 to 64 lowercase hex digits", id)
		}
		found := false
		for _, s := range inScope {
			found = found || strings.HasPrefix(s.ID, id)
		}
		if found {
			forget = append(forget, id)
			continue
		}
		// Not in scope: gone already, or someone else's.
		if _, err := r.snapshotByID(ctx, id); err == nil {
			return &Error{Op: "forget", Kind: ErrOutOfScope, ExitCode: -1, Err: fmt.Errorf("snapshot %s is not one of host %s with tags %v", id, scope.Host, scope.Tags)}
		}
	}
	if len(forget) == 0 {
		return nil
	}
	if _, err := r.run(ctx, "forget", r.timeout(), append([]string{"forget"}, forget...)...); err != nil {
		return err
	}
	if prune {
		return r.Prune(ctx)
	}
	return nil
}

// Prune removes data no snapshot references any more (restic prune),
// bounded by MaintenanceTimeout. It takes the exclusive lock: one
// maintenance host runs it.
func (r *Repository) Prune(ctx context.Context) error {
	_, err := r.run(ctx, "prune", r.maintenanceTimeout(), "prune")
	return err
}

// dataSubset is what restic check --read-data-subset accepts: n/t, x% (or
// x.y%), or a size with a k, m, g or t suffix.
var dataSubset = regexp.MustCompile(`^([1-9][0-9]*/[1-9][0-9]*|[0-9]+(\.[0-9]+)?%|[1-9][0-9]*[kKmMgGtT])$`)

// Check verifies the repository's structure (restic check) and, when
// readDataSubset is not "", reads that subset of its data too: "n/t" (the
// n-th of t parts), "x%" (a random x percent) or a size ("500M"). Errors
// found are ErrDamaged. Bounded by MaintenanceTimeout; it takes the
// exclusive lock.
func (r *Repository) Check(ctx context.Context, readDataSubset string) error {
	args := []string{"check"}
	if readDataSubset != "" {
		if !dataSubset.MatchString(readDataSubset) {
			return configError("check", "read-data-subset %q: want n/t, x%% or a size such as 500M", readDataSubset)
		}
		args = append(args, "--read-data-subset="+readDataSubset)
	}
	_, err := r.run(ctx, "check", r.maintenanceTimeout(), args...)
	return err
}

// Unlock removes stale locks only (restic unlock without --remove-all):
// those of a restic that is no longer running on this host, and those not
// refreshed for 30 minutes. A live restic's lock, on this host or another,
// is never removed.
func (r *Repository) Unlock(ctx context.Context) error {
	_, err := r.run(ctx, "unlock", r.timeout(), "unlock")
	return err
}
