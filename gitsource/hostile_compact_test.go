package gitsource

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/desired"
	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// cacheObjects lists every object of a cache on disk, packed or loose.
// Caller holds r.mu.
func cacheObjects(t *testing.T, st *diskStorage) map[plumbing.Hash]bool {
	t.Helper()
	all := map[plumbing.Hash]bool{}
	packs, err := st.ObjectPacks()
	require.NoError(t, err)
	for _, p := range packs {
		hs, err := packHashes(st, p)
		require.NoError(t, err)
		for _, h := range hs {
			all[h] = true
		}
	}
	require.NoError(t, st.ForEachObjectHash(func(h plumbing.Hash) error {
		all[h] = true
		return nil
	}))
	return all
}

// requireObjects reads every object of want from r's cache and checks
// that its content hashes to its name.
func requireObjects(t *testing.T, r *Repo, want map[plumbing.Hash]bool) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.st.(*diskStorage)
	for h := range want {
		obj, err := st.EncodedObject(plumbing.AnyObject, h)
		require.NoError(t, err, "object %s lost", h)
		rd, err := obj.Reader()
		require.NoError(t, err, "object %s unreadable", h)
		hasher := plumbing.NewHasher(obj.Type(), obj.Size())
		_, err = io.Copy(hasher, rd)
		rd.Close()
		require.NoError(t, err)
		require.Equal(t, h, hasher.Sum(), "object %s corrupt", h)
	}
}

// TestHostileCompactOwnPackAgain: a cache holds its largest (fetched)
// pack and one pack an earlier compaction wrote from its loose objects.
// Compacting it again merges that one pack alone: encodePack writes the
// same objects in the same order at the same level, so the new pack is
// byte for byte the old one, has its name, is moved over it, and is then
// deleted as "merged".
func TestHostileCompactOwnPackAgain(t *testing.T) {
	defer func(p, l int) { maxPacks, maxLoose = p, l }(maxPacks, maxLoose)
	maxPacks, maxLoose = 1, 4
	ctx := context.Background()
	rm := gittest.NewBare(t)
	gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"big": incompressible(t, 256<<10)}})
	cache := t.TempDir()
	r, err := Open(ctx, Options{URL: rm, CacheDir: cache})
	require.NoError(t, err)
	_, err = r.Fetch(ctx, "main")
	require.NoError(t, err)
	// Our own commits, loose; no maintain between them (maxLoose is
	// passed only by the last).
	maxLoose = 1 << 20
	var tips []string
	for i := 0; i < 3; i++ {
		tip, err := r.Update(ctx, "main", func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
			return map[string][]byte{fmt.Sprintf("hosts/%d.yaml", i): []byte(fmt.Sprint(i))}, "ours", nil
		})
		require.NoError(t, err)
		tips = append(tips, tip)
	}
	maxLoose = 4
	r.mu.Lock()
	want := cacheObjects(t, r.st.(*diskStorage))
	require.Empty(t, r.upkeep()) // loose objects into a second pack
	r.mu.Unlock()
	packs, loose := countPacks(t, cache)
	require.Equal(t, 2, packs)
	require.Zero(t, loose)
	requireObjects(t, r, want)

	// Two packs, more than maxPacks: the next upkeep merges the smaller.
	r.mu.Lock()
	require.Empty(t, r.upkeep())
	r.mu.Unlock()
	packs, _ = countPacks(t, cache)
	t.Logf("packs after the second compaction: %d", packs)
	requireObjects(t, r, want)
	requireObjects(t, mustOpen(t, Options{URL: rm, CacheDir: cache}), want)
	for _, tip := range tips {
		_, err := r.ReadFile(tip, "big")
		require.NoError(t, err)
	}
}

// TestHostileCompactInterruptedDelete: compaction deletes each merged
// pack with go-git's DeleteOldObjectPackAndIndex, which removes the .pack
// and then the .idx. A compaction stopped between the two (the process
// killed) leaves a merged pack's .idx without its .pack; every object is
// still in the new pack. The cache opened afterwards must read them all.
func TestHostileCompactInterruptedDelete(t *testing.T) {
	defer func(p, l int) { maxPacks, maxLoose = p, l }(maxPacks, maxLoose)
	maxPacks, maxLoose = 1<<20, 1<<20
	ctx := context.Background()
	rm := gittest.NewBare(t)
	cache := t.TempDir()
	r, err := Open(ctx, Options{URL: rm, CacheDir: cache})
	require.NoError(t, err)
	for i := 0; i < 4; i++ {
		gittest.Commit(t, rm, Edit(fmt.Sprintf("vms/%d.yaml", i)))
		_, err := r.Fetch(ctx, "main")
		require.NoError(t, err)
	}
	idxs := readGlob(t, filepath.Join(cache, "objects", "pack", "pack-*.idx"))
	maxPacks = 2
	r.mu.Lock()
	want := cacheObjects(t, r.st.(*diskStorage))
	changed, err := compact(r.st.(*diskStorage))
	r.mu.Unlock()
	require.NoError(t, err)
	require.True(t, changed)
	require.NoError(t, r.Close())
	// The state between the two removals of one merged pack.
	restored := 0
	for m, b := range idxs {
		if _, err := os.Stat(strings.TrimSuffix(m, ".idx") + ".pack"); os.IsNotExist(err) && restored == 0 {
			require.NoError(t, os.WriteFile(m, b, 0o600))
			restored++
		}
	}
	require.Equal(t, 1, restored)
	maxPacks = 16
	r2, err := Open(ctx, Options{URL: rm, CacheDir: cache})
	require.NoError(t, err)
	tip := gittest.Rev(t, rm, "main")
	_, rerr := r2.ReadFile(tip, "vms/3.yaml")
	if rerr != nil {
		// Does a fetch mend it?
		_, ferr := r2.Fetch(ctx, "main")
		_, again := r2.ReadFile(tip, "vms/3.yaml")
		t.Logf("after a fetch: fetch %v, read %v", ferr, again)
	}
	require.NoError(t, rerr)
	requireObjects(t, r2, want)
}

// TestHostileCompactLargeDeltaChain: a merged pack holds a delta chain
// over a blob past largeObject (git's own deltas, from a repacked remote),
// so encodePack reads it through diskStorage's bounded chain resolution;
// a loose blob past largeObject is merged too. Every object must come
// out whole, in this Repo and in the cache opened again.
func TestHostileCompactLargeDeltaChain(t *testing.T) {
	defer func(p, l int) { maxPacks, maxLoose = p, l }(maxPacks, maxLoose)
	maxPacks, maxLoose = 1<<20, 1<<20
	ctx := context.Background()
	rm := gittest.NewBare(t)
	base := incompressible(t, 3<<20)
	for i := 0; i < 4; i++ {
		v := base[:1<<20] + fmt.Sprintf("edit %d\n", i) + base[1<<20:]
		gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"big.bin": v, "n": fmt.Sprint(i)}})
	}
	gittest.Git(t, rm, "repack", "-adf", "--depth=10", "--window=10")
	cache := t.TempDir()
	r, err := Open(ctx, Options{URL: rm, CacheDir: cache})
	require.NoError(t, err)
	_, err = r.Fetch(ctx, "main")
	require.NoError(t, err)
	// A larger pack, kept as it is.
	gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"huge.bin": incompressible(t, 8<<20)}})
	_, err = r.Fetch(ctx, "main")
	require.NoError(t, err)
	// A loose blob past largeObject, our own.
	loose := incompressible(t, 2<<20)
	tip, err := r.Update(ctx, "main", func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
		return map[string][]byte{"loose.bin": []byte(loose)}, "ours", nil
	})
	require.NoError(t, err)
	r.mu.Lock()
	st := r.st.(*diskStorage)
	want := cacheObjects(t, st)
	chains := 0
	for h := range want {
		if _, links, found, err := st.chain(h); err == nil && found && len(links) > 1 && needsBoundedRead(links) {
			chains++
		}
	}
	r.mu.Unlock()
	require.NotZero(t, chains, "no delta chain past largeObject in the cache: the set-up does not test the bounded read")
	maxPacks, maxLoose = 1, 1
	r.mu.Lock()
	require.Empty(t, r.upkeep())
	r.mu.Unlock()
	packs, nloose := countPacks(t, cache)
	require.Equal(t, 2, packs)
	require.Zero(t, nloose)
	requireObjects(t, r, want)
	maxPacks, maxLoose = 16, 2048
	r2 := mustOpen(t, Options{URL: rm, CacheDir: cache})
	requireObjects(t, r2, want)
	data, err := r2.ReadFileMax(tip, "loose.bin", 4<<20)
	require.NoError(t, err)
	require.Equal(t, loose, string(data))
}

// TestHostileTreeReadAcrossCompaction: a desired.Tree taken before an
// Update whose upkeep compacts the cache (deleting the packs and loose
// objects the tree's files were in, and reopening the store) must still
// read every file afterwards.
func TestHostileTreeReadAcrossCompaction(t *testing.T) {
	defer func(p, l int) { maxPacks, maxLoose = p, l }(maxPacks, maxLoose)
	maxPacks, maxLoose = 1<<20, 1<<20
	ctx := context.Background()
	rm := gittest.NewBare(t)
	for i := 0; i < 3; i++ {
		gittest.Commit(t, rm, Edit(fmt.Sprintf("vms/%d.yaml", i)))
	}
	cache := t.TempDir()
	r, err := Open(ctx, Options{URL: rm, CacheDir: cache})
	require.NoError(t, err)
	gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"big": incompressible(t, 64<<10)}})
	_, err = r.Fetch(ctx, "main") // the largest pack, kept
	require.NoError(t, err)
	tip, err := r.Update(ctx, "main", func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
		return map[string][]byte{"hosts/a.yaml": []byte("a")}, "ours", nil
	})
	require.NoError(t, err)
	tr, err := r.Tree(tip, "")
	require.NoError(t, err)
	maxPacks, maxLoose = 1, 1
	_, err = r.Update(ctx, "main", func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
		return map[string][]byte{"hosts/b.yaml": []byte("b")}, "ours", nil
	})
	require.NoError(t, err)
	_, loose := countPacks(t, cache)
	require.Zero(t, loose, "the Update did not compact")
	n := 0
	require.NoError(t, tr.Walk(func(f desired.File) error {
		_, err := f.Read()
		n++
		return err
	}))
	require.Equal(t, 5, n)
}

// TestHostileFastForwardFetchAfterCompaction is TestHostileCompactOwnPackAgain
// through the public calls alone: our Updates to a branch are compacted
// into a pack of their own; then a person fast-forwards main to our tip (a
// ref move, no new object). Fetching main brings no pack but moves a ref,
// so upkeep runs, merges that one pack, writes it again byte for byte
// under its own name, and deletes it.
func TestHostileFastForwardFetchAfterCompaction(t *testing.T) {
	defer func(p, l int) { maxPacks, maxLoose = p, l }(maxPacks, maxLoose)
	maxPacks, maxLoose = 1, 4
	ctx := context.Background()
	rm, cache, r := oursCache(t)
	var err error
	var tip string
	for i := 0; ; i++ {
		require.Less(t, i, 10, "no compaction into a second pack")
		tip = writeOurs(t, r, i)
		if packs, loose := countPacks(t, cache); packs == 2 && loose == 0 {
			break
		}
	}
	gittest.SetBranch(t, rm, "main", tip) // a fast-forward to our tip
	got, err := r.Fetch(ctx, "main")
	require.NoError(t, err)
	require.Equal(t, tip, got)
	_, err = r.ReadFile(tip, "hosts/0.yaml")
	require.NoError(t, err, "our commit's file, after the fetch")
	r.mu.Lock()
	st := r.st.(*diskStorage)
	_, err = st.EncodedObject(plumbing.AnyObject, plumbing.NewHash(tip))
	r.mu.Unlock()
	require.NoError(t, err, "our tip commit, after the fetch")
}

// TestHostileInterruptedCompactionThenFastForward: maxPacks as shipped.
// A cache of one fetched pack and our loose objects compacts them into a
// pack and is stopped before it deletes the loose objects (a crash; here
// they are put back). Reopened, a fetch that only moves a ref (main
// fast-forwarded to our tip) runs upkeep: the loose objects are past
// maxLoose, the one pack merged is the one the interrupted compaction
// wrote, in the same order, so it is written again under its own name
// and deleted, and then the loose objects are deleted too.
func TestHostileInterruptedCompactionThenFastForward(t *testing.T) {
	defer func(p, l int) { maxPacks, maxLoose = p, l }(maxPacks, maxLoose)
	maxLoose = 1 << 20
	ctx := context.Background()
	rm, cache, r := oursCache(t)
	var err error
	var tip string
	for i := 0; i < 3; i++ {
		tip = writeOurs(t, r, i)
	}
	// Keep the loose objects, compact, put them back: the compaction
	// stopped after its pack was installed.
	saved := readGlob(t, filepath.Join(cache, "objects", "[0-9a-f][0-9a-f]", "*"))
	require.NotEmpty(t, saved)
	maxLoose = 4
	r.mu.Lock()
	changed, err := compact(r.st.(*diskStorage))
	r.mu.Unlock()
	require.NoError(t, err)
	require.True(t, changed)
	require.NoError(t, r.Close())
	for p, b := range saved {
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o700))
		require.NoError(t, os.WriteFile(p, b, 0o444))
	}
	packs, loose := countPacks(t, cache)
	require.Equal(t, 2, packs)
	require.Equal(t, len(saved), loose)

	r2 := mustOpen(t, Options{URL: rm, CacheDir: cache})
	gittest.SetBranch(t, rm, "main", tip)
	got, err := r2.Fetch(ctx, "main")
	require.NoError(t, err)
	require.Equal(t, tip, got)
	_, err = r2.ReadFile(tip, "hosts/0.yaml")
	require.NoError(t, err, "our commit's file, after the fetch")
}

// oursCache is a remote whose main holds an incompressible blob, and a
// cache on disk that fetched main and a branch "ours" at the same commit
// (a pack of git's), for our own commits to add loose objects to.
func oursCache(t *testing.T) (rm, cache string, r *Repo) {
	t.Helper()
	ctx := context.Background()
	rm = gittest.NewBare(t)
	gittest.Commit(t, rm, gittest.Edit{Write: map[string]string{"big": incompressible(t, 256<<10)}})
	cache = t.TempDir()
	r, err := Open(ctx, Options{URL: rm, CacheDir: cache})
	require.NoError(t, err)
	main, err := r.Fetch(ctx, "main")
	require.NoError(t, err)
	gittest.SetBranch(t, rm, "ours", main)
	_, err = r.Fetch(ctx, "ours")
	require.NoError(t, err)
	return rm, cache, r
}

// writeOurs commits hosts/<i>.yaml on "ours" through Update (loose
// objects) and returns the new tip.
func writeOurs(t *testing.T, r *Repo, i int) string {
	t.Helper()
	tip, err := r.Update(context.Background(), "ours", func(string, func(string) ([]byte, error)) (map[string][]byte, string, error) {
		return map[string][]byte{fmt.Sprintf("hosts/%d.yaml", i): []byte(fmt.Sprint(i))}, "ours", nil
	})
	require.NoError(t, err)
	return tip
}

// readGlob is path → content of every file pattern matches: what a test
// puts back to stage a compaction cut short.
func readGlob(t *testing.T, pattern string) map[string][]byte {
	t.Helper()
	ms, err := filepath.Glob(pattern)
	require.NoError(t, err)
	out := map[string][]byte{}
	for _, m := range ms {
		b, err := os.ReadFile(m)
		require.NoError(t, err)
		out[m] = b
	}
	return out
}
