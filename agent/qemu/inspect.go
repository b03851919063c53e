package qemu

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
)

// ErrImageNotSelfContained is wrapped (inside agent.Permanent) by an image
// that refers to anything outside itself, or whose format could.
var ErrImageNotSelfContained = errors.New("image is not self-contained")

// Image formats the backend boots.
const (
	formatQCOW2 = "qcow2"
	formatRaw   = "raw"
)

// foreignMagic are the signatures of image formats other than qcow2 and
// raw. Each can refer to other files (vmdk extents, vhdx parent locators,
// qed backing files, ...) or needs secrets (luks): an image starting with
// one is refused, never booted as raw, since qemu-img and a human reading
// "raw" would disagree about what it is.
var foreignMagic = []struct {
	offset int
	magic  []byte
	name   string
}{
	{0, []byte("KDMV"), "vmdk"},
	{0, []byte("COWD"), "vmdk"},
	{0, []byte("# Disk DescriptorFile"), "vmdk descriptor"},
	{0, []byte("vhdxfile"), "vhdx"},
	{0, []byte("QED\x00"), "qed"},
	{0, []byte("conectix"), "vpc"},
	{0, []byte("LUKS\xba\xbe"), "luks"},
	{0, []byte("WithoutFreeSpace"), "parallels"},
	{0, []byte("WithouFreSpacExt"), "parallels"},
	{0, []byte("Bochs Virtual HD Image"), "bochs"},
	{0, []byte("#!/bin/sh\n#V2.0 Format\nmodprobe cloop"), "cloop"},
	{0, []byte("QEVM"), "qemu vmstate"},
	{64, []byte("\x7f\x10\xda\xbe"), "vdi"},
	{0, []byte("<<< Oracle VM VirtualBox Disk Image >>>"), "vdi"},
	{0, []byte("<<< innotek VirtualBox Disk Image >>>"), "vdi"},
	{0, []byte("<<< Sun VirtualBox Disk Image >>>"), "vdi"},
	{0, []byte("<<< Sun xVM VirtualBox Disk Image >>>"), "vdi"},
	{0, []byte("<<< QEMU VM Virtual Disk Image >>>"), "vdi"},
}

// qcow2 header fields (docs/interop/qcow2.txt in QEMU's source).
const (
	qcow2Magic            = "QFI\xfb"
	qcow2V2HeaderLen      = 72
	qcow2IncompatDataFile = 1 << 2 // incompatible_features bit 2: external data file
	qcow2ExtEnd           = 0x00000000
	qcow2ExtDataFile      = 0x44415441 // "DATA": external data file name
	qcow2ExtBackingFormat = 0xe2792aca
)

// inspectImage reads the header of a downloaded image and returns its
// format ("qcow2" or "raw"), or an error wrapping ErrImageNotSelfContained
// that names the field at fault: a qcow2 backing file, an external data
// file (the incompatible feature bit or the header extension), encryption,
// or a format other than qcow2 or raw. It reads the file itself and opens
// nothing the image names, so a hostile image is refused before qemu-img
// or QEMU ever opens it.
func inspectImage(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("inspect image: %w", err)
	}
	defer f.Close()
	head := make([]byte, 64<<10)
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("inspect image: %w", err)
	}
	head = head[:n]
	if bytes.HasPrefix(head, []byte(qcow2Magic)) {
		return formatQCOW2, checkQCOW2(head)
	}
	if bytes.HasPrefix(head, []byte("QFI")) {
		// qcow version 1 ("QFI\xfb" with version 1 is caught above).
		return "", fmt.Errorf("%w: format qcow (version 1): want qcow2 or raw", ErrImageNotSelfContained)
	}
	for _, m := range foreignMagic {
		if len(head) >= m.offset+len(m.magic) && bytes.Equal(head[m.offset:m.offset+len(m.magic)], m.magic) {
			return "", fmt.Errorf("%w: format %s: want qcow2 or raw", ErrImageNotSelfContained, m.name)
		}
	}
	return formatRaw, nil
}

// checkQCOW2 refuses a qcow2 header that refers outside the image: what
// parseQCOW2 refuses, and a backing file.
func checkQCOW2(h []byte) error {
	q, err := parseQCOW2(h)
	switch {
	case err != nil:
		return err
	case q.backingOffset != 0:
		return fmt.Errorf("%w: qcow2 backing_file_offset is %d: the image names a backing file", ErrImageNotSelfContained, q.backingOffset)
	case q.backingSize != 0:
		return fmt.Errorf("%w: qcow2 backing_file_size is %d: the image names a backing file", ErrImageNotSelfContained, q.backingSize)
	case q.hasBackingFormat:
		return fmt.Errorf("%w: qcow2 header extension backing-format: the image names a backing file", ErrImageNotSelfContained)
	}
	return nil
}
