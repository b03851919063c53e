package tinyguest

import (
	"fmt"
	"io"
)

// cpioWriter writes a cpio archive in the "newc" format (magic 070701),
// the one the Linux kernel unpacks as an initramfs. Each entry's header is
// 13 eight-digit hex fields; names and data are padded to 4 bytes; the
// archive ends with an entry named TRAILER!!!.
//
// It is our own because the maintained Go cpio library that resolves here
// (cavaliergopher/cpio v1.0.1) cannot write device numbers, and an
// initramfs needs a /dev/console character device.
type cpioWriter struct {
	w     io.Writer
	ino   uint32
	err   error
	count int64
}

// cpioEntry is one archive member. Mode carries the file type bits
// (0100000 file, 040000 directory, 0120000 symlink, 020000 char device).
type cpioEntry struct {
	Name      string
	Mode      uint32
	Data      []byte // file content or symlink target
	RdevMajor uint32
	RdevMinor uint32
}

const (
	cpioTypeFile    = 0100000
	cpioTypeDir     = 040000
	cpioTypeSymlink = 0120000
	cpioTypeChar    = 020000
)

func (c *cpioWriter) write(p []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(p)
	c.count += int64(n)
	c.err = err
}

func (c *cpioWriter) pad() {
	if r := c.count % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// add writes one entry. Times are zero so the archive depends on content only.
func (c *cpioWriter) add(e cpioEntry) error {
	c.ino++
	nlink := uint32(1)
	if e.Mode&0170000 == cpioTypeDir {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, e.Mode, 0, 0, nlink, 0, len(e.Data), 0, 0, e.RdevMajor, e.RdevMinor, len(e.Name)+1, 0)
	c.write([]byte(hdr))
	c.write(append([]byte(e.Name), 0))
	c.pad()
	c.write(e.Data)
	c.pad()
	return c.err
}

// close writes the trailer entry.
func (c *cpioWriter) close() error {
	c.ino = 0
	return c.add(cpioEntry{Name: "TRAILER!!!"})
}
