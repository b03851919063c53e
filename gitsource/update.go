package gitsource

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/mail"
	"sort"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/plumbing/transport/client"

	"github.com/gitfleet/gitfleet/desired"
)

// signature is a commit identity without a time.
type signature struct{ name, email string }

// parseSignature parses "Name <email>"; empty gives DefaultCommitter.
func parseSignature(s string) (signature, error) {
	if s == "" {
		s = DefaultCommitter
	}
	a, err := mail.ParseAddress(s)
	if err != nil {
		return signature{}, fmt.Errorf("%q is not \"Name <email>\": %w", s, err)
	}
	return signature{name: a.Name, email: a.Address}, nil
}

// errRejected marks a push the remote refused because the branch moved (or
// a concurrent push held its lock): Update fetches again and retries.
var errRejected = errors.New("push rejected")

// Update writes one commit to branch by compare-and-swap: fetch, apply
// mutate on the tip, push without force; on rejection, fetch again and
// retry with jittered backoff. It returns the new tip (or the unchanged tip
// when mutate had nothing to write).
//
// A branch absent on the remote is created with a root commit. The commit is
// built in the object store (no worktree) from the tip's tree with the
// mutation's paths replaced or removed; directories left empty disappear, as
// in git. Its push names the fetched tip as the old value, so the remote
// takes it only if the branch still points there. A mutation that changes
// nothing (same contents) writes no commit. An error from mutate stops
// Update and is returned as it is (unless it wraps ErrObjectMissing from
// read: that attempt is retried). After Options.UpdateAttempts rejections
// the error matches ErrConflict; when ctx ends, it matches ctx's error (and
// ErrConflict too if ctx ended while waiting to retry). Update calls on one
// Repo run one at a time.
func (r *Repo) Update(ctx context.Context, branch string, mutate Mutation) (string, error) {
	return r.edit(ctx, branch, mutation(mutate), nil)
}

// UpdateAt is Update whose first attempt builds on tip, the branch's tip
// the caller just fetched (FetchAll; "" when the branch was absent),
// without fetching it again: when the branch is still there the write
// costs one round trip with the remote, the push. When it moved, the push
// is refused as a lost race and the next attempts fetch first, as
// Update's do; a tip the cache does not hold is fetched as well.
func (r *Repo) UpdateAt(ctx context.Context, branch, tip string, mutate Mutation) (string, error) {
	return r.edit(ctx, branch, mutation(mutate), func() (string, bool) { return tip, true })
}

// mutation is mutate as an EditFunc (never replacing the tip).
func mutation(mutate Mutation) EditFunc {
	return func(tip *Commit, read func(string) ([]byte, error)) (Write, error) {
		hash := ""
		if tip != nil {
			hash = tip.Hash
		}
		files, msg, err := mutate(hash, read)
		return Write{Files: files, Message: msg}, err
	}
}

// Write is the commit an EditFunc asks for: Files (path → content, nil
// removes the path; empty: nothing to write) and Message, as a Mutation
// returns them.
//
// ReplaceTip builds the commit on the tip's parents instead of on the tip,
// so the tip leaves the branch's history: the push is a compare-and-swap
// that is not a fast-forward (the remote must allow non-fast-forward
// updates of the branch; git's receive.denyNonFastForwards and a GitHub
// ruleset's "block force pushes" refuse it, and the refusal is returned,
// never retried as a lost race). The new tree is still the tip's tree with
// Files applied. It is ignored on a branch that has no tip yet.
//
// Signer, when set, signs the commit: its signature goes in the commit's
// gpgsig header, over the commit without that header, as `git commit -S`
// does (trust.CommitSigner signs as gpg.format=ssh does). A signing
// failure fails the write; nothing is pushed.
//
// Reuse, when it names a commit the cache holds whose first parent is the
// tip's first parent (a sibling of the tip this Repo wrote before), points
// the branch at that commit instead of building one: a non-fast-forward
// compare-and-swap, as ReplaceTip's, whose push carries the commit and
// the trees and blobs it holds that its parent's tree lacks (the remote
// stores nothing new when it still has them). A commit the cache no
// longer holds, or of another parent, is not reused: the Write is then
// built from Files and Message as if Reuse were empty, so an EditFunc
// that sets it gives both.
type Write struct {
	Files      map[string][]byte
	Message    string
	ReplaceTip bool
	Signer     CommitSigner
	Reuse      string
}

// CommitSigner signs a commit: payload is the commit object without its
// gpgsig header (go-git's EncodeWithoutSignature, the bytes `git
// verify-commit` checks); the result is the armored signature the header
// holds ("-----BEGIN SSH SIGNATURE-----…" or an OpenPGP one). It must be
// safe for concurrent use.
type CommitSigner interface {
	SignCommit(payload []byte) (armored string, err error)
}

// EditFunc is a Mutation that sees the tip commit itself (nil when the
// branch does not exist yet: its message and parents decide whether a
// Write may replace it) and may ask for ReplaceTip. It may run several
// times: once per attempt.
type EditFunc func(tip *Commit, read func(path string) ([]byte, error)) (Write, error)

// Edit is Update with an EditFunc: the same fetch, build and
// compare-and-swap push with retries, where the function may ask for the
// commit to replace the tip (Write.ReplaceTip) instead of following it.
// A writer that alone writes its branch uses it to keep history from
// growing with updates that carry no news.
func (r *Repo) Edit(ctx context.Context, branch string, edit EditFunc) (string, error) {
	return r.edit(ctx, branch, edit, nil)
}

// EditAt is Edit whose first attempt builds on tip, the branch's tip the
// caller just fetched, as UpdateAt's does.
func (r *Repo) EditAt(ctx context.Context, branch, tip string, edit EditFunc) (string, error) {
	return r.edit(ctx, branch, edit, func() (string, bool) { return tip, true })
}

// EditOwn is Edit for a branch that this Repo alone writes (an agent's host
// branch): the first attempt builds on the tip the cache last saw (the
// tracking ref its last fetch or push set) without fetching, which spares
// a round trip with the remote per write. When anything else moved the
// branch the push is refused as a lost race, and the next attempts fetch
// first, as Edit's do. A cache that has not seen the branch fetches.
func (r *Repo) EditOwn(ctx context.Context, branch string, edit EditFunc) (string, error) {
	return r.edit(ctx, branch, edit, func() (string, bool) { return r.trackedTip(branch) })
}

// edit is Edit; first, when set, gives the tip the first attempt builds
// on without fetching (false: fetch as every later attempt does). first
// is called once the writes before this one are done, so a tip it reads
// from the cache is the last one this Repo pushed.
func (r *Repo) edit(ctx context.Context, branch string, edit EditFunc, first func() (string, bool)) (string, error) {
	if err := checkBranch(branch); err != nil {
		return "", fmt.Errorf("update: %w", err)
	}
	r.updateMu.Lock()
	defer r.updateMu.Unlock()
	e := BranchEdit{Branch: branch, Edit: edit}
	if first != nil {
		e.Tip, e.Known = first()
	}
	tips, err := r.updateLoop(ctx, []BranchEdit{e})
	if err != nil {
		return "", err
	}
	return tips[0], nil
}

// updateLoop is the one compare-and-swap loop of Update, Edit and EditMany:
// each attempt takes the branches' tips (attemptTips), runs the edits on
// them, builds the commits and pushes them naming those tips
// (attemptMany). A rejection, or a tip gone from the cache (a fresh clone
// between the fetch and the build), waits a jittered backoff and tries
// again on tips fetched afresh, up to Options.UpdateAttempts; any other
// error ends it. Errors name the branches ("update B1, B2: …").
// Caller holds r.updateMu.
func (r *Repo) updateLoop(ctx context.Context, edits []BranchEdit) ([]string, error) {
	what := strings.Join(editedBranches(edits), ", ")
	attempts := r.attempts()
	var lastErr error
	for attempt := 0; attempt < attempts; attempt++ {
		if err := r.backoff(ctx, attempt); err != nil {
			return nil, fmt.Errorf("update %s: %w: %w (last: %v)", what, ErrConflict, err, lastErr)
		}
		tips, err := r.attemptTips(ctx, edits, attempt)
		if err != nil {
			return nil, err
		}
		newTips, err := r.attemptMany(ctx, edits, tips)
		if err == nil {
			return newTips, nil
		}
		if u := r.refusedWrite(err); u != nil {
			return nil, fmt.Errorf("update %s: %w", what, u)
		}
		if !errors.Is(err, errRejected) && !errors.Is(err, ErrObjectMissing) {
			return nil, fmt.Errorf("update %s: %w", what, err)
		}
		r.log.WithField("branch", what).WithField("attempt", attempt+1).Debug(err.Error())
		lastErr = err
	}
	return nil, fmt.Errorf("update %s: %w after %d attempts: %v", what, ErrConflict, attempts, lastErr)
}

// attemptTips are the tips the edits build on in attempt: an edit's own
// Tip in the first attempt when Known, else its branch's tip fetched now
// ("" for a branch the remote lacks). The branches to fetch are fetched
// together: one ref advertisement and at most one upload-pack.
func (r *Repo) attemptTips(ctx context.Context, edits []BranchEdit, attempt int) ([]string, error) {
	given := func(e BranchEdit) bool { return attempt == 0 && e.Known }
	var fetch []string
	for _, e := range edits {
		if !given(e) {
			fetch = append(fetch, e.Branch)
		}
	}
	var fetched map[string]string
	if len(fetch) > 0 {
		var err error
		if fetched, err = r.FetchAll(ctx, fetch, nil); err != nil {
			return nil, fmt.Errorf("update %s: %w", strings.Join(fetch, ", "), err)
		}
	}
	tips := make([]string, len(edits))
	for i, e := range edits {
		if given(e) {
			tips[i] = e.Tip
		} else {
			tips[i] = fetched[e.Branch]
		}
	}
	return tips, nil
}

// attempts is Options.UpdateAttempts, or its default.
func (r *Repo) attempts() int {
	if r.opts.UpdateAttempts <= 0 {
		return DefaultUpdateAttempts
	}
	return r.opts.UpdateAttempts
}

// backoff waits before attempt (none before the first) a jittered,
// exponentially growing time bounded by Options.MaxBackoff; it returns
// ctx's error when ctx ends first.
func (r *Repo) backoff(ctx context.Context, attempt int) error {
	if attempt == 0 {
		return nil
	}
	base, ceiling := r.opts.Backoff, r.opts.MaxBackoff
	if base <= 0 {
		base = 25 * time.Millisecond
	}
	if ceiling <= 0 {
		ceiling = 2 * time.Second
	}
	wait := base << min(attempt-1, 20)
	if wait > ceiling || wait <= 0 {
		wait = ceiling
	}
	wait = time.Duration(rand.Int64N(int64(wait) + 1))
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// trackedTip is branch's tracking ref when the cache holds its commit.
func (r *Repo) trackedTip(branch string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ref, err := r.st.Reference(trackingRef(branch))
	if err != nil {
		return "", false
	}
	if _, err := r.st.EncodedObject(plumbing.CommitObject, ref.Hash()); err != nil {
		return "", false
	}
	return ref.Hash().String(), true
}

// prepared is a commit an edit asked for, built in the store but not
// pushed: zero commit when there is nothing to write; written holds the
// new objects, replace whether it replaces the tip.
type prepared struct {
	commit  plumbing.Hash
	written []plumbing.Hash
	replace bool
}

// prepare runs edit on tip and builds the commit it asks for.
func (r *Repo) prepare(branch, tip string, edit EditFunc) (prepared, error) {
	// The tip is read once: its commit gives the message and parents the
	// edit sees, and the root tree that reads and the build start from.
	var tipCommit *Commit
	var root plumbing.Hash
	if tip != "" {
		r.mu.Lock()
		c, err := r.resolve(tip)
		r.mu.Unlock()
		if err != nil {
			return prepared{}, fmt.Errorf("commit info: %w", err)
		}
		tipCommit, root = describe(c), c.TreeHash
	}
	read := func(p string) ([]byte, error) {
		if tip == "" {
			return nil, &notFoundError{commit: "(new branch " + branch + ")", path: p}
		}
		cp, err := cleanPath(p)
		if err != nil || cp == "" {
			return nil, fmt.Errorf("read %q at %s: bad path: %v", p, desired.Hash(tip).Short(), err)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.readAt(tip, root, p, cp, -1)
	}
	w, err := edit(tipCommit, read)
	if err != nil || len(w.Files) == 0 {
		return prepared{}, err
	}
	if w.Reuse != "" && tipCommit != nil {
		if p, ok := r.reuse(tipCommit, w.Reuse); ok {
			return p, nil
		}
	}
	var parents []string
	if tipCommit != nil {
		parents = []string{tip}
		if w.ReplaceTip {
			parents = tipCommit.Parents
		}
	}
	commit, written, err := r.build(tip, root, parents, w.Files, w.Message, w.Signer)
	if err != nil {
		return prepared{}, err
	}
	return prepared{commit: commit, written: written, replace: w.ReplaceTip}, nil
}

// reuse prepares pointing the branch at the existing commit hash, a
// sibling of tip (the same first parent); false when the cache does not
// hold it whole or it is no sibling.
func (r *Repo) reuse(tip *Commit, hash string) (prepared, bool) {
	if len(tip.Parents) == 0 || hash == tip.Hash {
		return prepared{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.resolve(hash)
	if err != nil || len(c.ParentHashes) == 0 || c.ParentHashes[0].String() != tip.Parents[0] {
		return prepared{}, false
	}
	parent, err := r.resolve(tip.Parents[0])
	if err != nil {
		return prepared{}, false
	}
	objs := []plumbing.Hash{c.Hash}
	if !r.newTreeObjects(c.TreeHash, parent.TreeHash, &objs) {
		return prepared{}, false
	}
	seen := map[plumbing.Hash]bool{}
	uniq := objs[:0]
	for _, h := range objs { // a pack holds each object once
		if !seen[h] {
			seen[h] = true
			uniq = append(uniq, h)
		}
	}
	return prepared{commit: c.Hash, written: uniq, replace: true}, true
}

// newTreeObjects appends to objs the tree at h and every object under it
// that the tree at old (zero: none) lacks at the same path; false when
// one of them is not in the cache. Caller holds r.mu.
func (r *Repo) newTreeObjects(h, old plumbing.Hash, objs *[]plumbing.Hash) bool {
	if h == old {
		return true
	}
	t, err := object.GetTree(r.st, h)
	if err != nil {
		return false
	}
	*objs = append(*objs, h)
	was := map[string]plumbing.Hash{}
	if !old.IsZero() {
		if ot, err := object.GetTree(r.st, old); err == nil {
			for _, e := range ot.Entries {
				was[e.Name] = e.Hash
			}
		}
	}
	for _, e := range t.Entries {
		switch {
		case was[e.Name] == e.Hash || e.Mode == filemode.Submodule:
		case e.Mode == filemode.Dir:
			if !r.newTreeObjects(e.Hash, was[e.Name], objs) {
				return false
			}
		default:
			if _, err := r.st.EncodedObject(plumbing.BlobObject, e.Hash); err != nil {
				return false
			}
			*objs = append(*objs, e.Hash)
		}
	}
	return true
}

// pack encodes the objects hs (each once) as a pack to push.
func (r *Repo) pack(hs []plumbing.Hash) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var buf bytes.Buffer
	if _, err := encodePack(&buf, r.st, hs); err != nil {
		return nil, fmt.Errorf("pack new objects: %w", err)
	}
	return buf.Bytes(), nil
}

// pushed records the new tips of pushed updates as tracking refs.
func (r *Repo) pushed(ups []refUpdate) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, u := range ups {
		if err := r.st.SetReference(plumbing.NewHashReference(trackingRef(u.branch), u.new)); err != nil {
			// The push stands; the next Fetch sets the tracking ref.
			r.log.WithError(err).WithField("branch", u.branch).Warn("record pushed tip")
		}
	}
}

// build writes the commit of files on tip's tree (root; zero for a new
// branch), with parents, into the store and returns it with the new
// objects (for the pack), signed by signer when it is not nil. A zero hash means the
// tree did not change (and the parents are tip itself).
func (r *Repo) build(tip string, root plumbing.Hash, parents []string, files map[string][]byte, msg string, signer CommitSigner) (plumbing.Hash, []plumbing.Hash, error) {
	edits := make(map[string][]byte, len(files))
	for p, data := range files {
		cp, err := cleanPath(p)
		if err != nil || cp == "" {
			return plumbing.ZeroHash, nil, fmt.Errorf("bad path %q: %v", p, err)
		}
		edits[cp] = data
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	b := &builder{r: r}
	parentHashes := make([]plumbing.Hash, len(parents))
	for i, p := range parents {
		parentHashes[i] = plumbing.NewHash(p)
	}
	replacing := tip != "" && !(len(parents) == 1 && parents[0] == tip)
	newRoot, err := b.edit(root, edits)
	if err != nil {
		return plumbing.ZeroHash, nil, err
	}
	if newRoot == root && !replacing {
		// Nothing changed (or, on a new branch, only absent paths were
		// removed): no commit.
		return plumbing.ZeroHash, nil, nil
	}
	if newRoot.IsZero() {
		// Every file removed: git records the empty tree.
		if newRoot, err = b.writeTree(nil); err != nil {
			return plumbing.ZeroHash, nil, err
		}
	}
	now := time.Now()
	sig := object.Signature{Name: r.committer.name, Email: r.committer.email, When: now}
	if msg == "" {
		msg = "gitfleet update"
	}
	if !strings.HasSuffix(msg, "\n") {
		msg += "\n"
	}
	c := &object.Commit{Author: sig, Committer: sig, Message: msg, TreeHash: newRoot, ParentHashes: parentHashes}
	if signer != nil {
		if c.PGPSignature, err = signCommit(c, signer); err != nil {
			return plumbing.ZeroHash, nil, err
		}
	}
	ch, err := b.store(c)
	if err != nil {
		return plumbing.ZeroHash, nil, err
	}
	return ch, b.written, nil
}

// signCommit signs c's encoding without a signature, the payload git
// signs and verifies.
func signCommit(c *object.Commit, signer CommitSigner) (string, error) {
	enc := &plumbing.MemoryObject{}
	if err := c.EncodeWithoutSignature(enc); err != nil {
		return "", fmt.Errorf("sign commit: encode: %w", err)
	}
	rd, err := enc.Reader()
	if err != nil {
		return "", fmt.Errorf("sign commit: %w", err)
	}
	defer rd.Close()
	payload, err := io.ReadAll(rd)
	if err != nil {
		return "", fmt.Errorf("sign commit: %w", err)
	}
	armored, err := signer.SignCommit(payload)
	if err != nil {
		return "", fmt.Errorf("sign commit: %w", err)
	}
	if strings.TrimSpace(armored) == "" {
		return "", errors.New("sign commit: the signer returned no signature")
	}
	return armored, nil
}

// builder edits trees in the object store and remembers what it wrote
// (each object once: a pack must not hold one twice).
type builder struct {
	r       *Repo
	written []plumbing.Hash
	seen    map[plumbing.Hash]bool
}

// encodable is an object go-git can encode (blob data aside).
type encodable interface {
	Encode(plumbing.EncodedObject) error
}

func (b *builder) store(o encodable) (plumbing.Hash, error) {
	obj := b.r.st.NewEncodedObject()
	if err := o.Encode(obj); err != nil {
		return plumbing.ZeroHash, err
	}
	return b.put(obj)
}

func (b *builder) put(obj plumbing.EncodedObject) (plumbing.Hash, error) {
	h, err := b.r.st.SetEncodedObject(obj)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("store object: %w", err)
	}
	if !b.seen[h] {
		if b.seen == nil {
			b.seen = map[plumbing.Hash]bool{}
		}
		b.seen[h] = true
		b.written = append(b.written, h)
	}
	return h, nil
}

func (b *builder) writeBlob(data []byte) (plumbing.Hash, error) {
	obj := b.r.st.NewEncodedObject()
	obj.SetType(plumbing.BlobObject)
	obj.SetSize(int64(len(data)))
	w, err := obj.Writer()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if _, err := w.Write(data); err != nil {
		return plumbing.ZeroHash, err
	}
	if err := w.Close(); err != nil {
		return plumbing.ZeroHash, err
	}
	return b.put(obj)
}

// writeTree stores a tree of entries, sorted the way git sorts them
// (a directory sorts as if its name ended in "/").
func (b *builder) writeTree(entries []object.TreeEntry) (plumbing.Hash, error) {
	sort.Slice(entries, func(i, j int) bool {
		return sortName(entries[i]) < sortName(entries[j])
	})
	return b.store(&object.Tree{Entries: entries})
}

func sortName(e object.TreeEntry) string {
	if e.Mode == filemode.Dir {
		return e.Name + "/"
	}
	return e.Name
}

// edit applies edits (paths relative to the tree at h, nil data removes) and
// returns the new tree's hash: zero when the tree ends up empty, h itself
// when nothing changed. A path's write or removal replaces whatever the
// tree holds there (a directory where a file is written, a file where a
// directory is written under): these trees are the writer's, and an entry
// of another kind in the way is someone else's, never a reason to stop
// writing.
func (b *builder) edit(h plumbing.Hash, edits map[string][]byte) (plumbing.Hash, error) {
	t, err := b.level(h)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	files, dirs, err := splitEdits(edits)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	for name, data := range files {
		if err := b.editFile(t, name, data); err != nil {
			return plumbing.ZeroHash, err
		}
	}
	for name, sub := range dirs {
		if err := b.editDir(t, name, sub); err != nil {
			return plumbing.ZeroHash, err
		}
	}
	if !t.changed {
		return h, nil
	}
	return b.writeLevel(t)
}

// splitEdits splits edits into this level's files (name → data) and the
// edits under each subdirectory (name → paths relative to it). Removals
// under a path written itself are subsumed by the write; a path written
// both as a file and under as a directory is an error.
func splitEdits(edits map[string][]byte) (files map[string][]byte, dirs map[string]map[string][]byte, err error) {
	files, dirs = map[string][]byte{}, map[string]map[string][]byte{}
	for p, data := range edits {
		dir, rest, nested := strings.Cut(p, "/")
		if !nested {
			files[p] = data
			continue
		}
		if dirs[dir] == nil {
			dirs[dir] = map[string][]byte{}
		}
		dirs[dir][rest] = data
	}
	for name := range files {
		if sub, clash := dirs[name]; clash {
			if !allNil(sub) {
				return nil, nil, fmt.Errorf("write %s: also written as a directory", name)
			}
			delete(dirs, name)
		}
	}
	return files, dirs, nil
}

// treeLevel is one tree while builder.edit changes it: its entries, each
// one's index by name, the names removed, and whether anything changed.
type treeLevel struct {
	entries []object.TreeEntry
	index   map[string]int
	removed map[string]bool
	changed bool
}

// level reads the tree at h (zero: a tree that does not exist yet) for
// editing.
func (b *builder) level(h plumbing.Hash) (*treeLevel, error) {
	t := &treeLevel{index: map[string]int{}, removed: map[string]bool{}}
	if !h.IsZero() {
		tree, err := b.r.tree(h)
		if err != nil {
			return nil, err
		}
		t.entries = append(t.entries, tree.Entries...)
	}
	for i, e := range t.entries {
		t.index[e.Name] = i
	}
	return t, nil
}

// put sets name's entry to mode and hash, adding it when absent.
func (t *treeLevel) put(name string, mode filemode.FileMode, hash plumbing.Hash) {
	if i, exists := t.index[name]; exists {
		if t.entries[i].Hash != hash || t.entries[i].Mode != mode {
			t.entries[i].Hash, t.entries[i].Mode = hash, mode
			t.changed = true
		}
		return
	}
	t.index[name] = len(t.entries)
	t.entries = append(t.entries, object.TreeEntry{Name: name, Mode: mode, Hash: hash})
	t.changed = true
}

// remove drops name's entry.
func (t *treeLevel) remove(name string) {
	t.removed[name] = true
	t.changed = true
}

// editFile writes data as the file name of t, or removes whatever t holds
// there when data is nil. An executable file stays executable; a
// directory in the way is replaced.
func (b *builder) editFile(t *treeLevel, name string, data []byte) error {
	i, exists := t.index[name]
	if data == nil {
		if exists {
			t.remove(name)
		}
		return nil
	}
	bh, err := b.writeBlob(data)
	if err != nil {
		return err
	}
	mode := filemode.Regular
	if exists && t.entries[i].Mode == filemode.Executable {
		mode = filemode.Executable
	}
	t.put(name, mode, bh)
	return nil
}

// editDir applies sub to the directory name of t: a directory left empty
// is removed, a file in the way is replaced, unless sub only removes
// (there is nothing under a file to remove).
func (b *builder) editDir(t *treeLevel, name string, sub map[string][]byte) error {
	var old plumbing.Hash
	if i, exists := t.index[name]; exists {
		if t.entries[i].Mode != filemode.Dir && allNil(sub) {
			return nil
		}
		if t.entries[i].Mode == filemode.Dir {
			old = t.entries[i].Hash
		}
	}
	nh, err := b.edit(old, sub)
	if err != nil {
		return fmt.Errorf("%s/%w", name, err)
	}
	switch {
	case nh == old:
	case nh.IsZero():
		t.remove(name)
	default:
		t.put(name, filemode.Dir, nh)
	}
	return nil
}

// writeLevel stores t's entries but the removed ones as a tree: zero
// when none is left.
func (b *builder) writeLevel(t *treeLevel) (plumbing.Hash, error) {
	kept := t.entries[:0]
	for _, e := range t.entries {
		if !t.removed[e.Name] {
			kept = append(kept, e)
		}
	}
	if len(kept) == 0 {
		return plumbing.ZeroHash, nil
	}
	return b.writeTree(kept)
}

// allNil reports whether edits only remove.
func allNil(edits map[string][]byte) bool {
	for _, data := range edits {
		if data != nil {
			return false
		}
	}
	return true
}

// refUpdate is one branch a push moves from old (a full hash; "" for a
// branch to create) to new.
type refUpdate struct {
	branch string
	old    string
	new    plumbing.Hash
}

// errNoAtomic marks an atomic push the remote cannot take: it does not
// advertise git's atomic capability (receive.advertiseAtomic false, or a
// server without it). Nothing was sent.
var errNoAtomic = errors.New("the remote does not advertise atomic pushes")

// push sends ups (whose new objects are in pack) in one receive-pack,
// naming each branch's old value as the value it must still have. With
// atomic, the remote takes all of them or none (git's atomic capability;
// errNoAtomic when it lacks it). A refusal because a branch moved is
// errRejected: found in the ref advertisement before anything is sent,
// or reported by the remote (pushOutcome).
func (r *Repo) push(ctx context.Context, ups []refUpdate, pack []byte, atomic bool) error {
	what := strings.Join(branchesOf(ups), ", ")
	sess, err := r.receivePack(what)
	if err != nil {
		return err
	}
	defer sess.Close()
	ar, err := sess.AdvertisedReferencesContext(ctx)
	if err != nil {
		return fmt.Errorf("push %s: %w", what, err)
	}
	req, err := pushRequest(what, ar, ups, atomic)
	if err != nil {
		return err
	}
	req.Packfile = io.NopCloser(bytes.NewReader(pack))
	if !ar.Capabilities.Supports(capability.ReportStatus) {
		return fmt.Errorf("push %s: the remote does not report status", what)
	}
	said := askRemoteMessages(ar, req)
	rs, err := sess.ReceivePack(ctx, req)
	return pushOutcome(what, rs, err, said)
}

// receivePack opens a receive-pack session with the remote, within the
// ssh deadline (see sshdeadline.go).
func (r *Repo) receivePack(what string) (transport.ReceivePackSession, error) {
	ep, err := transport.NewEndpoint(r.url)
	if err != nil {
		return nil, err
	}
	ep.Proxy = r.proxyOptions()
	cl, err := client.NewClient(ep)
	if err != nil {
		return nil, err
	}
	sess, err := cl.NewReceivePackSession(ep, r.auth)
	if err != nil {
		return nil, fmt.Errorf("push %s: %w", what, err)
	}
	return sess, nil
}

// pushRequest is the update request for ups: one command per branch from
// its old value to its new one, atomic when asked. A branch whose
// advertised value is not its old one is errRejected: it moved, and
// nothing is sent.
func pushRequest(what string, ar *packp.AdvRefs, ups []refUpdate, atomic bool) (*packp.ReferenceUpdateRequest, error) {
	if atomic && !ar.Capabilities.Supports(capability.Atomic) {
		return nil, fmt.Errorf("push %s: %w", what, errNoAtomic)
	}
	refs, err := ar.AllReferences()
	if err != nil {
		return nil, fmt.Errorf("push %s: %w", what, err)
	}
	req := packp.NewReferenceUpdateRequestFromCapabilities(ar.Capabilities)
	if atomic {
		if err := req.Capabilities.Set(capability.Atomic); err != nil {
			return nil, fmt.Errorf("push %s: %w", what, err)
		}
	}
	for _, u := range ups {
		name := plumbing.ReferenceName("refs/heads/" + u.branch)
		old := plumbing.ZeroHash
		if u.old != "" {
			old = plumbing.NewHash(u.old)
		}
		current := plumbing.ZeroHash
		if ref, err := refs.Reference(name); err == nil {
			current = ref.Hash()
		}
		if current != old {
			return nil, fmt.Errorf("%w: %s moved from %s to %s", errRejected, u.branch, desired.Hash(old.String()).Short(), desired.Hash(current.String()).Short())
		}
		req.Commands = append(req.Commands, &packp.Command{Name: name, Old: old, New: u.new})
	}
	return req, nil
}

// pushOutcome reads the remote's answer to a push, its report rs and
// the session's err: nil when it took every update, errRejected when it
// refused one as a lost race, else the failure; a refused update is
// ErrPushRefused, with what the remote said (said) during the push.
func pushOutcome(what string, rs *packp.ReportStatus, err error, said *remoteMessages) error {
	if rs == nil {
		if err != nil && pushRejected(err) {
			return fmt.Errorf("%w: %v", errRejected, err)
		}
		if err != nil {
			return fmt.Errorf("push %s: %w%s", what, err, remoteSays(said))
		}
		return fmt.Errorf("push %s: no report from the remote", what)
	}
	if failed := rs.Error(); failed != nil {
		// In an atomic push every ref reports the failure of one: git
		// says "atomic transaction failed" for all of them when a ref's
		// lock found another value (the old values were checked just
		// before, so a concurrent push moved it), "atomic push failure"
		// for the others when one ref's update was refused.
		for _, cs := range rs.CommandStatuses {
			if cerr := cs.Error(); cerr != nil && (pushRejected(cerr) || strings.Contains(cerr.Error(), "atomic transaction failed")) {
				return fmt.Errorf("%w: %v", errRejected, cerr)
			}
		}
		if pushRejected(failed) {
			return fmt.Errorf("%w: %v", errRejected, failed)
		}
		return fmt.Errorf("push %s: %w", what, &refusedError{reason: failed, said: said.said()})
	}
	if err != nil {
		return fmt.Errorf("push %s: %w", what, err)
	}
	return nil
}

// remoteSays is "; the remote says: …" with what the remote said during
// a push, "" when it said nothing.
func remoteSays(said *remoteMessages) string {
	if s := said.said(); s != "" {
		return "; the remote says: " + s
	}
	return ""
}

// refusedError is a ref update the remote refused (ErrPushRefused): its
// report's reason, and what the remote said during the push.
type refusedError struct {
	reason error
	said   string
}

func (e *refusedError) Error() string {
	msg := ErrPushRefused.Error() + ": " + e.reason.Error()
	if e.said != "" {
		msg += "; the remote says: " + e.said
	}
	return msg
}

func (e *refusedError) Unwrap() []error { return []error{ErrPushRefused, e.reason} }

// RemoteMessage is what the remote said when it refused a push in err's
// chain (ErrPushRefused): its hook's output, one printable line of at
// most 2 KiB; "" when err holds no refusal or the remote said nothing.
func RemoteMessage(err error) string {
	var r *refusedError
	if errors.As(err, &r) {
		return r.said
	}
	return ""
}

// refusedNonFastForward recognizes a remote's refusal of a push that
// replaces the tip: git's receive.denyNonFastForwards reports
// "non-fast-forward" for it, a git host's protected branch or ruleset a
// refused force push or a declined hook. push checked the old value just
// before, so a lost race reads as a failed ref lock, not as these.
func refusedNonFastForward(err error) bool {
	msg := strings.ToLower(err.Error())
	for _, s := range []string{"non-fast-forward", "force-push", "force push", "protected branch", "declined"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// pushRejected recognizes git receive-pack's refusals of a ref update that
// lost a race: the ref moved or was locked by a concurrent push.
func pushRejected(err error) bool {
	msg := strings.ToLower(err.Error())
	for _, s := range []string{
		"failed to update ref", "failed to lock", "cannot lock ref", "stale info",
		"non-fast-forward", "fetch first", "reference has changed", "but expected",
	} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
