package gitsource

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// The shallow-update bound. The answer to a shallow fetch starts with
// the server's shallow and unshallow lines up to a flush (protocol v0's
// shallow-update section), then its ACK and NAK lines; go-git reads every
// one into memory (it skips any other line of the shallow section, an ACK
// or NAK included, and holds every ACK after it), then merges the shallow
// ones into the cache's shallow list one by one against every entry
// already there (Remote.updateShallow), so a server that sends millions
// costs memory and time squared. gitsource reads at most maxShallowLines
// pkt-lines, maxShallowBytes in all, before the pack (its first side-band
// packet, or its first byte that is no pkt-line length) of an upload-pack
// answer, over http(s) and the file transport; past that the fetch fails
// with ErrTooManyShallows, a git failure like any other (the last good
// state stays), never cache damage. Over ssh go-git reads the answer from its own session: there
// the operation's deadline is the bound.

// maxShallowLines and maxShallowBytes bound the shallow-update section:
// gitfleet fetches at depth 1 at most a few thousand branches at once (a
// host branch each), one shallow line each. Variables so that tests can
// lower them.
var (
	maxShallowLines       = 10000
	maxShallowBytes int64 = 1 << 20
)

// ErrTooManyShallows: the remote's answer to a shallow fetch listed more
// shallow lines (or bytes of them) than gitsource reads. Nothing in the
// cache changed.
var ErrTooManyShallows = errors.New("the remote sent too many shallow lines")

// limitShallow returns a reader of an upload-pack answer r, byte for
// byte, that fails with ErrTooManyShallows when the pkt-lines before the
// pack pass the bounds.
func limitShallow(r io.Reader) io.Reader {
	return &shallowReader{r: bufio.NewReader(r), head: true}
}

// sideBands are the first bytes of side-band packets: the pack's data,
// progress, an error.
var sideBands = []byte{1, 2, 3}

type shallowReader struct {
	r *bufio.Reader
	// head is set while the pkt-lines before the pack are read; pending
	// holds bytes read and not yet returned.
	head    bool
	pending []byte
	lines   int
	bytes   int64
}

func (s *shallowReader) Read(p []byte) (int, error) {
	for len(s.pending) == 0 && s.head {
		if err := s.nextLine(); err != nil {
			return 0, err
		}
	}
	if len(s.pending) > 0 {
		n := copy(p, s.pending)
		s.pending = s.pending[n:]
		return n, nil
	}
	return s.r.Read(p)
}

// nextLine reads one pkt-line of the head into pending: a data line or a
// flush, each counted (go-git reads on past a flush, and past an ACK or
// NAK, as long as it sees lines). The pack's start (a side-band packet,
// or bytes that are no pkt-line length), a short read or any other
// length ends the head, for go-git to judge.
func (s *shallowReader) nextLine() error {
	var l [4]byte
	n, err := io.ReadFull(s.r, l[:])
	s.pending = append(s.pending, l[:n]...)
	if err != nil {
		s.head = false
		return nil
	}
	size, err := strconv.ParseUint(string(l[:]), 16, 16)
	if err != nil || (size > 0 && size <= 4) {
		s.head = false // the pack itself, a delimiter, or garbage
		return nil
	}
	if size > 0 {
		payload := make([]byte, size-4)
		n, err = io.ReadFull(s.r, payload)
		s.pending = append(s.pending, payload[:n]...)
		if err != nil || bytes.IndexByte(sideBands, payload[0]) >= 0 {
			s.head = false // cut short, or the pack in side-band packets
			return nil
		}
	}
	s.lines++
	s.bytes += int64(size)
	if s.lines > maxShallowLines || s.bytes > maxShallowBytes {
		s.pending = nil
		return fmt.Errorf("%w: more than %d lines or %s before the pack; gitfleet reads at most that", ErrTooManyShallows, maxShallowLines, sizeText(maxShallowBytes))
	}
	return nil
}
