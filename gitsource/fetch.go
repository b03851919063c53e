package gitsource

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"
	"github.com/go-git/go-git/v5/plumbing/format/objfile"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/storage"
	"github.com/go-git/go-git/v5/storage/filesystem/dotgit"
	"github.com/go-git/go-git/v5/storage/memory"
)

// Fetch fetches branch and returns its tip commit hash.
//
// The branch is fetched with the refspec +refs/heads/B:refs/remotes/origin/B,
// at Options.Depth. The tip's commit and its whole tree are checked present
// before Fetch returns, so a later Tree or ReadFile of the tip does not find
// a hole. A remote without the branch gives ErrBranchNotFound (wrapped).
// Cache damage (a missing object, a ref changed concurrently, a shallow gap,
// an object an earlier read found missing) is repaired: fetch again with the
// tracking ref dropped, then clone the cache afresh as the last resort.
// Network and authentication failures are returned as they are.
func (r *Repo) Fetch(ctx context.Context, branch string) (string, error) {
	if err := checkBranch(branch); err != nil {
		return "", fmt.Errorf("fetch: %w", err)
	}
	tips, err := r.fetchRefs(ctx, refSet{branches: []string{branch}})
	if err != nil {
		return "", err
	}
	tip, ok := tips[branch]
	if !ok {
		return "", fmt.Errorf("fetch %s: %w: %s on %s", branch, ErrBranchNotFound, branch, redactURL(r.url))
	}
	return tip, nil
}

// FetchPrefix fetches, in one fetch, every branch whose name starts with
// prefix (which must end in "/": "gitfleet/hosts/", say) and returns
// branch → tip commit for each. It is FetchAll with that prefix alone.
func (r *Repo) FetchPrefix(ctx context.Context, prefix string) (map[string]string, error) {
	return r.FetchAll(ctx, nil, []string{prefix})
}

// FetchAll fetches branches and every branch under each of prefixes (each
// ending in "/": "gitfleet/hosts/", say) in one fetch — one ref
// advertisement and at most one upload-pack — and returns branch → tip
// commit for every branch found. A branch the remote lacks is absent from
// the answer, not an error (it costs one more ref advertisement, to learn
// which of several is missing); no branch at all is an empty map. The
// refspecs are +refs/heads/B:refs/remotes/origin/B for each branch and the
// glob +refs/heads/PREFIX*:refs/remotes/origin/PREFIX* for each prefix, at
// Options.Depth, with pruning: a branch deleted on the remote under a
// prefix leaves the answer and the cache. Every tip's commit and tree are
// checked present before FetchAll returns. Cache damage is repaired as
// Fetch repairs it (the tracking refs asked for are dropped and the fetch
// repeated; the last resort is a fresh clone, which fetches back every
// branch the cache tracked in one fetch too). Network and authentication
// failures are returned as they are. Under a context carrying an
// Advertisement (WithAdvertisement) that another fetch of the same remote
// recorded, it runs no upload-pack when every branch asked for is
// advertised at the tip the cache tracks, and asks only for the exact
// branches advertised.
func (r *Repo) FetchAll(ctx context.Context, branches, prefixes []string) (map[string]string, error) {
	for _, b := range branches {
		if err := checkBranch(b); err != nil {
			return nil, fmt.Errorf("fetch: %w", err)
		}
	}
	for _, p := range prefixes {
		if !strings.HasSuffix(p, "/") {
			return nil, fmt.Errorf("fetch prefix %q: must end in /", p)
		}
		if err := checkBranch(p + "x"); err != nil {
			return nil, fmt.Errorf("fetch prefix: %w", err)
		}
	}
	return r.fetchRefs(ctx, refSet{branches: branches, prefixes: prefixes})
}

// refSet is what one fetch asks for: exact branches, and prefixes (each
// ending in "/") of which every branch is fetched.
type refSet struct {
	branches, prefixes []string
}

// String names the set for errors and log lines: "main, gitfleet/hosts/*".
func (s refSet) String() string {
	names := append([]string(nil), s.branches...)
	for _, p := range s.prefixes {
		names = append(names, p+"*")
	}
	return strings.Join(names, ", ")
}

// specs are the refspecs of the set.
func (s refSet) specs() []config.RefSpec {
	out := make([]config.RefSpec, 0, len(s.branches)+len(s.prefixes))
	for _, b := range s.branches {
		out = append(out, config.RefSpec("+refs/heads/"+b+":"+trackingRef(b).String()))
	}
	for _, p := range s.prefixes {
		out = append(out, config.RefSpec("+refs/heads/"+p+"*:"+trackingRef(p).String()+"*"))
	}
	return out
}

// fetchRefs is the one fetch of Fetch, FetchPrefix and FetchAll: none
// when ctx carries an Advertisement in which set is unchanged (see
// WithAdvertisement); else fetch, verify, and on cache damage repair and
// try again (the second repair clones afresh), recording the
// advertisement read. Cache upkeep follows a fetch that brought objects.
func (r *Repo) fetchRefs(ctx context.Context, set refSet) (map[string]string, error) {
	adv := advertisementOf(ctx)
	if tips, ok := r.fetchAdvertised(adv, set); ok {
		return tips, nil
	}
	if advertised := adv.tips(r.url); advertised != nil && len(set.branches) > 0 {
		// The branches the remote lacks are known: not asked for, so
		// no second advertisement is read to find which.
		present := set.advertisedIn(advertised)
		if len(present.branches)+len(present.prefixes) == 0 {
			return map[string]string{}, nil
		}
		set = present
	}
	tips, err := r.fetchLoop(ctx, set)
	if adv != nil {
		adv.settle(r.url, err == nil)
	}
	return tips, err
}

// fetchLoop is fetchRefs's fetch, verify and repair loop.
func (r *Repo) fetchLoop(ctx context.Context, set refSet) (map[string]string, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		if attempt > 0 {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("fetch %s: %w (after %v)", set, err, lastErr)
			}
			if err := r.repair(ctx, set, attempt == 2); err != nil {
				if u := r.refusedWrite(err); u != nil {
					err = u
				}
				return nil, fmt.Errorf("fetch %s: repair cache after %v: %w", set, lastErr, err)
			}
		}
		tips, fetched, err := r.fetchMoved(ctx, set, attempt == 2)
		if err == nil && fetched && r.maintain(ctx, set) {
			// A fresh clone: fetch again, so the tips returned are in it.
			tips, _, err = r.fetchMoved(ctx, set, true)
		}
		if err == nil {
			return tips, nil
		}
		if u := r.refusedWrite(err); u != nil {
			// Reported at once: a repair would write more.
			return nil, fmt.Errorf("fetch %s from %s: %w", set, redactURL(r.url), u)
		}
		if !repairable(err) {
			return nil, fmt.Errorf("fetch %s from %s: %w", set, redactURL(r.url), err)
		}
		r.log.WithError(err).WithField("branch", set.String()).WithField("attempt", attempt+1).Warn("fetch found the cache damaged; repairing")
		lastErr = err
	}
	return nil, fmt.Errorf("fetch %s from %s: %w", set, redactURL(r.url), lastErr)
}

// refMovedRetries is how many times fetchMoved asks again.
const refMovedRetries = 3

// fetchMoved is fetchOnce, asked again (at most refMovedRetries times,
// each with a new ref advertisement) while the remote refuses a tip it
// advertised: "not our ref". Over http the advertisement and the request
// are two requests, each served by its own git-upload-pack, and a branch
// whose tip was replaced between them (an agent's heartbeat-only write
// replaces its tip, several times a second across 1,000 hosts) is
// refused as no longer reachable: a race lost, not a failure of the
// remote nor damage of the cache.
func (r *Repo) fetchMoved(ctx context.Context, set refSet, final bool) (map[string]string, bool, error) {
	for try := 0; ; try++ {
		tips, fetched, err := r.fetchOnce(ctx, set, final)
		if err == nil || !refMoved(err) || try == refMovedRetries || ctx.Err() != nil {
			return tips, fetched, err
		}
		r.log.WithError(err).WithField("branch", set.String()).Debug("a branch moved during the fetch; asking again")
	}
}

// refMoved reports whether err is upload-pack's refusal of a tip it
// advertised ("not our ref"; git's upload-pack.c).
func refMoved(err error) bool {
	return strings.Contains(err.Error(), "not our ref")
}

// fetchOnce fetches set in one fetch and verifies the tips; fetched tells
// whether objects arrived. An exact branch the remote lacks is left out
// (the remote's branches are listed once to learn which). With final set,
// objects still missing after the fetch are recorded as gone from the
// remote instead of failing.
func (r *Repo) fetchOnce(ctx context.Context, set refSet, final bool) (tips map[string]string, fetched bool, err error) {
	fetched, err = r.fetchSpecs(ctx, set)
	if errors.Is(err, git.NoMatchingRefSpecError{}) {
		if len(set.branches) == 1 && len(set.prefixes) == 0 {
			return map[string]string{}, false, nil
		}
		// Which of the branches is missing: ask once, fetch the rest.
		remote, lerr := r.remoteBranches(ctx)
		if lerr != nil {
			return nil, false, lerr
		}
		present := set
		present.branches = nil
		for _, b := range set.branches {
			if _, ok := remote[b]; ok {
				present.branches = append(present.branches, b)
			}
		}
		set = present
		fetched, err = false, nil
		if len(set.branches)+len(set.prefixes) > 0 {
			fetched, err = r.fetchSpecs(ctx, set)
		}
	}
	if errors.Is(err, transport.ErrEmptyRemoteRepository) {
		return map[string]string{}, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	tips, err = r.trackedTips(set)
	if err != nil {
		return nil, false, err
	}
	for _, tip := range tips {
		if err := r.verifyCommit(plumbing.NewHash(tip)); err != nil {
			return nil, false, err
		}
	}
	for h := range r.missing {
		if err := r.readable(h); err == nil {
			delete(r.missing, h)
		} else if final {
			r.log.WithField("object", h.String()).Warn("object not on the remote any more; not repairing it again")
			r.absent[h] = struct{}{}
			delete(r.missing, h)
		} else {
			return nil, false, fmt.Errorf("%w: %s (found missing by an earlier read)", ErrObjectMissing, h)
		}
	}
	return tips, fetched, nil
}

// readable reports whether object h can be read whole from the cache: its
// index entry alone is not enough when its data is damaged (a pack
// overwritten in place). Streamed, never held in memory. Caller holds r.mu.
func (r *Repo) readable(h plumbing.Hash) error {
	obj, err := r.st.EncodedObject(plumbing.AnyObject, h)
	if err != nil {
		return err
	}
	rd, err := obj.Reader()
	if err != nil {
		return err
	}
	defer rd.Close()
	_, err = io.Copy(io.Discard, rd)
	return err
}

// indexWithin fetches with opts, ctx bounding the whole fetch: the
// transfer, and the indexing of the pack that arrived (go-git closes the
// pack writer without a context). Caller holds r.mu.
func (r *Repo) indexWithin(ctx context.Context, opts *git.FetchOptions) error {
	fetch := func() error { return r.repo.FetchContext(ctx, opts) }
	if st, ok := r.st.(*diskStorage); ok {
		return st.during(ctx, fetch)
	}
	return fetch()
}

// fetchSpecs runs one go-git fetch of set's refspecs; fetched tells
// whether the remote sent anything ("already up to date" is no error).
func (r *Repo) fetchSpecs(ctx context.Context, set refSet) (fetched bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	err = r.remote(ctx, func(ctx context.Context) error {
		return r.indexWithin(ctx, &git.FetchOptions{
			RemoteName: remoteName,
			RefSpecs:   set.specs(),
			Depth:      r.opts.Depth,
			Auth:       r.auth,
			Tags:       git.NoTags,
			Prune:      len(set.prefixes) > 0,
			// ProxyOptions: the ssh deadline (see sshdeadline.go).
			ProxyOptions: r.proxyOptions(),
		})
	})
	if errors.Is(err, git.NoErrAlreadyUpToDate) {
		return false, nil
	}
	return err == nil, err
}

// trackedTips reads the tracking refs of set: branch → tip. Caller holds
// r.mu.
func (r *Repo) trackedTips(set refSet) (map[string]string, error) {
	tips := make(map[string]string, len(set.branches))
	for _, b := range set.branches {
		ref, err := r.st.Reference(trackingRef(b))
		if err != nil {
			return nil, fmt.Errorf("%w: tracking ref of %s after fetch: %v", ErrObjectMissing, b, err)
		}
		tips[b] = ref.Hash().String()
	}
	if len(set.prefixes) == 0 {
		return tips, nil
	}
	iter, err := r.st.IterReferences()
	if err != nil {
		return nil, fmt.Errorf("%w: list tracking refs of %s: %v", ErrObjectMissing, set, err)
	}
	err = iter.ForEach(func(ref *plumbing.Reference) error {
		name := ref.Name().String()
		if ref.Type() != plumbing.HashReference {
			return nil
		}
		for _, p := range set.prefixes {
			if tracking := trackingRef(p).String(); strings.HasPrefix(name, tracking) {
				tips[p+strings.TrimPrefix(name, tracking)] = ref.Hash().String()
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: list tracking refs of %s: %v", ErrObjectMissing, set, err)
	}
	return tips, nil
}

// repair makes the next fetch of set transfer its objects again: drop its
// tracking refs (so the fetch does not stop at "up to date"), or, with
// reclone set, clone the whole cache afresh and fetch back, in one fetch,
// every branch it tracked that the remote still has.
func (r *Repo) repair(ctx context.Context, set refSet, reclone bool) error {
	if !reclone {
		err := r.dropTracking(set)
		if err == nil {
			return nil
		}
		// The refs themselves are damaged past dropping them.
		r.log.WithError(err).WithField("branch", set.String()).Warn("cannot drop the tracking refs; cloning the cache afresh")
	}
	// A fresh clone throws the cache away: first make sure the remote
	// answers, so a network failure never costs the cache.
	remote, err := r.remoteBranches(ctx)
	if err != nil {
		return err
	}
	r.mu.Lock()
	branches, err := trackedBranches(r.st)
	if err != nil {
		branches = nil // the refs may be part of the damage
	}
	r.log.WithField("branch", set.String()).Warn("cloning the cache afresh")
	err = r.openStorage(true)
	r.mu.Unlock()
	if err != nil {
		return err
	}
	var back refSet
	for _, b := range branches {
		if _, ok := remote[b]; ok {
			back.branches = append(back.branches, b)
		}
	}
	if len(back.branches) == 0 {
		return nil
	}
	if _, _, err := r.fetchOnce(ctx, back, true); err != nil {
		r.log.WithError(err).WithField("branches", len(back.branches)).Warn("refetch after a fresh clone failed; the next fetch of each retries")
	}
	return nil
}

// dropTracking removes the tracking refs of set's branches and of every
// branch under its prefixes, and forgets which trees were verified.
func (r *Repo) dropTracking(set refSet) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.verified = map[plumbing.Hash]struct{}{}
	drop := append([]string(nil), set.branches...)
	if len(set.prefixes) > 0 {
		tracked, err := trackedBranches(r.st)
		if err != nil {
			return err
		}
		for _, b := range tracked {
			for _, p := range set.prefixes {
				if strings.HasPrefix(b, p) {
					drop = append(drop, b)
				}
			}
		}
	}
	for _, b := range drop {
		if err := r.st.RemoveReference(trackingRef(b)); err != nil && !errors.Is(err, plumbing.ErrReferenceNotFound) {
			return err
		}
	}
	return nil
}

// trackedBranches lists the branches the cache tracks.
func trackedBranches(st storage.Storer) ([]string, error) {
	iter, err := st.IterReferences()
	if err != nil {
		return nil, err
	}
	prefix := "refs/remotes/" + remoteName + "/"
	var out []string
	err = iter.ForEach(func(ref *plumbing.Reference) error {
		if n := ref.Name().String(); strings.HasPrefix(n, prefix) {
			out = append(out, strings.TrimPrefix(n, prefix))
		}
		return nil
	})
	return out, err
}

// verifyCommit checks that commit and every object of its tree are present.
// Trees verified once are remembered (by hash, so a one-file commit checks
// one path). Caller holds r.mu.
func (r *Repo) verifyCommit(h plumbing.Hash) error {
	c, err := object.GetCommit(r.st, h)
	if err != nil {
		return fmt.Errorf("%w: commit %s: %v", ErrObjectMissing, h, err)
	}
	return r.verifyTree(c.TreeHash)
}

// verifyTree checks one tree recursively. Caller holds r.mu.
func (r *Repo) verifyTree(h plumbing.Hash) error {
	if _, ok := r.verified[h]; ok {
		return nil
	}
	t, err := object.GetTree(r.st, h)
	if err != nil {
		return fmt.Errorf("%w: tree %s: %v", ErrObjectMissing, h, err)
	}
	for _, e := range t.Entries {
		switch e.Mode {
		case filemode.Dir:
			if err := r.verifyTree(e.Hash); err != nil {
				return err
			}
		case filemode.Submodule:
			// A gitlink names a commit of another repository.
		default:
			if err := r.st.HasEncodedObject(e.Hash); err != nil {
				return fmt.Errorf("%w: blob %s (%s): %v", ErrObjectMissing, e.Hash, e.Name, err)
			}
		}
	}
	if len(r.verified) > 1<<20 {
		r.verified = map[plumbing.Hash]struct{}{}
	}
	r.verified[h] = struct{}{}
	return nil
}

// cacheDamage lists the errors go-git's storage gives for a damaged
// cache, by class (from storage/filesystem/dotgit, plumbing/format/packfile,
// idxfile and objfile): refs (an empty or garbage ref file, a ref path that
// is a directory, malformed or duplicated packed-refs, a symbolic ref to
// nowhere, a ref that changed under us), objects (absent, of the wrong
// type), packs (truncated, overwritten, a pack without its index or an
// index without its pack, a bad delta), loose objects (a bad header). Every
// one is mended by fetching again or, as the last resort, cloning afresh.
var cacheDamage = []error{
	ErrObjectMissing, plumbing.ErrObjectNotFound, plumbing.ErrInvalidType,
	storage.ErrReferenceHasChanged, plumbing.ErrReferenceNotFound, storer.ErrMaxResolveRecursion,
	dotgit.ErrEmptyRefFile, dotgit.ErrIsDir, dotgit.ErrPackedRefsBadFormat,
	dotgit.ErrPackedRefsDuplicatedRef, dotgit.ErrSymRefTargetNotFound,
	dotgit.ErrPackfileNotFound, dotgit.ErrIdxNotFound, dotgit.ErrConfigNotFound,
	packfile.ErrMalformedPackFile, packfile.ErrInvalidDelta, packfile.ErrDeltaCmd,
	packfile.ErrReferenceDeltaNotFound, packfile.ErrInflatedSizeMismatch, packfile.ErrLengthOverflow,
	idxfile.ErrMalformedIdxFile, idxfile.ErrUnsupportedVersion,
	objfile.ErrHeader, objfile.ErrNegativeSize,
}

// cacheDamageText matches damage go-git reports without a sentinel (a
// wrapped os error, a zlib or hex decoding error, an unwrapped message).
var cacheDamageText = []string{
	"object not found", "reference has changed concurrently", "shallow",
	"malformed", "checksum", "invalid object", "zlib", "packfile", "idx file",
	"ref file is empty", "is a directory", "invalid byte", "encoding/hex", "invalid hash",
}

// ErrRemoteAnswer: the remote's answer (its ref advertisement, or its
// answer to an upload request: shallow lines, ACKs, NAK) did not decode.
// It is the remote's fault, like a refused pack: nothing in the cache is
// repaired, and the next fetch asks again.
var ErrRemoteAnswer = errors.New("the remote's answer does not decode")

// remoteAnswerText matches go-git's errors for an answer it could not
// decode, flattened into text: the http transport's upload-pack answer,
// and the ref advertisement's decoder (which names the pkt-line).
var remoteAnswerText = []string{"error decoding upload-pack response", "pkt-line "}

// isRemoteAnswer reports whether err is a remote's answer that did not
// decode (its messages can hold "shallow" or "malformed", which name
// cache damage elsewhere).
func isRemoteAnswer(err error) bool {
	if errors.Is(err, ErrRemoteAnswer) {
		return true
	}
	msg := err.Error()
	for _, t := range remoteAnswerText {
		if strings.Contains(msg, t) {
			return true
		}
	}
	return false
}

// repairable reports whether err is damage a refetch or a fresh clone can
// mend, as opposed to a network, authentication, timeout or input failure.
func repairable(err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded), errors.Is(err, ErrTimeout),
		errors.Is(err, ErrBranchNotFound), errors.Is(err, ErrObjectFormat), errors.Is(err, ErrTooManyRefs), errors.Is(err, ErrTooManyShallows), errors.Is(err, ErrPackRefused), isUnwritable(err), isRemoteAnswer(err),
		errors.Is(err, transport.ErrAuthenticationRequired), errors.Is(err, transport.ErrAuthorizationFailed),
		errors.Is(err, transport.ErrRepositoryNotFound), errors.Is(err, transport.ErrInvalidAuthMethod):
		return false
	}
	for _, d := range cacheDamage {
		if errors.Is(err, d) {
			return true
		}
	}
	msg := strings.ToLower(err.Error())
	for _, s := range cacheDamageText {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// remoteBranches lists the remote's branches, name → tip, from one ref
// advertisement (like git ls-remote --heads); an empty repository has
// none. It does not touch the cache.
func (r *Repo) remoteBranches(ctx context.Context) (map[string]string, error) {
	remote := git.NewRemote(memory.NewStorage(), &config.RemoteConfig{Name: remoteName, URLs: []string{r.url}})
	var refs []*plumbing.Reference
	err := r.remote(ctx, func(ctx context.Context) (err error) {
		refs, err = remote.ListContext(ctx, &git.ListOptions{Auth: r.auth, ProxyOptions: r.proxyOptions()})
		return err
	})
	if errors.Is(err, transport.ErrEmptyRemoteRepository) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list branches on %s: %w", redactURL(r.url), err)
	}
	out := make(map[string]string, len(refs))
	for _, ref := range refs {
		if b, ok := strings.CutPrefix(ref.Name().String(), "refs/heads/"); ok && ref.Type() == plumbing.HashReference {
			out[b] = ref.Hash().String()
		}
	}
	return out, nil
}

// remotePrefixDigest digests the names and tips of the remote's branches
// under prefix, from one ref advertisement; none is ErrBranchNotFound.
func (r *Repo) remotePrefixDigest(ctx context.Context, prefix string) (string, error) {
	remote, err := r.remoteBranches(ctx)
	if err != nil {
		return "", err
	}
	d := prefixDigest(remote, prefix)
	if d == "" {
		return "", fmt.Errorf("%w: no %s* on %s", ErrBranchNotFound, prefix, redactURL(r.url))
	}
	return d, nil
}

// prefixDigest digests the names and tips of the branches under prefix
// ("" when there are none).
func prefixDigest(branches map[string]string, prefix string) string {
	var lines []string
	for b, tip := range branches {
		if strings.HasPrefix(b, prefix) {
			lines = append(lines, "refs/heads/"+b+" "+tip)
		}
	}
	if len(lines) == 0 {
		return ""
	}
	sort.Strings(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(sum[:])
}

// RemoteHead resolves branch's tip on the remote without fetching objects
// (the ref advertisement only, like git ls-remote). It does not touch the
// cache. A remote without the branch gives ErrBranchNotFound (wrapped).
func (r *Repo) RemoteHead(ctx context.Context, branch string) (string, error) {
	if err := checkBranch(branch); err != nil {
		return "", fmt.Errorf("remote head: %w", err)
	}
	remote, err := r.remoteBranches(ctx)
	if err != nil {
		return "", fmt.Errorf("remote head %s: %w", branch, err)
	}
	tip, ok := remote[branch]
	if !ok {
		return "", fmt.Errorf("remote head %s: %w: %s on %s", branch, ErrBranchNotFound, branch, redactURL(r.url))
	}
	return tip, nil
}
