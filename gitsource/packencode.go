package gitsource

import (
	"compress/zlib"
	"crypto/sha1"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/storer"
)

// encodePack writes the objects hs of st to w as a git pack (version 2):
// each object whole (no deltas), compressed at zlib.BestSpeed, then the
// pack's SHA-1, which it returns (a cache names the pack by it): the same
// objects in the same order make the same pack, byte for byte. go-git's
// encoder compresses at the default level: a publish of the big fleet's
// ledger (hundreds of KB) spent about 10 ms of CPU there, for a pack the
// remote inflates at once.
func encodePack(w io.Writer, st storer.EncodedObjectStorer, hs []plumbing.Hash) (plumbing.Hash, error) {
	sum := sha1.New()
	out := io.MultiWriter(w, sum)
	var head [12]byte
	copy(head[:], "PACK")
	binary.BigEndian.PutUint32(head[4:], 2)
	binary.BigEndian.PutUint32(head[8:], uint32(len(hs)))
	if _, err := out.Write(head[:]); err != nil {
		return plumbing.ZeroHash, err
	}
	zw, err := zlib.NewWriterLevel(out, zlib.BestSpeed)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	for _, h := range hs {
		obj, err := st.EncodedObject(plumbing.AnyObject, h)
		if err != nil {
			return plumbing.ZeroHash, fmt.Errorf("object %s: %w", h, err)
		}
		if _, err := out.Write(objectHeader(obj.Type(), obj.Size())); err != nil {
			return plumbing.ZeroHash, err
		}
		rd, err := obj.Reader()
		if err != nil {
			return plumbing.ZeroHash, fmt.Errorf("object %s: %w", h, err)
		}
		zw.Reset(out)
		_, err = io.Copy(zw, rd)
		rd.Close()
		if err != nil {
			return plumbing.ZeroHash, fmt.Errorf("object %s: %w", h, err)
		}
		if err := zw.Close(); err != nil {
			return plumbing.ZeroHash, err
		}
	}
	var h plumbing.Hash
	copy(h[:], sum.Sum(nil))
	_, err = w.Write(h[:])
	return h, err
}

// objectHeader is a pack entry's header: the type in bits 4-6 of the first
// byte, the size in its low 4 bits and 7 bits of each following byte, low
// bits first, every byte but the last with its high bit set.
func objectHeader(t plumbing.ObjectType, size int64) []byte {
	b := []byte{byte(t)<<4 | byte(size&0x0f)}
	for size >>= 4; size > 0; size >>= 7 {
		b[len(b)-1] |= 0x80
		b = append(b, byte(size&0x7f))
	}
	return b
}
