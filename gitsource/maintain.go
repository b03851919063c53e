package gitsource

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/storage/filesystem"
	"github.com/go-git/go-git/v5/storage/memory"
)

// Cache upkeep. Every fetch that brings objects adds a pack file to a cache
// on disk, and every Update adds loose objects; go-git looks an object up in
// every pack in turn, so a long-running cache would slow down pack by pack.
// A memory cache only grows. maintain bounds both. (Variables so that tests
// can lower them.)
var (
	// maxPacks: past this many packs, all but the largest are merged.
	maxPacks = 16
	// maxLoose: past this many loose objects, they are packed too.
	maxLoose = 2048
	// memoryGrowth and memoryFloor: a memory cache holding more than
	// memoryGrowth times the objects it held after its last fresh clone
	// (and more than memoryFloor) is cloned afresh.
	memoryGrowth = 4
	memoryFloor  = 20000
)

// maintain keeps the cache compact after a fetch of branch brought objects.
// Failures are logged, never returned: the cache still works, only slower.
func (r *Repo) maintain(ctx context.Context, branch string) {
	r.mu.Lock()
	switch st := r.st.(type) {
	case *filesystem.Storage:
		defer r.mu.Unlock()
		compacted, err := compact(st)
		if err != nil {
			r.log.WithError(err).Warn("compact the cache")
		}
		if compacted {
			// go-git keeps its pack index in memory; open the store afresh
			// so it sees the new packs only.
			if err := r.openStorage(false); err != nil {
				r.log.WithError(err).Error("reopen the cache after compacting")
			}
		}
	case *memory.Storage:
		n := len(st.ObjectStorage.Objects)
		if r.baseline == 0 {
			r.baseline = n
		}
		grown := n > memoryFloor && n > memoryGrowth*r.baseline
		r.mu.Unlock()
		if !grown {
			return
		}
		r.log.WithField("objects", n).Info("memory cache grew; cloning it afresh")
		if err := r.repair(ctx, branch, true); err != nil {
			r.log.WithError(err).Warn("fresh clone of the memory cache")
			return
		}
		if _, _, err := r.fetchOnce(ctx, branch, true); err != nil {
			r.log.WithError(err).WithField("branch", branch).Warn("refetch after a fresh clone failed; the next Fetch retries")
		}
		r.mu.Lock()
		if ms, ok := r.st.(*memory.Storage); ok {
			r.baseline = len(ms.ObjectStorage.Objects)
		}
		r.mu.Unlock()
	default:
		r.mu.Unlock()
	}
}

// compact merges every pack but the largest, and the loose objects, into
// one new pack, then deletes what it merged. It reports whether it changed
// the store. Nothing is deleted unless the new pack was written whole.
func compact(st *filesystem.Storage) (bool, error) {
	packs, err := st.ObjectPacks()
	if err != nil {
		return false, err
	}
	var loose []plumbing.Hash
	err = st.ForEachObjectHash(func(h plumbing.Hash) error {
		loose = append(loose, h)
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("list loose objects: %w", err)
	}
	if len(packs) <= maxPacks && len(loose) <= maxLoose {
		return false, nil
	}
	fs := st.Filesystem()
	size := func(h plumbing.Hash) int64 {
		fi, err := fs.Stat(fs.Join("objects", "pack", "pack-"+h.String()+".pack"))
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	sort.Slice(packs, func(i, j int) bool { return size(packs[i]) > size(packs[j]) })
	merge := packs
	if len(packs) > 0 {
		merge = packs[1:] // keep the largest as it is
	}
	seen := map[plumbing.Hash]bool{}
	var objs []plumbing.Hash
	add := func(h plumbing.Hash) {
		if !seen[h] {
			seen[h] = true
			objs = append(objs, h)
		}
	}
	for _, p := range merge {
		hs, err := packHashes(st, p)
		if err != nil {
			return false, err
		}
		for _, h := range hs {
			add(h)
		}
	}
	for _, h := range loose {
		add(h)
	}
	if len(objs) == 0 {
		return false, nil
	}
	w, err := st.PackfileWriter()
	if err != nil {
		return false, err
	}
	// No delta search: it would cost more CPU than the disk it saves here.
	if _, err := packfile.NewEncoder(w, st, false).Encode(objs, 0); err != nil {
		_ = w.Close()
		return false, fmt.Errorf("write merged pack: %w", err)
	}
	if err := w.Close(); err != nil {
		return false, fmt.Errorf("write merged pack: %w", err)
	}
	for _, p := range merge {
		if err := st.DeleteOldObjectPackAndIndex(p, time.Time{}); err != nil {
			return true, fmt.Errorf("delete merged pack %s: %w", p, err)
		}
	}
	for _, h := range loose {
		if err := st.DeleteLooseObject(h); err != nil {
			return true, fmt.Errorf("delete packed loose object %s: %w", h, err)
		}
	}
	return true, nil
}

// packHashes lists the objects of one pack from its index.
func packHashes(st *filesystem.Storage, pack plumbing.Hash) ([]plumbing.Hash, error) {
	fs := st.Filesystem()
	f, err := fs.Open(fs.Join("objects", "pack", "pack-"+pack.String()+".idx"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	idx := idxfile.NewMemoryIndex()
	if err := idxfile.NewDecoder(f).Decode(idx); err != nil {
		return nil, fmt.Errorf("read index of pack %s: %w", pack, err)
	}
	it, err := idx.Entries()
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []plumbing.Hash
	for {
		e, err := it.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read index of pack %s: %w", pack, err)
		}
		out = append(out, e.Hash)
	}
	return out, nil
}

// objectCount is the number of objects of a memory cache (0 for a cache on
// disk). Caller holds r.mu.
func (r *Repo) objectCount() int {
	if ms, ok := r.st.(*memory.Storage); ok {
		return len(ms.ObjectStorage.Objects)
	}
	return 0
}
