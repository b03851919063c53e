package gitsource

import (
	"bufio"
	"bytes"
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
	idx, sum, err := indexPack(w.f, w.n)
	if err != nil {
		return fmt.Errorf("index fetched pack: %w", err)
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
	// children counts the deltas still to resolve on this entry.
	children int
}

// indexPack reads a pack of size bytes from f (at offset 0) and returns
// its index and checksum. Whole objects are only hashed as they stream
// by; a delta is resolved against its base (as git index-pack does): in
// memory when base, delta and result are at most largeObject, with bases
// shared by several deltas kept up to deltaCacheBytes, and through spill
// files beside the pack when any of them is larger.
// A pack that refers to objects outside itself (a thin pack; gitsource
// never asks for one) is malformed.
func indexPack(f *os.File, size int64) (*idxfile.MemoryIndex, plumbing.Hash, error) {
	sc := packfile.NewScanner(f)
	_, count, err := sc.Header()
	if err != nil {
		return nil, plumbing.ZeroHash, err
	}
	// Every object takes at least two bytes: a count past that is a lie
	// that must not size an allocation.
	if int64(count) > size/2 {
		return nil, plumbing.ZeroHash, fmt.Errorf("%w: %d objects claimed in %d bytes", packfile.ErrMalformedPackFile, count, size)
	}
	entries := make([]*packEntry, 0, count)
	byOffset := make(map[int64]*packEntry, count)
	byHash := make(map[plumbing.Hash]*packEntry, count)
	for i := uint32(0); i < count; i++ {
		oh, err := sc.NextObjectHeader()
		if err != nil {
			return nil, plumbing.ZeroHash, wrapPackEOF(err)
		}
		e := &packEntry{offset: oh.Offset, typ: oh.Type}
		var sink io.Writer = io.Discard
		var hasher plumbing.Hasher
		switch oh.Type {
		case plumbing.OFSDeltaObject:
			base, ok := byOffset[oh.OffsetReference]
			if !ok {
				return nil, plumbing.ZeroHash, fmt.Errorf("%w: delta at %d on no object (offset %d)", packfile.ErrMalformedPackFile, oh.Offset, oh.OffsetReference)
			}
			base.children++
			e.delta, e.base = true, oh.OffsetReference
		case plumbing.REFDeltaObject:
			e.delta, e.ref = true, oh.Reference
		case plumbing.CommitObject, plumbing.TreeObject, plumbing.BlobObject, plumbing.TagObject:
			hasher = plumbing.NewHasher(oh.Type, oh.Length)
			sink = hasher
		default:
			return nil, plumbing.ZeroHash, fmt.Errorf("%w: object of type %v at %d", packfile.ErrMalformedPackFile, oh.Type, oh.Offset)
		}
		n, crc, err := sc.NextObject(sink)
		if err != nil {
			return nil, plumbing.ZeroHash, wrapPackEOF(err)
		}
		if n != oh.Length {
			return nil, plumbing.ZeroHash, fmt.Errorf("%w: object at %d", packfile.ErrInflatedSizeMismatch, oh.Offset)
		}
		e.crc = crc
		if !e.delta {
			e.hash = hasher.Sum()
			byHash[e.hash] = e
		}
		entries = append(entries, e)
		byOffset[e.offset] = e
	}
	sum, err := sc.Checksum()
	if err != nil {
		return nil, plumbing.ZeroHash, wrapPackEOF(err)
	}
	for _, e := range entries {
		if e.delta && e.ref != plumbing.ZeroHash {
			if base, ok := byHash[e.ref]; ok {
				base.children++
			}
		}
	}
	d := &deltaResolver{sc: packfile.NewScanner(f), byOffset: byOffset, byHash: byHash, dir: filepath.Dir(f.Name()), cache: map[int64]objData{}}
	defer d.close()
	// A ref-delta may name a base that is itself a delta resolved later:
	// go round until nothing more resolves.
	for pending := true; pending; {
		pending = false
		progress := false
		for _, e := range entries {
			if !e.delta || e.hash != plumbing.ZeroHash {
				continue
			}
			ok, err := d.resolve(e)
			if err != nil {
				return nil, plumbing.ZeroHash, err
			}
			progress = progress || ok
			pending = pending || !ok
		}
		if pending && !progress {
			return nil, plumbing.ZeroHash, fmt.Errorf("%w: a delta's base is not in the pack", packfile.ErrReferenceDeltaNotFound)
		}
	}
	w := new(idxfile.Writer)
	if err := w.OnHeader(count); err != nil {
		return nil, plumbing.ZeroHash, err
	}
	for _, e := range entries {
		w.Add(e.hash, uint64(e.offset), e.crc)
	}
	if err := w.OnFooter(sum); err != nil {
		return nil, plumbing.ZeroHash, err
	}
	idx, err := w.Index()
	return idx, sum, err
}

// deltaResolver finds the hashes of a pack's deltas.
type deltaResolver struct {
	sc       *packfile.Scanner
	byOffset map[int64]*packEntry
	byHash   map[plumbing.Hash]*packEntry
	// dir holds spill files (tmp_spill_*, beside the pack being indexed).
	dir string
	// cache holds the content of bases with deltas still to resolve on
	// them: in memory up to deltaCacheBytes, spilled ones on disk.
	cache      map[int64]objData
	cacheBytes int
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

// spillObject is a spilled base handed to go-git's streaming delta
// applier (packfile.ReaderFromDelta), which reads it from the start again
// when a copy goes backwards.
type spillObject struct {
	plumbing.EncodedObject // nil: only Size and Reader are called
	data                   objData
}

func (s spillObject) Size() int64                    { return s.data.size }
func (s spillObject) Reader() (io.ReadCloser, error) { return s.data.open() }

// resolve finds e's hash and type; false when its ref-delta base is not
// known yet.
func (d *deltaResolver) resolve(e *packEntry) (bool, error) {
	if e.ref != plumbing.ZeroHash {
		if _, ok := d.byHash[e.ref]; !ok {
			return false, nil
		}
	}
	data, typ, err := d.content(e, 0)
	if err != nil {
		return false, err
	}
	defer d.drop(data)
	h := plumbing.NewHasher(typ, data.size)
	rd, err := data.open()
	if err != nil {
		return false, err
	}
	_, err = io.Copy(h, rd)
	_ = rd.Close()
	if err != nil {
		return false, fmt.Errorf("hash delta at %d: %w", e.offset, err)
	}
	e.typ = typ
	e.hash = h.Sum()
	d.byHash[e.hash] = e
	d.hold(e, data)
	return true, nil
}

// maxDeltaDepth is git's own bound on a delta chain (pack-objects'
// OE_DEPTH_BITS).
const maxDeltaDepth = 4095

// content returns the whole object at e and its type. What it returns is
// the caller's to drop, unless hold kept it.
func (d *deltaResolver) content(e *packEntry, depth int) (objData, plumbing.ObjectType, error) {
	if depth > maxDeltaDepth {
		return objData{}, 0, fmt.Errorf("%w: delta chain deeper than %d", packfile.ErrMalformedPackFile, maxDeltaDepth)
	}
	if b, ok := d.cache[e.offset]; ok && e.hash != plumbing.ZeroHash {
		return b, e.typ, nil
	}
	raw, err := d.raw(e)
	if err != nil {
		return objData{}, 0, err
	}
	if !e.delta {
		return raw, e.typ, nil
	}
	defer d.drop(raw)
	var base *packEntry
	if e.ref != plumbing.ZeroHash {
		base = d.byHash[e.ref]
	} else {
		base = d.byOffset[e.base]
	}
	if base == nil {
		return objData{}, 0, fmt.Errorf("%w: delta at %d", packfile.ErrReferenceDeltaNotFound, e.offset)
	}
	src, typ, err := d.content(base, depth+1)
	if err != nil {
		return objData{}, 0, err
	}
	out, err := d.patch(src, raw)
	// One delta on base fewer to go.
	base.children--
	d.hold(base, src)
	d.drop(src)
	if err != nil {
		return objData{}, 0, fmt.Errorf("delta at %d: %w", e.offset, err)
	}
	return out, typ, nil
}

// patch applies the delta instructions raw to src. Small ones are
// applied in memory; when the base, the delta or the result is past
// largeObject, go-git's streaming applier reads the base and the delta
// from where they are and the result goes to a spill file, so a 100 MB
// blob stored as a delta costs disk, not memory. The result's size is
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
	delta, err := raw.open()
	if err != nil {
		return objData{}, err
	}
	defer delta.Close()
	rd, err := packfile.ReaderFromDelta(spillObject{data: src}, delta)
	if err != nil {
		return objData{}, err
	}
	defer rd.Close()
	if dstSize <= largeObject {
		out, err := io.ReadAll(io.LimitReader(rd, int64(dstSize)+1))
		if err != nil {
			return objData{}, err
		}
		if uint64(len(out)) != dstSize {
			return objData{}, packfile.ErrInvalidDelta
		}
		return objData{mem: out, size: int64(len(out))}, nil
	}
	return d.spill(func(w io.Writer) (int64, error) {
		n, err := io.Copy(w, rd)
		if err == nil && uint64(n) != dstSize {
			err = packfile.ErrInvalidDelta
		}
		return n, err
	})
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

// spill writes an object's content to a new spill file.
func (d *deltaResolver) spill(write func(io.Writer) (int64, error)) (objData, error) {
	f, err := os.CreateTemp(d.dir, "tmp_spill_")
	if err != nil {
		return objData{}, err
	}
	bw := bufio.NewWriterSize(f, 64<<10)
	n, err := write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return objData{}, err
	}
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
	_ = os.Remove(o.file)
}

// hold keeps the content of e while deltas on it remain to be resolved —
// in memory within deltaCacheBytes, a spill file on disk — and lets it go
// when none remain.
func (d *deltaResolver) hold(e *packEntry, data objData) {
	c, cached := d.cache[e.offset]
	switch {
	case cached && e.children <= 0:
		delete(d.cache, e.offset)
		d.cacheBytes -= len(c.mem)
		if c.file != "" {
			_ = os.Remove(c.file)
		}
	case !cached && e.children > 0 && e.hash != plumbing.ZeroHash && (data.file != "" || d.cacheBytes+len(data.mem) <= deltaCacheBytes):
		d.cache[e.offset] = data
		d.cacheBytes += len(data.mem)
	}
}

// close removes every spill file still held.
func (d *deltaResolver) close() {
	for off, c := range d.cache {
		if c.file != "" {
			_ = os.Remove(c.file)
		}
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
