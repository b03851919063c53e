package gitsource

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing/format/idxfile"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/stretchr/testify/require"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// deltaRepo commits ten versions of a few files that differ a little, so
// git packs most of them as deltas (chains of them), and returns the
// bare repository.
func deltaRepo(t *testing.T) string {
	dir := gittest.NewBare(t)
	body := ""
	for v := 0; v < 10; v++ {
		for i := 0; i < 40; i++ {
			body += fmt.Sprintf("line %d of version %d, kept by every later version\n", i, v)
		}
		gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{
			"fleet/a.yaml":    fmt.Sprintf("version: %d\n%s", v, body),
			"fleet/b.yaml":    fmt.Sprintf("%sversion: %d\n", body, v),
			"fleet/small.txt": fmt.Sprintf("v%d\n", v),
		}})
	}
	gittest.Git(t, dir, "repack", "-a", "-d", "-q", "--depth=50")
	return dir
}

// A fetched pack is indexed by gitsource itself: git fsck finds the cache
// whole (every object hashed as git would, every delta resolved, the
// index matching the pack), and every version of every file reads back.
func TestFetchedPackIndexIsGits(t *testing.T) {
	ctx := context.Background()
	dir := deltaRepo(t)
	cache := filepath.Join(t.TempDir(), "cache")
	r, err := Open(ctx, Options{URL: dir, CacheDir: cache})
	require.NoError(t, err)
	defer r.Close()
	tip, err := r.Fetch(ctx, "main")
	require.NoError(t, err)
	verifyPack := exec.Command("git", "verify-pack", "-v")
	packs, _ := filepath.Glob(filepath.Join(cache, "objects", "pack", "*.idx"))
	require.Len(t, packs, 1)
	verifyPack.Args = append(verifyPack.Args, packs[0])
	out, err := verifyPack.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "chain length = 2", "the pack holds delta chains:\n%s", out)
	out, err = exec.Command("git", "-C", cache, "fsck", "--full", "--strict").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for v, c := 9, tip; v >= 0; v-- {
		got, err := r.ReadFile(c, "fleet/b.yaml")
		require.NoError(t, err)
		require.True(t, strings.HasSuffix(string(got), fmt.Sprintf("version: %d\n", v)))
		require.Equal(t, gittest.Show(t, dir, c, "fleet/a.yaml"), strings.TrimSpace(string(mustRead(t, r, c, "fleet/a.yaml"))))
		if v > 0 {
			c = gittest.Rev(t, dir, c+"^")
		}
	}
}

func mustRead(t *testing.T, r *Repo, commit, p string) []byte {
	b, err := r.ReadFile(commit, p)
	require.NoError(t, err)
	return b
}

// A pack of ref-deltas (a base named by hash, as git sends to a client
// that does not ask for ofs-delta) gets the index git index-pack makes
// for it; a pack cut short or with a wrong checksum is refused as
// malformed, the remote's fault and not cache damage (cloning the cache
// afresh would fetch the same pack), and leaves nothing in the cache.
func TestPackWriterRefDeltasAndDamage(t *testing.T) {
	ctx := context.Background()
	dir := deltaRepo(t)
	objs := gittest.Git(t, dir, "rev-list", "--objects", "--all")
	pack := exec.Command("git", "-C", dir, "pack-objects", "--stdout", "-q")
	pack.Stdin = strings.NewReader(objs + "\n")
	data, err := pack.Output()
	require.NoError(t, err)

	want := filepath.Join(t.TempDir(), "want.pack")
	require.NoError(t, os.WriteFile(want, data, 0o600))
	out, err := exec.Command("git", "index-pack", want).CombinedOutput()
	require.NoError(t, err, "%s", out)
	wantIdx, err := os.ReadFile(strings.TrimSuffix(want, ".pack") + ".idx")
	require.NoError(t, err)

	cache := filepath.Join(t.TempDir(), "cache")
	r, err := Open(ctx, Options{URL: dir, CacheDir: cache})
	require.NoError(t, err)
	defer r.Close()
	st := r.st.(*diskStorage)
	write := func(b []byte) error {
		w, err := st.PackfileWriter()
		require.NoError(t, err)
		if _, err := w.Write(b); err != nil {
			return err
		}
		return w.Close()
	}
	for name, bad := range map[string][]byte{
		"cut short":      data[:len(data)/2],
		"wrong checksum": append(bytes.Clone(data[:len(data)-1]), data[len(data)-1]^1),
	} {
		err := write(bad)
		require.Error(t, err, name)
		require.ErrorIs(t, err, ErrPackRefused, name)
		require.ErrorIs(t, err, packfile.ErrMalformedPackFile, name)
		require.False(t, repairable(err), "%s: %v is not reported as cache damage", name, err)
		left, _ := filepath.Glob(filepath.Join(cache, "objects", "pack", "*"))
		require.Empty(t, left, name)
	}
	require.NoError(t, write(data))
	idxs, _ := filepath.Glob(filepath.Join(cache, "objects", "pack", "*.idx"))
	require.Len(t, idxs, 1)
	got, err := os.ReadFile(idxs[0])
	require.NoError(t, err)
	require.Equal(t, decodeIdx(t, wantIdx), decodeIdx(t, got))
	out, err = exec.Command("git", "-C", cache, "fsck", "--full").CombinedOutput()
	require.NoError(t, err, "%s", out)
}

// decodeIdx lists an index's entries as text, for comparison.
func decodeIdx(t *testing.T, b []byte) string {
	idx := idxfile.NewMemoryIndex()
	require.NoError(t, idxfile.NewDecoder(bytes.NewReader(b)).Decode(idx))
	it, err := idx.Entries()
	require.NoError(t, err)
	var sb strings.Builder
	for {
		e, err := it.Next()
		if err != nil {
			break
		}
		fmt.Fprintf(&sb, "%s %d %08x\n", e.Hash, e.Offset, e.CRC32)
	}
	return sb.String()
}

// Deltas past largeObject resolve through spill files, never whole in
// memory: a 3 MiB binary changed in place, with its halves swapped (a
// copy that goes backwards in its base) and grown by an insert larger
// than largeObject, is stored by git as a chain of deltas; the cache
// indexes it as git does, every version reads back byte for byte, and no
// spill file is left behind.
func TestLargeDeltasResolveThroughSpillFiles(t *testing.T) {
	ctx := context.Background()
	dir := gittest.NewBare(t)
	v0 := make([]byte, 3*largeObject)
	_, err := rand.Read(v0)
	require.NoError(t, err)
	v1 := bytes.Clone(v0)
	copy(v1[len(v1)/2:], "changed in place")
	half := len(v1) / 2
	v2 := append(bytes.Clone(v1[half:]), v1[:half]...)
	grown := make([]byte, largeObject+largeObject/2)
	_, err = rand.Read(grown)
	require.NoError(t, err)
	v3 := append(bytes.Clone(v2), grown...)
	versions := [][]byte{v0, v1, v2, v3}
	for i, v := range versions {
		gittest.Commit(t, dir, gittest.Edit{Write: map[string]string{
			"assets/disk.img": string(v),
			"fleet/small.txt": fmt.Sprintf("v%d\n", i),
		}})
	}
	gittest.Git(t, dir, "repack", "-a", "-d", "-q", "--depth=50", "--window=10")
	verify, err := exec.Command("sh", "-c", "git verify-pack -v "+dir+"/objects/pack/*.idx").CombinedOutput()
	require.NoError(t, err, "%s", verify)
	require.Regexp(t, `blob +\d+ +\d+ +\d+ +\d+ +[0-9a-f]{40}`, string(verify), "the big blob is stored as a delta")

	cache := filepath.Join(t.TempDir(), "cache")
	r, err := Open(ctx, Options{URL: dir, CacheDir: cache})
	require.NoError(t, err)
	defer r.Close()
	_, err = r.Fetch(ctx, "main")
	require.NoError(t, err)
	out, err := exec.Command("git", "-C", cache, "fsck", "--full", "--strict").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for i, v := range versions {
		rev := gittest.Rev(t, dir, fmt.Sprintf("main~%d", len(versions)-1-i)) + ":assets/disk.img"
		got, err := exec.Command("git", "-C", cache, "cat-file", "blob", rev).Output()
		require.NoError(t, err, rev)
		require.True(t, bytes.Equal(v, got), "%s reads back as committed", rev)
	}
	left, _ := filepath.Glob(filepath.Join(cache, "objects", "pack", "tmp_*"))
	require.Empty(t, left, "spill files are removed")
}

// applyDelta reads a large base at each copy's offset: a delta of 200,000
// one-byte copies alternating between the base's last and first byte (a
// copy backwards every time) costs what it writes, where a streaming
// applier re-reading the base from its start for each would read 800 GB.
// Malformed instructions are refused, never written past the result.
func TestApplyDeltaCopiesAtOffsets(t *testing.T) {
	base := make([]byte, 4*largeObject)
	base[0], base[len(base)-1] = 'a', 'z'
	delta := binary.AppendUvarint(nil, uint64(len(base)))
	delta = binary.AppendUvarint(delta, 200000)
	last := uint32(len(base) - 1)
	var want bytes.Buffer
	for i := 0; i < 100000; i++ {
		delta = append(delta, 0x80|0x0f|0x10, byte(last), byte(last>>8), byte(last>>16), byte(last>>24), 1)
		delta = append(delta, 0x80|0x10, 1)
		want.WriteString("za")
	}
	var got bytes.Buffer
	n, err := applyDelta(&got, bytes.NewReader(base), int64(len(base)), bufio.NewReader(bytes.NewReader(delta)), 200000)
	require.NoError(t, err)
	require.Equal(t, int64(200000), n)
	require.True(t, bytes.Equal(want.Bytes(), got.Bytes()))

	head := func(dst uint64) []byte {
		return binary.AppendUvarint(binary.AppendUvarint(nil, uint64(len(base))), dst)
	}
	for name, tc := range map[string]struct {
		delta []byte
		dst   uint64
		want  error
	}{
		"copy past the base":         {append(head(2), 0x80|0x0f|0x10, byte(last), byte(last>>8), byte(last>>16), byte(last>>24), 2), 2, packfile.ErrInvalidDelta},
		"copy past the result":       {append(head(1), 0x80|0x10, 2), 1, packfile.ErrInvalidDelta},
		"insert past the result":     {append(head(1), 2, 'x', 'y'), 1, packfile.ErrInvalidDelta},
		"instructions past the end":  {append(head(1), 1, 'x', 1, 'y'), 1, packfile.ErrInvalidDelta},
		"instructions end too early": {append(head(3), 1, 'x'), 3, packfile.ErrInvalidDelta},
		"reserved command 0":         {append(head(1), 0), 1, packfile.ErrDeltaCmd},
	} {
		var out bytes.Buffer
		_, err := applyDelta(&out, bytes.NewReader(base), int64(len(base)), bufio.NewReader(bytes.NewReader(tc.delta)), tc.dst)
		require.ErrorIs(t, err, tc.want, name)
		require.LessOrEqual(t, uint64(out.Len()), tc.dst, name)
	}
}
