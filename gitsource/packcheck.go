package gitsource

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/sirupsen/logrus"
)

// packTrailer is the size of a pack's trailer (the SHA-1 of everything
// before it) and of each of the two checksums that end its index (the
// pack's trailer, then the index's own): gitformat-pack(5).
const packTrailer = 20

// dropDamagedPacks removes from a cache every pack whose trailer is not
// the one its index records, and its index: a pack cut short (a crash or
// a full disk in the middle of a write, a copy that stopped) or
// overwritten. Its index stays whole, so every object in it still looks
// present, and only reading one past the cut fails — after a fetch that
// saw nothing wrong, so a one-shot run (`gitfleet controller --once`)
// failed every time, and a running one only repaired it after a failed
// read. Without the pack its objects are missing, which the fetch that
// follows Open finds and repairs (fetching them again or cloning
// afresh). The check reads 40 bytes per pack. One CacheDir belongs to
// one Repo, so no pack is being written while it runs.
func dropDamagedPacks(dir string, log *logrus.Entry) {
	idxs, err := filepath.Glob(filepath.Join(dir, "objects", "pack", "pack-*.idx"))
	if err != nil {
		return
	}
	for _, idx := range idxs {
		pack := strings.TrimSuffix(idx, ".idx") + ".pack"
		why := packDamage(pack, idx)
		if why == "" {
			continue
		}
		entry := log.WithField("pack", pack).WithField("damage", why)
		removed := true
		for _, p := range []string{pack, idx} {
			if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
				entry.WithError(err).Warn("remove a damaged pack from the cache")
				removed = false
			}
		}
		if removed {
			entry.Warn("removed a damaged pack from the cache; its objects are fetched again")
		}
	}
}

// packDamage says why pack does not match idx ("" when its trailer is
// the one idx records, or pack is absent: sweepLeftovers removes an
// index without its pack).
func packDamage(pack, idx string) string {
	ptail, psize, err := fileTail(pack, packTrailer)
	if os.IsNotExist(err) {
		return ""
	}
	if err != nil {
		return err.Error()
	}
	// A pack holds a 12-byte header and its trailer at the least.
	if psize < 12+packTrailer {
		return fmt.Sprintf("pack of %d bytes is shorter than a header and a trailer", psize)
	}
	itail, isize, err := fileTail(idx, 2*packTrailer)
	if err != nil {
		return err.Error()
	}
	if isize < 2*packTrailer {
		return fmt.Sprintf("index of %d bytes holds no checksums", isize)
	}
	if !bytes.Equal(ptail, itail[:packTrailer]) {
		return fmt.Sprintf("the pack's trailer is not the checksum its index records (the pack is %d bytes: cut short or overwritten)", psize)
	}
	return ""
}

// fileTail reads the last n bytes of the file at path and its size.
func fileTail(path string, n int64) ([]byte, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	if fi.Size() < n {
		return nil, fi.Size(), nil
	}
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, fi.Size()-n); err != nil && err != io.EOF {
		return nil, fi.Size(), err
	}
	return buf, fi.Size(), nil
}
