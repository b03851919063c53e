package gitsource

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/storage/filesystem"
)

// Bounded memory on fetch. go-git indexes a fetched pack by reading every
// object whole into memory, deltas or not (its Parser's resolveDeltas),
// so a fetch cost as much memory as the largest blob in it — a 100 MB
// binary anywhere in the repository, far outside any path gitfleet reads,
// cost 100 MB. diskStorage replaces that one step: the pack streams to a
// file, each whole object streams through its hash, and only the bases
// and results of small deltas are held in memory, one chain at a time;
// large ones are resolved through spill files.

// largeObject is the size in bytes past which the cache reads an object
// from its pack as a stream instead of decoding it whole: gitfleet's own
// files are at most 1 MiB (desired.MaxFileSize), so only what it never
// reads whole is bigger.
const largeObject = 1 << 20

// deltaCacheBytes bounds the delta bases kept in memory while a pack is
// indexed; a base past it is inflated again for each delta on it.
const deltaCacheBytes = 16 << 20

// diskStorage is go-git's storage of a cache on disk with a fetched pack
// written and indexed in bounded memory (see PackfileWriter).
type diskStorage struct {
	*filesystem.Storage
	// dir is the cache directory (the bare repository).
	dir string
	// maxSpill is Options.MaxSpill.
	maxSpill int64
	// ctx bounds the indexing of a fetched pack: the fetch's own context
	// (with the git deadline), set while the fetch runs; nil means none.
	// Guarded by Repo.mu, as the storage is.
	ctx context.Context
	// packs are the packs' indexes, open while the packs stay the same
	// (see objectread.go); nil until first needed. goGits holds packed
	// objects judged small enough for go-git to read.
	packs  []*packIndex
	goGits map[plumbing.Hash]struct{}
}

// during runs op with ctx as the bound of any pack indexed meanwhile.
// Caller holds Repo.mu.
func (s *diskStorage) during(ctx context.Context, op func() error) error {
	s.ctx = ctx
	defer func() { s.ctx = nil }()
	return op()
}

var _ storer.PackfileWriter = (*diskStorage)(nil)

// PackfileWriter returns a writer that stores a pack in the cache: the
// bytes go to a temporary file under objects/pack; Close checks the pack
// (its trailing SHA-1, every object's zlib stream and declared size, every
// delta against its base), writes its index and moves both into place,
// index first, so a listed pack always has its index. Closing an empty
// writer stores nothing. A failed Close leaves nothing behind but a tmp_
// file that the next Open sweeps.
func (s *diskStorage) PackfileWriter() (io.WriteCloser, error) {
	dir := filepath.Join(s.dir, "objects", "pack")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store fetched pack: %w", err)
	}
	f, err := os.CreateTemp(dir, "tmp_pack_")
	if err != nil {
		return nil, fmt.Errorf("store fetched pack: %w", err)
	}
	return &packWriter{st: s, f: f}, nil
}

// packWriter is one pack on its way into the cache.
type packWriter struct {
	st *diskStorage
	f  *os.File
	n  int64
}

func (w *packWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.n += int64(n)
	if err != nil {
		return n, fmt.Errorf("store fetched pack: %w", err)
	}
	return n, nil
}

// Close indexes the pack and moves it into the cache.
func (w *packWriter) Close() error {
	tmp := w.f.Name()
	err := w.install()
	if cerr := w.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("store fetched pack: %w", cerr)
	}
	_ = os.Remove(tmp)
	_ = os.Remove(tmp + ".idx")
	return err
}

func (w *packWriter) install() error {
	if w.n == 0 {
		return nil
	}
	if err := w.f.Sync(); err != nil {
		return fmt.Errorf("store fetched pack: %w", err)
	}
	if _, err := w.f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	ctx := w.st.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	idx, sum, err := indexPack(ctx, w.f, w.n, spillLimit(w.st.maxSpill, w.n))
	if err != nil {
		return fmt.Errorf("index fetched pack: %w", packFault(err))
	}
	idxTmp, err := os.Create(w.f.Name() + ".idx")
	if err != nil {
		return fmt.Errorf("store fetched pack: %w", err)
	}
	_, err = idxfile.NewEncoder(idxTmp).Encode(idx)
	if err == nil {
		err = idxTmp.Sync()
	}
	if cerr := idxTmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("store fetched pack index: %w", err)
	}
	base := filepath.Join(w.st.dir, "objects", "pack", "pack-"+sum.String())
	if err := os.Rename(idxTmp.Name(), base+".idx"); err != nil {
		return fmt.Errorf("store fetched pack index: %w", err)
	}
	if err := os.Rename(w.f.Name(), base+".pack"); err != nil {
		return fmt.Errorf("store fetched pack: %w", err)
	}
	// go-git keeps the index of every pack in memory: load them again.
	w.st.Reindex()
	w.st.resetPacks()
	return nil
}

// packEntry is one object of a pack being indexed.
type packEntry struct {
	offset int64
	crc    uint32
	typ    plumbing.ObjectType // the object's type; a delta's once resolved
	delta  bool
	// base is the offset of an ofs-delta's base; ref the hash of a
	// ref-delta's base.
	base int64
	ref  plumbing.Hash
	hash plumbing.Hash // zero until known
	// children counts the deltas still to resolve on this entry; depth
	// is the length of its delta chain (0 for a whole object).
	children int
	depth    int
}

// ErrPackRefused: gitsource will not index a fetched pack: it is
// malformed (a bad checksum, zlib stream, declared size or delta, an
// object count that lies, an end that comes early), or it has a delta
// chain deeper than git's own bound, deltas whose bases form a cycle or
// are missing from the pack, or deltas that expand past the spill limit
// (a delta bomb; see Options.MaxSpill).
// The error names the object (its offset in the pack). It is a fault of
// the remote's pack, not of the cache: nothing is repaired, nothing in the
// cache changed, and the pack's temporary files are removed.
var ErrPackRefused = errors.New("fetched pack refused")

// packFault is an error of indexing a fetched pack as what it is: the
// context's end and a filesystem that refuses writes stay what they are;
// anything else (a bad checksum, zlib stream, size or delta, a pack that
// ends early) is a fault of the pack the remote sent, ErrPackRefused, and
// never cache damage: the pack was only ever in a temporary file, so
// repairing the cache (cloning it afresh, throwing away what it held)
// would mend nothing and fetch the same pack again.
func packFault(err error) error {
	if errors.Is(err, ErrPackRefused) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || isUnwritable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrPackRefused, err)
}

// DefaultMaxSpill is the floor of the spill limit when Options.MaxSpill
// is zero: indexing or reading one pack may hold at most
// max(DefaultMaxSpill, 4 × the pack's size) bytes in spill files at once.
const DefaultMaxSpill int64 = 1 << 30

// spillLimit is the most bytes of spill files indexing or reading a pack
// of packSize bytes may hold at once: max if set, else
// max(DefaultMaxSpill, 4 × packSize).
func spillLimit(limit, packSize int64) int64 {
	if limit > 0 {
		return limit
	}
	return DefaultMaxSpill + max(0, 4*packSize-DefaultMaxSpill)
}

// indexPack reads a pack of size bytes from f (at offset 0) and returns
// its index and checksum, as git index-pack does. Whole objects are only
// hashed as they stream by. Deltas are then resolved once each, depth
// first from every whole object through the deltas on it (by offset or by
// the base's hash), so a chain costs its length, not its length squared:
// in memory when base, delta and result are at most largeObject, with
// bases that still have deltas on them kept up to deltaCacheBytes and in
// spill files beyond; through spill files when any of them is larger.
// Spill files live beside the pack and never hold more than spill bytes
// at once. A chain deeper than maxDeltaDepth, a delta that never resolves
// (its base absent, or a cycle of ref-deltas) or a spill past the limit is
// ErrPackRefused. A pack that refers to objects outside itself (a thin
// pack; gitsource never asks for one) is refused. ctx ends the work
// between objects and during long copies (its error is returned).
func indexPack(ctx context.Context, f *os.File, size, spill int64) (*idxfile.MemoryIndex, plumbing.Hash, error) {
	sc := packfile.NewScanner(f)
	entries, err := scanPack(ctx, sc, size)
	if err != nil {
		return nil, plumbing.ZeroHash, err
	}
	sum, err := packChecksum(sc, size)
	if err != nil {
		return nil, plumbing.ZeroHash, err
	}
	d := &deltaResolver{ctx: ctx, sc: packfile.NewScanner(f), dir: filepath.Dir(f.Name()), cache: map[int64]objData{}, spillLimit: spill}
	defer d.close()
	if err := d.resolveAll(entries); err != nil {
		return nil, plumbing.ZeroHash, err
	}
	if err := refuseRepeats(entries); err != nil {
		return nil, plumbing.ZeroHash, err
	}
	idx, err := packIndexOf(entries, sum)
	return idx, sum, err
}

// scanPack reads the pack's header and then each of its objects once, as
// it streams by: a whole object through its hash, a delta to its end.
// The entries it returns are in the pack's order, deltas unresolved.
func scanPack(ctx context.Context, sc *packfile.Scanner, size int64) ([]*packEntry, error) {
	_, count, err := sc.Header()
	if err != nil {
		return nil, err
	}
	// Every object takes at least two bytes: a count past that is a lie
	// that must not size an allocation.
	if int64(count) > size/2 {
		return nil, fmt.Errorf("%w: %d objects claimed in %d bytes", packfile.ErrMalformedPackFile, count, size)
	}
	entries := make([]*packEntry, 0, count)
	byOffset := make(map[int64]*packEntry, count)
	for i := uint32(0); i < count; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		e, err := scanObject(ctx, sc, byOffset)
		if err != nil {
			return nil, err
		}
		entries = append(entries, e)
		byOffset[e.offset] = e
	}
	return entries, nil
}

// scanObject reads the pack's next object: its type, offset and CRC, and
// a whole object's hash, or which base a delta is on (an ofs-delta's must
// be one of the objects before it, byOffset).
func scanObject(ctx context.Context, sc *packfile.Scanner, byOffset map[int64]*packEntry) (*packEntry, error) {
	oh, err := sc.NextObjectHeader()
	if err != nil {
		return nil, wrapPackEOF(err)
	}
	e := &packEntry{offset: oh.Offset, typ: oh.Type}
	var sink io.Writer = io.Discard
	var hasher plumbing.Hasher
	switch oh.Type {
	case plumbing.OFSDeltaObject:
		if _, ok := byOffset[oh.OffsetReference]; !ok {
			return nil, fmt.Errorf("%w: delta at %d on no object (offset %d)", packfile.ErrMalformedPackFile, oh.Offset, oh.OffsetReference)
		}
		e.delta, e.base = true, oh.OffsetReference
	case plumbing.REFDeltaObject:
		e.delta, e.ref = true, oh.Reference
	case plumbing.CommitObject, plumbing.TreeObject, plumbing.BlobObject, plumbing.TagObject:
		hasher = plumbing.NewHasher(oh.Type, oh.Length)
		sink = ctxWriter{ctx, hasher}
	default:
		return nil, fmt.Errorf("%w: object of type %v at %d", packfile.ErrMalformedPackFile, oh.Type, oh.Offset)
	}
	n, crc, err := sc.NextObject(sink)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		return nil, wrapPackEOF(err)
	}
	if n != oh.Length {
		return nil, fmt.Errorf("%w: object at %d", packfile.ErrInflatedSizeMismatch, oh.Offset)
	}
	e.crc = crc
	if !e.delta {
		e.hash = hasher.Sum()
	}
	return e, nil
}

// packChecksum reads the pack's trailing checksum, after its last object.
// Nothing may follow it (git index-pack: "pack has junk at the end"): the
// stored file would not be the pack it is named after.
func packChecksum(sc *packfile.Scanner, size int64) (plumbing.Hash, error) {
	sum, err := sc.Checksum()
	if err != nil {
		return plumbing.ZeroHash, wrapPackEOF(err)
	}
	end, err := sc.SeekFromStart(0)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if end != size {
		return plumbing.ZeroHash, fmt.Errorf("%w: %d bytes after the pack's checksum", packfile.ErrMalformedPackFile, size-end)
	}
	return sum, nil
}

// refuseRepeats refuses a pack that holds an object twice: it would be
// listed once in the index, so a delta on the other copy would name a
// base at an offset the index does not know: unreadable, and taken for
// cache damage on every read. git pack-objects never repeats one.
func refuseRepeats(entries []*packEntry) error {
	seen := make(map[plumbing.Hash]int64, len(entries))
	for _, e := range entries {
		if at, ok := seen[e.hash]; ok {
			return fmt.Errorf("%w: object %s is in the pack twice, at offsets %d and %d", ErrPackRefused, e.hash, at, e.offset)
		}
		seen[e.hash] = e.offset
	}
	return nil
}

// packIndexOf is the index of the pack whose resolved entries and
// checksum are given.
func packIndexOf(entries []*packEntry, sum plumbing.Hash) (*idxfile.MemoryIndex, error) {
	w := new(idxfile.Writer)
	if err := w.OnHeader(uint32(len(entries))); err != nil {
		return nil, err
	}
	for _, e := range entries {
		w.Add(e.hash, uint64(e.offset), e.crc)
	}
	if err := w.OnFooter(sum); err != nil {
		return nil, err
	}
	return w.Index()
}

// ctxWriter is a writer that fails once its context ended, so that a
// long stream (a large object hashed, a delta applied) stops with it.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

// deltaResolver finds the hashes of a pack's deltas, or reads one object
// through its delta chain.
type deltaResolver struct {
	ctx context.Context
	sc  *packfile.Scanner
	// dir holds spill files (tmp_spill_*, beside the pack being read).
	dir string
	// cache holds the content of bases with deltas still to resolve on
	// them: in memory up to deltaCacheBytes, spilled ones on disk.
	cache      map[int64]objData
	cacheBytes int
	// spilled is the size of the spill files that exist now; it may not
	// pass spillLimit.
	spilled, spillLimit int64
	// at is the offset of the object being resolved, for errors.
	at int64
}

// objData is the content of one object while a pack is indexed: in
// memory, or, past largeObject, in a spill file, so that memory never
// follows the largest object or delta in a pack.
type objData struct {
	mem  []byte
	file string // the spill file's path; "" when in memory
	size int64
}

// open reads o from its start.
func (o objData) open() (io.ReadCloser, error) {
	if o.file == "" {
		return io.NopCloser(bytes.NewReader(o.mem)), nil
	}
	return os.Open(o.file)
}

// readerAtCloser reads at any offset and is closed when done.
type readerAtCloser interface {
	io.ReaderAt
	io.Closer
}

// openAt opens o for reads at any offset.
func (o objData) openAt() (readerAtCloser, error) {
	if o.file == "" {
		return struct {
			io.ReaderAt
			io.Closer
		}{bytes.NewReader(o.mem), io.NopCloser(nil)}, nil
	}
	return os.Open(o.file)
}

// maxDeltaDepth is git's own bound on a delta chain (pack-objects'
// OE_DEPTH_BITS).
const maxDeltaDepth = 4095

// resolveAll resolves every delta of entries: each whole object is the
// root of a tree of deltas (ofs-deltas by their base's offset, ref-deltas
// by its hash), walked depth first so that only the bases on the path
// being walked are held. A delta no tree reaches is ErrPackRefused.
func (d *deltaResolver) resolveAll(entries []*packEntry) error {
	kids := groupDeltas(entries)
	resolved := 0
	for _, root := range entries {
		if root.delta {
			continue
		}
		n, err := d.resolveTree(root, kids)
		if err != nil {
			return err
		}
		resolved += n
	}
	if resolved < kids.count {
		return unresolved(entries, kids.count-resolved, kids.count)
	}
	return nil
}

// deltaKids are a pack's deltas by their base: ofs-deltas by its offset,
// ref-deltas by its hash; count is how many deltas there are.
type deltaKids struct {
	ofs   map[int64][]*packEntry
	ref   map[plumbing.Hash][]*packEntry
	count int
}

// groupDeltas finds the deltas of entries on each base.
func groupDeltas(entries []*packEntry) *deltaKids {
	k := &deltaKids{ofs: map[int64][]*packEntry{}, ref: map[plumbing.Hash][]*packEntry{}}
	for _, e := range entries {
		switch {
		case !e.delta:
		case e.ref != plumbing.ZeroHash:
			k.ref[e.ref] = append(k.ref[e.ref], e)
			k.count++
		default:
			k.ofs[e.base] = append(k.ofs[e.base], e)
			k.count++
		}
	}
	return k
}

// of takes the deltas on e, now that its hash is known. A hash that two
// objects share (a pack may repeat an object) has its ref-deltas
// resolved once.
func (k *deltaKids) of(e *packEntry) []*packEntry {
	out := append(k.ofs[e.offset], k.ref[e.hash]...)
	delete(k.ref, e.hash)
	return out
}

// resolveTree resolves the deltas on root and on them in turn, depth
// first, holding each base until its last delta is resolved, and returns
// how many it resolved. It reads root only when a delta is on it.
func (d *deltaResolver) resolveTree(root *packEntry, kids *deltaKids) (int, error) {
	k := kids.of(root)
	if len(k) == 0 {
		return 0, nil
	}
	// pending holds the deltas whose base is resolved and held, in the
	// order they are taken (last first).
	type step struct{ e, base *packEntry }
	var pending []step
	hold := func(e *packEntry, data objData, k []*packEntry) error {
		e.children = len(k)
		if err := d.hold(e, data); err != nil {
			return err
		}
		for _, c := range k {
			pending = append(pending, step{c, e})
		}
		return nil
	}
	d.at = root.offset
	data, err := d.raw(root)
	if err != nil {
		return 0, err
	}
	if err := hold(root, data, k); err != nil {
		return 0, err
	}
	resolved := 0
	for len(pending) > 0 {
		s := pending[len(pending)-1]
		pending = pending[:len(pending)-1]
		if err := d.ctx.Err(); err != nil {
			return 0, err
		}
		e, base := s.e, s.base
		if e.hash != plumbing.ZeroHash {
			continue // reached twice through a repeated base hash
		}
		e.depth = base.depth + 1
		if e.depth > maxDeltaDepth {
			return 0, fmt.Errorf("%w: object at offset %d: delta chain deeper than %d (git's own bound)", ErrPackRefused, e.offset, maxDeltaDepth)
		}
		data, err := d.resolve(e, base)
		if err != nil {
			return 0, err
		}
		resolved++
		if err := hold(e, data, kids.of(e)); err != nil {
			return 0, err
		}
	}
	return resolved, nil
}

// unresolved refuses a pack in which missing of its deltas never
// resolve (their bases are absent, or form a cycle), naming the first
// such delta; nil when there is none.
func unresolved(entries []*packEntry, missing, deltas int) error {
	for _, e := range entries {
		if e.delta && e.hash == plumbing.ZeroHash {
			return fmt.Errorf("%w: %d of %d deltas never resolve, the first at offset %d (on %s): their bases are not in the pack or form a cycle (%w)",
				ErrPackRefused, missing, deltas, e.offset, baseName(e), packfile.ErrReferenceDeltaNotFound)
		}
	}
	return nil
}

// baseName names a delta's base for an error.
func baseName(e *packEntry) string {
	if e.ref != plumbing.ZeroHash {
		return "object " + e.ref.String()
	}
	return fmt.Sprintf("the object at offset %d", e.base)
}

// resolve applies delta e to its base, which is held, and finds e's hash
// and type. The content it returns is the caller's to hold or drop.
func (d *deltaResolver) resolve(e, base *packEntry) (objData, error) {
	d.at = e.offset
	src, ok := d.cache[base.offset]
	if !ok {
		return objData{}, fmt.Errorf("delta at %d: its base at %d is not held", e.offset, base.offset)
	}
	raw, err := d.raw(e)
	if err != nil {
		return objData{}, err
	}
	out, err := d.patch(src, raw)
	d.drop(raw)
	// One delta on base fewer to go.
	base.children--
	d.release(base)
	if err != nil {
		return objData{}, fmt.Errorf("delta at %d: %w", e.offset, err)
	}
	h := plumbing.NewHasher(base.typ, out.size)
	rd, err := out.open()
	if err == nil {
		_, err = io.Copy(ctxWriter{d.ctx, h}, rd)
		_ = rd.Close()
	}
	if err != nil {
		d.drop(out)
		return objData{}, fmt.Errorf("hash delta at %d: %w", e.offset, err)
	}
	e.typ = base.typ
	e.hash = h.Sum()
	return out, nil
}

// patch applies the delta instructions raw to src. Small ones are
// applied in memory by go-git; when the base, the delta or the result is
// past largeObject, applyDelta reads the base and the delta from where
// they are and the result goes to a spill file, so a 100 MB blob stored
// as a delta costs disk, not memory. The result's size is
// read from the delta's header first: a delta that claims more than it
// makes, or the reverse, is invalid.
func (d *deltaResolver) patch(src, raw objData) (objData, error) {
	hdr, err := raw.open()
	if err != nil {
		return objData{}, err
	}
	srcSize, dstSize, err := deltaSizes(bufio.NewReader(hdr))
	_ = hdr.Close()
	if err != nil {
		return objData{}, err
	}
	if srcSize != uint64(src.size) {
		return objData{}, packfile.ErrInvalidDelta
	}
	if src.file == "" && raw.file == "" && dstSize <= largeObject {
		out, err := packfile.PatchDelta(src.mem, raw.mem)
		if err != nil {
			return objData{}, err
		}
		return objData{mem: out, size: int64(len(out))}, nil
	}
	base, err := src.openAt()
	if err != nil {
		return objData{}, err
	}
	defer base.Close()
	delta, err := raw.open()
	if err != nil {
		return objData{}, err
	}
	defer delta.Close()
	apply := func(w io.Writer) (int64, error) {
		return applyDelta(w, base, src.size, bufio.NewReaderSize(delta, 64<<10), dstSize)
	}
	if dstSize <= largeObject {
		var out bytes.Buffer
		out.Grow(int(dstSize))
		if _, err := apply(&out); err != nil {
			return objData{}, err
		}
		return objData{mem: out.Bytes(), size: int64(out.Len())}, nil
	}
	return d.spill(apply)
}

// applyDelta writes the result of git's delta instructions in delta (its
// two leading sizes included) over base, of baseSize bytes, to w, and
// returns the bytes written: dstSize, or an error matching
// packfile.ErrInvalidDelta or ErrDeltaCmd. Copies read base at their
// offset (io.ReaderAt), so a delta that copies backwards, or the same
// range many times, costs what it writes, never a re-read of the base.
// The format: git's diff-delta.c / patch-delta.c, as go-git's
// packfile.PatchDelta reads it.
func applyDelta(w io.Writer, base io.ReaderAt, baseSize int64, delta *bufio.Reader, dstSize uint64) (int64, error) {
	if _, _, err := deltaSizes(delta); err != nil {
		return 0, err
	}
	var n int64
	var insert [0x7f]byte
	win := &baseWindow{r: base, size: baseSize}
	for uint64(n) < dstSize {
		cmd, err := delta.ReadByte()
		if err != nil {
			return n, packfile.ErrInvalidDelta
		}
		switch {
		case cmd&0x80 != 0: // copy from base
			var off, size uint64
			for i := uint(0); i < 4; i++ {
				if cmd&(1<<i) != 0 {
					b, err := delta.ReadByte()
					if err != nil {
						return n, packfile.ErrInvalidDelta
					}
					off |= uint64(b) << (8 * i)
				}
			}
			for i := uint(0); i < 3; i++ {
				if cmd&(0x10<<i) != 0 {
					b, err := delta.ReadByte()
					if err != nil {
						return n, packfile.ErrInvalidDelta
					}
					size |= uint64(b) << (8 * i)
				}
			}
			if size == 0 {
				size = 0x10000
			}
			if off+size > uint64(baseSize) || uint64(n)+size > dstSize {
				return n, packfile.ErrInvalidDelta
			}
			m, err := win.copy(w, int64(off), int64(size))
			n += m
			if err != nil {
				return n, err
			}
		case cmd != 0: // insert cmd bytes from the delta
			if uint64(n)+uint64(cmd) > dstSize {
				return n, packfile.ErrInvalidDelta
			}
			// A delta cut short is invalid; a write that fails (the
			// spill limit, a full disk, the context's end) is that
			// failure, not the delta's.
			if _, err := io.ReadFull(delta, insert[:cmd]); err != nil {
				return n, packfile.ErrInvalidDelta
			}
			m, err := w.Write(insert[:cmd])
			n += int64(m)
			if err != nil {
				return n, err
			}
		default:
			return n, packfile.ErrDeltaCmd
		}
	}
	if _, err := delta.ReadByte(); err != io.EOF {
		return n, packfile.ErrInvalidDelta // instructions past the result
	}
	return n, nil
}

// baseWindow reads a delta's base through a window of its bytes, so
// that many small copies near each other (a delta of one-byte copies: a
// few bytes of pack each), forwards or backwards, cost a memory copy
// each, not a read of the base's file and a buffer each: 4 MiB of
// one-byte copies from a spilled base took 14 s.
type baseWindow struct {
	r    io.ReaderAt
	size int64
	buf  [64 << 10]byte
	off  int64 // of buf[0] in the base
	n    int   // bytes of buf that hold the base
}

// copy writes size bytes of the base from off to w.
func (b *baseWindow) copy(w io.Writer, off, size int64) (int64, error) {
	var done int64
	for done < size {
		at := off + done
		if at < b.off || at >= b.off+int64(b.n) {
			// Past the window: the next one starts here. Before it (a
			// delta that walks the base backwards): it ends here.
			start := at
			if at < b.off {
				start = max(0, at+1-int64(len(b.buf)))
			}
			n, err := b.r.ReadAt(b.buf[:min(int64(len(b.buf)), b.size-start)], start)
			b.off, b.n = start, n
			if at >= start+int64(n) {
				if err == nil {
					err = io.ErrUnexpectedEOF
				}
				return done, err
			}
		}
		chunk := b.buf[at-b.off : min(int64(b.n), at-b.off+size-done)]
		m, err := w.Write(chunk)
		done += int64(m)
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// deltaSizes reads the two sizes a delta starts with: its base's and its
// result's (git's delta format: little-endian base-128 varints).
func deltaSizes(r io.ByteReader) (src, dst uint64, err error) {
	if src, err = binary.ReadUvarint(r); err != nil {
		return 0, 0, packfile.ErrInvalidDelta
	}
	if dst, err = binary.ReadUvarint(r); err != nil {
		return 0, 0, packfile.ErrInvalidDelta
	}
	return src, dst, nil
}

// raw inflates the data stored at e: a whole object, or a delta's
// instructions; past largeObject to a spill file.
func (d *deltaResolver) raw(e *packEntry) (objData, error) {
	oh, err := d.sc.SeekObjectHeader(e.offset)
	if err != nil {
		return objData{}, wrapPackEOF(err)
	}
	if oh.Length > largeObject {
		return d.spill(func(w io.Writer) (int64, error) {
			n, _, err := d.sc.NextObject(w)
			return n, wrapPackEOF(err)
		})
	}
	var buf bytes.Buffer
	buf.Grow(int(oh.Length))
	if _, _, err := d.sc.NextObject(&buf); err != nil {
		return objData{}, wrapPackEOF(err)
	}
	return objData{mem: buf.Bytes(), size: int64(buf.Len())}, nil
}

// errSpillLimit stops a spill file's writer at the limit.
var errSpillLimit = errors.New("spill limit reached")

// spillCounter counts a spill file's bytes against the resolver's limit
// and stops at the context's end.
type spillCounter struct {
	d *deltaResolver
	w io.Writer
	n int64
}

func (c *spillCounter) Write(p []byte) (int, error) {
	if err := c.d.ctx.Err(); err != nil {
		return 0, err
	}
	if c.d.spilled+c.n+int64(len(p)) > c.d.spillLimit {
		return 0, errSpillLimit
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// spill writes an object's content to a new spill file, within the
// spill limit: past it the object is ErrPackRefused (a delta bomb), and a
// full filesystem is the filesystem's error (ENOSPC), never the pack's.
func (d *deltaResolver) spill(write func(io.Writer) (int64, error)) (objData, error) {
	f, err := os.CreateTemp(d.dir, "tmp_spill_")
	if err != nil {
		return objData{}, err
	}
	c := &spillCounter{d: d, w: f}
	bw := bufio.NewWriterSize(c, 64<<10)
	n, err := write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(f.Name())
		if errors.Is(err, errSpillLimit) {
			return objData{}, fmt.Errorf("%w: the object at offset %d expands past the spill limit of %s (%s held already): a delta bomb, or a pack larger than the limit allows (Options.MaxSpill)",
				ErrPackRefused, d.at, sizeText(d.spillLimit), sizeText(d.spilled))
		}
		if isUnwritable(err) {
			return objData{}, fmt.Errorf("spill the object at offset %d to %s: %w", d.at, d.dir, err)
		}
		return objData{}, err
	}
	d.spilled += n
	return objData{file: f.Name(), size: n}, nil
}

// drop lets go of content the resolver no longer needs: a spill file not
// held in the cache is removed.
func (d *deltaResolver) drop(o objData) {
	if o.file == "" {
		return
	}
	for _, c := range d.cache {
		if c.file == o.file {
			return
		}
	}
	d.remove(o)
}

// remove deletes a spill file and counts its bytes free.
func (d *deltaResolver) remove(o objData) {
	if o.file != "" && os.Remove(o.file) == nil {
		d.spilled -= o.size
	}
}

// hold keeps the content of e while deltas on it remain to be resolved:
// in memory within deltaCacheBytes, in a spill file past it; content
// nothing depends on is dropped.
func (d *deltaResolver) hold(e *packEntry, data objData) error {
	if e.children <= 0 {
		d.drop(data)
		return nil
	}
	if data.file == "" && d.cacheBytes+len(data.mem) > deltaCacheBytes {
		spilled, err := d.spill(func(w io.Writer) (int64, error) {
			n, err := w.Write(data.mem)
			return int64(n), err
		})
		if err != nil {
			return err
		}
		data = spilled
	}
	d.cache[e.offset] = data
	d.cacheBytes += len(data.mem)
	return nil
}

// release lets go of e's content once no delta on it remains.
func (d *deltaResolver) release(e *packEntry) {
	c, cached := d.cache[e.offset]
	if !cached || e.children > 0 {
		return
	}
	delete(d.cache, e.offset)
	d.cacheBytes -= len(c.mem)
	d.remove(c)
}

// close removes every spill file still held.
func (d *deltaResolver) close() {
	for off, c := range d.cache {
		d.remove(c)
		delete(d.cache, off)
	}
}

// wrapPackEOF reports a pack that ends early as malformed (cache damage
// or a cut connection), as go-git's parser does.
func wrapPackEOF(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: %w", packfile.ErrMalformedPackFile, err)
	}
	return err
}
