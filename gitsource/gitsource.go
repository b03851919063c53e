// Package gitsource is everything gitfleet does with git, over go-git: open or
// clone a remote (file, http(s), ssh) into a cache directory, fetch one
// branch, resolve a remote head cheaply, read a tree at a commit without a
// worktree, diff two trees, walk first-parent history, and write one commit
// to one branch by compare-and-swap push (never force: the old tip is
// always named), retrying on rejection; Edit may replace the tip rather
// than follow it; FetchAll fetches several branches and every branch
// under a prefix in one fetch, and UpdateAt writes on the tip it just
// fetched without fetching again. A git failure is always returned as an error, never as an
// empty tree. It owns no branch file of gitfleet's: callers name branches
// and paths.
//
// A Repo keeps one local cache of one remote: a bare repository in
// Options.CacheDir, or memory storage. Every branch is fetched with an explicit
// refspec into its remote-tracking ref (+refs/heads/B:refs/remotes/origin/B).
// Damage to the cache (a missing object, an empty or garbage ref file, a
// truncated pack, a stale lock, a missing HEAD, a reference changed under us,
// a shallow-history gap; a pack whose trailer its index does not record is
// dropped at Open) is repaired by fetching again and, as the last
// resort, by cloning the cache afresh (every tracked branch fetched back in
// one fetch); it is never read as an empty tree. Fetch, FetchPrefix and
// FetchAll share that one loop and repair.
// Every operation with the remote ends by Options.Timeout on every
// transport (ErrTimeout), the indexing of the fetched pack included; a
// SHA-256 repository is ErrObjectFormat. What a remote sends is bounded:
// its ref advertisement (ErrTooManyRefs), its shallow lines
// (ErrTooManyShallows), the delta chains and expansion of its pack
// (ErrPackRefused, within Options.MaxSpill of spill files).
//
// A typical reader fetches, then reads at the commit Fetch returned:
//
//	tip, err := repo.Fetch(ctx, "main")        // ErrBranchNotFound: no branch yet
//	tree, err := repo.Tree(tip, "")            // a desired.Tree for the loader
//	changes, err := repo.Diff(lastTip, tip)    // renames paired
//
// A writer hands Update a function of the tip; it runs once per attempt:
//
//	tip, err := repo.Update(ctx, "gitfleet/status", func(tip string, read func(string) ([]byte, error)) (map[string][]byte, string, error) {
//		return map[string][]byte{"hosts/hv-a.yaml": data}, "status of hv-a", nil
//	})
//
// All methods of a Repo are safe for concurrent use; reads and fetches of
// one Repo take turns on its cache, Updates run one at a time. One CacheDir
// belongs to one Repo at a time. The cache keeps itself compact: past 16
// pack files (each fetch adds one) or 2048 loose objects (each Update adds
// a few) they are merged, and a memory cache whose object data grew past
// 16 MiB and fourfold since its last clone is cloned afresh.
package gitsource

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-git/go-billy/v5/osfs"
	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/storage"
	"github.com/go-git/go-git/v5/storage/filesystem"
	"github.com/go-git/go-git/v5/storage/memory"
	"github.com/sirupsen/logrus"
)

// Sentinel errors callers test with errors.Is.
var (
	// ErrBranchNotFound: the remote has no such branch (yet).
	ErrBranchNotFound = errors.New("branch not found")
	// ErrFileNotFound: the path does not exist in the tree of that commit.
	// It also matches fs.ErrNotExist.
	ErrFileNotFound = errors.New("file not found")
	// ErrNotAFile: the path names a directory or a submodule, not a file.
	// On the gitfleet branches, whose files anyone who can push may
	// replace, it is read like a file that does not parse.
	ErrNotAFile = errors.New("not a file")
	// ErrShallowHistory: a history walk reached the boundary of a shallow
	// fetch (Options.Depth > 0); the older history is not in the cache. It is
	// never read as "history ends here".
	ErrShallowHistory = errors.New("history beyond a shallow fetch is not available")
	// ErrConflict: Update was rejected on every attempt (the branch kept
	// moving under it), or the context ended while it was retrying.
	ErrConflict = errors.New("update kept being rejected")
	// ErrNonFastForward: the remote refused a Write with ReplaceTip
	// because it allows only fast-forward updates of the branch (git's
	// receive.denyNonFastForwards, a protected branch or a ruleset that
	// blocks force pushes). It is not retried: write without ReplaceTip.
	ErrNonFastForward = errors.New("remote refuses non-fast-forward updates")
	// ErrPushRefused: the remote refused a ref update for a reason other
	// than a lost race (a pre-receive hook declined, a protected branch,
	// a quota). The error's text carries the remote's own message where
	// it sent one ("the remote says: …", at most 2 KiB, one printable
	// line). It is not retried: nothing changes until the remote's
	// owner does.
	ErrPushRefused = errors.New("the remote refused the update")
	// ErrObjectMissing: an object the cache should hold is absent or
	// unreadable. Fetch repairs the cache; the read is never taken as empty.
	ErrObjectMissing = errors.New("git object missing from cache")
	// ErrTimeout: a git operation with the remote (fetch, ls-remote, push)
	// ran past Options.Timeout and was stopped (the connection closed, a
	// local git server process killed). The error also matches
	// context.DeadlineExceeded. Nothing in the cache changed for it.
	ErrTimeout = errors.New("git operation timed out")
	// ErrObjectFormat: the remote's repository uses an object format
	// gitsource cannot read (SHA-256; go-git reads SHA-1 only). No repair
	// helps; the repository must be SHA-1.
	ErrObjectFormat = errors.New("unsupported git object format")
	// ErrCacheUnwritable: the filesystem of the cache refused a write: it
	// is full (ENOSPC), over quota (EDQUOT) or read-only (EROFS). The
	// error names the cache directory. Nothing is repaired (a fresh clone
	// needs more room, not less) and nothing the cache held is lost: the
	// operation succeeds again once there is room.
	ErrCacheUnwritable = errors.New("cache filesystem refuses writes")
)

// DefaultTimeout bounds one git operation with the remote when
// Options.Timeout is zero.
const DefaultTimeout = 60 * time.Second

// DefaultCommitter is the identity of commits written by Update when
// Options.Committer is empty.
const DefaultCommitter = "gitfleet <gitfleet@localhost>"

// DefaultUpdateAttempts bounds the attempts of one Update when
// Options.UpdateAttempts is zero.
const DefaultUpdateAttempts = 10

// Auth holds credentials for a remote. Token is sent as HTTP basic auth
// password (user Username, or "git" when empty); Username/Password is plain
// basic auth; SSHKeyFile is a private key for ssh:// and scp-like URLs, checked
// against KnownHostsFile (default ~/.ssh/known_hosts).
type Auth struct {
	Username       string
	Password       string
	Token          string
	SSHKeyFile     string
	KnownHostsFile string
}

// Options configure Open.
type Options struct {
	// URL of the remote: file://, a local path, http(s)://, ssh:// or scp-like.
	URL string
	// CacheDir holds the local bare clone; empty keeps it in memory. It must
	// be absent, empty, or a cache a previous Open made (holding HEAD,
	// objects, refs or config): Open refuses any other non-empty
	// directory, since a repair may delete the cache. Entries of a cache
	// that are not git's are logged and kept, a repair included.
	// One CacheDir belongs to one Repo (one process) at a time.
	CacheDir string
	Auth     Auth
	// Depth limits fetches to that many commits per branch (0 = full). Agents
	// use 1 for the snapshots branch.
	Depth int
	// Committer is author and committer of commits written by Update, as
	// "Name <email>"; empty means DefaultCommitter.
	Committer string
	// UpdateAttempts bounds the fetch-build-push attempts of one Update; 0
	// means DefaultUpdateAttempts.
	UpdateAttempts int
	// Backoff is the base of Update's jittered exponential backoff between
	// attempts (the n-th wait is random in [0, Backoff·2ⁿ], at most
	// MaxBackoff); 0 means 25 ms.
	Backoff time.Duration
	// MaxBackoff caps one wait between Update attempts; 0 means 2 s.
	MaxBackoff time.Duration
	// Timeout bounds each operation with the remote — one fetch, one
	// ls-remote, one push — on every transport: an http request is
	// cancelled, a local (file) or ssh server is killed or disconnected
	// when it passes. 0 means DefaultTimeout. A caller's context can end
	// an operation sooner.
	Timeout time.Duration
	// MaxSpill bounds, in bytes, the temporary files that indexing a
	// fetched pack, or reading one object through its delta chain, may
	// hold at once beside the cache (large delta bases and results go to
	// disk, not memory); 0 means max(DefaultMaxSpill, 4 × the pack's
	// size). Past it the fetch or read fails with ErrPackRefused naming
	// the object: a small pack that expands past it is a delta bomb.
	MaxSpill int64
	// Logger receives the package's log lines; nil means the standard logrus
	// logger. The component field is set to "gitsource".
	Logger *logrus.Entry
}

// Commit describes one commit.
type Commit struct {
	Hash    string
	Author  string // "Name <email>"
	Time    time.Time
	Parents []string
	Message string
	// Committer is "Name <email>" of the committer, CommitTime the commit
	// time (Time is the author time).
	Committer  string
	CommitTime time.Time
}

// Change is one path changed between two trees. From is empty for an added
// file, To for a removed one; both are set (and differ) for a rename. Both
// are set and equal for a file modified in place.
type Change struct {
	From string
	To   string
}

// Mutation computes the files to write on top of tip (the branch tip just
// fetched, empty when the branch does not exist yet); read reads a file at tip
// (ErrFileNotFound when absent). It returns path → new content, where a nil
// content removes the path, and the commit message. An empty map means
// nothing to write. A Mutation may run several times: once per attempt.
type Mutation func(tip string, read func(path string) ([]byte, error)) (map[string][]byte, string, error)

// remoteName is the name of the one remote of a cache.
const remoteName = "origin"

// Repo is one remote and its local cache. Its methods are safe for concurrent
// use.
type Repo struct {
	opts      Options
	url       string
	auth      transport.AuthMethod
	committer signature
	log       *logrus.Entry

	// mu guards every access to the storage and the fields below it. go-git
	// storage is not safe for concurrent use, so reads take it too.
	mu   sync.Mutex
	st   storage.Storer
	repo *git.Repository
	// verified holds tree hashes whose whole subtree is known present.
	verified map[plumbing.Hash]struct{}
	// missing holds objects a read found absent; the next Fetch repairs
	// them. absent holds objects a fresh clone did not bring back (the
	// remote no longer has them): they are not repaired again.
	missing map[plumbing.Hash]struct{}
	absent  map[plumbing.Hash]struct{}
	sizes   map[plumbing.Hash]int64
	// listed caches the listings of tree objects (Tree's Walk).
	listed listings
	// baseline is the size of the cache after its last fresh clone: bytes
	// of object data in memory, bytes of packs on disk (see maintain).
	baseline int64

	// updateMu serializes Update calls.
	updateMu sync.Mutex
	// noAtomic is set once the remote was seen to take no atomic
	// pushes (EditMany then pushes one branch at a time).
	noAtomic atomic.Bool
}

// Open opens (or clones into opts.CacheDir) the remote. It does not fetch.
func Open(ctx context.Context, opts Options) (*Repo, error) {
	if opts.URL == "" {
		return nil, errors.New("open git source: empty URL")
	}
	u, err := normalizeURL(opts.URL)
	if err != nil {
		return nil, fmt.Errorf("open git source %s: %w", redactURL(opts.URL), err)
	}
	auth, err := opts.Auth.method(u)
	if err != nil {
		return nil, fmt.Errorf("open git source %s: %w", redactURL(opts.URL), err)
	}
	sig, err := parseSignature(opts.Committer)
	if err != nil {
		return nil, fmt.Errorf("open git source %s: committer: %w", redactURL(opts.URL), err)
	}
	opts.CacheDir = resolveCacheDir(opts.CacheDir)
	log := opts.Logger
	if log == nil {
		log = logrus.NewEntry(logrus.StandardLogger())
	}
	r := &Repo{
		opts:      opts,
		url:       u,
		auth:      auth,
		committer: sig,
		log:       log.WithField("component", "gitsource"),
		verified:  map[plumbing.Hash]struct{}{},
		missing:   map[plumbing.Hash]struct{}{},
		absent:    map[plumbing.Hash]struct{}{},
		sizes:     map[plumbing.Hash]int64{},
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.openStorage(false); err != nil {
		if u := r.unwritable(err); u != nil {
			err = u
		}
		return nil, fmt.Errorf("open git source %s: %w", redactURL(opts.URL), err)
	}
	return r, nil
}

// unwritableErrnos are the errors of a filesystem that takes no more
// writes, and unwritableText their messages (for an error go-git
// flattened into text).
var (
	unwritableErrnos = []error{syscall.ENOSPC, syscall.EDQUOT, syscall.EROFS}
	unwritableText   = []string{"no space left on device", "disk quota exceeded", "read-only file system"}
)

// isUnwritable reports whether err is a filesystem's refusal of a write.
func isUnwritable(err error) bool {
	if err == nil {
		return false
	}
	for _, e := range append(unwritableErrnos, ErrCacheUnwritable) {
		if errors.Is(err, e) {
			return true
		}
	}
	msg := strings.ToLower(err.Error())
	for _, t := range unwritableText {
		if strings.Contains(msg, t) {
			return true
		}
	}
	return false
}

// refusedWrite is unwritable for an operation that wrote to the cache:
// the temporary files of the failed write only take room the next one
// needs, so they are removed. Caller does not hold r.mu (every writer of
// the cache holds it).
func (r *Repo) refusedWrite(err error) error {
	u := r.unwritable(err)
	if u != nil && r.opts.CacheDir != "" {
		r.mu.Lock()
		sweepLeftovers(r.opts.CacheDir, r.log)
		r.mu.Unlock()
	}
	return u
}

// unwritable returns err as an ErrCacheUnwritable naming the cache when
// the cache's filesystem refused a write, and nil for any other error
// (and for one already marked).
func (r *Repo) unwritable(err error) error {
	if !isUnwritable(err) || errors.Is(err, ErrCacheUnwritable) {
		return nil
	}
	return fmt.Errorf("%w: cache %s: %w (the cache is kept as it is and used again once its filesystem takes writes)", ErrCacheUnwritable, r.opts.CacheDir, err)
}

// normalizeURL makes local paths absolute (go-git resolves them against the
// working directory of each call otherwise).
func normalizeURL(raw string) (string, error) {
	ep, err := transport.NewEndpoint(raw)
	if err != nil {
		return "", err
	}
	if ep.Protocol != "file" {
		return raw, nil
	}
	p := strings.TrimPrefix(raw, "file://")
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	return abs, nil
}

// localPath returns the directory of a local remote, or "" for a network one.
func (r *Repo) localPath() string {
	ep, err := transport.NewEndpoint(r.url)
	if err != nil || ep.Protocol != "file" {
		return ""
	}
	return ep.Path
}

// openStorage opens the cache (or makes a fresh one when fresh is set or
// none exists) and points its remote at r.url. Caller holds r.mu.
func (r *Repo) openStorage(fresh bool) error {
	if r.opts.CacheDir == "" {
		st := memory.NewStorage()
		repo, err := git.Init(st, nil)
		if err != nil {
			return err
		}
		return r.adopt(st, repo, true)
	}
	dir := r.opts.CacheDir
	if err := moveAsideFile(dir, r.log); err != nil {
		return err
	}
	if fresh {
		if err := removeCache(dir); err != nil {
			return err
		}
	}
	// The clone holds the remote's URL (credentials and all) and every
	// file of the fleet (cloud-init user-data): for this user alone.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	// Pack files stay open between reads (maintain keeps them few): opening
	// one per object read would dominate a walk of a large tree. (go-git's
	// ExclusiveAccess would also spare the loose-object lookups, but it does
	// not see packs a fetch adds.)
	// Objects past largeObject are read from their pack as a stream, not
	// decoded whole into memory (and never into the object cache); a
	// fetched pack is indexed in bounded memory (see diskStorage).
	st := &diskStorage{dir: dir, maxSpill: r.opts.MaxSpill, goGits: map[plumbing.Hash]struct{}{}, Storage: filesystem.NewStorageWithOptions(osfs.New(dir), cache.NewObjectLRU(32*cache.MiByte),
		filesystem.Options{MaxOpenDescriptors: 2 * maxPacks, LargeObjectThreshold: largeObject})}
	if init, err := r.checkCacheDir(dir, ents, fresh); err != nil || init {
		if err != nil {
			return err
		}
		repo, err := git.Init(st, nil)
		if err != nil {
			return fmt.Errorf("init cache %s: %w", dir, err)
		}
		return r.adopt(st, repo, true)
	}
	damaged := func(err error) error {
		_ = st.Close()
		if fresh {
			return fmt.Errorf("fresh cache %s: %w", dir, err)
		}
		r.log.WithField("cache", dir).WithError(err).Warn("cache damaged; cloning afresh")
		return r.openStorage(true)
	}
	if !isBareRepo(dir) {
		return damaged(errors.New("HEAD, objects or refs missing"))
	}
	repo, err := git.Open(st, nil)
	if err != nil {
		return damaged(fmt.Errorf("reopen: %w", err))
	}
	if shallow, err := st.Shallow(); r.opts.Depth == 0 && (err != nil || len(shallow) > 0) {
		// A shallow cache (from an earlier Depth) would leave holes in the
		// full history this Repo promises; go-git cannot deepen it, so
		// start afresh.
		_ = st.Close()
		r.log.WithField("cache", dir).Info("cache is shallow but full history is wanted; cloning afresh")
		return r.openStorage(true)
	} else if err != nil {
		return damaged(fmt.Errorf("read shallow list: %w", err))
	}
	if err := r.adopt(st, repo, false); err != nil {
		return damaged(err)
	}
	return nil
}

// isBareRepo reports whether dir looks like a bare repository.
func isBareRepo(dir string) bool {
	for _, name := range []string{"HEAD", "objects", "refs"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return false
		}
	}
	return true
}

// isCache reports whether the entries of a directory are those of a git
// cache, maybe damaged (some missing, a lock file left behind): it holds
// HEAD, objects, refs or config. Anything else in it is a stray (see
// strays), kept and ignored; a directory holding none of those names is
// no cache, and is never deleted.
func isCache(ents []os.DirEntry) bool {
	for _, e := range ents {
		switch e.Name() {
		case "HEAD", "objects", "refs", "config":
			return true
		}
	}
	return false
}

// sweepLeftovers removes what an interrupted git leaves in a cache: lock
// files (go-git locks with flock and writes none, so any is stale, and
// one under refs/ reads as a broken ref), partial packs of a fetch cut
// short (never read, only taking space) and an index whose pack is gone
// (a pack's deletion removes the pack, then its index; its installation
// moves the index in first): an index holds no object, and one without
// its pack fails every read of a packed object. One CacheDir belongs to
// one Repo, so nothing else is writing them.
func sweepLeftovers(dir string, log *logrus.Entry) {
	var stale []string
	if ms, err := filepath.Glob(filepath.Join(dir, "*.lock")); err == nil {
		stale = append(stale, ms...)
	}
	if ms, err := filepath.Glob(filepath.Join(dir, "objects", "pack", "tmp_*")); err == nil {
		stale = append(stale, ms...)
	}
	if ms, err := filepath.Glob(filepath.Join(dir, "objects", "pack", "pack-*.idx")); err == nil {
		for _, idx := range ms {
			if _, err := os.Stat(strings.TrimSuffix(idx, ".idx") + ".pack"); errors.Is(err, fs.ErrNotExist) {
				stale = append(stale, idx)
			}
		}
	}
	_ = filepath.WalkDir(filepath.Join(dir, "refs"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".lock") {
			stale = append(stale, p)
		}
		return nil
	})
	for _, p := range stale {
		if err := os.Remove(p); err != nil {
			log.WithError(err).WithField("path", p).Warn("remove a stale lock, partial pack or orphan index from the cache")
			continue
		}
		log.WithField("path", p).Info("removed a stale lock, partial pack or orphan index from the cache")
	}
}

// moveAsideFile moves a file (not a directory) found at the cache path out
// of the way, keeping it beside as PATH.damaged-UNIXNANO: the path is the
// cache's, but what a person put there is not thrown away.
// resolveCacheDir follows a cache path that is a symlink to a directory
// (systemd's CacheDirectory= under DynamicUser=yes is one), so the cache
// is the directory it names and the link is never taken for damage. Any
// other path, a dangling link included, is returned as it is.
func resolveCacheDir(dir string) string {
	if dir == "" {
		return dir
	}
	if fi, err := os.Lstat(dir); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		return dir
	}
	target, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return dir
	}
	if fi, err := os.Stat(target); err != nil || !fi.IsDir() {
		return dir
	}
	return target
}

func moveAsideFile(dir string, log *logrus.Entry) error {
	fi, err := os.Lstat(dir)
	if err != nil || fi.IsDir() {
		return nil
	}
	aside := fmt.Sprintf("%s.damaged-%d", dir, time.Now().UnixNano())
	if err := os.Rename(dir, aside); err != nil {
		return fmt.Errorf("cache path %s is not a directory, and moving it aside failed: %w", dir, err)
	}
	log.WithField("cache", dir).WithField("movedTo", aside).Warn("cache path was not a directory; moved it aside")
	return nil
}

// removeCache deletes a cache directory, refusing anything that does not look
// like one; its strays are moved back into a new, otherwise empty
// directory at the same path.
func removeCache(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(ents) > 0 && !isCache(ents) {
		return fmt.Errorf("refuse to remove %s: not a git cache", dir)
	}
	old := fmt.Sprintf("%s.old-%d", dir, time.Now().UnixNano())
	if err := os.Rename(dir, old); err != nil {
		return err
	}
	if err := keepStrays(old, dir, ents); err != nil {
		return err
	}
	return os.RemoveAll(old)
}

// adopt installs a storage and makes sure its remote points at r.url; when
// the URL changed, the old remote-tracking refs are dropped. The caches of
// facts about objects (present, sizes) survive a reopen of the same store
// (objects are immutable and only a fresh store loses them). Caller holds
// r.mu.
func (r *Repo) adopt(st storage.Storer, repo *git.Repository, fresh bool) error {
	cfg, err := repo.Config()
	if err != nil {
		return err
	}
	rc, ok := cfg.Remotes[remoteName]
	if !ok || len(rc.URLs) != 1 || rc.URLs[0] != r.url {
		if ok {
			if err := dropRemoteRefs(st); err != nil {
				return err
			}
		}
		cfg.Remotes[remoteName] = &config.RemoteConfig{
			Name:  remoteName,
			URLs:  []string{r.url},
			Fetch: []config.RefSpec{"+refs/heads/*:refs/remotes/origin/*"},
		}
		if err := st.SetConfig(cfg); err != nil {
			return err
		}
	}
	r.closeStorage()
	r.st, r.repo = st, repo
	if fresh {
		r.baseline = 0
		r.verified = map[plumbing.Hash]struct{}{}
		r.sizes = map[plumbing.Hash]int64{}
		r.listed.reset()
	}
	return nil
}

// closeStorage releases the open files of the current storage, if any.
// Caller holds r.mu.
func (r *Repo) closeStorage() {
	if c, ok := r.st.(io.Closer); ok {
		if err := c.Close(); err != nil {
			r.log.WithError(err).Debug("close cache")
		}
	}
}

// Close releases the files the cache keeps open. Reads after Close fail;
// the Repo must not be used after it.
func (r *Repo) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closeStorage()
	return nil
}

// dropRemoteRefs removes every remote-tracking ref of the cache.
func dropRemoteRefs(st storage.Storer) error {
	iter, err := st.IterReferences()
	if err != nil {
		return err
	}
	var names []plumbing.ReferenceName
	_ = iter.ForEach(func(ref *plumbing.Reference) error {
		if strings.HasPrefix(ref.Name().String(), "refs/remotes/") {
			names = append(names, ref.Name())
		}
		return nil
	})
	for _, n := range names {
		if err := st.RemoveReference(n); err != nil {
			return err
		}
	}
	return nil
}

// trackingRef is the remote-tracking ref of branch.
func trackingRef(branch string) plumbing.ReferenceName {
	return plumbing.ReferenceName("refs/remotes/" + remoteName + "/" + branch)
}

// checkBranch rejects branch names git would not accept.
func checkBranch(branch string) error {
	if branch == "" {
		return errors.New("empty branch name")
	}
	if err := plumbing.ReferenceName("refs/heads/" + branch).Validate(); err != nil {
		return fmt.Errorf("branch %q: %w", branch, err)
	}
	return nil
}

// remote runs op, one operation with the remote, under Options.Timeout. An
// op that its deadline ended gives an error matching ErrTimeout (and
// context.DeadlineExceeded); an end of ctx itself is returned as it is.
func (r *Repo) remote(ctx context.Context, op func(context.Context) error) error {
	timeout := r.timeout()
	octx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	deadline, _ := octx.Deadline()
	err := op(octx)
	// The ssh deadline ends the connection itself, a moment after the
	// context's: its i/o timeout is the same deadline.
	if err != nil && ctx.Err() == nil && (octx.Err() != nil || !time.Now().Before(deadline) || netTimeout(err)) {
		return &timeoutError{after: timeout, err: err}
	}
	if f := objectFormat(err); f != "" {
		return fmt.Errorf("%w %s: gitfleet reads only sha1 repositories (convert it, or serve a sha1 mirror)", ErrObjectFormat, f)
	}
	return refound(err)
}

// remoteFaults are the errors gitsource's own readers of a remote's
// answer give, which go-git sometimes passes on as text alone ("error
// decoding upload-pack response: %s").
var remoteFaults = []error{ErrTooManyRefs, ErrTooManyShallows, ErrPackRefused}

// refound makes err match the remote fault its text names, when go-git
// flattened it.
func refound(err error) error {
	if err == nil {
		return nil
	}
	for _, f := range remoteFaults {
		if !errors.Is(err, f) && strings.Contains(err.Error(), f.Error()) {
			return &flattened{err: err, fault: f}
		}
	}
	return err
}

// flattened is an error whose text names a remote fault: it reads as it
// is and matches the fault.
type flattened struct{ err, fault error }

func (f *flattened) Error() string   { return f.err.Error() }
func (f *flattened) Unwrap() []error { return []error{f.err, f.fault} }

// objectFormatCap finds the object-format capability in a ref
// advertisement that go-git could not decode (a SHA-256 repository's
// 64-digit hashes are not SHA-1's 40).
var objectFormatCap = regexp.MustCompile(`object-format=([a-z0-9-]+)`)

// objectFormat names the object format err reports a remote to use, when
// it is not sha1.
func objectFormat(err error) string {
	if err == nil {
		return ""
	}
	m := objectFormatCap.FindStringSubmatch(err.Error())
	if m == nil || m[1] == "sha1" {
		return ""
	}
	return m[1]
}

// netTimeout reports whether err is a network i/o timeout.
func netTimeout(err error) bool {
	var ne net.Error
	return (errors.As(err, &ne) && ne.Timeout()) || strings.Contains(err.Error(), "i/o timeout")
}

// timeout is the bound of one operation with the remote.
func (r *Repo) timeout() time.Duration {
	if r.opts.Timeout <= 0 {
		return DefaultTimeout
	}
	return r.opts.Timeout
}

// timeoutError is an operation its deadline stopped.
type timeoutError struct {
	after time.Duration
	err   error
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("%v after %v: %v", ErrTimeout, e.after, e.err)
}

func (e *timeoutError) Is(target error) bool {
	return target == ErrTimeout || target == context.DeadlineExceeded
}

func (e *timeoutError) Unwrap() error { return e.err }
