package qemu

import "bytes"

// trimTail returns at most the last n bytes of b, starting at a line
// boundary where one is near, with surrounding space trimmed.
func trimTail(b []byte, n int) []byte {
	b = bytes.TrimSpace(b)
	if len(b) <= n {
		return b
	}
	b = b[len(b)-n:]
	if i := bytes.IndexByte(b, '\n'); i >= 0 && i < len(b)-1 {
		b = b[i+1:]
	}
	return b
}
