package gitsource

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
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
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		if attempt > 0 {
			if err := ctx.Err(); err != nil {
				return "", fmt.Errorf("fetch %s: %w (after %v)", branch, err, lastErr)
			}
			if err := r.repair(ctx, branch, attempt == 2); err != nil {
				if u := r.refusedWrite(err); u != nil {
					err = u
				}
				return "", fmt.Errorf("fetch %s: repair cache after %v: %w", branch, lastErr, err)
			}
		}
		tip, fetched, err := r.fetchOnce(ctx, branch, attempt == 2)
		if err == nil && fetched && r.maintain(ctx, branch) {
			// A fresh clone: fetch again, so the tip returned is in it.
			tip, _, err = r.fetchOnce(ctx, branch, true)
		}
		if err == nil {
			return tip, nil
		}
		if u := r.refusedWrite(err); u != nil {
			// Reported at once: a repair would write more.
			return "", fmt.Errorf("fetch %s from %s: %w", branch, redactURL(r.url), u)
		}
		if !repairable(err) {
			return "", fmt.Errorf("fetch %s from %s: %w", branch, redactURL(r.url), err)
		}
		r.log.WithError(err).WithField("branch", branch).WithField("attempt", attempt+1).Warn("fetch found the cache damaged; repairing")
		lastErr = err
	}
	return "", fmt.Errorf("fetch %s from %s: %w", branch, redactURL(r.url), lastErr)
}

// fetchOnce fetches branch and verifies the tip; fetched tells whether
// objects arrived. With final set, objects still missing after the fetch
// are recorded as gone from the remote instead of failing.
func (r *Repo) fetchOnce(ctx context.Context, branch string, final bool) (tip string, fetched bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	spec := config.RefSpec("+refs/heads/" + branch + ":" + trackingRef(branch).String())
	err = r.remote(ctx, func(ctx context.Context) error {
		return r.indexWithin(ctx, &git.FetchOptions{
			RemoteName: remoteName,
			RefSpecs:   []config.RefSpec{spec},
			Depth:      r.opts.Depth,
			Auth:       r.auth,
			Tags:       git.NoTags,
			// ProxyOptions: the ssh deadline (see sshdeadline.go).
			ProxyOptions: r.proxyOptions(),
		})
	})
	switch {
	case err == nil:
		fetched = true
	case errors.Is(err, git.NoErrAlreadyUpToDate):
	case errors.Is(err, git.NoMatchingRefSpecError{}):
		return "", false, fmt.Errorf("%w: %s on %s", ErrBranchNotFound, branch, redactURL(r.url))
	case errors.Is(err, transport.ErrEmptyRemoteRepository):
		return "", false, fmt.Errorf("%w: %s on %s (empty repository)", ErrBranchNotFound, branch, redactURL(r.url))
	default:
		return "", false, err
	}
	ref, err := r.st.Reference(trackingRef(branch))
	if err != nil {
		return "", false, fmt.Errorf("%w: tracking ref of %s after fetch: %v", ErrObjectMissing, branch, err)
	}
	h := ref.Hash()
	if err := r.verifyCommit(h); err != nil {
		return "", false, err
	}
	for h := range r.missing {
		if _, err := r.st.EncodedObject(plumbing.AnyObject, h); err == nil {
			delete(r.missing, h)
		} else if final {
			r.log.WithField("object", h.String()).Warn("object not on the remote any more; not repairing it again")
			r.absent[h] = struct{}{}
			delete(r.missing, h)
		} else {
			return "", false, fmt.Errorf("%w: %s (found missing by an earlier read)", ErrObjectMissing, h)
		}
	}
	return h.String(), fetched, nil
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

// repair makes the next fetch of branch transfer its objects again: drop
// the tracking ref (so the fetch does not stop at "up to date"), or, with
// reclone set, clone the whole cache afresh and fetch back every branch it
// tracked.
func (r *Repo) repair(ctx context.Context, branch string, reclone bool) error {
	r.mu.Lock()
	if !reclone {
		r.verified = map[plumbing.Hash]struct{}{}
		err := r.st.RemoveReference(trackingRef(branch))
		r.mu.Unlock()
		if err == nil || errors.Is(err, plumbing.ErrReferenceNotFound) {
			return nil
		}
		// The refs themselves are damaged past dropping one.
		r.log.WithError(err).WithField("branch", branch).Warn("cannot drop the tracking ref; cloning the cache afresh")
	} else {
		r.mu.Unlock()
	}
	// A fresh clone throws the cache away: first make sure the remote
	// answers, so a network failure never costs the cache.
	if _, err := r.RemoteHead(ctx, branch); err != nil && !errors.Is(err, ErrBranchNotFound) {
		return err
	}
	r.mu.Lock()
	branches, err := trackedBranches(r.st)
	if err != nil {
		branches = nil // the refs may be part of the damage
	}
	r.log.WithField("branch", branch).Warn("cloning the cache afresh")
	err = r.openStorage(true)
	r.mu.Unlock()
	if err != nil {
		return err
	}
	for _, b := range branches {
		if b == branch {
			continue
		}
		if _, _, err := r.fetchOnce(ctx, b, true); err != nil {
			r.log.WithError(err).WithField("branch", b).Warn("refetch after a fresh clone failed; the next Fetch of it retries")
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

// repairable reports whether err is damage a refetch or a fresh clone can
// mend, as opposed to a network, authentication, timeout or input failure.
func repairable(err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded), errors.Is(err, ErrTimeout),
		errors.Is(err, ErrBranchNotFound), errors.Is(err, ErrObjectFormat), errors.Is(err, ErrTooManyRefs), errors.Is(err, ErrTooManyShallows), errors.Is(err, ErrPackRefused), isUnwritable(err),
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

// remotePrefixDigest digests the names and tips of the remote's branches
// under prefix, from one ref advertisement; none is ErrBranchNotFound.
func (r *Repo) remotePrefixDigest(ctx context.Context, prefix string) (string, error) {
	remote := git.NewRemote(memory.NewStorage(), &config.RemoteConfig{Name: remoteName, URLs: []string{r.url}})
	var refs []*plumbing.Reference
	err := r.remote(ctx, func(ctx context.Context) (err error) {
		refs, err = remote.ListContext(ctx, &git.ListOptions{Auth: r.auth, ProxyOptions: r.proxyOptions()})
		return err
	})
	if errors.Is(err, transport.ErrEmptyRemoteRepository) {
		return "", fmt.Errorf("%w: %s* on %s (empty repository)", ErrBranchNotFound, prefix, redactURL(r.url))
	}
	if err != nil {
		return "", fmt.Errorf("list %s* on %s: %w", prefix, redactURL(r.url), err)
	}
	var lines []string
	want := "refs/heads/" + prefix
	for _, ref := range refs {
		if ref.Type() == plumbing.HashReference && strings.HasPrefix(ref.Name().String(), want) {
			lines = append(lines, ref.Name().String()+" "+ref.Hash().String())
		}
	}
	if len(lines) == 0 {
		return "", fmt.Errorf("%w: no %s* on %s", ErrBranchNotFound, prefix, redactURL(r.url))
	}
	sort.Strings(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(sum[:]), nil
}

// RemoteHead resolves branch's tip on the remote without fetching objects
// (the ref advertisement only, like git ls-remote). It does not touch the
// cache. A remote without the branch gives ErrBranchNotFound (wrapped).
func (r *Repo) RemoteHead(ctx context.Context, branch string) (string, error) {
	if err := checkBranch(branch); err != nil {
		return "", fmt.Errorf("remote head: %w", err)
	}
	remote := git.NewRemote(memory.NewStorage(), &config.RemoteConfig{Name: remoteName, URLs: []string{r.url}})
	var refs []*plumbing.Reference
	err := r.remote(ctx, func(ctx context.Context) (err error) {
		refs, err = remote.ListContext(ctx, &git.ListOptions{Auth: r.auth, ProxyOptions: r.proxyOptions()})
		return err
	})
	if err != nil {
		if errors.Is(err, transport.ErrEmptyRemoteRepository) {
			return "", fmt.Errorf("remote head %s: %w: %s on %s (empty repository)", branch, ErrBranchNotFound, branch, redactURL(r.url))
		}
		return "", fmt.Errorf("remote head %s on %s: %w", branch, redactURL(r.url), err)
	}
	want := plumbing.ReferenceName("refs/heads/" + branch)
	for _, ref := range refs {
		if ref.Name() == want && ref.Type() == plumbing.HashReference {
			return ref.Hash().String(), nil
		}
	}
	return "", fmt.Errorf("remote head %s: %w: %s on %s", branch, ErrBranchNotFound, branch, redactURL(r.url))
}

// FetchPrefix fetches, in one fetch, every branch whose name starts with
// prefix (which must end in "/": "gitfleet/hosts/", say) and returns
// branch → tip commit for each. The refspec is the glob
// +refs/heads/PREFIX*:refs/remotes/origin/PREFIX*, at Options.Depth, with
// pruning: a branch deleted on the remote leaves the answer and the cache.
// No matching branch is an empty map, not an error. Every tip's commit and
// tree are checked present before FetchPrefix returns. Cache damage is
// repaired like Fetch's (the prefix's tracking refs are dropped and the
// fetch repeated; the last resort is a fresh clone). Network and
// authentication failures are returned as they are.
func (r *Repo) FetchPrefix(ctx context.Context, prefix string) (map[string]string, error) {
	if !strings.HasSuffix(prefix, "/") {
		return nil, fmt.Errorf("fetch prefix %q: must end in /", prefix)
	}
	if err := checkBranch(prefix + "x"); err != nil {
		return nil, fmt.Errorf("fetch prefix: %w", err)
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		if attempt > 0 {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("fetch %s*: %w (after %v)", prefix, err, lastErr)
			}
			if err := r.repairPrefix(ctx, prefix, attempt == 2); err != nil {
				if u := r.refusedWrite(err); u != nil {
					err = u
				}
				return nil, fmt.Errorf("fetch %s*: repair cache after %v: %w", prefix, lastErr, err)
			}
		}
		tips, fetched, err := r.fetchPrefixOnce(ctx, prefix)
		if err == nil && fetched && len(tips) > 0 && r.maintain(ctx, someBranch(tips)) {
			// A fresh clone: fetch again, so the tips returned are in it.
			tips, _, err = r.fetchPrefixOnce(ctx, prefix)
		}
		if err == nil {
			return tips, nil
		}
		if u := r.refusedWrite(err); u != nil {
			return nil, fmt.Errorf("fetch %s* from %s: %w", prefix, redactURL(r.url), u)
		}
		if !repairable(err) {
			return nil, fmt.Errorf("fetch %s* from %s: %w", prefix, redactURL(r.url), err)
		}
		r.log.WithError(err).WithField("branch", prefix+"*").WithField("attempt", attempt+1).Warn("fetch found the cache damaged; repairing")
		lastErr = err
	}
	return nil, fmt.Errorf("fetch %s* from %s: %w", prefix, redactURL(r.url), lastErr)
}

// fetchPrefixOnce is one glob fetch of prefix and the check of its tips;
// fetched is whether the remote sent anything (cache upkeep follows only
// then, as for Fetch).
func (r *Repo) fetchPrefixOnce(ctx context.Context, prefix string) (tips map[string]string, fetched bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	spec := config.RefSpec("+refs/heads/" + prefix + "*:" + trackingRef(prefix).String() + "*")
	err = r.remote(ctx, func(ctx context.Context) error {
		return r.indexWithin(ctx, &git.FetchOptions{
			RemoteName:   remoteName,
			RefSpecs:     []config.RefSpec{spec},
			Depth:        r.opts.Depth,
			Auth:         r.auth,
			Tags:         git.NoTags,
			Prune:        true,
			ProxyOptions: r.proxyOptions(),
		})
	})
	switch {
	case err == nil:
		fetched = true
	case errors.Is(err, git.NoErrAlreadyUpToDate):
	case errors.Is(err, transport.ErrEmptyRemoteRepository):
		return map[string]string{}, false, nil
	default:
		return nil, false, err
	}
	iter, err := r.st.IterReferences()
	if err != nil {
		return nil, false, fmt.Errorf("%w: list tracking refs of %s*: %v", ErrObjectMissing, prefix, err)
	}
	tracking := trackingRef(prefix).String()
	tips = map[string]string{}
	err = iter.ForEach(func(ref *plumbing.Reference) error {
		name := ref.Name().String()
		if ref.Type() != plumbing.HashReference || !strings.HasPrefix(name, tracking) {
			return nil
		}
		tips[prefix+strings.TrimPrefix(name, tracking)] = ref.Hash().String()
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("%w: list tracking refs of %s*: %v", ErrObjectMissing, prefix, err)
	}
	for _, tip := range tips {
		if err := r.verifyCommit(plumbing.NewHash(tip)); err != nil {
			return nil, false, err
		}
	}
	return tips, fetched, nil
}

// repairPrefix drops the tracking refs of prefix, so the next fetch
// transfers their objects again, or with reclone set clones the cache
// afresh.
func (r *Repo) repairPrefix(ctx context.Context, prefix string, reclone bool) error {
	if reclone {
		// repair probes the remote with the branch it names; a name
		// under prefix that does not exist is an answer too.
		return r.repair(ctx, prefix+"repair", true)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.verified = map[plumbing.Hash]struct{}{}
	branches, err := trackedBranches(r.st)
	if err != nil {
		return err
	}
	for _, b := range branches {
		if strings.HasPrefix(b, prefix) {
			if err := r.st.RemoveReference(trackingRef(b)); err != nil && !errors.Is(err, plumbing.ErrReferenceNotFound) {
				return err
			}
		}
	}
	return nil
}

// someBranch is one branch of tips (the first by name).
func someBranch(tips map[string]string) string {
	first := ""
	for b := range tips {
		if first == "" || b < first {
			first = b
		}
	}
	return first
}
