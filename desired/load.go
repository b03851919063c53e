package desired

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/gitfleet/gitfleet/internal/parallel"
)

// Loader loads fleets from trees and remembers what it parsed: objects are
// cached by file path and content ID (File.ID, or the sha256 of the content
// when the tree gives no ID), so loading a tree that differs from the last
// one in one file parses one file. Only the files of the latest Load stay
// cached.
//
// A Loader is not safe for concurrent use. The objects of a returned Fleet
// are shared with the cache and with later Fleets: treat them as read-only.
type Loader struct {
	dir   string
	cache map[string]*parsed
	// cacheWhole is true when cache holds every object file of the last
	// Load's tree (that Load read them all), so that SetBaselineLast may
	// take it as a baseline.
	cacheWhole bool
	// baseline holds the cache key (path NUL content ID) of each object
	// file at the commit the fleet runs; nil when unknown. Its values are
	// unused: SetBaselineLast shares the map of an earlier cache.
	baseline map[string]*parsed
	// effective holds the effective VMs of the last Load's VMs that name
	// a profile, by the two files' cache keys (withProfiles).
	effective map[effectiveKey]*parsed
}

// SetBaseline gives the Loader the tree of the commit the fleet runs (the
// controller's applied commit), nil for none. A later Load that finds a
// name defined twice reports it at the file the change added: the one
// that did not hold its content at that commit (a new path, or a changed
// file), naming the other as the existing definition. Without a baseline,
// or when neither or both files are new, the later path is reported.
// It walks t (no file is read when t gives content IDs, as git trees do).
func (l *Loader) SetBaseline(t Tree) error {
	if t == nil {
		l.baseline = nil
		return nil
	}
	b := map[string]*parsed{}
	err := t.Walk(func(f File) error {
		rel, ok := l.relative(f.Path)
		if !ok || hidden(rel) || !isYAML(rel) || (f.Mode != Regular && f.Mode != Executable) {
			return nil
		}
		id := f.ID
		if id == "" {
			data, err := f.Read()
			if err != nil {
				return fmt.Errorf("read %s: %w", f.Path, err)
			}
			sum := sha256.Sum256(data)
			id = "sha256:" + hex.EncodeToString(sum[:])
		}
		b[f.Path+"\x00"+id] = nil
		return nil
	})
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	l.baseline = b
	return nil
}

// SetBaselineLast makes the tree of the last Load the baseline, as
// SetBaseline with that tree would, without walking it: for a caller whose
// fleet now runs the commit it loaded last (a controller that published
// it). It reports false, and changes nothing, when the last Load did not
// read every object file (a file could not be read, or there was no Load
// yet): then call SetBaseline.
func (l *Loader) SetBaselineLast() bool {
	if !l.cacheWhole {
		return false
	}
	// Load replaces the cache map, never changes it: sharing it is safe.
	l.baseline = l.cache
	return true
}

// parsed is the outcome of parsing one file at one path.
type parsed struct {
	obj  *object
	errs []*Error
}

// NewLoader returns a Loader for the objects under dir, a slash-separated
// directory relative to the tree root ("" or "." for the whole tree). File
// paths in errors and Origins stay relative to the tree root.
func NewLoader(dir string) *Loader {
	dir = filepath.ToSlash(dir)
	if dir != "" {
		dir = path.Clean(dir)
	}
	if dir == "." || dir == "/" {
		dir = ""
	}
	return &Loader{dir: dir, cache: map[string]*parsed{}}
}

// PrefixTree presents t with every path under prefix, a slash-separated
// directory: "vms/a.yaml" becomes prefix + "/vms/a.yaml". With
// NewLoader(prefix), errors then name files as prefix/... in their location
// and in their messages, such as the paths a command line was given.
func PrefixTree(t Tree, prefix string) Tree {
	return prefixTree{t: t, prefix: strings.TrimSuffix(filepath.ToSlash(prefix), "/") + "/"}
}

type prefixTree struct {
	t      Tree
	prefix string
}

func (p prefixTree) Walk(fn func(File) error) error {
	return p.t.Walk(func(f File) error {
		f.Path = p.prefix + f.Path
		return fn(f)
	})
}

// LoadDir loads and validates the fleet in directory dir on disk. File
// paths in errors are relative to dir.
func LoadDir(dir string) (*Fleet, error) {
	return NewLoader("").Load(DirTree(dir))
}

// candidate is one object file to parse.
type candidate struct {
	file File
	key  string // cache key, once known
	res  *parsed
	err  error // failure to read
	// root is the document of a file parsed by this Load (nil for one
	// from the cache), kept for this Load only.
	root *yaml.Node
}

// Load reads every object file under the Loader's directory in t, decodes
// and validates each, then runs the cross-object checks.
//
// Object files are the *.yaml and *.yml files (any letter case) that are
// neither hidden (name starting with ".") nor below a hidden directory; all
// other files are ignored. A symlink or a submodule anywhere under the
// directory (outside hidden directories) is an error: it could hide or
// duplicate objects, and it is never followed.
//
// The result is a Fleet and a nil error, or a nil Fleet and either an
// ErrorList (every problem in the tree, sorted by file and line; it matches
// ErrInvalid) or another error when the tree itself could not be read (a
// missing git object, an unreadable file) — never a smaller fleet.
//
// A tree without a single object file under the directory (or under the
// root, for a Loader without one) is rejected with one Error naming the
// directory (File is the directory, or "." for the root), whatever else the
// directory holds: hidden files and files of other kinds (README.md,
// .gitfleet/schema.json) are no objects. A fleet without objects would read
// as "delete every VM and volume", and a directory that was renamed, moved
// or mistyped must not read that way. To delete every VM, keep the Host
// files.
func (l *Loader) Load(t Tree) (*Fleet, error) {
	l.cacheWhole = false
	cands, errs, err := l.candidates(t)
	if err != nil {
		return nil, fmt.Errorf("walk tree: %w", err)
	}
	if len(cands) == 0 && len(errs) == 0 {
		return nil, ErrorList{l.noObjects()}
	}
	l.parseAll(cands)
	objs, unchanged, fileErrs, err := l.collect(cands)
	if err != nil {
		return nil, err
	}
	errs = append(errs, fileErrs...)
	// With some files rejected, what they define is unknown: the checks
	// that a referenced object exists would only add false alarms.
	keys, roots := objectKeys(cands)
	objs, profileErrs := l.withProfiles(objs, keys, roots, unchanged, len(errs) == 0)
	errs = append(errs, profileErrs...)
	errs = append(errs, crossCheck(objs, len(errs) == 0, unchanged)...)
	if len(errs) > 0 {
		errs.Sort()
		return nil, errs
	}
	return newFleet(objs), nil
}

// candidates walks t and returns the object files under the Loader's
// directory, sorted by path, and the errors of the files that are refused
// without being read (symlinks, submodules, files over MaxFileSize). The
// error is a failure to walk the tree.
func (l *Loader) candidates(t Tree) ([]*candidate, ErrorList, error) {
	var cands []*candidate
	var errs ErrorList
	err := t.Walk(func(f File) error {
		c, e := l.candidate(f)
		switch {
		case e != nil:
			errs = append(errs, e)
		case c != nil:
			cands = append(cands, c)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].file.Path < cands[j].file.Path })
	return cands, errs, nil
}

// candidate classifies one file of the tree: an object file to parse, a
// file refused on its mode or size (the Error), or neither (nil, nil) for
// a file outside the directory, hidden, or of another extension.
func (l *Loader) candidate(f File) (*candidate, *Error) {
	rel, ok := l.relative(f.Path)
	if !ok || hidden(rel) {
		return nil, nil
	}
	switch f.Mode {
	case Symlink:
		return nil, &Error{File: f.Path, Line: 1, Col: 1,
			Msg: "symlinks are not followed; replace the link by the file it points to, or remove it"}
	case Submodule:
		return nil, &Error{File: f.Path, Line: 1, Col: 1,
			Msg: "submodules are not read; copy the objects into this repository, or remove the submodule"}
	}
	if !isYAML(rel) {
		return nil, nil
	}
	if f.Size > MaxFileSize {
		return nil, &Error{File: f.Path, Line: 1, Col: 1,
			Msg: fmt.Sprintf("file is %d bytes; an object file may be at most %d bytes (1 MiB)", f.Size, MaxFileSize)}
	}
	c := &candidate{file: f}
	if f.ID != "" {
		c.key = f.Path + "\x00" + f.ID
	}
	return c, nil
}

// collect gathers the parsed candidates: their objects (in path order),
// which of them the baseline holds unchanged, and the errors of each file
// on its own. It makes the candidates the Loader's cache. The error is the
// first failure to read a file; then the cache is left as it was.
func (l *Loader) collect(cands []*candidate) (objs []*object, unchanged map[*object]bool, errs ErrorList, err error) {
	next := make(map[string]*parsed, len(cands))
	objs = make([]*object, 0, len(cands))
	unchanged = make(map[*object]bool, len(l.baseline))
	for _, c := range cands {
		if c.err != nil {
			return nil, nil, nil, c.err
		}
		next[c.key] = c.res
		errs = append(errs, c.res.errs...)
		if c.res.obj != nil {
			objs = append(objs, c.res.obj)
			if _, ok := l.baseline[c.key]; ok {
				unchanged[c.res.obj] = true
			}
		}
	}
	l.cache, l.cacheWhole = next, true
	return objs, unchanged, errs, nil
}

// objectKeys are the cache keys of the objects of cands and the documents
// of those parsed by this Load, in the order collect lists the objects.
func objectKeys(cands []*candidate) (keys []string, roots []*yaml.Node) {
	keys, roots = make([]string, 0, len(cands)), make([]*yaml.Node, 0, len(cands))
	for _, c := range cands {
		if c.res.obj != nil {
			keys, roots = append(keys, c.key), append(roots, c.root)
		}
	}
	return keys, roots
}

// newFleet files checked objects by kind and name.
func newFleet(objs []*object) *Fleet {
	f := &Fleet{
		VMs:                map[string]*VM{},
		Volumes:            map[string]*Volume{},
		Hosts:              map[string]*Host{},
		Profiles:           map[string]*Profile{},
		BackupRepositories: map[string]*BackupRepository{},
	}
	for _, o := range objs {
		switch o.kind {
		case KindVM:
			f.VMs[o.name] = o.vm
		case KindVolume:
			f.Volumes[o.name] = o.volume
		case KindHost:
			f.Hosts[o.name] = o.host
		case KindProfile:
			f.Profiles[o.name] = o.profile
		case KindBackupRepository:
			f.BackupRepositories[o.name] = o.backupRepo
		}
	}
	return f
}

// parseAll fills in res (or err) of every candidate, from the cache where
// the key is known and cached, else by reading and parsing, spread over
// GOMAXPROCS workers.
func (l *Loader) parseAll(cands []*candidate) {
	var todo []*candidate
	for _, c := range cands {
		if c.key != "" {
			if r, ok := l.cache[c.key]; ok {
				c.res = r
				continue
			}
		}
		todo = append(todo, c)
	}
	parallel.For(len(todo), func(i int) { l.parseOne(todo[i]) })
}

// parseOne reads and parses one candidate. It reads l.cache but never
// writes it, so workers may call it concurrently.
func (l *Loader) parseOne(c *candidate) {
	data, err := c.file.Read()
	if err != nil {
		c.err = fmt.Errorf("read %s: %w", c.file.Path, err)
		return
	}
	if c.key == "" {
		sum := sha256.Sum256(data)
		c.key = c.file.Path + "\x00sha256:" + hex.EncodeToString(sum[:])
		if r, ok := l.cache[c.key]; ok {
			c.res = r
			return
		}
	}
	obj, root, errs := parseFileRoot(c.file.Path, data)
	c.res, c.root = &parsed{obj: obj, errs: errs}, root
}

// noObjects is the error of a tree without object files under the
// Loader's directory. Every caller (validate on a directory, the controller
// and plan on a git tree) gets this same message for the same directory.
func (l *Loader) noObjects() *Error {
	const why = "a fleet without objects would delete every VM and volume, so it is refused " +
		"(to delete every VM and volume, delete their files and keep the Host files)"
	if l.dir == "" {
		return &Error{File: ".", Line: 1, Col: 1,
			Msg: "no objects under the repository root: no *.yaml or *.yml file outside hidden directories; " + why}
	}
	return &Error{File: l.dir, Line: 1, Col: 1,
		Msg: fmt.Sprintf("no objects under %q: the directory is missing or holds no *.yaml or *.yml file outside hidden directories; %s", l.dir, why)}
}

// relative returns p relative to the Loader's directory, and whether p is
// inside it.
func (l *Loader) relative(p string) (string, bool) {
	if l.dir == "" {
		return p, true
	}
	if rest, ok := strings.CutPrefix(p, l.dir+"/"); ok {
		return rest, true
	}
	return "", false
}

// hidden reports whether any element of the slash-separated path starts
// with a dot.
func hidden(p string) bool {
	return strings.HasPrefix(p, ".") || strings.Contains(p, "/.")
}

func isYAML(p string) bool {
	ext := strings.ToLower(path.Ext(p))
	return ext == ".yaml" || ext == ".yml"
}

// DirTree is the Tree of a directory on disk. Symlinks are reported with
// mode Symlink and never followed (root itself may be a symlink); ".git"
// directories are not walked. IDs are left empty, so a Loader identifies
// contents by their sha256. A special file (device, FIFO, socket) named
// *.yaml or *.yml is an error of the tree. Read returns at most MaxFileSize+1 bytes, enough for
// the Loader to reject a file that grew past the limit. Other special files
// are not reported.
func DirTree(root string) Tree { return dirTree(root) }

type dirTree string

func (root dirTree) Walk(fn func(File) error) error {
	base, err := filepath.EvalSymlinks(string(root))
	if err != nil {
		return err
	}
	return filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == ".git" && p != base {
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(base, p)
		if err != nil {
			return err
		}
		f := File{Path: filepath.ToSlash(rel)}
		switch t := d.Type(); {
		case t&fs.ModeSymlink != 0:
			f.Mode = Symlink
			f.Read = func() ([]byte, error) { return nil, fmt.Errorf("%s is a symlink", p) }
			return fn(f)
		case t.IsRegular():
		case isYAML(p):
			return fmt.Errorf("%s is not a regular file (%s)", p, t)
		default:
			return nil // a socket or FIFO that no Loader would read
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		f.Size = info.Size()
		if info.Mode()&0o111 != 0 {
			f.Mode = Executable
		}
		size := f.Size
		f.Read = func() ([]byte, error) { return readLimited(p, size) }
		return fn(f)
	})
}

// readLimited reads at most MaxFileSize+1 bytes of the file at p, sizing
// its buffer by size, the file's size when it was listed.
func readLimited(p string, size int64) ([]byte, error) {
	fh, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	r := io.LimitReader(fh, MaxFileSize+1)
	buf := make([]byte, 0, min(max(size, 0), MaxFileSize)+1)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
