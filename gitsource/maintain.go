package gitsource

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"
	"github.com/go-git/go-git/v5/storage/memory"
)

// Cache upkeep. Every fetch that brings objects adds a pack file to a cache
// on disk, and every Update adds loose objects; go-git looks an object up in
// every pack in turn, so a long-running cache would slow down pack by pack.
// A memory cache only grows. A shallow cache (Depth > 0) gains a line in its
// shallow list per fetch, and go-git sends the whole list with every fetch;
// it also keeps the objects of every tip it ever fetched, though it needs
// only the current ones. maintain bounds all of these. (Variables so that
// tests can lower them.)
var (
	// maxPacks: past this many packs, all but the largest are merged.
	maxPacks = 16
	// maxLoose: past this many loose objects, they are packed too.
	maxLoose = 2048
	// maxShallow: a shallow cache with a longer shallow list, and one
	// longer than growth times its tracked branches, is cloned afresh
	// (cheap: only the tips, in one fetch). A fresh shallow clone lists
	// about one commit per branch it tracks, so a cache of 1,000 host
	// branches starts at 1,000 and must not count as grown.
	maxShallow = 512
	// growth: a memory cache, or a shallow cache on disk, that grew past
	// growth times its size after its last fresh clone, and past its
	// floor, is cloned afresh (sizes in bytes). A full cache on disk is
	// only compacted: its history is what it is for.
	growth = 4
	// memoryFloor is in bytes of object data, diskFloor in bytes of pack
	// files. Bytes, not objects: the controller's tips publish a ledger
	// of hundreds of KB per pass in a handful of objects, so a floor in
	// objects let a thousand passes keep 300 MB.
	memoryFloor = int64(16 << 20)
	diskFloor   = int64(64 << 20)
)

// maintain keeps the cache compact after a fetch of set brought objects
// (or an Update wrote some). It reports whether it cloned the cache afresh
// (then the caller must fetch set again: what it fetched before may be
// gone). Failures are logged, never returned: the cache still works, only
// slower.
func (r *Repo) maintain(ctx context.Context, set refSet) bool {
	r.mu.Lock()
	why := r.upkeep()
	r.mu.Unlock()
	if why == "" {
		return false
	}
	r.log.WithField("why", why).Info("cloning the cache afresh to keep it small")
	if err := r.repair(ctx, set, true); err != nil {
		r.log.WithError(err).Warn("fresh clone of the cache")
	}
	return true
}

// upkeep compacts a cache on disk and says why the cache should be cloned
// afresh ("" when it should not). Caller holds r.mu.
func (r *Repo) upkeep() string {
	var size, floor int64
	switch st := r.st.(type) {
	case *diskStorage:
		compacted, err := compact(st)
		if err != nil {
			r.log.WithError(err).Warn("compact the cache")
		}
		if compacted {
			// go-git keeps its pack index in memory; open the store afresh
			// so it sees the new packs only.
			if err := r.openStorage(false); err != nil {
				r.log.WithError(err).Error("reopen the cache after compacting")
				return ""
			}
		}
		if r.opts.Depth == 0 {
			return ""
		}
		size, floor = packBytes(r.st.(*diskStorage)), diskFloor
	case *memory.Storage:
		size, floor = r.objectBytes(), memoryFloor
	default:
		return ""
	}
	if r.opts.Depth > 0 {
		if sh, err := r.st.Shallow(); err == nil && len(sh) > maxShallow {
			tracked, _ := trackedBranches(r.st)
			if len(sh) > growth*len(tracked) {
				return fmt.Sprintf("%d shallow commits listed for %d branches", len(sh), len(tracked))
			}
		}
	}
	if r.baseline == 0 {
		r.baseline = max(size, 1)
	}
	if size > floor && size > int64(growth)*r.baseline {
		return fmt.Sprintf("grew from %d to %d", r.baseline, size)
	}
	return ""
}

// packBytes is the total size of the pack files of a cache on disk.
func packBytes(st *diskStorage) int64 {
	packs, err := st.ObjectPacks()
	if err != nil {
		return 0
	}
	var n int64
	for _, h := range packs {
		n += packSize(st, h)
	}
	return n
}

// packSize is the size of one pack file of a cache on disk, 0 when it
// cannot be read.
func packSize(st *diskStorage, pack plumbing.Hash) int64 {
	fs := st.Filesystem()
	fi, err := fs.Stat(fs.Join("objects", "pack", "pack-"+pack.String()+".pack"))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// compact merges every pack but the largest, and the loose objects, into
// one new pack, then deletes what it merged. It reports whether it changed
// the store. Nothing is deleted unless the new pack was written whole. It
// holds one object in memory at a time (BenchmarkCompactPeakRSS).
func compact(st *diskStorage) (bool, error) {
	packs, loose, err := packsAndLoose(st)
	if err != nil {
		return false, err
	}
	if len(packs) <= maxPacks && len(loose) <= maxLoose {
		return false, nil
	}
	merge := allButLargest(st, packs)
	objs, err := mergedObjects(st, merge, loose)
	if err != nil {
		return false, err
	}
	if len(objs) == 0 {
		return false, nil
	}
	made, err := writeMergedPack(st, objs)
	if err != nil {
		return false, err
	}
	return true, deleteMerged(st, merge, made, loose)
}

// packsAndLoose lists the packs and the loose objects of a cache on disk.
func packsAndLoose(st *diskStorage) (packs, loose []plumbing.Hash, err error) {
	if packs, err = st.ObjectPacks(); err != nil {
		return nil, nil, err
	}
	err = st.ForEachObjectHash(func(h plumbing.Hash) error {
		loose = append(loose, h)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("list loose objects: %w", err)
	}
	return packs, loose, nil
}

// allButLargest are the packs to merge: every one but the largest, which
// is kept as it is (most of the cache's bytes, which every compaction
// would otherwise rewrite). It sorts packs, largest first.
func allButLargest(st *diskStorage, packs []plumbing.Hash) []plumbing.Hash {
	sort.Slice(packs, func(i, j int) bool { return packSize(st, packs[i]) > packSize(st, packs[j]) })
	if len(packs) == 0 {
		return packs
	}
	return packs[1:]
}

// mergedObjects are the objects of the packs merge and the loose
// objects, each once.
func mergedObjects(st *diskStorage, merge, loose []plumbing.Hash) ([]plumbing.Hash, error) {
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
			return nil, err
		}
		for _, h := range hs {
			add(h)
		}
	}
	for _, h := range loose {
		add(h)
	}
	return objs, nil
}

// writeMergedPack writes objs into the cache as one new pack and returns
// its name (its checksum). One object at a time, whole (no delta search:
// it would cost more CPU than the disk it saves here). go-git's encoder
// holds every object it packs in memory at once: the merge of a few
// hundred of the controller's ledgers (hundreds of KB each) raised its
// RSS by 100 MB.
func writeMergedPack(st *diskStorage, objs []plumbing.Hash) (plumbing.Hash, error) {
	w, err := st.PackfileWriter()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	made, err := encodePack(w, st, objs)
	if err != nil {
		_ = w.Close()
		return plumbing.ZeroHash, fmt.Errorf("write merged pack: %w", err)
	}
	if err := w.Close(); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("write merged pack: %w", err)
	}
	return made, nil
}

// deleteMerged deletes what the new pack made holds now: the packs merge
// and the loose objects. A merged pack that is made itself, byte for
// byte (its objects alone, as an earlier compaction wrote them), is the
// new pack, not one to delete.
func deleteMerged(st *diskStorage, merge []plumbing.Hash, made plumbing.Hash, loose []plumbing.Hash) error {
	for _, p := range merge {
		if p == made {
			continue
		}
		if err := st.DeleteOldObjectPackAndIndex(p, time.Time{}); err != nil {
			return fmt.Errorf("delete merged pack %s: %w", p, err)
		}
	}
	for _, h := range loose {
		if err := st.DeleteLooseObject(h); err != nil {
			return fmt.Errorf("delete packed loose object %s: %w", h, err)
		}
	}
	return nil
}

// packHashes lists the objects of one pack from its index.
func packHashes(st *diskStorage, pack plumbing.Hash) ([]plumbing.Hash, error) {
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

// objectBytes is the size of the object data a memory cache holds, in
// bytes (0 for a cache on disk): one pass over its objects, a
// millisecond for a hundred thousand. Caller holds r.mu.
func (r *Repo) objectBytes() int64 {
	ms, ok := r.st.(*memory.Storage)
	if !ok {
		return 0
	}
	var n int64
	for _, o := range ms.ObjectStorage.Objects {
		n += o.Size()
	}
	return n
}
