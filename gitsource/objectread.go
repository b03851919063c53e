package gitsource

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
)

// Bounded memory on read. go-git reads a packed delta by reading its base
// whole into memory and patching it there (packfile.ApplyDelta), and
// learns a delta's size by inflating the whole delta: a 1 KiB fleet file
// stored as a delta on a 100 MB blob cost 269 MB to read. diskStorage
// reads such objects itself: it finds the object in the packs' indexes on
// disk, reads sizes from the object and delta headers alone, and resolves
// a delta chain with anything past largeObject in it (a base, a delta, an
// intermediate result) through spill files, as the pack indexer does
// (see deltaResolver), within the spill limit. Chains of small objects
// are left to go-git, whose caches serve tree walks well.

// goGitDepth is the longest delta chain of small objects left to go-git;
// a longer one is resolved here, once per link (go-git re-reads
// ref-delta bases from the pack for every link).
const goGitDepth = 64

// maxGoGits bounds the objects remembered as go-git's to read.
const maxGoGits = 1 << 17

// packIndex is one pack's index (.idx, version 2, see gitformat-pack),
// read from disk at each lookup: only its fan-out table is kept.
type packIndex struct {
	pack   string // the .pack file's path
	idx    *os.File
	packF  *os.File // opened at the first read of the pack
	count  uint32
	fanout [256]uint32
	size   int64 // of the pack, in bytes
}

// idxHeader is the size of an index's header and fan-out table.
const idxHeader = 8 + 256*4

// openPackIndex opens the index at path and reads its fan-out table.
func openPackIndex(path string) (*packIndex, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	var head [idxHeader]byte
	if _, err := f.ReadAt(head[:], 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("read pack index %s: %w", path, err)
	}
	if !bytes.Equal(head[:4], []byte{0xff, 't', 'O', 'c'}) || binary.BigEndian.Uint32(head[4:8]) != 2 {
		f.Close()
		return nil, fmt.Errorf("pack index %s: not a version 2 index", path)
	}
	p := &packIndex{pack: strings.TrimSuffix(path, ".idx") + ".pack", idx: f}
	for i := range p.fanout {
		p.fanout[i] = binary.BigEndian.Uint32(head[8+4*i:])
	}
	p.count = p.fanout[255]
	fi, err := os.Stat(p.pack)
	if err != nil {
		f.Close()
		return nil, err
	}
	p.size = fi.Size()
	return p, nil
}

// find returns the offset of h in the pack; false when it is not there.
func (p *packIndex) find(h plumbing.Hash) (int64, bool, error) {
	lo := uint32(0)
	if h[0] > 0 {
		lo = p.fanout[h[0]-1]
	}
	hi := p.fanout[h[0]]
	var at plumbing.Hash
	var err error
	i := lo + uint32(sort.Search(int(hi-lo), func(k int) bool {
		if err != nil {
			return true
		}
		_, err = p.idx.ReadAt(at[:], idxHeader+int64(lo+uint32(k))*20)
		return bytes.Compare(at[:], h[:]) >= 0
	}))
	if err != nil {
		return 0, false, err
	}
	if i >= hi {
		return 0, false, nil
	}
	if _, err := p.idx.ReadAt(at[:], idxHeader+int64(i)*20); err != nil || at != h {
		return 0, false, err
	}
	var b [8]byte
	offs := idxHeader + int64(p.count)*24
	if _, err := p.idx.ReadAt(b[:4], offs+int64(i)*4); err != nil {
		return 0, false, err
	}
	off := binary.BigEndian.Uint32(b[:4])
	if off&0x80000000 == 0 {
		return int64(off), true, nil
	}
	if _, err := p.idx.ReadAt(b[:], offs+int64(p.count)*4+int64(off&0x7fffffff)*8); err != nil {
		return 0, false, err
	}
	return int64(binary.BigEndian.Uint64(b[:])), true, nil
}

// scanner is a scanner of the pack, its file opened once.
func (p *packIndex) scanner() (*packfile.Scanner, error) {
	if p.packF == nil {
		f, err := os.Open(p.pack)
		if err != nil {
			return nil, err
		}
		p.packF = f
	}
	return packfile.NewScanner(p.packF), nil
}

func (p *packIndex) close() {
	p.idx.Close()
	if p.packF != nil {
		p.packF.Close()
	}
}

// packIndexes lists the indexes of the cache's packs, opened once until
// the packs change (resetPacks). Caller holds Repo.mu.
func (s *diskStorage) packIndexes() ([]*packIndex, error) {
	if s.packs != nil {
		return s.packs, nil
	}
	paths, err := filepath.Glob(filepath.Join(s.dir, "objects", "pack", "pack-*.idx"))
	if err != nil {
		return nil, err
	}
	packs := []*packIndex{}
	for _, path := range paths {
		p, err := openPackIndex(path)
		if err != nil {
			for _, p := range packs {
				p.close()
			}
			return nil, err
		}
		packs = append(packs, p)
	}
	s.packs = packs
	return packs, nil
}

// resetPacks forgets the open indexes: a pack was added or removed.
func (s *diskStorage) resetPacks() {
	for _, p := range s.packs {
		p.close()
	}
	s.packs = nil
	clear(s.goGits)
}

// Close closes the pack indexes and go-git's storage.
func (s *diskStorage) Close() error {
	s.resetPacks()
	return s.Storage.Close()
}

// chainLink is one object of a delta chain as its headers give it.
type chainLink struct {
	offset int64
	typ    plumbing.ObjectType // a whole object's type; a delta's type
	length int64               // stored: an object's size, a delta's instructions'
	// src and dst are a delta's base and result sizes.
	src, dst int64
}

// chain reads the headers of h's delta chain in its pack, h first, its
// whole base last; false when h is in no pack.
func (s *diskStorage) chain(h plumbing.Hash) (*packIndex, []chainLink, bool, error) {
	packs, err := s.packIndexes()
	if err != nil {
		return nil, nil, false, err
	}
	for _, p := range packs {
		off, ok, err := p.find(h)
		if err != nil {
			return nil, nil, false, fmt.Errorf("%w: index of %s: %v", ErrObjectMissing, filepath.Base(p.pack), err)
		}
		if !ok {
			continue
		}
		links, err := p.links(off, true)
		if errors.Is(err, errForeignBase) {
			return nil, nil, false, nil
		}
		return p, links, true, err
	}
	return nil, nil, false, nil
}

// links reads the chain from the object at off down to its whole base;
// with all unset it stops at the first link (for a size).
func (p *packIndex) links(off int64, all bool) ([]chainLink, error) {
	sc, err := p.scanner()
	if err != nil {
		return nil, err
	}
	var links []chainLink
	for {
		if len(links) > maxDeltaDepth {
			return nil, fmt.Errorf("%w: object at offset %d of %s: delta chain deeper than %d", ErrObjectMissing, links[0].offset, filepath.Base(p.pack), maxDeltaDepth)
		}
		oh, err := sc.SeekObjectHeader(off)
		if err != nil {
			return nil, fmt.Errorf("%w: object at offset %d of %s: %v", ErrObjectMissing, off, filepath.Base(p.pack), wrapPackEOF(err))
		}
		l := chainLink{offset: off, typ: oh.Type, length: oh.Length}
		if oh.Type != plumbing.OFSDeltaObject && oh.Type != plumbing.REFDeltaObject {
			return append(links, l), nil
		}
		if l.src, l.dst, err = deltaHead(sc); err != nil {
			return nil, fmt.Errorf("%w: delta at offset %d of %s: %v", ErrObjectMissing, off, filepath.Base(p.pack), err)
		}
		links = append(links, l)
		if !all {
			return links, nil
		}
		next := oh.OffsetReference
		if oh.Type == plumbing.REFDeltaObject {
			var ok bool
			if next, ok, err = p.find(oh.Reference); err != nil {
				return nil, fmt.Errorf("%w: index of %s: %v", ErrObjectMissing, filepath.Base(p.pack), err)
			}
			if !ok {
				return nil, errForeignBase
			}
		}
		off = next
	}
}

// errForeignBase: a ref-delta's base is in another pack (gitsource's own
// packs never do that); go-git reads such an object.
var errForeignBase = errors.New("delta base in another pack")

// errHeadRead stops an inflate once a delta's two sizes are in.
var errHeadRead = errors.New("delta header read")

// headBytes keeps the first bytes of a delta, up to its two sizes.
type headBytes struct{ b []byte }

func (h *headBytes) Write(p []byte) (int, error) {
	h.b = append(h.b, p[:min(len(p), 2*binary.MaxVarintLen64-len(h.b))]...)
	if len(h.b) >= 2*binary.MaxVarintLen64 {
		return 0, errHeadRead
	}
	return len(p), nil
}

// deltaHead inflates only as much of the scanner's current delta as its
// two leading sizes take.
func deltaHead(sc *packfile.Scanner) (src, dst int64, err error) {
	var h headBytes
	if _, _, err := sc.NextObject(&h); err != nil && !errors.Is(err, errHeadRead) {
		return 0, 0, err
	}
	s, d, err := deltaSizes(bytes.NewReader(h.b))
	return int64(s), int64(d), err
}

// EncodedObjectSize is the size of object h from its headers alone: a
// whole object's header, a delta's result size from the delta's first
// bytes. Nothing is resolved.
func (s *diskStorage) EncodedObjectSize(h plumbing.Hash) (int64, error) {
	packs, err := s.packIndexes()
	if err != nil {
		return 0, err
	}
	for _, p := range packs {
		off, ok, err := p.find(h)
		if err != nil {
			return 0, fmt.Errorf("%w: index of %s: %v", ErrObjectMissing, filepath.Base(p.pack), err)
		}
		if !ok {
			continue
		}
		links, err := p.links(off, false)
		if err != nil {
			return 0, err
		}
		if l := links[0]; l.typ == plumbing.OFSDeltaObject || l.typ == plumbing.REFDeltaObject {
			return l.dst, nil
		}
		return links[0].length, nil
	}
	return s.Storage.EncodedObjectSize(h) // a loose object: its header
}

// EncodedObject reads object h: a packed delta whose chain holds an
// object, a delta or a result past largeObject, or is longer than
// goGitDepth, is resolved here in bounded memory (an object whose
// Reader resolves it each time, through spill files when large); any
// other object is go-git's to read.
func (s *diskStorage) EncodedObject(t plumbing.ObjectType, h plumbing.Hash) (plumbing.EncodedObject, error) {
	if _, ok := s.goGits[h]; ok {
		return s.Storage.EncodedObject(t, h)
	}
	p, links, found, err := s.chain(h)
	if err != nil {
		return nil, err
	}
	if !found || len(links) == 1 || !needsBoundedRead(links) {
		if found {
			// Judged once: a walk of a tree read before costs go-git's
			// object cache only.
			if len(s.goGits) >= maxGoGits {
				clear(s.goGits)
			}
			s.goGits[h] = struct{}{}
		}
		return s.Storage.EncodedObject(t, h)
	}
	base := links[len(links)-1]
	if t != plumbing.AnyObject && base.typ != t {
		return nil, plumbing.ErrObjectNotFound
	}
	return &chainObject{s: s, p: p, h: h, typ: base.typ, size: links[0].dst, links: links}, nil
}

// needsBoundedRead reports whether go-git would read a large object, or
// a long chain, whole into memory to resolve links.
func needsBoundedRead(links []chainLink) bool {
	if len(links) > goGitDepth {
		return true
	}
	for _, l := range links {
		if l.length > largeObject || l.src > largeObject || l.dst > largeObject {
			return true
		}
	}
	return false
}

// chainObject is a packed delta read by resolving its chain at each
// Reader call; the spill files of a large result go when the reader is
// closed.
type chainObject struct {
	s     *diskStorage
	p     *packIndex
	h     plumbing.Hash
	typ   plumbing.ObjectType
	size  int64
	links []chainLink
}

var _ plumbing.EncodedObject = (*chainObject)(nil)

func (o *chainObject) Hash() plumbing.Hash         { return o.h }
func (o *chainObject) Type() plumbing.ObjectType   { return o.typ }
func (o *chainObject) SetType(plumbing.ObjectType) {}
func (o *chainObject) Size() int64                 { return o.size }
func (o *chainObject) SetSize(int64)               {}
func (o *chainObject) Writer() (io.WriteCloser, error) {
	return nil, errors.New("a packed object is read-only")
}

// Reader resolves the chain, base first: each link against the one
// below it, holding one base and one result at a time (in memory up to
// largeObject, in spill files past it, within the spill limit). The
// result is checked against the object's hash: a mismatch is
// ErrObjectMissing, damage the next fetch repairs.
func (o *chainObject) Reader() (io.ReadCloser, error) {
	sc, err := o.p.scanner()
	if err != nil {
		return nil, err
	}
	d := &deltaResolver{ctx: context.Background(), sc: sc, dir: filepath.Dir(o.p.pack), cache: map[int64]objData{},
		spillLimit: spillLimit(o.s.maxSpill, o.p.size)}
	fail := func(err error) (io.ReadCloser, error) {
		d.close()
		return nil, fmt.Errorf("read %s %s: %w", o.typ, o.h, err)
	}
	base := o.links[len(o.links)-1]
	d.at = base.offset
	cur, err := d.raw(&packEntry{offset: base.offset})
	if err != nil {
		return fail(err)
	}
	for i := len(o.links) - 2; i >= 0; i-- {
		d.at = o.links[i].offset
		raw, err := d.raw(&packEntry{offset: o.links[i].offset})
		if err != nil {
			d.drop(cur)
			return fail(err)
		}
		out, err := d.patch(cur, raw)
		d.drop(raw)
		d.drop(cur)
		if err != nil {
			return fail(fmt.Errorf("delta at offset %d: %w", o.links[i].offset, deltaFault(err)))
		}
		cur = out
	}
	hasher := plumbing.NewHasher(o.typ, cur.size)
	rd, err := cur.open()
	if err == nil {
		_, err = io.Copy(hasher, rd)
		_ = rd.Close()
	}
	if err != nil {
		d.drop(cur)
		return fail(err)
	}
	if sum := hasher.Sum(); sum != o.h {
		d.drop(cur)
		return fail(fmt.Errorf("%w: its chain resolves to %s", ErrObjectMissing, sum))
	}
	rd, err = cur.open()
	if err != nil {
		d.drop(cur)
		return fail(err)
	}
	return spillReader{ReadCloser: rd, drop: func() { d.drop(cur) }}, nil
}

// deltaFault is an error of applying a delta of the cache's packs as
// what it is: a delta that does not apply is damage of the pack on disk
// (ErrObjectMissing, mended by fetching again); a spill refused (the
// spill limit, a filesystem that takes no writes) is not, since fetching
// again would meet it again.
func deltaFault(err error) error {
	for _, damage := range []error{packfile.ErrInvalidDelta, packfile.ErrDeltaCmd, packfile.ErrMalformedPackFile, packfile.ErrInflatedSizeMismatch} {
		if errors.Is(err, damage) {
			return fmt.Errorf("%w: %w", ErrObjectMissing, err)
		}
	}
	return err
}

// spillReader reads a resolved object and removes its spill file on
// Close.
type spillReader struct {
	io.ReadCloser
	drop func()
}

func (r spillReader) Close() error {
	err := r.ReadCloser.Close()
	r.drop()
	return err
}
