package fleet

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/trust"
)

// VerifyMode says which desired-state commits must carry an allowed
// signature before the controller applies a head (docs/DESIGN.md, "Signed
// desired state").
type VerifyMode string

// The verification modes.
const (
	// VerifyOff applies any commit (the default).
	VerifyOff VerifyMode = "off"
	// VerifyHead checks the head commit only: what GitHub's web merge
	// signs.
	VerifyHead VerifyMode = "head"
	// VerifyEvery checks every first-parent commit since the last applied
	// one (only the head when nothing was applied yet): a signed merge
	// over an unsigned direct push is refused too.
	VerifyEvery VerifyMode = "every"
)

// VerifyModes lists the modes, for flags and messages.
var VerifyModes = []string{string(VerifyOff), string(VerifyHead), string(VerifyEvery)}

// ParseVerifyMode parses off, head or every ("" is off).
func ParseVerifyMode(s string) (VerifyMode, error) {
	switch VerifyMode(s) {
	case "", VerifyOff:
		return VerifyOff, nil
	case VerifyHead, VerifyEvery:
		return VerifyMode(s), nil
	}
	return "", fmt.Errorf("verification mode %q: want off, head or every", s)
}

// maxRangeWalk bounds the commits a range since the applied commit may
// hold: a longer range is rejected in VerifyEvery mode (ErrRangeTooLong)
// and its trailers are read from the newest maxRangeWalk commits only.
const maxRangeWalk = 1000

// ErrRangeTooLong is wrapped by the rejection of a head whose first-parent
// range since the applied commit exceeds maxRangeWalk in VerifyEvery mode:
// not every commit could be verified.
var ErrRangeTooLong = errors.New("too many commits since the applied one to verify each")

// AppliedRange returns the first-parent commits from head back to applied,
// newest first, without applied and without the commits applied already
// holds; only head when applied is "". It first walks to applied itself;
// when the first-parent line misses it (applied reached through a merge's
// second parent, or a rewritten history) it walks again and stops at the
// first ancestor of applied; when applied is not in the repository at all
// (a fresh clone after a force-push), at the root. More than maxRangeWalk
// commits: the first maxRangeWalk and truncated.
func AppliedRange(h History, applied, head string) (commits []*gitsource.Commit, truncated bool, err error) {
	if applied == "" {
		c, err := h.CommitInfo(head)
		if err != nil {
			return nil, false, fmt.Errorf("read %s: %w", desired.Hash(head).Short(), err)
		}
		return []*gitsource.Commit{c}, false, nil
	}
	walk := func(stop func(*gitsource.Commit) (bool, error)) (bool, error) {
		commits, truncated = nil, false
		met := false
		err := h.FirstParents(head, func(c *gitsource.Commit) (bool, error) {
			s, err := stop(c)
			if err != nil || s {
				met = s
				return false, err
			}
			if len(commits) == maxRangeWalk {
				truncated = true
				return false, nil
			}
			commits = append(commits, c)
			return true, nil
		})
		return met, err
	}
	met, err := walk(func(c *gitsource.Commit) (bool, error) { return c.Hash == applied, nil })
	if err != nil && !errors.Is(err, gitsource.ErrShallowHistory) {
		return nil, false, fmt.Errorf("walk history from %s: %w", desired.Hash(head).Short(), err)
	}
	if met {
		return commits, truncated, nil
	}
	if _, err := h.CommitInfo(applied); errors.Is(err, gitsource.ErrObjectMissing) {
		// A rewritten history whose old commits this cache never held (a
		// fresh clone after a force-push): every commit of head's line is
		// new, as far as anything here can tell.
		if _, err := walk(func(*gitsource.Commit) (bool, error) { return false, nil }); err != nil && !errors.Is(err, gitsource.ErrShallowHistory) {
			return nil, false, fmt.Errorf("walk history from %s: %w", desired.Hash(head).Short(), err)
		}
		return commits, truncated, nil
	}
	if _, err := walk(func(c *gitsource.Commit) (bool, error) { return h.IsAncestor(c.Hash, applied) }); err != nil {
		return nil, false, fmt.Errorf("walk history from %s to %s: %w", desired.Hash(head).Short(), desired.Hash(applied).Short(), err)
	}
	return commits, truncated, nil
}

// Signatures is the signature check of a controller or a plan: a mode, the
// keys allowed and the repository the commits' signatures are read from.
type Signatures struct {
	Mode    VerifyMode
	Signers *trust.Signers
	Repo    interface {
		Signed(commit string) (*gitsource.SignedCommit, error)
	}
	// FirstSeen returns when the verifier first saw a commit: the time
	// its key's validity (valid-after=, valid-before=, an OpenPGP
	// expiry or revocation) is judged at, never the commit's own dates,
	// which its signer writes. Nil judges every commit at the current
	// time, as first seen now (`gitfleet plan` on a pull request).
	FirstSeen func(commit string) time.Time
}

// at is when commit is judged.
func (s Signatures) at(commit string) time.Time {
	if s.FirstSeen == nil {
		return time.Now()
	}
	return s.FirstSeen(commit)
}

// Verify checks the commits of rng (AppliedRange: newest first, rng[0] the
// head) as the mode asks. A refused signature is an error wrapping
// trust.ErrSignature (and ErrRangeTooLong for a truncated range in
// VerifyEvery mode) that names the commit and the key; any other error is
// git's.
func (s Signatures) Verify(rng []*gitsource.Commit, truncated bool) error {
	if s.Mode == VerifyOff || len(rng) == 0 {
		return nil
	}
	check := rng[:1]
	if s.Mode == VerifyEvery {
		if truncated {
			return fmt.Errorf("%w: %w: more than %d first-parent commits since the applied one; apply a head within that range, or start the controller once with --verify-signatures=head",
				trust.ErrSignature, ErrRangeTooLong, maxRangeWalk)
		}
		check = rng
	}
	// Oldest first: the first refusal named is where the unsigned part
	// of the history starts.
	for i := len(check) - 1; i >= 0; i-- {
		c, err := s.Repo.Signed(check[i].Hash)
		if err != nil {
			return fmt.Errorf("read the signature of %s: %w", desired.Hash(check[i].Hash).Short(), err)
		}
		if _, err := s.Signers.Verify(c, s.at(c.Hash)); err != nil {
			where := "the head"
			if i > 0 {
				where = fmt.Sprintf("%d first-parent commit(s) below the head %s", i, desired.Hash(rng[0].Hash).Short())
			}
			return fmt.Errorf("%w (%s; --verify-signatures=%s)", err, where, s.Mode)
		}
	}
	return nil
}

// VerifyFrom is the controller's check of head over applied, the commit
// the ledger names as applied, with rng and truncated AppliedRange's
// answer for them. The ledger lives on the snapshots branch, which anyone
// who can push there may rewrite, so it is no witness of what was
// verified: the head is verified even when the ledger names it as applied
// (an empty rng), and in VerifyEvery mode so is applied itself when the
// repository holds it, since a forged applied commit just under a signed
// head would otherwise leave the unsigned commits below it unchecked. A
// refusal of applied names it and how to start over.
func (s Signatures) VerifyFrom(h History, applied, head string, rng []*gitsource.Commit, truncated bool) error {
	if s.Mode == VerifyOff {
		return nil
	}
	if len(rng) == 0 {
		c, err := h.CommitInfo(head)
		if err != nil {
			return fmt.Errorf("read %s: %w", desired.Hash(head).Short(), err)
		}
		rng = []*gitsource.Commit{c}
	}
	if err := s.Verify(rng, truncated); err != nil || s.Mode != VerifyEvery || applied == "" || applied == head {
		return err
	}
	c, err := s.Repo.Signed(applied)
	if errors.Is(err, gitsource.ErrObjectMissing) {
		return nil // a rewritten history: AppliedRange walked to the root
	}
	if err != nil {
		return fmt.Errorf("read the signature of %s: %w", desired.Hash(applied).Short(), err)
	}
	if _, err := s.Signers.Verify(c, s.at(c.Hash)); err != nil {
		return fmt.Errorf("%w (the commit the ledger names as applied, where the range checked starts; start the controller once with --verify-signatures=head over a signed head to start again from there; --verify-signatures=%s)", err, s.Mode)
	}
	return nil
}

// AllowDeletesTrailer is the commit-message trailer that lets a change
// tombstone more objects than the mass-delete guard allows:
// "Gitfleet-Allow-Deletes: <n>", n at least the number of new tombstones.
const AllowDeletesTrailer = "Gitfleet-Allow-Deletes"

// DefaultMaxDeletes is Config.MaxDeletes' default.
const DefaultMaxDeletes = 10

var trailerLine = regexp.MustCompile(`(?im)^` + AllowDeletesTrailer + `:[ \t]*([0-9]{1,9})[ \t]*$`)

// AllowedDeletes returns the largest n of the AllowDeletesTrailer lines
// in the commits' messages, and whether there was one.
func AllowedDeletes(commits []*gitsource.Commit) (int, bool) {
	n, found := 0, false
	for _, c := range commits {
		for _, m := range trailerLine.FindAllStringSubmatch(c.Message, -1) {
			v, err := strconv.Atoi(m[1])
			if err == nil && (!found || v > n) {
				n, found = v, true
			}
		}
	}
	return n, found
}

// ErrMassDelete is wrapped by the rejection of a desired state that would
// newly tombstone more objects than the guard allows without the
// AllowDeletesTrailer.
var ErrMassDelete = errors.New("mass delete")

// DeleteGuard is the mass-delete guard (docs/DESIGN.md, "Mass-delete
// guard"): a change that newly tombstones more than Max objects, or more
// than 25% of a host's VMs when it tombstones more than one VM there,
// needs a commit in the applied range with "Gitfleet-Allow-Deletes: n",
// n at least the number of new tombstones. Max < 0 turns the guard off.
type DeleteGuard struct {
	Max int
}

// Deletes are the new tombstones of a change: Total objects (VMs and
// volumes, host moves included), VMs per host, and Held, the VMs each
// host held before.
type Deletes struct {
	Total int
	VMs   map[string]int
	Held  map[string]int
}

// Check returns nil when the deletes pass the guard, or when allowed (the
// trailer's n, found) covers them; else an error wrapping ErrMassDelete
// that names the count, the limit tripped and the trailer needed.
func (g DeleteGuard) Check(d Deletes, allowed int, found bool) error {
	why := g.Trips(d)
	if why == "" || (found && allowed >= d.Total) {
		return nil
	}
	have := "no commit in the change carries it"
	if found {
		have = fmt.Sprintf("the change allows %d", allowed)
	}
	return fmt.Errorf("%w: the change would newly tombstone %d object(s) (%s): rejected; to delete them, add the trailer \"%s: %d\" to a commit message in the change (the merge or squash commit when merging) — %s",
		ErrMassDelete, d.Total, why, AllowDeletesTrailer, d.Total, have)
}

// Trips says why the deletes trip the guard without a trailer ("" when
// they do not).
func (g DeleteGuard) Trips(d Deletes) string {
	if g.Max < 0 || d.Total == 0 {
		return ""
	}
	var why []string
	if d.Total > g.Max {
		why = append(why, fmt.Sprintf("more than --max-deletes %d", g.Max))
	}
	hosts := make([]string, 0, len(d.VMs))
	for h := range d.VMs {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		k, held := d.VMs[h], d.Held[h]
		if k > 1 && k*4 > held { // more than 25%
			why = append(why, fmt.Sprintf("%d of host %s's %d VMs, more than 25%%", k, h, held))
		}
	}
	return strings.Join(why, "; ")
}

// maxSideWalk bounds the commits read from each merge's side branch for
// trailers.
const maxSideWalk = 100

// WithMergedCommits returns rng and, for each merge commit in it, the
// commits its second parent brings (walking first parents from there until
// an ancestor of the merge's first parent, at most maxSideWalk): a trailer
// written in a pull request's own commits counts when it lands through a
// merge commit.
func WithMergedCommits(h History, rng []*gitsource.Commit) ([]*gitsource.Commit, error) {
	out := append([]*gitsource.Commit(nil), rng...)
	for _, m := range rng {
		if len(m.Parents) < 2 {
			continue
		}
		n := 0
		err := h.FirstParents(m.Parents[1], func(c *gitsource.Commit) (bool, error) {
			anc, err := h.IsAncestor(c.Hash, m.Parents[0])
			if err != nil || anc || n >= maxSideWalk {
				return false, err
			}
			n++
			out = append(out, c)
			return true, nil
		})
		if err != nil && !errors.Is(err, gitsource.ErrShallowHistory) {
			return nil, fmt.Errorf("walk the side of merge %s: %w", desired.Hash(m.Hash).Short(), err)
		}
	}
	return out, nil
}
