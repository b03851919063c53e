package fleet

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/gitsource"
	"github.com/gitfleet/gitfleet/snapshots"
)

// maxAttributionWalk bounds the commits one attribution walks; objects not
// found within it are attributed to the head.
const maxAttributionWalk = 1000

// History is the part of a git repository attribution, AppliedRange and
// WithMergedCommits read (*gitsource.Repo).
type History interface {
	IsAncestor(a, b string) (bool, error)
	FirstParents(from string, fn func(*gitsource.Commit) (bool, error)) error
	Diff(from, to string) ([]gitsource.Change, error)
	ReadFile(commit, path string) ([]byte, error)
	CommitInfo(hash string) (*gitsource.Commit, error)
}

var _ History = (*gitsource.Repo)(nil)

// attribute finds, for each ref that the applied commit had and head lacks,
// the commit that removed it: walking head's first-parent history back to
// applied, the newest commit whose first parent had the ref and which does
// not. A merge commit whose side branch deleted a file is therefore the
// removing commit. When applied is not an ancestor of head (a force-push or
// rewrite), every ref is attributed to head and flagged Rewritten; compute
// never asks then, since a rewritten history retains what it dropped
// instead of tombstoning it. dir is the
// objects' directory in the tree ("" for the root). Git errors are returned,
// never read as "not found".
func attribute(h History, dir, applied, head string, refs []ref) (map[ref]snapshots.Tombstone, error) {
	out := make(map[ref]snapshots.Tombstone, len(refs))
	headInfo, err := h.CommitInfo(head)
	if err != nil {
		return nil, fmt.Errorf("read head commit: %w", err)
	}
	atHead := func(rewritten bool) snapshots.Tombstone {
		return snapshots.Tombstone{Commit: desired.Hash(headInfo.Hash), Author: headInfo.Author,
			Time: headInfo.Time.UTC().Format(time.RFC3339), Rewritten: rewritten}
	}
	anc := false
	if applied != "" {
		if anc, err = h.IsAncestor(applied, head); err != nil {
			return nil, fmt.Errorf("is %s an ancestor of %s: %w", applied, head, err)
		}
	}
	if !anc {
		for _, r := range refs {
			out[r] = atHead(true)
		}
		return out, nil
	}
	walked := 0
	missing := make(map[ref]bool, len(refs))
	for _, r := range refs {
		missing[r] = true
	}
	err = h.FirstParents(head, func(c *gitsource.Commit) (bool, error) {
		// applied is an ancestor, but may lie off the first-parent line
		// (reached through a merge's second parent): bound the walk.
		if c.Hash == applied || len(missing) == 0 || len(c.Parents) == 0 || walked >= maxAttributionWalk {
			return false, nil
		}
		walked++
		parent := c.Parents[0]
		changes, err := h.Diff(parent, c.Hash)
		if err != nil {
			return false, fmt.Errorf("diff %s..%s: %w", parent, c.Hash, err)
		}
		before, after := map[ref]bool{}, map[ref]bool{}
		for _, ch := range changes {
			if ch.From != "" && inDir(dir, ch.From) {
				r, ok, err := identify(h, parent, ch.From)
				if err != nil {
					return false, err
				}
				if ok {
					before[r] = true
				}
			}
			if ch.To != "" && inDir(dir, ch.To) {
				r, ok, err := identify(h, c.Hash, ch.To)
				if err != nil {
					return false, err
				}
				if ok {
					after[r] = true
				}
			}
		}
		for r := range before {
			if missing[r] && !after[r] {
				out[r] = snapshots.Tombstone{Commit: desired.Hash(c.Hash), Author: c.Author, Time: c.Time.UTC().Format(time.RFC3339)}
				delete(missing, r)
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("walk history from %s: %w", head, err)
	}
	// Not found on the way (an object file rewritten in place through
	// intermediate invalid commits, say): the head is the best witness.
	for r := range missing {
		out[r] = atHead(false)
	}
	return out, nil
}

// removes reports whether the change from parent to commit removes r, as
// attribute reads it: a file in dir that held r at parent changed, and no
// file changed holds r at commit. Git errors are returned.
func removes(h History, dir, parent, commit string, r ref) (bool, error) {
	changes, err := h.Diff(parent, commit)
	if err != nil {
		return false, fmt.Errorf("diff %s..%s: %w", parent, commit, err)
	}
	before := false
	for _, ch := range changes {
		if ch.From != "" && inDir(dir, ch.From) {
			got, ok, err := identify(h, parent, ch.From)
			if err != nil {
				return false, err
			}
			before = before || (ok && got == r)
		}
		if ch.To != "" && inDir(dir, ch.To) {
			got, ok, err := identify(h, commit, ch.To)
			if err != nil {
				return false, err
			}
			if ok && got == r {
				return false, nil
			}
		}
	}
	return before, nil
}

func inDir(dir, p string) bool {
	if dir == "" {
		return isObjectPath(p)
	}
	return strings.HasPrefix(p, dir+"/") && isObjectPath(p)
}

func isObjectPath(p string) bool {
	ext := strings.ToLower(path.Ext(p))
	if ext != ".yaml" && ext != ".yml" {
		return false
	}
	for _, part := range strings.Split(p, "/") {
		if strings.HasPrefix(part, ".") {
			return false
		}
	}
	return true
}

// identify reads the kind, name and host of the object in path at commit.
// A file that is not an object of a known kind (an invalid intermediate
// commit) identifies nothing.
func identify(h History, commit, p string) (ref, bool, error) {
	data, err := h.ReadFile(commit, p)
	if err != nil {
		if errors.Is(err, gitsource.ErrFileNotFound) {
			return ref{}, false, fmt.Errorf("read %s at %s: listed by the diff but missing: %w", p, commit, err)
		}
		return ref{}, false, fmt.Errorf("read %s at %s: %w", p, commit, err)
	}
	var doc struct {
		Kind     desired.Kind `yaml:"kind"`
		Metadata struct {
			Name string `yaml:"name"`
		} `yaml:"metadata"`
		Spec struct {
			Host string `yaml:"host"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil || doc.Metadata.Name == "" {
		return ref{}, false, nil
	}
	switch doc.Kind {
	case desired.KindVM, desired.KindVolume:
		return ref{Kind: doc.Kind, Name: doc.Metadata.Name, Host: doc.Spec.Host}, true, nil
	}
	return ref{}, false, nil
}
