package gitsource

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/binary"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"
)

// Hostile packs the indexer must refuse as the remote's fault, leaving
// nothing in the cache: ofs-deltas on no earlier object, deltas whose
// declared sizes lie, copies past the base, object counts that lie, and
// a cycle through an ofs-delta and a ref-delta.
func TestHostilePacksRefused(t *testing.T) {
	base := []byte("0123456789abcdef")
	bh := plumbing.ComputeHash(plumbing.BlobObject, base)
	lies := func(src, dst uint64, instr ...byte) []byte {
		return append(binary.AppendUvarint(binary.AppendUvarint(nil, src), dst), instr...)
	}
	big := make([]byte, 2<<20)
	cases := map[string][]byte{
		"result larger than declared":  craftPack(t, []craftObject{{typ: plumbing.BlobObject, data: base}, {ofs: 1, data: lies(16, 4, 0x90|0x80, 0, 8)}}),
		"result smaller than declared": craftPack(t, []craftObject{{typ: plumbing.BlobObject, data: base}, {ofs: 1, data: lies(16, 40, 0x91, 0, 8)}}),
		"copy past the base's end":     craftPack(t, []craftObject{{typ: plumbing.BlobObject, data: base}, {ofs: 1, data: lies(16, 8, 0x91, 12, 8)}}),
		"wrong base size":              craftPack(t, []craftObject{{typ: plumbing.BlobObject, data: base}, {ofs: 1, data: lies(15, 8, 0x91, 0, 8)}}),
		"large: result smaller":        craftPack(t, []craftObject{{typ: plumbing.BlobObject, data: big}, {ofs: 1, data: lies(2<<20, 3<<20, 0x80)}}),
		"large: copy past the end":     craftPack(t, []craftObject{{typ: plumbing.BlobObject, data: big}, {ofs: 1, data: lies(2<<20, 0x10000, 0x80|0x08, 0xff)}}),
		"large: trailing instructions": craftPack(t, []craftObject{{typ: plumbing.BlobObject, data: big}, {ofs: 1, data: lies(2<<20, 2<<20, repeat(0x80, 33)...)}}),
		"ofs and ref cycle": craftPack(t, []craftObject{
			{typ: plumbing.BlobObject, data: base},
			{ref: plumbing.ComputeHash(plumbing.BlobObject, []byte("0123456789abcdefX")), data: deltaOf(17, 16, "")},
			{ofs: 1, data: deltaOf(16, 16, "X")},
		}),
		"ref to itself": craftPack(t, []craftObject{{typ: plumbing.BlobObject, data: base}, {ref: plumbing.ComputeHash(plumbing.BlobObject, []byte("zz")), data: deltaOf(2, 2, "")}}),
	}
	_ = bh
	for name, pack := range cases {
		_, st, cache := openEmptyCache(t, Options{})
		err := storePack(context.Background(), st, pack)
		t.Logf("%s: %v", name, err)
		require.ErrorIs(t, err, ErrPackRefused, name)
		require.False(t, repairable(err), "%s: the remote's fault, not cache damage", name)
		requireNothingLeft(t, cache)
	}
	// Cut short, and an ofs-delta whose offset points at itself or
	// before the pack (its offset bytes edited in a good pack).
	good := craftPack(t, []craftObject{{typ: plumbing.BlobObject, data: base}, {ofs: 1, data: deltaOf(16, 16, "X")}})
	at := 12 + len(craftPack(t, []craftObject{{typ: plumbing.BlobObject, data: base}})) - 32 // the delta's header
	self := append([]byte(nil), good...)
	self[at+1] = 0 // offset 0: itself
	outside := append([]byte(nil), good...)
	outside[at+1] = 0x7f // 127 bytes back: before the pack
	for name, p := range map[string][]byte{"cut short": good[:len(good)/2], "ofs-delta on itself": resum(self), "ofs-delta before the pack": resum(outside)} {
		_, st, cache := openEmptyCache(t, Options{})
		err := storePack(context.Background(), st, p)
		t.Logf("%s: %v", name, err)
		require.ErrorIs(t, err, ErrPackRefused, name)
		require.False(t, repairable(err), "%s: the remote's fault, not cache damage", name)
		requireNothingLeft(t, cache)
	}
	// Object counts that lie.
	pack := craftPack(t, []craftObject{{typ: plumbing.BlobObject, data: base}, {typ: plumbing.BlobObject, data: []byte("x")}})
	for name, n := range map[string]uint32{"more": 3, "fewer": 1, "huge": 1 << 31} {
		p := append([]byte(nil), pack...)
		binary.BigEndian.PutUint32(p[8:], n)
		_, st, cache := openEmptyCache(t, Options{})
		err := storePack(context.Background(), st, p)
		t.Logf("count %s: %v", name, err)
		require.ErrorIs(t, err, ErrPackRefused, name)
		require.False(t, repairable(err), "count %s: the remote's fault, not cache damage", name)
		requireNothingLeft(t, cache)
	}
}

// resum gives an edited pack its trailing SHA-1 again.
func resum(p []byte) []byte {
	sum := sha1.Sum(p[:len(p)-20])
	return append(p[:len(p)-20:len(p)-20], sum[:]...)
}

func repeat(b byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

// A read that cannot spill (past the spill limit, or a filesystem that
// refuses the spill file) fails as what it is, never as a missing object:
// that would be cache damage, repaired by cloning the cache afresh on
// every pass, which mends nothing.
func TestReadSpillFailureIsNoCacheDamage(t *testing.T) {
	pack, _, _ := smallOverLarge(t, 4<<20)
	r, st, cache := openEmptyCache(t, Options{})
	require.NoError(t, storePack(context.Background(), st, pack))
	var huge []byte
	for i := 0; i < (8<<20)/128; i++ {
		huge = append(huge, repeat('x', 127)...)
	}
	h := plumbing.ComputeHash(plumbing.BlobObject, huge)
	r.mu.Lock()
	defer r.mu.Unlock()
	st.maxSpill = 16 << 20 // the base and the delta fit, the result not
	o, err := st.EncodedObject(plumbing.BlobObject, h)
	require.NoError(t, err)
	_, err = o.Reader()
	t.Logf("read past the spill limit: %v", err)
	require.ErrorIs(t, err, ErrPackRefused)
	require.NotErrorIs(t, err, ErrObjectMissing)
	require.False(t, repairable(err))
	requireNoSpill(t, cache)

	st.maxSpill = 0
	rd, err := o.Reader()
	require.NoError(t, err, "within the limit it reads")
	require.NoError(t, rd.Close())
	requireNoSpill(t, cache)
}

// A delta of inserts whose result cannot be written (past the spill
// limit here; a full disk or the context's end alike) fails with that
// cause while indexing too, not as an invalid delta.
func TestInsertDeltaWriteFailureKeepsItsCause(t *testing.T) {
	pack, _, _ := smallOverLarge(t, 4<<20)
	_, st, cache := openEmptyCache(t, Options{MaxSpill: 16 << 20})
	err := storePack(context.Background(), st, pack)
	t.Logf("index past the spill limit: %v", err)
	require.ErrorIs(t, err, ErrPackRefused)
	require.Contains(t, err.Error(), "expands past the spill limit")
	require.NotErrorIs(t, err, packfile.ErrInvalidDelta)
	requireNothingLeft(t, cache)
}

// serveAnswer serves over http a remote whose ref advertisement is adv
// and whose every upload-pack answer is answer, and returns its URL.
func serveAnswer(t *testing.T, adv, answer string) string {
	mux := http.NewServeMux()
	mux.HandleFunc("/r.git/info/refs", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-git-upload-pack-advertisement")
		io.WriteString(w, pkt("# service=git-upload-pack\n")+"0000"+adv)
	})
	mux.HandleFunc("/r.git/git-upload-pack", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-git-upload-pack-result")
		io.WriteString(w, answer)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/r.git"
}

// serveAnswerFile is serveAnswer over the file transport: a stand-in
// git-upload-pack first in PATH. It returns the remote's path.
func serveAnswerFile(t *testing.T, adv, answer string) string {
	bin := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bin, "adv"), []byte(adv), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(bin, "answer"), []byte(answer), 0o600))
	script := "#!/bin/sh\ncat " + bin + "/adv\nwhile read -r l; do case \"$l\" in *done*) break;; esac; done\ncat " + bin + "/answer\n"
	require.NoError(t, os.WriteFile(filepath.Join(bin, "git-upload-pack"), []byte(script), 0o700))
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	return filepath.Join(t.TempDir(), "r.git")
}

// A remote whose answer to a shallow fetch is malformed (a shallow line
// of the wrong length, a pkt-line length that is no number), or whose ref
// advertisement is, fails the fetch as the remote's fault, over http and
// the file transport: no repair, no fresh clone of the cache.
func TestMalformedShallowAnswerIsNoCacheDamage(t *testing.T) {
	adv, _ := shallowFlood(0)
	type remote struct{ adv, answer string }
	cases := map[string]remote{
		"short shallow line":      {adv, pkt("shallow abc\n") + "0000" + pkt("NAK\n")},
		"long unshallow line":     {adv, pkt("unshallow "+strings.Repeat("a", 41)+"\n") + "0000" + pkt("NAK\n")},
		"pkt length not a number": {adv, "00zzshallow"},
		"malformed advertisement": {pkt("zz"+adv[6:]) + "0000", ""},
	}
	serve := map[string]func(*testing.T, string, string) string{"http": serveAnswer, "file": serveAnswerFile}
	for name, c := range cases {
		for transport, serve := range serve {
			name := name + " over " + transport
			logger, hook := logtest.NewNullLogger()
			r, err := Open(context.Background(), Options{URL: serve(t, c.adv, c.answer), CacheDir: filepath.Join(t.TempDir(), "cache"), Depth: 1, Logger: logrus.NewEntry(logger)})
			require.NoError(t, err, name)
			_, err = r.Fetch(context.Background(), "main")
			t.Logf("%s: %v", name, err)
			require.Error(t, err, name)
			require.False(t, repairable(err), "%s: the remote's fault, not cache damage", name)
			for _, e := range hook.AllEntries() {
				require.NotContains(t, e.Message, "repair", name)
			}
			r.Close()
		}
	}
}

// The spill limit holds exactly: a delta whose result is as large as the
// limit indexes, one byte less of limit refuses it.
func TestSpillLimitBoundary(t *testing.T) {
	pack := bomb(t, 32) // a 2 MiB result, the only spill
	_, st, _ := openEmptyCache(t, Options{MaxSpill: 2 << 20})
	require.NoError(t, storePack(context.Background(), st, pack))
	_, st, cache := openEmptyCache(t, Options{MaxSpill: 2<<20 - 1})
	err := storePack(context.Background(), st, pack)
	require.ErrorIs(t, err, ErrPackRefused)
	requireNothingLeft(t, cache)
}

// A pack with bytes after its trailing checksum is refused: what follows
// the checksum is no part of any object, and a pack stored with it would
// not be the pack its name and index say.
func TestPackWithTrailingBytesRefused(t *testing.T) {
	pack := craftPack(t, []craftObject{{typ: plumbing.BlobObject, data: []byte("a")}})
	_, st, cache := openEmptyCache(t, Options{})
	err := storePack(context.Background(), st, append(pack, "trailing"...))
	t.Logf("trailing bytes: %v", err)
	require.ErrorIs(t, err, ErrPackRefused)
	require.False(t, repairable(err))
	requireNothingLeft(t, cache)
}

// A base that is itself the result of a large delta (a chain of large
// results) indexes and reads back through spill files, and leaves none.
func TestLargeResultAsBase(t *testing.T) {
	big := make([]byte, 2<<20)
	mid := append(append([]byte(nil), big...), "mid"...)
	top := append(append([]byte(nil), mid[:100]...), "top"...)
	d1 := binary.AppendUvarint(binary.AppendUvarint(nil, uint64(len(big))), uint64(len(mid)))
	for i := 0; i < 32; i++ {
		d1 = append(d1, 0x80|0x01|0x02|0x04, 0, byte(i), 0) // copy 64 KiB at i×64 KiB
	}
	d1 = append(d1, 3, 'm', 'i', 'd')
	objs := []craftObject{{typ: plumbing.BlobObject, data: big}, {ofs: 1, data: d1}, {ofs: 1, data: deltaOf(len(mid), 100, "top")}}
	r, st, cache := openEmptyCache(t, Options{})
	require.NoError(t, storePack(context.Background(), st, craftPack(t, objs)))
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, want := range [][]byte{mid, top} {
		o, err := st.EncodedObject(plumbing.BlobObject, plumbing.ComputeHash(plumbing.BlobObject, want))
		require.NoError(t, err)
		rd, err := o.Reader()
		require.NoError(t, err)
		got, err := io.ReadAll(rd)
		require.NoError(t, err)
		require.NoError(t, rd.Close())
		require.Equal(t, len(want), len(got))
		require.True(t, string(want) == string(got))
	}
	left, _ := filepath.Glob(cache + "/objects/pack/tmp_*")
	require.Empty(t, left)
}

// A pack that holds an object twice, with a delta on the second copy, is
// refused: the index lists each object once, so the delta would name a
// base the index does not know, and every read of it would fail as cache
// damage, repaired by fetching the same pack again.
func TestPackRepeatingAnObjectRefused(t *testing.T) {
	pack := craftPack(t, []craftObject{{typ: plumbing.BlobObject, data: []byte("a")}, {typ: plumbing.BlobObject, data: []byte("a")}, {ofs: 1, data: deltaOf(1, 1, "b")}})
	_, st, cache := openEmptyCache(t, Options{})
	err := storePack(context.Background(), st, pack)
	t.Logf("an object twice: %v", err)
	require.ErrorIs(t, err, ErrPackRefused)
	require.Contains(t, err.Error(), "in the pack twice")
	require.False(t, repairable(err))
	requireNothingLeft(t, cache)
}

// A large chain whose pack on disk changed under its index (the same
// layout, one byte of a delta's insert different: an unlucky disk)
// resolves to another object: the read fails as cache damage, to be
// fetched again, and never returns the wrong content.
func TestChainResolvingToWrongHashIsDamage(t *testing.T) {
	big := make([]byte, 2<<20)
	mk := func(line string) []byte {
		return craftPack(t, []craftObject{{typ: plumbing.BlobObject, data: big}, {ofs: 1, data: deltaOf(len(big), 64, line)}})
	}
	good, bad := mk("kind: VM\n"), mk("kind: VX\n")
	require.Equal(t, len(good), len(bad), "the same layout")
	r, st, cache := openEmptyCache(t, Options{})
	require.NoError(t, storePack(context.Background(), st, good))
	packs, _ := filepath.Glob(cache + "/objects/pack/*.pack")
	require.Len(t, packs, 1)
	require.NoError(t, os.WriteFile(packs[0], bad, 0o600))
	r.mu.Lock()
	defer r.mu.Unlock()
	st.resetPacks()
	o, err := st.EncodedObject(plumbing.BlobObject, plumbing.ComputeHash(plumbing.BlobObject, append(append([]byte(nil), big[:64]...), "kind: VM\n"...)))
	require.NoError(t, err)
	_, err = o.Reader()
	t.Logf("a chain resolving to another object: %v", err)
	require.ErrorIs(t, err, ErrObjectMissing)
	require.True(t, repairable(err))
	requireNoSpill(t, cache)
}

// byteCopies is delta instructions that make n bytes from a base of
// baseSize bytes, one byte per copy, walking the base backwards from
// its end (each copy a few bytes of pack: a delta that costs its
// receiver time, not bytes).
func byteCopies(baseSize, n int) []byte {
	d := binary.AppendUvarint(binary.AppendUvarint(nil, uint64(baseSize)), uint64(n))
	for i := 0; i < n; i++ {
		off := (baseSize - 1 - i%baseSize)
		d = append(d, 0x80|0x0f|0x10, byte(off), byte(off>>8), byte(off>>16), byte(off>>24), 1)
	}
	return d
}

// One-byte copies across the base's windows make what go-git's
// PatchDelta makes.
func TestApplyDeltaByteCopiesAcrossWindows(t *testing.T) {
	base := make([]byte, 200<<10)
	for i := range base {
		base[i] = byte(i * 7)
	}
	d := byteCopies(len(base), 300<<10)
	want, err := packfile.PatchDelta(base, d)
	require.NoError(t, err)
	var got bytes.Buffer
	n, err := applyDelta(&got, bytes.NewReader(base), int64(len(base)), bufio.NewReader(bytes.NewReader(d)), uint64(len(want)))
	require.NoError(t, err)
	require.Equal(t, int64(len(want)), n)
	require.True(t, bytes.Equal(want, got.Bytes()))
}

// BenchmarkByteCopiesFromSpilledBase indexes a pack of 100 KB whose delta
// makes 4 MiB from a 2 MiB base (spilled, past largeObject) one byte per
// copy, walking the base backwards: 9 s when each copy read the base's
// file, 0.4 s through a window (a loaded 2-core machine).
func BenchmarkByteCopiesFromSpilledBase(b *testing.B) {
	big := make([]byte, 2<<20)
	pack := craftPack(b, []craftObject{{typ: plumbing.BlobObject, data: big}, {ofs: 1, data: byteCopies(len(big), 4<<20)}})
	path := filepath.Join(b.TempDir(), "tmp_pack")
	if err := os.WriteFile(path, pack, 0o600); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := indexPack(context.Background(), f, int64(len(pack)), DefaultMaxSpill); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}
