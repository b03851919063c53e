package gitsource

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/utils/merkletrie"

	"github.com/gitfleet/gitfleet/desired"
)

// notFoundError is a path absent from a tree: it matches ErrFileNotFound and
// fs.ErrNotExist.
type notFoundError struct {
	commit, path string
}

func (e *notFoundError) Error() string {
	return fmt.Sprintf("%s at %s: %v", e.path, desired.Hash(e.commit).Short(), ErrFileNotFound)
}

func (e *notFoundError) Is(target error) bool {
	return target == ErrFileNotFound || target == fs.ErrNotExist
}

// missingObject records that a read found object h absent, so the next Fetch
// repairs the cache, and returns the error to give the caller. Caller holds
// r.mu.
func (r *Repo) missingObject(what string, h plumbing.Hash, err error) error {
	// A commit beyond a shallow boundary is expected to be absent; trees and
	// blobs of a fetched commit never are.
	// Any other failure to read an object the cache lists (damaged data:
	// "zlib: invalid header") is repaired the same way.
	// A refusal, a deadline or a full disk is no damage.
	expected := r.opts.Depth > 0 && what == "commit" && errors.Is(err, plumbing.ErrObjectNotFound)
	notDamage := errors.Is(err, ErrPackRefused) || errors.Is(err, ErrTimeout) || errors.Is(err, context.Canceled) ||
		errors.Is(err, context.DeadlineExceeded) || isUnwritable(err)
	if !expected && !notDamage {
		if _, gone := r.absent[h]; !gone {
			r.missing[h] = struct{}{}
		}
		r.verified = map[plumbing.Hash]struct{}{}
		r.listed.reset()
	}
	return fmt.Errorf("%w: %s %s: %v", ErrObjectMissing, what, h, err)
}

// resolve turns a commit hash (or a revision such as refs/remotes/origin/main
// or HEAD~1, resolved in the cache) into a commit. Caller holds r.mu.
func (r *Repo) resolve(rev string) (*object.Commit, error) {
	if rev == "" {
		return nil, errors.New("empty commit")
	}
	var h plumbing.Hash
	if plumbing.IsHash(rev) {
		h = plumbing.NewHash(rev)
	} else {
		hp, err := r.repo.ResolveRevision(plumbing.Revision(rev))
		if err != nil {
			return nil, fmt.Errorf("resolve %q: %w", rev, err)
		}
		h = *hp
	}
	c, err := object.GetCommit(r.st, h)
	if err != nil {
		// A commit the caller names may simply not be fetched (yet), or be
		// gone from the remote: not a sign of a damaged cache, so it is not
		// recorded for repair. A missing parent is (see parent).
		return nil, fmt.Errorf("%w: commit %s (not fetched, or not on the remote): %v", ErrObjectMissing, h, err)
	}
	return c, nil
}

// parent loads a commit reached through a parent link: its absence means a
// hole in fetched history, recorded for repair. Caller holds r.mu.
func (r *Repo) parent(h plumbing.Hash) (*object.Commit, error) {
	c, err := object.GetCommit(r.st, h)
	if err != nil {
		return nil, r.missingObject("commit", h, err)
	}
	return c, nil
}

// tree loads a tree object. Caller holds r.mu.
func (r *Repo) tree(h plumbing.Hash) (*object.Tree, error) {
	t, err := object.GetTree(r.st, h)
	if err != nil {
		return nil, r.missingObject("tree", h, err)
	}
	return t, nil
}

// cleanPath checks a slash-separated path relative to a tree root.
func cleanPath(p string) (string, error) {
	if p == "" || p == "." {
		return "", nil
	}
	if strings.HasPrefix(p, "/") || path.Clean(p) != p {
		return "", fmt.Errorf("path %q is not clean and relative", p)
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." || c == "." || c == "" || strings.EqualFold(c, ".git") {
			return "", fmt.Errorf("path %q: component %q not allowed", p, c)
		}
	}
	return p, nil
}

// lookup finds the entry at p under root. A missing path gives a
// notFoundError; a missing object gives ErrObjectMissing (go-git's own
// lookups read both as "not found", which this package must not). Caller
// holds r.mu.
func (r *Repo) lookup(commit string, root plumbing.Hash, p string) (object.TreeEntry, error) {
	entry := object.TreeEntry{Name: "", Mode: filemode.Dir, Hash: root}
	if p == "" {
		return entry, nil
	}
	for _, name := range strings.Split(p, "/") {
		if entry.Mode != filemode.Dir {
			return entry, &notFoundError{commit, p}
		}
		t, err := r.tree(entry.Hash)
		if err != nil {
			return entry, err
		}
		found := false
		for _, e := range t.Entries {
			if e.Name == name {
				entry, found = e, true
				break
			}
		}
		if !found {
			return entry, &notFoundError{commit, p}
		}
	}
	return entry, nil
}

// readBlob reads a blob whole. Caller holds r.mu.
func (r *Repo) readBlob(h plumbing.Hash) ([]byte, error) {
	b, err := object.GetBlob(r.st, h)
	if err != nil {
		return nil, r.missingObject("blob", h, err)
	}
	rd, err := b.Reader()
	if err != nil {
		return nil, r.missingObject("blob", h, err)
	}
	defer rd.Close()
	data, err := io.ReadAll(rd)
	if err != nil {
		return nil, r.missingObject("blob", h, err)
	}
	return data, nil
}

// blobSize is the size of a blob in bytes, cached by hash. Caller holds r.mu.
func (r *Repo) blobSize(h plumbing.Hash) (int64, error) {
	if n, ok := r.sizes[h]; ok {
		return n, nil
	}
	n, err := r.st.EncodedObjectSize(h)
	if err != nil {
		return 0, r.missingObject("blob", h, err)
	}
	if len(r.sizes) > 1<<20 {
		r.sizes = map[plumbing.Hash]int64{}
	}
	r.sizes[h] = n
	return n, nil
}

// ErrFileTooLarge is wrapped by ReadFileMax when a file is bigger than
// the caller's limit; the file's contents were not read.
var ErrFileTooLarge = errors.New("file too large")

// ReadFile reads path at commit. An absent path gives ErrFileNotFound
// (also fs.ErrNotExist); a path that is a directory or a submodule is an
// error; a missing object is ErrObjectMissing, never an empty file.
func (r *Repo) ReadFile(commit, p string) ([]byte, error) { return r.ReadFileMax(commit, p, -1) }

// ReadFileMax is ReadFile for a file of at most max bytes (max < 0: no
// limit). The size is looked up before the blob is read, so a forged file
// of any size costs no memory: a bigger one is an error wrapping
// ErrFileTooLarge that gives its size.
func (r *Repo) ReadFileMax(commit, p string, max int64) ([]byte, error) {
	cp, err := cleanPath(p)
	if err != nil || cp == "" {
		return nil, fmt.Errorf("read %q at %s: bad path: %v", p, desired.Hash(commit).Short(), err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.resolve(commit)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return r.readAt(commit, c.TreeHash, p, cp, max)
}

// readAt is ReadFileMax of the clean path cp (p as the caller gave it) in
// the tree root of commit. Caller holds r.mu.
func (r *Repo) readAt(commit string, root plumbing.Hash, p, cp string, max int64) ([]byte, error) {
	e, err := r.lookup(commit, root, cp)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	if e.Mode == filemode.Dir || e.Mode == filemode.Submodule {
		return nil, fmt.Errorf("read %s at %s: not a file (mode %s)", p, desired.Hash(commit).Short(), e.Mode)
	}
	if max >= 0 {
		n, err := r.blobSize(e.Hash)
		if err != nil {
			return nil, fmt.Errorf("read %s at %s: %w", p, desired.Hash(commit).Short(), err)
		}
		if n > max {
			return nil, fmt.Errorf("read %s at %s: %w: %d bytes, the limit is %d", p, desired.Hash(commit).Short(), ErrFileTooLarge, n, max)
		}
	}
	data, err := r.readBlob(e.Hash)
	if err != nil {
		return nil, fmt.Errorf("read %s at %s: %w", p, desired.Hash(commit).Short(), err)
	}
	return data, nil
}

// Tree returns the tree of commit under dir ("" for the root) as a
// desired.Tree, with blob hashes as File.ID.
//
// A dir absent from the commit gives ErrFileNotFound; a missing object
// (now or during Walk) is ErrObjectMissing, never a smaller tree. Paths of
// the walked files are relative to dir. File.Read reads the blob lazily; it
// stays valid while the cache holds the commit.
func (r *Repo) Tree(commit, dir string) (desired.Tree, error) {
	cd, err := cleanPath(dir)
	if err != nil {
		return nil, fmt.Errorf("tree %q at %s: %w", dir, desired.Hash(commit).Short(), err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.resolve(commit)
	if err != nil {
		return nil, fmt.Errorf("tree %q: %w", dir, err)
	}
	e, err := r.lookup(c.Hash.String(), c.TreeHash, cd)
	if err != nil {
		return nil, fmt.Errorf("tree: %w", err)
	}
	if e.Mode != filemode.Dir {
		return nil, fmt.Errorf("tree %q at %s: not a directory (mode %s)", dir, desired.Hash(commit).Short(), e.Mode)
	}
	return &gitTree{r: r, root: e.Hash}, nil
}

// gitTree is a desired.Tree over a git tree object.
type gitTree struct {
	r    *Repo
	root plumbing.Hash
}

var _ desired.Tree = (*gitTree)(nil)

// Walk implements desired.Tree. The entries are listed under the Repo's
// lock, then fn is called without it (so fn may call File.Read and other
// Repo methods).
func (t *gitTree) Walk(fn func(desired.File) error) error {
	files, err := t.list()
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := fn(f); err != nil {
			return err
		}
	}
	return nil
}

func (t *gitTree) list() ([]desired.File, error) {
	r := t.r
	r.mu.Lock()
	defer r.mu.Unlock()
	var files []desired.File
	var walk, walkTree func(h plumbing.Hash, prefix string) error
	// walk takes a listing from the cache, else lists the tree and
	// caches its listing.
	walk = func(h plumbing.Hash, prefix string) error {
		key := listingKey{tree: h, prefix: prefix}
		if listed, ok := r.listed.get(key); ok {
			files = append(files, listed...)
			return nil
		}
		start := len(files)
		if err := walkTree(h, prefix); err != nil {
			return err
		}
		r.listed.put(key, slices.Clone(files[start:]))
		return nil
	}
	walkTree = func(h plumbing.Hash, prefix string) error {
		tr, err := r.tree(h)
		if err != nil {
			return err
		}
		for _, e := range tr.Entries {
			p := prefix + e.Name
			f := desired.File{Path: p, ID: e.Hash.String()}
			switch e.Mode {
			case filemode.Dir:
				if err := walk(e.Hash, p+"/"); err != nil {
					return err
				}
				continue
			case filemode.Submodule:
				f.Mode = desired.Submodule
				f.Read = func() ([]byte, error) {
					return nil, fmt.Errorf("read %s: a submodule has no contents here", p)
				}
				files = append(files, f)
				continue
			case filemode.Symlink:
				f.Mode = desired.Symlink
			case filemode.Executable:
				f.Mode = desired.Executable
			case filemode.Regular, filemode.Deprecated:
				f.Mode = desired.Regular
			default:
				return fmt.Errorf("tree %s: %s has unknown mode %s", h, p, e.Mode)
			}
			n, err := r.blobSize(e.Hash)
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			f.Size = n
			blob := e.Hash
			f.Read = func() ([]byte, error) {
				r.mu.Lock()
				defer r.mu.Unlock()
				data, err := r.readBlob(blob)
				if err != nil {
					return nil, fmt.Errorf("read %s: %w", p, err)
				}
				return data, nil
			}
			files = append(files, f)
		}
		return nil
	}
	if err := walk(t.root, ""); err != nil {
		return nil, fmt.Errorf("walk tree %s: %w", t.root, err)
	}
	return files, nil
}

// Diff lists the changed paths from one commit's tree to another's, with
// renames detected (by content similarity, as git does). An empty from
// means the empty tree (every file added). Changes come sorted by path.
func (r *Repo) Diff(from, to string) ([]Change, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var a *object.Tree
	if from != "" {
		c, err := r.resolve(from)
		if err != nil {
			return nil, fmt.Errorf("diff: %w", err)
		}
		if a, err = r.tree(c.TreeHash); err != nil {
			return nil, fmt.Errorf("diff: %w", err)
		}
	}
	c, err := r.resolve(to)
	if err != nil {
		return nil, fmt.Errorf("diff: %w", err)
	}
	b, err := r.tree(c.TreeHash)
	if err != nil {
		return nil, fmt.Errorf("diff: %w", err)
	}
	if a == nil {
		a = &object.Tree{}
	}
	changes, err := object.DiffTreeWithOptions(context.Background(), a, b, object.DefaultDiffTreeOptions)
	if err != nil {
		if errors.Is(err, plumbing.ErrObjectNotFound) {
			r.verified = map[plumbing.Hash]struct{}{}
			return nil, fmt.Errorf("diff %s..%s: %w: %v", desired.Hash(from).Short(), desired.Hash(to).Short(), ErrObjectMissing, err)
		}
		return nil, fmt.Errorf("diff %s..%s: %w", desired.Hash(from).Short(), desired.Hash(to).Short(), err)
	}
	out := make([]Change, 0, len(changes))
	for _, ch := range changes {
		action, err := ch.Action()
		if err != nil {
			return nil, fmt.Errorf("diff %s..%s: %w", desired.Hash(from).Short(), desired.Hash(to).Short(), err)
		}
		switch action {
		case merkletrie.Insert:
			out = append(out, Change{To: ch.To.Name})
		case merkletrie.Delete:
			out = append(out, Change{From: ch.From.Name})
		default:
			out = append(out, Change{From: ch.From.Name, To: ch.To.Name})
		}
	}
	return out, nil
}

// CommitInfo describes one commit.
func (r *Repo) CommitInfo(hash string) (*Commit, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.resolve(hash)
	if err != nil {
		return nil, fmt.Errorf("commit info: %w", err)
	}
	return describe(c), nil
}

func describe(c *object.Commit) *Commit {
	parents := make([]string, len(c.ParentHashes))
	for i, p := range c.ParentHashes {
		parents[i] = p.String()
	}
	return &Commit{
		Hash:       c.Hash.String(),
		Author:     fmt.Sprintf("%s <%s>", c.Author.Name, c.Author.Email),
		Time:       c.Author.When,
		Parents:    parents,
		Message:    c.Message,
		Committer:  fmt.Sprintf("%s <%s>", c.Committer.Name, c.Committer.Email),
		CommitTime: c.Committer.When,
	}
}

// shallow returns the cache's shallow boundary commits. Caller holds r.mu.
func (r *Repo) shallow() (map[plumbing.Hash]bool, error) {
	hs, err := r.st.Shallow()
	if err != nil {
		return nil, fmt.Errorf("read shallow list: %w", err)
	}
	out := make(map[plumbing.Hash]bool, len(hs))
	for _, h := range hs {
		out[h] = true
	}
	return out, nil
}

// FirstParents walks first-parent history from commit, newest first, calling
// fn until it returns false or history ends.
//
// History ends at a root commit. A walk that needs a parent beyond a shallow
// boundary returns ErrShallowHistory; a missing commit is ErrObjectMissing.
// An error from fn is returned as it is.
func (r *Repo) FirstParents(from string, fn func(*Commit) (bool, error)) error {
	r.mu.Lock()
	c, err := r.resolve(from)
	if err != nil {
		r.mu.Unlock()
		return fmt.Errorf("first parents: %w", err)
	}
	shallow, err := r.shallow()
	r.mu.Unlock()
	if err != nil {
		return err
	}
	for {
		more, err := fn(describe(c))
		if err != nil || !more {
			return err
		}
		if len(c.ParentHashes) == 0 {
			return nil
		}
		if shallow[c.Hash] {
			return fmt.Errorf("first parents of %s: %w (at %s)", desired.Hash(from).Short(), ErrShallowHistory, desired.Hash(c.Hash.String()).Short())
		}
		parent := c.ParentHashes[0]
		r.mu.Lock()
		c, err = r.parent(parent)
		r.mu.Unlock()
		if err != nil {
			return fmt.Errorf("first parents of %s: %w", desired.Hash(from).Short(), err)
		}
	}
}

// IsAncestor reports whether a is an ancestor of (or equal to) b.
//
// It walks b's history (all parents); a walk that reaches a shallow boundary
// without finding a returns ErrShallowHistory, a missing commit
// ErrObjectMissing: neither is read as "not an ancestor".
func (r *Repo) IsAncestor(a, b string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// a need not be in the cache (it may lie beyond a shallow boundary):
	// only its hash is looked for.
	var target plumbing.Hash
	if plumbing.IsHash(a) {
		target = plumbing.NewHash(a)
	} else {
		ca, err := r.resolve(a)
		if err != nil {
			return false, fmt.Errorf("is ancestor: %w", err)
		}
		target = ca.Hash
	}
	cb, err := r.resolve(b)
	if err != nil {
		return false, fmt.Errorf("is ancestor: %w", err)
	}
	if target == cb.Hash {
		return true, nil
	}
	shallow, err := r.shallow()
	if err != nil {
		return false, err
	}
	// Commit times cannot prune the walk (clocks skew), so it visits every
	// commit reachable from b once.
	seen := map[plumbing.Hash]bool{cb.Hash: true}
	queue := []plumbing.Hash{cb.Hash}
	hitShallow := false
	for len(queue) > 0 {
		h := queue[0]
		queue = queue[1:]
		if shallow[h] {
			hitShallow = true
			continue
		}
		c, err := r.parent(h)
		if err != nil {
			return false, fmt.Errorf("is ancestor: %w", err)
		}
		for _, p := range c.ParentHashes {
			if p == target {
				return true, nil
			}
			if !seen[p] {
				seen[p] = true
				queue = append(queue, p)
			}
		}
	}
	if hitShallow {
		return false, fmt.Errorf("is ancestor %s of %s: %w", desired.Hash(a).Short(), desired.Hash(b).Short(), ErrShallowHistory)
	}
	return false, nil
}

// SignedCommit is a commit's signature and the bytes it signs.
type SignedCommit struct {
	Commit
	// Signature is the commit's gpgsig header as git wrote it (an armored
	// OpenPGP signature, "-----BEGIN PGP SIGNATURE-----", or an SSH
	// signature, "-----BEGIN SSH SIGNATURE-----"); "" when it is unsigned.
	Signature string
	// Payload is the commit object without its signature header: what
	// `git commit -S` signed and `git verify-commit` checks.
	Payload []byte
}

// Signed reads commit's signature and signed payload (go-git's
// EncodeWithoutSignature, the bytes git signs). A commit missing from the
// cache is ErrObjectMissing.
func (r *Repo) Signed(commit string) (*SignedCommit, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.resolve(commit)
	if err != nil {
		return nil, fmt.Errorf("signature: %w", err)
	}
	enc := &plumbing.MemoryObject{}
	if err := c.EncodeWithoutSignature(enc); err != nil {
		return nil, fmt.Errorf("signature of %s: encode: %w", desired.Hash(commit).Short(), err)
	}
	rd, err := enc.Reader()
	if err != nil {
		return nil, fmt.Errorf("signature of %s: %w", desired.Hash(commit).Short(), err)
	}
	defer rd.Close()
	payload, err := io.ReadAll(rd)
	if err != nil {
		return nil, fmt.Errorf("signature of %s: %w", desired.Hash(commit).Short(), err)
	}
	return &SignedCommit{Commit: *describe(c), Signature: c.PGPSignature, Payload: payload}, nil
}
