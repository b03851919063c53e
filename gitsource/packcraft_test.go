package gitsource

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/gitfleet/gitfleet/testsupport/gittest"
)

// craftObject is one object of a pack made by hand: a whole object of
// typ, or a delta (data is its instructions) on the ofs-th object before
// it (ofs > 0) or on the object named ref.
type craftObject struct {
	typ  plumbing.ObjectType
	data []byte
	ofs  int
	ref  plumbing.Hash
}

// craftPack encodes objs as a version 2 pack, as git's pack format
// documentation (gitformat-pack) describes it, trailing SHA-1 included:
// the shapes git never writes (a chain of ref-deltas stored deepest
// first, a delta bomb, a small file on a huge base) for the indexer and
// the reader to meet.
func craftPack(t testing.TB, objs []craftObject) []byte {
	t.Helper()
	var pack bytes.Buffer
	pack.WriteString("PACK")
	_ = binary.Write(&pack, binary.BigEndian, uint32(2))
	_ = binary.Write(&pack, binary.BigEndian, uint32(len(objs)))
	offsets := make([]int64, len(objs))
	z := zlib.NewWriter(nil)
	for i, o := range objs {
		offsets[i] = int64(pack.Len())
		typ := o.typ
		switch {
		case o.ofs > 0:
			typ = plumbing.OFSDeltaObject
		case o.ref != plumbing.ZeroHash:
			typ = plumbing.REFDeltaObject
		}
		size := uint64(len(o.data))
		c := byte(typ)<<4 | byte(size&0x0f)
		size >>= 4
		for size > 0 {
			pack.WriteByte(c | 0x80)
			c = byte(size & 0x7f)
			size >>= 7
		}
		pack.WriteByte(c)
		switch typ {
		case plumbing.OFSDeltaObject:
			// git's offset encoding: big-endian base-128, each
			// continuation adding one.
			off := uint64(offsets[i] - offsets[i-o.ofs])
			b := []byte{byte(off & 0x7f)}
			for off >>= 7; off > 0; off >>= 7 {
				off--
				b = append([]byte{byte(0x80 | off&0x7f)}, b...)
			}
			pack.Write(b)
		case plumbing.REFDeltaObject:
			pack.Write(o.ref[:])
		}
		z.Reset(&pack)
		_, _ = z.Write(o.data)
		_ = z.Close()
	}
	sum := sha1.Sum(pack.Bytes())
	pack.Write(sum[:])
	return pack.Bytes()
}

// deltaOf is delta instructions that make dst from a base of baseSize
// bytes: a copy of the base's first n bytes (n ≤ 0xffffff, 0 for none),
// then insert, at most 127 bytes.
func deltaOf(baseSize int, n int, insert string) []byte {
	d := binary.AppendUvarint(nil, uint64(baseSize))
	d = binary.AppendUvarint(d, uint64(n+len(insert)))
	if n > 0 {
		d = append(d, 0x80|0x10|0x20|0x40, byte(n), byte(n>>8), byte(n>>16))
	}
	if insert != "" {
		d = append(d, byte(len(insert)))
		d = append(d, insert...)
	}
	return d
}

// commitPack adds to objs a tree of entries (name → blob hash, regular
// files) and a commit of it, and returns the pack and the commit.
func commitPack(t testing.TB, objs []craftObject, entries map[string]plumbing.Hash) ([]byte, string) {
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var tree []byte
	for _, n := range names {
		h := entries[n]
		tree = append(append(tree, "100644 "+n+"\x00"...), h[:]...)
	}
	commit := []byte(fmt.Sprintf("tree %s\nauthor a <a@example.org> 0 +0000\ncommitter a <a@example.org> 0 +0000\n\nfleet\n",
		plumbing.ComputeHash(plumbing.TreeObject, tree)))
	objs = append(objs, craftObject{typ: plumbing.TreeObject, data: tree}, craftObject{typ: plumbing.CommitObject, data: commit})
	return craftPack(t, objs), plumbing.ComputeHash(plumbing.CommitObject, commit).String()
}

// bareFromPack makes a bare repository holding pack (indexed by git
// itself) with main at commit, and returns its path.
func bareFromPack(t testing.TB, pack []byte, commit string) string {
	dir := gittest.NewBare(t)
	path := filepath.Join(dir, "objects", "pack", "crafted.pack")
	if err := os.WriteFile(path, pack, 0o600); err != nil {
		t.Fatal(err)
	}
	gittest.Git(t, dir, "index-pack", path)
	gittest.Git(t, dir, "update-ref", "refs/heads/main", commit)
	return dir
}
